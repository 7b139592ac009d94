"""Every call this job makes to the Kubernetes API, through the official client.

Responses are read as plain JSON (`_preload_content=False`): faster than model objects for
thousands of nodes, and tolerant of fields newer than the client.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from job.config import Config
from job.health import FORBIDDEN, CalicoNodePod, HealthInputs, Webhook, is_crash_looping
from job.model import KubeNode, NetworkUnavailable
from job.retry import RetryPolicy, describe_error

log = structlog.get_logger("calico_gc.kube")
T = TypeVar("T")
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_LIST_RESTARTS = 5
NETWORK_UNAVAILABLE_TAINT = "node.kubernetes.io/network-unavailable"
CALICO_NODE_CONTAINER = "calico-node"
WEBHOOK_KINDS = (("Validating", "validatingwebhookconfigurations"), ("Mutating", "mutatingwebhookconfigurations"))
REQUEST_TIMEOUT_S = 30
MIN_RENEW_INTERVAL_S = 1.0


class KubeError(Exception):
    """The Kubernetes API failed for good (after retries where they make sense): the one error
    this boundary raises. `status` is the HTTP status, None when no answer came."""

    def __init__(self, message: str, status: int | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind or ("unauthorized" if status in (401, 403) else "unavailable")


class Conflict(KubeError):
    """A write lost a resourceVersion race (HTTP 409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 409)


def _is_tls(error: BaseException) -> bool:
    reason = getattr(error, "reason", None)
    return isinstance(error, urllib3.exceptions.SSLError) or isinstance(reason, urllib3.exceptions.SSLError)


def is_transient(error: BaseException) -> bool:
    """429/5xx and lost connections are worth another attempt; TLS refusals are not."""
    if isinstance(error, ApiException):
        return error.status in RETRYABLE_STATUSES
    if _is_tls(error):
        return False
    return isinstance(error, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def api_client(config: Config) -> k8s.ApiClient:
    """In a pod, the in-cluster configuration; elsewhere --kubeconfig, KUBECONFIG or
    ~/.kube/config, as kubectl looks. Any unusable configuration is one KubeError line."""
    path = config.kubeconfig
    if path is None and "KUBERNETES_SERVICE_HOST" not in os.environ:
        default = Path.home() / ".kube" / "config"
        path = default if default.is_file() else None
    if path is None:
        try:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except ConfigException as error:
            raise KubeError(
                f"no Kubernetes configuration: not in a pod ({error}) and no kubeconfig; set --kubeconfig or "
                "KUBECONFIG",
                kind="config",
            ) from error
        return k8s.ApiClient()
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(path), client_configuration=configuration
        )
    except Exception as error:  # YAML errors, wrong types, missing files: all the same to an operator
        first = " ".join(str(error).split())[:200] or type(error).__name__
        raise KubeError(
            f"kubeconfig {path} is not usable: {first}; check --kubeconfig or KUBECONFIG", kind="config"
        ) from error
    return k8s.ApiClient(configuration)


def _status_message(error: ApiException) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    message = body.get("message") if isinstance(body, dict) else None
    return " ".join(str(message or error.reason or "").split())[:300]


def _now() -> datetime:
    return datetime.now(UTC)


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


def _network_reason(error: object) -> str:
    found = _ERRNO.search(str(error))
    return found.group(1).strip() if found else _one_line(str(error), 160) or type(error).__name__


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


class Kube:
    """The job's Kubernetes calls, each retried on 429/5xx and connection errors.

    Requests go through the official client's ApiClient (configuration, auth, TLS) rather
    than the generated CoreV1Api, whose 4.5 MB module alone takes 1.5 s to import.
    """

    def __init__(
        self, api: k8s.ApiClient, retry: RetryPolicy, page_size: int = 500, clock: Callable[[], datetime] = _now
    ) -> None:
        self._api = api
        self._retry = retry
        self._page_size = page_size
        self._clock = clock

    def request(
        self, method: str, path: str, query: dict[str, Any] | None = None, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One API call with retries; a non-2xx answer raises KubeError with its status."""
        text = self._request_text(method, path, query, body)
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise KubeError(
                f"{method} {path}: {self.host} answered something that is not a Kubernetes JSON object "
                f"({_one_line(text, 60)!r}); is it the API server, or a proxy in between?",
                kind="bad_answer",
            )
        return data

    def _failure(self, method: str, path: str, error: BaseException) -> KubeError:
        """Every way a call can fail, as one line that says what to check."""
        if isinstance(error, ApiException):
            status, message = error.status, _status_message(error)
            if status == 401:
                text = f"unauthorized (HTTP 401): {self.host} refused {self._credential()}"
            elif status == 403:
                text = f"forbidden (HTTP 403) {method} {path}: {message}; grant it in the RBAC of manifests/base"
                if "crd.projectcalico.org" in path:
                    text += " (DATASTORE_TYPE=kubernetes needs manifests/kdd)"
            else:
                text = f"{method} {path}: HTTP {status} {message}"
            return Conflict(text) if status == 409 else KubeError(text, status)
        if _is_tls(error):
            reason = getattr(error, "reason", error)
            return KubeError(
                f"TLS to the Kubernetes API at {self.host} failed: {_one_line(str(reason), 160)}; check the CA and "
                "client certificate of --kubeconfig (or the service account's ca.crt)",
                kind="tls",
            )
        reason = getattr(error, "reason", None) or error
        return KubeError(
            f"cannot reach the Kubernetes API at {self.host}: {_network_reason(reason)}; check --kubeconfig or "
            "KUBECONFIG (in a pod: the kubernetes service)"
        )

    def _credential(self) -> str:
        """Which credential was used, never its value."""
        configuration = self._api.configuration
        if (configuration.api_key or {}).get("authorization") or (configuration.api_key or {}).get("BearerToken"):
            return "the bearer token in use (the service account token, or the kubeconfig user's token)"
        if configuration.cert_file:
            return f"the client certificate {configuration.cert_file}"
        return "the anonymous request: the configuration carries no credential"

    def _request_text(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        retry: bool = True,
    ) -> str:
        def attempt() -> str:
            headers = {"Accept": "application/json, */*"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            _, url, headers, payload, _ = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response: Any = self._api.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=REQUEST_TIMEOUT_S
            )
            raw: bytes = response.read()
            if not 200 <= response.status <= 299:
                raise ApiException.from_response(http_resp=response, body=raw.decode(errors="replace"), data=None)
            return raw.decode(errors="replace")

        try:
            return self._retry.call(attempt, is_transient) if retry else attempt()
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            raise self._failure(method, path, error) from error

    def list_all(self, path: str, parse: Callable[[dict[str, Any]], T], query: dict[str, Any] | None = None) -> list[T]:
        """Every item of a collection, paged, each parsed as its page arrives (a page of full Pod
        objects is large; what is kept of them is small). A 410 (expired continue) restarts it."""
        for _ in range(MAX_LIST_RESTARTS):
            items: list[T] = []
            token: str | None = None
            try:
                while True:
                    page = self.request("GET", path, {**(query or {}), "limit": self._page_size, "continue": token})
                    items.extend(parse(item) for item in page.get("items") or [])
                    token = (page.get("metadata") or {}).get("continue") or None
                    if token is None:
                        return items
            except KubeError as error:
                if error.status != 410:
                    raise
                log.warning("list_restarted", path=path, reason="continue token expired (410)")
        raise KubeError(f"listing {path} kept expiring ({MAX_LIST_RESTARTS} restarts)")

    def list_nodes(self) -> tuple[KubeNode, ...]:
        """All Nodes, with their addresses and network-unavailable state."""
        return tuple(self.list_all("/api/v1/nodes", _kube_node))

    def node_exists(self, name: str) -> bool:
        """A fresh GET of one Node: False only on 404."""
        try:
            self.request("GET", f"/api/v1/nodes/{name}")
            return True
        except KubeError as error:
            if error.status == 404:
                return False
            raise

    # ConfigMaps (grace state)

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    def write_config_map(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create (no resourceVersion) or replace guarded by its resourceVersion; the object as
        written, whose resourceVersion the next write must carry. A lost race raises Conflict."""
        name = body["metadata"]["name"]
        collection = f"/api/v1/namespaces/{namespace}/configmaps"
        if body["metadata"].get("resourceVersion"):
            return self.request("PUT", f"{collection}/{name}", body=body)
        return self.request("POST", collection, body=body)

    # Lease (one run at a time)

    def acquire_lease(self, namespace: str, name: str, holder: str, duration: timedelta) -> str | None:
        """Take the Lease if free, expired or ours; return the other holder when it is not."""
        now = self._clock()
        collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        spec = {
            "holderIdentity": holder,
            "leaseDurationSeconds": int(duration.total_seconds()),
            "acquireTime": _micro_time(now),
            "renewTime": _micro_time(now),
        }
        try:
            current = self.request("GET", f"{collection}/{name}")
        except KubeError as error:
            if error.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            }
            return self._write_lease("POST", collection, body, "another run")
        held = current.get("spec") or {}
        other = held.get("holderIdentity")
        renewed = _parse_time(held.get("renewTime")) or _parse_time(held.get("acquireTime"))
        expires = renewed + timedelta(seconds=held.get("leaseDurationSeconds") or 0) if renewed else None
        if other and other != holder and expires is not None and expires > now:
            return str(other)
        current["spec"] = {
            **held,
            **spec,
            "leaseTransitions": int(held.get("leaseTransitions") or 0) + (other != holder),
        }
        if other and other != holder:
            log.warning("lease_taken_over", previous_holder=other, expired_at=str(expires))
        return self._write_lease("PUT", f"{collection}/{name}", current, str(other or "another run"))

    def _write_lease(self, method: str, path: str, body: dict[str, Any], other: str) -> str | None:
        try:
            self.request(method, path, body=body)
            return None
        except KubeError as error:
            if error.status == 409:
                return other  # someone else wrote the Lease first
            raise

    def _rewrite_own_lease(
        self, namespace: str, name: str, holder: str, change: Callable[[dict[str, Any]], None], event: str
    ) -> bool:
        """Apply `change` to the Lease spec if it is still ours; False when it is not, or on any
        API error (gone, taken meanwhile: 409, unanswerable), which is logged as `event`."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        try:
            current = self.request("GET", path)
            spec = current.setdefault("spec", {})
            if spec.get("holderIdentity") != holder:
                return False
            change(spec)
            self.request("PUT", path, body=current)
            return True
        except KubeError as error:
            log.warning(event, status=error.status)
            return False

    def renew_lease(self, namespace: str, name: str, holder: str) -> bool:
        """Move renewTime on; False means the lock cannot be confirmed, so stop acting."""
        now = _micro_time(self._clock())
        return self._rewrite_own_lease(
            namespace, name, holder, lambda spec: spec.update(renewTime=now), "lease_renewal_failed"
        )

    @property
    def host(self) -> str:
        """The API server URL, for the report."""
        return str(self._api.configuration.host)

    def now(self) -> datetime:
        return self._clock()

    def release_lease(self, namespace: str, name: str, holder: str) -> None:
        """Give the Lease up if it is still ours."""

        def give_up(spec: dict[str, Any]) -> None:
            spec.pop("holderIdentity", None)
            spec["leaseDurationSeconds"] = 1

        self._rewrite_own_lease(namespace, name, holder, give_up, "lease_release_failed")

    # Network health (read-only)

    def read_health(self, config: Config) -> HealthInputs:
        """Everything the diagnosis needs; a check the job may not read becomes `skipped: forbidden`."""
        inputs = HealthInputs()
        try:
            selector = {"labelSelector": config.calico_node_selector}
            pods = [
                pod
                for namespace in config.calico_node_namespaces
                for pod in self.list_all(f"/api/v1/namespaces/{namespace}/pods", _calico_node_pod, selector)
            ]
            inputs.pods = tuple(self._with_previous_log(pod, config) for pod in pods)
        except KubeError as error:
            inputs.pods = None
            inputs.checks["calico_node"] = _skipped(error)
        try:
            hooks: list[Webhook] = []
            for kind, plural in WEBHOOK_KINDS:
                for hooks_of_one in self.list_all(
                    f"/apis/admissionregistration.k8s.io/v1/{plural}", partial(_webhooks, kind=kind)
                ):
                    hooks.extend(hooks_of_one)
            inputs.webhooks = tuple(hooks)
            inputs.ready_endpoints = {
                hook.service: self._ready_endpoints(*hook.service)
                for hook in hooks
                if hook.service and hook.failure_policy == "Fail"
            }
        except KubeError as error:
            inputs.webhooks = None
            inputs.checks["webhooks"] = _skipped(error)
        return inputs

    def _with_previous_log(self, pod: CalicoNodePod, config: Config) -> CalicoNodePod:
        if not is_crash_looping(pod, config.restart_threshold):
            return pod
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/log"
        query = {"container": CALICO_NODE_CONTAINER, "previous": "true", "tailLines": config.log_tail_lines}
        try:
            # Once, not retried: without a reachable kubelet (a node whose network is broken) the
            # log is a 500 every time, and only this pod's cause is lost, never the whole check.
            text = self._request_text("GET", path, query, retry=False)
        except KubeError as error:
            # 400: no previous container yet; 404: gone meanwhile
            return replace(pod, log_error=None if error.status in (400, 404) else str(error))
        return replace(pod, previous_log=text)

    def _ready_endpoints(self, namespace: str, service: str) -> int | None:
        """Ready endpoints behind a Service, from its EndpointSlices; None when not allowed to look."""
        try:
            ready_per_slice = self.list_all(
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                _ready_in_slice,
                {"labelSelector": f"kubernetes.io/service-name={service}"},
            )
        except KubeError as error:
            if error.status == 403:
                return None
            raise
        return sum(ready_per_slice)


def _ready_in_slice(endpoint_slice: dict[str, Any]) -> int:
    endpoints = endpoint_slice.get("endpoints") or []
    return sum(1 for e in endpoints if (e.get("conditions") or {}).get("ready") is not False)


def _skipped(error: KubeError) -> str:
    """Health is read-only help: a check that cannot be read is skipped, never a failed run."""
    log.warning("health_check_skipped", status=error.status, error=str(error))
    return FORBIDDEN if error.status == 403 else f"skipped: HTTP {error.status}"


@dataclass
class LeaseLock:
    """One run at a time. The Lease is short and renewed by a thread for the whole run, reads
    included, so a run killed by SIGKILL locks later runs out for one Lease duration at most."""

    kube: Kube
    namespace: str
    name: str
    holder: str
    duration: timedelta
    _renewed: datetime | None = None
    _lost: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)
    _renewing: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def acquire(self) -> str | None:
        other = self.kube.acquire_lease(self.namespace, self.name, self.holder, self.duration)
        if other is None:
            self._renewed = self.kube.now()
            self._thread = threading.Thread(target=self._renew_in_background, name="lease-renewal", daemon=True)
            self._thread.start()
        return other

    def _renew_in_background(self) -> None:
        interval = max(self.duration.total_seconds() / 3, MIN_RENEW_INTERVAL_S)
        while not self._done.wait(interval):
            if not self._renew():
                return

    def _renew(self) -> bool:
        """Renew now; on any failure the lock counts as lost, so that nothing more is deleted."""
        with self._renewing:
            if self._lost.is_set():
                return False
            now = self.kube.now()
            try:
                renewed = self.kube.renew_lease(self.namespace, self.name, self.holder)
            except Exception as error:  # unreachable after retries: the lock cannot be confirmed
                log.warning("lease_renewal_failed", error=describe_error(error))
                renewed = False
            if not renewed:
                log.warning("lock_lost", lease=f"{self.namespace}/{self.name}")
                self._lost.set()
                return False
            self._renewed = now
            return True

    def still_held(self) -> bool:
        """False once the Lease was lost; renews first when a third of its duration has passed."""
        if self._lost.is_set():
            return False
        if self._renewed is not None and self.kube.now() - self._renewed < self.duration / 3:
            return True
        return self._renew()

    def release(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if not self._lost.is_set():
            self.kube.release_lease(self.namespace, self.name, self.holder)


def _kube_node(item: dict[str, Any]) -> KubeNode:
    status = item.get("status") or {}
    addresses = status.get("addresses") or []
    internal = tuple(
        a["address"] for a in addresses if isinstance(a, dict) and a.get("type") == "InternalIP" and a.get("address")
    )
    condition = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "NetworkUnavailable" and c.get("status") == "True"
        ),
        None,
    )
    taint = next(
        (t for t in (item.get("spec") or {}).get("taints") or [] if t.get("key") == NETWORK_UNAVAILABLE_TAINT), None
    )
    unavailable = None
    if condition or taint:
        unavailable = NetworkUnavailable(
            since=(condition or {}).get("lastTransitionTime") or (taint or {}).get("timeAdded"),
            reason=(condition or {}).get("reason"),
            message=(condition or {}).get("message"),
            condition=condition is not None,
            taint_added=(taint or {}).get("timeAdded") if taint else None,
        )
    return KubeNode(str((item.get("metadata") or {}).get("name", "")), internal, unavailable)


def _calico_node_pod(item: dict[str, Any]) -> CalicoNodePod:
    metadata, spec, status = item.get("metadata") or {}, item.get("spec") or {}, item.get("status") or {}
    containers = status.get("containerStatuses") or []
    container = next(
        (c for c in containers if c.get("name") == CALICO_NODE_CONTAINER), containers[0] if containers else {}
    )
    waiting = (container.get("state") or {}).get("waiting") or {}
    terminated = (container.get("lastState") or {}).get("terminated") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return CalicoNodePod(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        node=spec.get("nodeName"),
        phase=status.get("phase"),
        ready=ready,
        restarts=int(container.get("restartCount") or 0),
        waiting_reason=waiting.get("reason"),
        last_exit_code=terminated.get("exitCode"),
        last_reason=terminated.get("reason"),
        last_finished_at=terminated.get("finishedAt"),
        labels=metadata.get("labels") or {},
    )


def _webhooks(configuration: dict[str, Any], kind: str) -> list[Webhook]:
    found = []
    for hook in configuration.get("webhooks") or []:
        service = (hook.get("clientConfig") or {}).get("service")
        found.append(
            Webhook(
                configuration=str((configuration.get("metadata") or {}).get("name", "")),
                name=str(hook.get("name", "")),
                kind=kind,
                failure_policy=hook.get("failurePolicy") or "Fail",
                rules=hook.get("rules") or [],
                namespace_selector=hook.get("namespaceSelector"),
                object_selector=hook.get("objectSelector"),
                service=(service.get("namespace", "default"), service["name"])
                if service and service.get("name")
                else None,
            )
        )
    return found
