"""A Kubernetes API test server on loopback that follows the real API's protocol.

It serves any resource by URL shape (`/api/v1/...`, `/apis/<group>/<version>/...`, cluster
or namespaced), with the real JSON shapes: lists with `limit`/`continue` paging and 410 for an
expired token, `Status` bodies, resourceVersion on every write and 409 on a stale one, 404 and
AlreadyExists. Faults (any status, e.g. 429/5xx/403) and hooks are injected per method and path.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
MAX_CONFIGMAP_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's (or Secret's) data
KINDS = {"nodes": "Node", "configmaps": "ConfigMap", "leases": "Lease", "pods": "Pod"}
_ROUTE = re.compile(
    r"^(?P<collection>/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
    r"|/apis/[^/]+/[^/]+(?:/namespaces/(?P<ns2>[^/]+))?/(?P<plural2>[a-z]+))"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$"
)


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    times: int
    body: dict[str, Any] | None = None


@dataclass
class Hook:
    method: str
    path: re.Pattern[str]
    action: Callable[[], None]
    times: int


def status_body(code: int, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(code, "Unknown"),
        "code": code,
        **({"details": details} if details else {}),
    }


@dataclass
class KubeApiServer:
    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)
    expired_tokens: bool = False
    logs: dict[tuple[str, str], str] = field(default_factory=dict)  # previous container logs by (ns, pod)
    # API groups not installed here (no CRDs): answered 404 as the real server does.
    uninstalled_groups: set[str] = field(default_factory=set)
    # Crash tests: asked at every write to Calico's CRDs, it answers "kill_before" (call `kill`,
    # drop the connection unanswered), "kill_after" (write, then the same), "conflict" (another
    # writer bumps the object's resourceVersion first) or None.
    crd_writes: Callable[[], str | None] | None = None
    kill: Callable[[], None] = lambda: None
    # (verb, resource, name) that RBAC refuses this client; SelfSubjectAccessReviews answer so.
    denied: set[tuple[str, str, str]] = field(default_factory=set)
    _revision: int = 100
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _server: ThreadingHTTPServer | None = None

    # Lifecycle

    def start(self) -> KubeApiServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_port}"

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }
        path.write_text(json.dumps(config))
        return path

    # Seeding and inspection

    def put(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            metadata = obj.setdefault("metadata", {})
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            metadata["resourceVersion"] = self._next_revision()
            self.objects.setdefault(collection, {})[metadata["name"]] = obj
            return obj

    def get(self, collection: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self.objects.get(collection, {}).get(name)

    def add_node(self, name: str, internal_ip: str | None = None) -> None:
        addresses = [{"type": "InternalIP", "address": internal_ip}] if internal_ip else []
        self.put(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name},
                "status": {"addresses": [*addresses, {"type": "Hostname", "address": name}]},
            },
        )

    def add_calico_node_pod(
        self, node: str, *, ready: bool = True, restarts: int = 0, waiting: str | None = None, log: str | None = None
    ) -> str:
        """A calico-node DaemonSet pod on `node` (kube-system); `log` is its previous container's log."""
        name = f"calico-node-{node.split('.')[0]}"
        container: dict[str, Any] = {
            "name": "calico-node",
            "ready": ready,
            "restartCount": restarts,
            "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}},
        }
        if restarts:
            container["lastState"] = {
                "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-11-30T11:58:02Z"}
            }
        self.put(
            "/api/v1/namespaces/kube-system/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "kube-system", "labels": {"k8s-app": "calico-node"}},
                "spec": {"nodeName": node},
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": str(ready)}],
                    "containerStatuses": [container],
                },
            },
        )
        if log is not None:
            self.logs[("kube-system", name)] = log
        return name

    def delete_node(self, name: str) -> None:
        with self._lock:
            self.objects.get("/api/v1/nodes", {}).pop(name, None)

    def fail(self, method: str, path: str, status: int, times: int = 1, body: dict[str, Any] | None = None) -> None:
        """Answer the next `times` matching requests with `status` instead of serving them."""
        self.faults.append(Fault(method, re.compile(path), status, times, body))

    def on(self, method: str, path: str, action: Callable[[], None], times: int = 1) -> None:
        """Run `action` before serving the next `times` matching requests."""
        self.hooks.append(Hook(method, re.compile(path), action, times))

    def count(self, method: str, path: str) -> int:
        pattern = re.compile(path)
        return sum(1 for m, p in self.requests if m == method and pattern.search(p))

    # Serving

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    def handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, dict[str, Any] | str] | None:
        """The answer, or None to drop the connection unanswered (the client was killed)."""
        path = urlsplit(raw_path).path
        action = None
        if (
            self.crd_writes is not None
            and method in ("POST", "PUT", "DELETE", "PATCH")
            and "/crd.projectcalico.org/" in path
        ):
            action = self.crd_writes()
        if action == "kill_before":
            self.kill()
            return None
        if action == "conflict":
            route = _ROUTE.match(path)
            current = self.get(route.group("collection"), route.group("name")) if route else None
            if current is not None:
                self.put(route.group("collection"), current)  # type: ignore[union-attr]
        answer = self._handle(method, raw_path, body)
        if action == "kill_after":
            self.kill()
            return None
        return answer

    def _handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, dict[str, Any] | str]:
        parts = urlsplit(raw_path)
        with self._lock:
            self.requests.append((method, parts.path))
            hooks = [h for h in self.hooks if h.method == method and h.path.search(parts.path) and h.times > 0]
            for hook in hooks:
                hook.times -= 1
        for hook in hooks:
            hook.action()
        with self._lock:
            for fault in self.faults:
                if fault.method == method and fault.path.search(parts.path) and fault.times > 0:
                    fault.times -= 1
                    return fault.status, fault.body or status_body(fault.status, f"injected {fault.status}")
            if method == "POST" and parts.path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
                return self._access_review(body)
            route = _ROUTE.match(parts.path)
            group = parts.path.split("/")[2] if parts.path.startswith("/apis/") else ""
            if route is None or group in self.uninstalled_groups:
                return 404, status_body(404, f"the server could not find the requested resource {parts.path}")
            collection, name = route.group("collection"), route.group("name")
            plural = route.group("plural") or route.group("plural2")
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            if route.group("sub") == "log" and method == "GET":
                return self._log(route.group("ns") or "", name or "", query)
            try:
                payload = json.loads(body) if body else {}
            except ValueError:
                return 400, status_body(400, "request body is not JSON")
            return self._serve(method, collection, plural, name, query, payload)

    def _serve(
        self,
        method: str,
        collection: str,
        plural: str,
        name: str | None,
        query: dict[str, str],
        payload: dict[str, Any],
    ) -> tuple[int, dict[str, Any]]:
        items = self.objects.setdefault(collection, {})
        kind = KINDS.get(plural, plural[:-1].capitalize())
        details = {"name": name, "kind": plural}
        if method == "GET" and name is None:
            if not items and "/namespaces/" not in collection:
                # A namespaced resource listed across namespaces (GET /api/v1/pods): all of them.
                api = collection.rsplit("/", 1)[0]
                items = {
                    f"{c.split('/namespaces/')[1].split('/')[0]}/{n}": obj
                    for c, objects in self.objects.items()
                    if c.startswith(f"{api}/namespaces/") and c.endswith(f"/{plural}")
                    for n, obj in objects.items()
                }
            return self._list(items, kind, query)
        if method in ("POST", "PUT") and plural in ("configmaps", "secrets"):
            size = sum(len(str(v)) for v in (payload.get("data") or {}).values())
            size += sum(len(base64.b64decode(v)) for v in (payload.get("binaryData") or {}).values())
            if size > MAX_CONFIGMAP_BYTES:  # as the real server validates it
                named = name or (payload.get("metadata") or {}).get("name")
                message = f'{kind} "{named}" is invalid: []: Too long: must have at most {MAX_CONFIGMAP_BYTES} bytes'
                return 422, status_body(422, message, details)
        if method == "POST" and name is None:
            metadata = payload.setdefault("metadata", {})
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]  # as the real server
            new_name = metadata.get("name")
            if not new_name:
                return 400, status_body(400, "metadata.name or generateName is required")
            if new_name in items:
                return 409, {**status_body(409, f'{plural} "{new_name}" already exists'), "reason": "AlreadyExists"}
            if metadata.get("resourceVersion"):  # as the real storage layer refuses it
                return 500, status_body(500, "resourceVersion should not be set on objects to be created")
            metadata.pop("uid", None)  # the server assigns identity on create, whatever was sent
            return 201, self.put(collection, payload)
        if name is None:
            return 405, status_body(405, "method not allowed")
        current = items.get(name)
        if current is None:
            return 404, status_body(404, f'{plural} "{name}" not found', details)
        if method == "GET":
            return 200, current
        if method == "PUT":
            sent = (payload.get("metadata") or {}).get("resourceVersion")
            if sent != current["metadata"]["resourceVersion"]:
                return 409, status_body(
                    409,
                    f'Operation cannot be fulfilled on {plural} "{name}": the object '
                    "has been modified; please apply your changes to the latest version "
                    "and try again",
                    details,
                )
            payload["metadata"]["uid"] = current["metadata"]["uid"]
            return 200, self.put(collection, payload)
        if method == "DELETE":
            preconditions = payload.get("preconditions") or {}
            for field in ("uid", "resourceVersion"):
                if preconditions.get(field) and preconditions[field] != current["metadata"].get(field):
                    return 409, status_body(
                        409,
                        f"Precondition failed: {field} in precondition: "
                        f"{preconditions[field]}, {field} in object meta: "
                        f"{current['metadata'].get(field)}",
                        details,
                    )
            del items[name]
            return 200, current
        return 405, status_body(405, "method not allowed")

    def _access_review(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """As the real server: the review comes back with `status.allowed`; nothing is stored."""
        review = json.loads(body)
        attributes = review.get("spec", {}).get("resourceAttributes", {})
        wanted = (attributes.get("verb"), attributes.get("resource"), attributes.get("name"))
        review["status"] = {"allowed": wanted not in self.denied}
        return 201, review

    def _log(self, namespace: str, pod: str, query: dict[str, str]) -> tuple[int, dict[str, Any] | str]:
        text = self.logs.get((namespace, pod))
        if text is None or query.get("previous") != "true":
            return 400, status_body(400, f'previous terminated container "calico-node" in pod "{pod}" not found')
        lines = text.splitlines()[-int(query.get("tailLines") or 10**9) :]
        return 200, "\n".join(lines) + "\n"

    def _list(self, items: dict[str, dict[str, Any]], kind: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        wanted = dict(pair.split("=", 1) for pair in query.get("labelSelector", "").split(",") if "=" in pair)
        names = sorted(
            n for n in items if all((items[n]["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
        )
        start = 0
        token = query.get("continue")
        if token:
            try:
                last = json.loads(base64.urlsafe_b64decode(token))["last"]
            except (ValueError, KeyError, binascii.Error):
                return 400, status_body(400, "invalid continue token")
            if self.expired_tokens:
                return 410, status_body(
                    410,
                    "The provided continue parameter is too old to display a "
                    "consistent list result. You can start a new list without the "
                    "continue parameter.",
                )
            start = next((i for i, n in enumerate(names) if n > last), len(names))
        limit = int(query.get("limit") or 0) or len(names)
        page = names[start : start + limit]
        metadata: dict[str, Any] = {"resourceVersion": str(self._revision)}
        if start + limit < len(names):
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps({"last": page[-1]}).encode()).decode()
            metadata["remainingItemCount"] = len(names) - start - limit
        return 200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": metadata, "items": [items[n] for n in page]}


def _handler(api: KubeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _respond(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            answer = api.handle(self.command, self.path, self.rfile.read(length) if length else b"")
            if answer is None:
                self.close_connection = True
                return
            status, body = answer
            text = isinstance(body, str)
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 429:
                self.send_header("Retry-After", "1")
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _respond

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
