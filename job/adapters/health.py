"""The read side of the network-health diagnosis: calico-node pods (and, for those that crash
loop, their previous log), admission webhooks and the endpoints behind them. Read-only; a check
that cannot be read is skipped, never a failed run. The diagnosis itself is pure (job/core/health.py)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar

import msgspec
import structlog

from job.adapters import kube_protobuf
from job.adapters.kube import Kube, KubeError, either, typed_page
from job.config import Config, format_duration
from job.core.health import FORBIDDEN, CalicoNodePod, HealthInputs, Webhook, is_crash_looping, log_digest

log = structlog.get_logger("calico_gc.health")


class _Container(Protocol):
    @property
    def name(self) -> str: ...


C = TypeVar("C", bound=_Container)
CALICO_NODE_CONTAINER = "calico-node"


# What the diagnosis reads of each object, typed, so that a server (or a proxy) that answers a
# field in another shape is one `bad_answer` naming it, and the check is skipped: never a traceback.
class _Named(msgspec.Struct, frozen=True):
    name: str = ""
    namespace: str = ""
    labels: dict[str, str] | None = None


class _Waiting(msgspec.Struct, frozen=True):
    reason: str | None = None


class _Terminated(msgspec.Struct, frozen=True):
    exitCode: int | None = None  # the API's names
    reason: str | None = None
    finishedAt: str | None = None


class _ContainerState(msgspec.Struct, frozen=True):
    waiting: _Waiting | None = None
    terminated: _Terminated | None = None


class _ContainerStatus(msgspec.Struct, frozen=True):
    name: str = ""
    state: _ContainerState = _ContainerState()
    lastState: _ContainerState = _ContainerState()
    restartCount: int = 0


class _PodCondition(msgspec.Struct, frozen=True):
    type: str = ""
    status: str = ""


class _PodStatus(msgspec.Struct, frozen=True):
    phase: str | None = None
    conditions: list[_PodCondition] | None = None
    containerStatuses: list[_ContainerStatus] | None = None


class _PodSpec(msgspec.Struct, frozen=True):
    nodeName: str | None = None


class _CalicoNodePod(msgspec.Struct, frozen=True):
    """A calico-node pod in JSON: the fields kube_protobuf's HealthPod reads in protobuf."""

    metadata: _Named = _Named()
    spec: _PodSpec = _PodSpec()
    status: _PodStatus = _PodStatus()


class _LabelRequirement(msgspec.Struct, frozen=True):
    key: str = ""
    operator: str = ""
    values: list[str] | None = None


class _LabelSelector(msgspec.Struct, frozen=True):
    matchLabels: dict[str, str] | None = None
    matchExpressions: list[_LabelRequirement] | None = None


class _Rule(msgspec.Struct, frozen=True):
    operations: list[str] | None = None
    apiGroups: list[str] | None = None
    resources: list[str] | None = None


class _Service(msgspec.Struct, frozen=True):
    namespace: str = "default"
    name: str = ""


class _ClientConfig(msgspec.Struct, frozen=True):
    service: _Service | None = None


class _Hook(msgspec.Struct, frozen=True):
    name: str = ""
    failurePolicy: str | None = None
    rules: list[_Rule] | None = None
    namespaceSelector: _LabelSelector | None = None
    objectSelector: _LabelSelector | None = None
    clientConfig: _ClientConfig = _ClientConfig()


class _WebhookConfiguration(msgspec.Struct, frozen=True):
    metadata: _Named = _Named()
    webhooks: list[_Hook] | None = None


class _EndpointConditions(msgspec.Struct, frozen=True):
    ready: bool | None = None


class _Endpoint(msgspec.Struct, frozen=True):
    conditions: _EndpointConditions = _EndpointConditions()


class _EndpointSlice(msgspec.Struct, frozen=True):
    endpoints: list[_Endpoint] | None = None


def _read_container(containers: Sequence[C]) -> C | None:
    """The container status the diagnosis reads: calico-node's, else the first (None: none)."""
    named = next((c for c in containers if c.name == CALICO_NODE_CONTAINER), None)
    return named or (containers[0] if containers else None)


def _calico_node_pod(pod: _CalicoNodePod) -> CalicoNodePod:
    """What the diagnosis reads of a calico-node pod: its calico-node container's status (or its
    first container's), readiness and labels."""
    metadata, status = pod.metadata, pod.status
    container = _read_container(status.containerStatuses or ()) or _ContainerStatus()
    waiting, terminated = container.state.waiting or _Waiting(), container.lastState.terminated or _Terminated()
    return CalicoNodePod(
        namespace=metadata.namespace,
        name=metadata.name,
        node=pod.spec.nodeName,
        phase=status.phase,
        ready=any(c.type == "Ready" and c.status == "True" for c in status.conditions or ()),
        restarts=container.restartCount,
        waiting_reason=waiting.reason,
        last_exit_code=terminated.exitCode,
        last_reason=terminated.reason,
        last_finished_at=terminated.finishedAt,
        labels=metadata.labels or {},
    )


def _calico_node_pod_of_protobuf(pod: Any) -> _CalicoNodePod:
    """A calico-node pod in protobuf as its JSON reads (an empty string as absent, as JSON leaves
    it out); of the container statuses only the one _calico_node_pod reads is made a record. A
    call per pod, not a generic walk over every field: 5,000 pods cost the reading thread
    0.16-0.22 s of CPU that way, 0.10-0.13 s this way."""
    status = pod.status
    container = _read_container(status.containerStatuses)
    return _CalicoNodePod(
        _Named(pod.metadata.name, pod.metadata.namespace, dict(pod.metadata.labels)),
        _PodSpec(pod.spec.nodeName or None),
        _PodStatus(
            status.phase or None,
            [_PodCondition(c.type, c.status) for c in status.conditions],
            None if container is None else [_container_of_protobuf(container)],
        ),
    )


def _container_of_protobuf(container: Any) -> _ContainerStatus:
    waiting = container.state.waiting if container.state.HasField("waiting") else None
    terminated = container.lastState.terminated if container.lastState.HasField("terminated") else None
    return _ContainerStatus(
        container.name,
        _ContainerState(waiting=None if waiting is None else _Waiting(waiting.reason or None)),
        _ContainerState(
            terminated=None
            if terminated is None
            else _Terminated(
                terminated.exitCode if terminated.HasField("exitCode") else None,
                terminated.reason or None,
                kube_protobuf.when(terminated, "finishedAt"),
            )
        ),
        container.restartCount,
    )


# The calico-node pods in protobuf where the server speaks it, else JSON: _CalicoNodePod either way.
CALICO_NODE_PAGE = either("PodList", _calico_node_pod_of_protobuf, typed_page(_CalicoNodePod), message="HealthPodList")
WEBHOOK_PAGE, ENDPOINT_SLICE_PAGE = typed_page(_WebhookConfiguration), typed_page(_EndpointSlice)
LOG_READERS = 8  # previous logs read at once: each waits on a kubelet, through the API server
WEBHOOK_KINDS = (("Validating", "validatingwebhookconfigurations"), ("Mutating", "mutatingwebhookconfigurations"))


def read_health(kube: Kube, config: Config) -> HealthInputs:
    """Everything the diagnosis needs; a check the job may not read becomes `skipped: forbidden`."""
    inputs = HealthInputs()
    try:
        selector = {"labelSelector": config.calico_node_selector}
        pods = [
            pod
            for namespace in config.calico_node_namespaces
            for pod in kube.list_all(
                f"/api/v1/namespaces/{namespace}/pods",
                _calico_node_pod,
                selector,
                CALICO_NODE_PAGE,
                kube_protobuf.ACCEPT,
            )
        ]
        inputs.pods = _with_previous_logs(kube, pods, config)
    except KubeError as error:
        inputs.pods = None
        inputs.checks["calico_node"] = _skipped(error)
    try:
        hooks: list[Webhook] = []
        for kind, plural in WEBHOOK_KINDS:
            for hooks_of_one in kube.list_all(
                f"/apis/admissionregistration.k8s.io/v1/{plural}", partial(_webhooks, kind=kind), page=WEBHOOK_PAGE
            ):
                hooks.extend(hooks_of_one)
        inputs.webhooks = tuple(hooks)
        inputs.ready_endpoints = {
            hook.service: _ready_endpoints(kube, *hook.service)
            for hook in hooks
            if hook.service and hook.failure_policy == "Fail"
        }
    except KubeError as error:
        inputs.webhooks = None
        inputs.checks["webhooks"] = _skipped(error)
    return inputs


def _with_previous_logs(kube: Kube, pods: Sequence[CalicoNodePod], config: Config) -> tuple[CalicoNodePod, ...]:
    """The pods, each crash-looping one with its previous log, read LOG_READERS at a time within
    --log-read-budget. When a fail-closed webhook stops calico-node on every node, every pod's log
    is read, one request each that the API server passes to a kubelet (30 s at most): one at a
    time, 5,000 of them could outlast the Job's deadline, and the plan waits for them. A log not
    read in time leaves its pod's cause unknown; a read still running then is abandoned (daemon
    threads, as the run abandons a read that hangs)."""
    looping = [index for index, pod in enumerate(pods) if is_crash_looping(pod, config.restart_threshold)]
    todo = queue.SimpleQueue[int]()
    for index in looping:
        todo.put(index)
    read: dict[int, CalicoNodePod] = {}
    budget = config.log_read_budget.total_seconds()
    deadline, all_read, lock = time.monotonic() + budget, threading.Event(), threading.Lock()

    def reader() -> None:
        while time.monotonic() < deadline:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            pod = _with_previous_log(kube, pods[index], config)
            with lock:
                read[index] = pod
                if len(read) == len(looping):
                    all_read.set()

    if looping and budget > 0:
        for _ in range(min(LOG_READERS, len(looping))):
            threading.Thread(target=reader, daemon=True).start()
        all_read.wait(budget)
    with lock:
        done = dict(read)
    budget_text = format_duration(config.log_read_budget)
    why = f"not read: --log-read-budget ({budget_text}) ran out, {len(done)} of {len(looping)} read"
    done |= {index: replace(pods[index], log_error=why) for index in looping if index not in done}
    return tuple(done.get(index, pod) for index, pod in enumerate(pods))


def _with_previous_log(kube: Kube, pod: CalicoNodePod, config: Config) -> CalicoNodePod:
    path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/log"
    query = {"container": CALICO_NODE_CONTAINER, "previous": "true", "tailLines": config.log_tail_lines}
    try:
        # Once, not retried: without a reachable kubelet (a node whose network is broken) the
        # log is a 500 every time, and only this pod's cause is lost, never the whole check.
        text = kube.request_bytes("GET", path, query, retry=False).decode(errors="replace")
    except KubeError as error:
        # 400: no previous container yet; 404: gone meanwhile
        return replace(pod, log_error=None if error.status in (400, 404) else str(error))
    return replace(pod, previous_log=log_digest(text))


def _ready_endpoints(kube: Kube, namespace: str, service: str) -> int | None:
    """Ready endpoints behind a Service, from its EndpointSlices; None when not allowed to look."""
    try:
        ready_per_slice = kube.list_all(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            _ready_in_slice,
            {"labelSelector": f"kubernetes.io/service-name={service}"},
            ENDPOINT_SLICE_PAGE,
        )
    except KubeError as error:
        if error.status == 403:
            return None
        raise
    return sum(ready_per_slice)


def _ready_in_slice(endpoint_slice: _EndpointSlice) -> int:
    return sum(1 for e in endpoint_slice.endpoints or () if e.conditions.ready is not False)


def _skipped(error: KubeError) -> str:
    """Health is read-only help: a check that cannot be read is skipped, never a failed run."""
    log.warning("health_check_skipped", status=error.status, error=str(error))
    if error.status == 403:
        return FORBIDDEN
    return f"skipped: HTTP {error.status}" if error.status else f"skipped: {error.kind}"


def _webhooks(configuration: _WebhookConfiguration, kind: str) -> list[Webhook]:
    return [
        Webhook(
            configuration=configuration.metadata.name,
            name=hook.name,
            kind=kind,
            failure_policy=hook.failurePolicy or "Fail",
            rules=[msgspec.to_builtins(rule) for rule in hook.rules or ()],
            namespace_selector=_selector(hook.namespaceSelector),
            object_selector=_selector(hook.objectSelector),
            service=(service.namespace, service.name)
            if (service := hook.clientConfig.service) and service.name
            else None,
        )
        for hook in configuration.webhooks or ()
    ]


def _selector(selector: _LabelSelector | None) -> dict[str, Any] | None:
    return None if selector is None else msgspec.to_builtins(selector)
