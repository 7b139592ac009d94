"""Every call this job makes to the Kubernetes API, through the official client.

Responses are read as plain JSON (`_preload_content=False`): faster than model objects for
thousands of nodes, and tolerant of fields newer than the client.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from job.config import Config
from job.model import KubeNode
from job.retry import RetryPolicy

log = structlog.get_logger("calico_gc.kube")
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_LIST_RESTARTS = 5
REQUEST_TIMEOUT_S = 30


class KubeError(Exception):
    """The Kubernetes API failed for good (after retries where they make sense)."""


class Conflict(Exception):
    """A write lost a resourceVersion race (HTTP 409)."""


def is_transient(error: BaseException) -> bool:
    if isinstance(error, ApiException):
        return error.status in RETRYABLE_STATUSES
    return isinstance(error, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def api_client(config: Config) -> k8s.ApiClient:
    """In a pod, the in-cluster configuration; elsewhere --kubeconfig or KUBECONFIG."""
    try:
        if config.kubeconfig is None:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
            return k8s.ApiClient()
        configuration = k8s.Configuration()
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(config.kubeconfig), client_configuration=configuration
        )
        return k8s.ApiClient(configuration)
    except (ConfigException, OSError) as error:
        raise KubeError(f"no usable Kubernetes configuration: {error}") from error


def _now() -> datetime:
    return datetime.now(UTC)


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

    def _request(
        self, method: str, path: str, query: dict[str, Any] | None = None, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One API call with retries; a non-2xx answer raises ApiException (with its status)."""

        def attempt() -> dict[str, Any]:
            headers = {"Accept": "application/json"}
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
            data: dict[str, Any] = json.loads(raw)
            return data

        return self._retry.call(attempt, is_transient)

    def list_nodes(self) -> tuple[KubeNode, ...]:
        """All Nodes, paged; a 410 (expired continue token) restarts the listing."""
        for _ in range(MAX_LIST_RESTARTS):
            nodes: list[KubeNode] = []
            token: str | None = None
            try:
                while True:
                    page = self._request("GET", "/api/v1/nodes", {"limit": self._page_size, "continue": token})
                    nodes.extend(_kube_node(item) for item in page.get("items") or [])
                    token = (page.get("metadata") or {}).get("continue") or None
                    if token is None:
                        return tuple(nodes)
            except ApiException as error:
                if error.status != 410:
                    raise KubeError(f"listing Nodes failed: HTTP {error.status} {error.reason}") from error
                log.warning("node_list_restarted", reason="continue token expired (410)")
        raise KubeError(f"listing Nodes kept expiring ({MAX_LIST_RESTARTS} restarts)")

    def node_exists(self, name: str) -> bool:
        """A fresh GET of one Node: False only on 404."""
        try:
            self._request("GET", f"/api/v1/nodes/{name}")
            return True
        except ApiException as error:
            if error.status == 404:
                return False
            raise KubeError(f"checking Node {name} failed: HTTP {error.status} {error.reason}") from error

    # ConfigMaps (grace state)

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        except ApiException as error:
            if error.status == 404:
                return None
            raise KubeError(f"reading ConfigMap {namespace}/{name} failed: HTTP {error.status}") from error

    def write_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        """Create (no resourceVersion) or replace guarded by its resourceVersion."""
        name = body["metadata"]["name"]
        collection = f"/api/v1/namespaces/{namespace}/configmaps"
        try:
            if body["metadata"].get("resourceVersion"):
                self._request("PUT", f"{collection}/{name}", body=body)
            else:
                self._request("POST", collection, body=body)
        except ApiException as error:
            if error.status == 409:
                raise Conflict(f"ConfigMap {namespace}/{name} changed meanwhile") from error
            raise KubeError(f"writing ConfigMap {namespace}/{name} failed: HTTP {error.status}") from error

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
            current = self._request("GET", f"{collection}/{name}")
        except ApiException as error:
            if error.status != 404:
                raise KubeError(f"reading Lease {namespace}/{name} failed: HTTP {error.status}") from error
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
            self._request(method, path, body=body)
            return None
        except ApiException as error:
            if error.status == 409:
                return other  # someone else wrote the Lease first
            raise KubeError(f"writing the Lease failed: HTTP {error.status} {error.reason}") from error

    def release_lease(self, namespace: str, name: str, holder: str) -> None:
        """Give the Lease up if it is still ours (a 409 or a new holder means it is not)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        try:
            current = self._request("GET", path)
            spec = current.get("spec") or {}
            if spec.get("holderIdentity") != holder:
                return
            spec.pop("holderIdentity", None)
            spec["leaseDurationSeconds"] = 1
            self._request("PUT", path, body=current)
        except ApiException as error:
            log.warning("lease_release_failed", status=error.status)


@dataclass(frozen=True)
class LeaseLock:
    kube: Kube
    namespace: str
    name: str
    holder: str
    duration: timedelta

    def acquire(self) -> str | None:
        return self.kube.acquire_lease(self.namespace, self.name, self.holder, self.duration)

    def release(self) -> None:
        self.kube.release_lease(self.namespace, self.name, self.holder)


def _kube_node(item: dict[str, Any]) -> KubeNode:
    addresses = (item.get("status") or {}).get("addresses") or []
    internal = tuple(
        a["address"] for a in addresses if isinstance(a, dict) and a.get("type") == "InternalIP" and a.get("address")
    )
    return KubeNode(str((item.get("metadata") or {}).get("name", "")), internal)
