"""What the real API server checks of a built-in kind's object beyond its name: the core group's
Events, which the job posts (job/adapters/events.py), and the spec of the Lease it locks with.

A core/v1 Event is validated only by `legacyValidateEvent`
(`pkg/apis/core/validation/events.go`): the stricter rules are for events.k8s.io/v1 alone. Its
name is checked only as a path segment (`ValidatePathSegmentName`,
`staging/src/k8s.io/apimachinery/pkg/api/validation/path/name.go`), not as a DNS subdomain.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
