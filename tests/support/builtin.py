"""What the real API server checks of a built-in kind's object beyond its name: the core group's
Events, which the job posts (job/adapters/events.py), and the spec of the Lease it locks with;
and what a Pod's create makes of the status and resources sent (the benches create pods).

A core/v1 Event is validated only by `legacyValidateEvent`
(`pkg/apis/core/validation/events.go`): the stricter rules are for events.k8s.io/v1 alone. Its
name is checked only as a path segment (`ValidatePathSegmentName`,
`staging/src/k8s.io/apimachinery/pkg/api/validation/path/name.go`), not as a DNS subdomain.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from job.kube_syntax import qualified_name_problems
from tests.support.crds import Cause

# An Event about a cluster-scoped object (a Node) lives in one of these: `default` (or none) where
# it has no eventTime, as the old recorders write it; `default` or `kube-system` where it has one.
_LEGACY_HOMES = ("", "default")
_HOMES = ("default", "kube-system")
# Fields an Event with an eventTime must carry, by JSON name (`reportingComponent` is the Go
# field ReportingController), each with the longest it may be; `message` may be empty.
_REQUIRED_WITH_TIME = (("reportingInstance", 128), ("action", 128), ("reason", 128))
_NOTE_LIMIT = 1024


def _invalid(path: str, value: object, why: str) -> Cause:
    return Cause("FieldValueInvalid", path, f"Invalid value: {json.dumps(value)}: {why}")


def event_causes(event: dict[str, Any], namespace: str) -> Iterator[Cause]:
    """Why the real server refuses a core/v1 Event in `namespace`, in its words and order."""
    involved = str((event.get("involvedObject") or {}).get("namespace") or "")
    timed = bool(event.get("eventTime"))
    # About a namespaced object: in its namespace (not checked where the Event has an eventTime).
    homes = (namespace if timed else involved,) if involved else _HOMES if timed else _LEGACY_HOMES
    if namespace not in homes:
        yield _invalid("involvedObject.namespace", involved, "does not match event.namespace")
    if not timed:
        return
    controller = str(event.get("reportingComponent") or "")
    if not controller:
        yield Cause("FieldValueRequired", "reportingController", "Required value")
    for problem in qualified_name_problems(controller):
        yield _invalid("reportingController", controller, problem)
    for name, limit in (*_REQUIRED_WITH_TIME, ("message", _NOTE_LIMIT)):
        value = str(event.get(name) or "")
        if not value and name != "message":
            yield Cause("FieldValueRequired", name, "Required value")
        if len(value.encode()) > limit:
            yield _invalid(name, "", f"can have at most {limit} characters")


def path_segment_causes(metadata: dict[str, Any]) -> Iterator[Cause]:
    """An Event's generateName, then its name, as `ValidatePathSegmentName` takes them: anything
    that holds no `/` or `%`, and a name that is not `.` or `..`."""
    for key in ("generateName", "name"):
        name = metadata.get(key)
        if not isinstance(name, str) or not name:
            continue
        if key == "name" and name in (".", ".."):
            yield _invalid(f"metadata.{key}", name, f"may not be '{name}'")
            continue
        for mark in ("/", "%"):
            if mark in name:
                yield _invalid(f"metadata.{key}", name, f"may not contain '{mark}'")


# A Lease's coordinated strategies that need no `/` (`validLeaseStrategies`).
_LEASE_STRATEGIES = ("OldestEmulationVersion",)


def lease_causes(lease: dict[str, Any]) -> Iterator[Cause]:
    """`ValidateLeaseSpec` (`pkg/apis/coordination/validation/validation.go`), in its words."""
    spec = lease.get("spec") or {}
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if isinstance(duration, int) and duration <= 0:
        yield _invalid("spec.leaseDurationSeconds", duration, "must be greater than 0")
    if isinstance(transitions, int) and transitions < 0:
        yield _invalid("spec.leaseTransitions", transitions, "must be greater than or equal to 0")
    strategy = spec.get("strategy")
    if isinstance(strategy, str):
        # The real server names the field twice here (a child of spec.strategy called strategy).
        if "/" not in strategy and strategy not in _LEASE_STRATEGIES:
            supported = ", ".join(json.dumps(s) for s in _LEASE_STRATEGIES)
            message = f"Unsupported value: {json.dumps(strategy)}: supported values: {supported}"
            yield Cause("FieldValueNotSupported", "spec.strategy.strategy", message)
        elif "/" in strategy:
            for problem in qualified_name_problems(strategy):
                yield _invalid("spec.strategy.strategy", strategy, problem)
    if spec.get("preferredHolder") and not strategy:
        why = "Forbidden: may only be specified if `strategy` is defined"
        yield Cause("FieldValueForbidden", "spec.preferredHolder", why)


# A Quantity as `resource.ParseQuantity` reads it (staging/src/k8s.io/apimachinery/pkg/api/resource/
# quantity.go): a number, then one suffix: binary (Ki..Ei), decimal (n..E) or an exponent (e3, E-2).
QUANTITY_PATTERN = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_QUANTITY = re.compile(r"([+-]?[0-9.]+)((?:[KMGTPE]i)|[numkMGTPE]?|[eE][-+]?[0-9]+)")
_SCALES = {
    **{f"{s}i": Fraction(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
    **{s: Fraction(10) ** p for s, p in zip("numkMGTPE", (-9, -6, -3, 3, 6, 9, 12, 15, 18), strict=True)},
    "": Fraction(1),
}
# The resources a pod's QoS class is judged by (`supportedQoSComputeResources`).
_QOS_RESOURCES = ("cpu", "memory")


class BadQuantity(ValueError):
    """A Quantity the real server's decoder refuses, in its words (`ErrFormatWrong`)."""


def quantity(value: object) -> Fraction:
    """A Quantity's value, from its string or (as its UnmarshalJSON takes one) a bare number."""
    text = json.dumps(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    found = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    try:
        number = Fraction(Decimal(found.group(1))) if found else None
    except InvalidOperation:
        number = None
    if found is None or number is None:
        raise BadQuantity(f"quantities must match the regular expression '{QUANTITY_PATTERN}'")
    suffix = found.group(2)
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SCALES[suffix]


def _resource_lists(pod: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A pod's spec and its containers (init containers after the others), each a dict."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    containers = [c for key in ("containers", "initContainers") for c in spec.get(key) or [] if isinstance(c, dict)]
    return spec, containers


def pod_quantity_problem(pod: dict[str, Any]) -> str | None:
    """The decoder's error for the first resource quantity of a Pod it cannot read, or None."""
    spec, containers = _resource_lists(pod)
    for resources in (spec.get("resources") or {}, *(c.get("resources") or {} for c in containers)):
        for amount in (*(resources.get("limits") or {}).values(), *(resources.get("requests") or {}).values()):
            try:
                quantity(amount)
            except BadQuantity as error:
                return str(error)
    return None


def prepare_pod_for_create(pod: dict[str, Any]) -> None:
    """What the real server makes of a Pod it is asked to create (its quantities decoded): each
    container's requests default to its limits where it names none (`SetDefaults_Pod`,
    pkg/apis/core/v1/defaults.go), and the status sent is replaced by a Pending one with the pod's
    QoS class (the pod strategy's PrepareForCreate, pkg/registry/core/pod/strategy.go): the
    kubelet reports the rest through /status."""
    spec, containers = _resource_lists(pod)
    for container in containers:
        resources = container.get("resources") or {}
        if limits := resources.get("limits"):
            container["resources"] = {**resources, "requests": {**limits, **(resources.get("requests") or {})}}
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(spec, containers)}


def _qos_class(spec: dict[str, Any], containers: list[dict[str, Any]]) -> str:
    """`ComputePodQOS` (pkg/apis/core/helper/qos/qos.go): the pod's own CPU and memory where its
    spec sets them (pod-level resources), else its containers' summed. BestEffort with no request
    or limit above zero; Guaranteed where CPU and memory are limited (by every container) and the
    requests equal the limits; Burstable otherwise."""
    pod_level = spec.get("resources") or {}
    named = {*(pod_level.get("requests") or {}), *(pod_level.get("limits") or {})} & set(_QOS_RESOURCES)
    each = [pod_level] if named else [c.get("resources") or {} for c in containers]
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for resources in each:
        for into, given in ((requests, resources.get("requests") or {}), (limits, resources.get("limits") or {})):
            for name, amount in given.items():
                if name in _QOS_RESOURCES and (value := quantity(amount)) > 0:
                    into[name] = into.get(name, Fraction(0)) + value
        limited = {n for n, a in (resources.get("limits") or {}).items() if n in _QOS_RESOURCES and quantity(a) > 0}
        guaranteed = guaranteed and limited == set(_QOS_RESOURCES)
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests.keys() == limits.keys() and all(limits[n] == v for n, v in requests.items()):
        return "Guaranteed"
    return "Burstable"
