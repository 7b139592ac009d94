"""A Kubernetes API test server on loopback that follows the real API's protocol.

It serves any resource by URL shape (`/api/v1/...`, `/apis/<group>/<version>/...`, cluster
or namespaced), with the real JSON shapes: lists with `limit`/`continue` paging and 410 for an
expired token, `Status` bodies, resourceVersion on every write and 409 on a stale one, 404 and
AlreadyExists. Every object written gets what the real server assigns: `uid`,
`creationTimestamp`, `resourceVersion`, `generation` (where its kind keeps one: raised when its
spec changes) and a
`managedFields` entry of its writer, listing each field it set. Lists validate their options as
the real server does (`resourceVersionMatch` needs `resourceVersion`, neither goes with
`continue`), label selectors are read and matched as the real server reads them (job.kube_syntax; a
malformed one is its 400) and pods take the real field selectors. Faults (any status, e.g.
429/5xx/403) and hooks are injected per method and path.

The answer's format is negotiated from `Accept` as the real server does: the core group's kinds
in protobuf (`application/vnd.kubernetes.protobuf`, errors too) when it is the first type asked
for, everything in JSON, and 406 when nothing asked for is served (protobuf of a custom
resource). Protobuf comes from k8s_protobuf, which refuses a field it has no number for. A list
of pods asked for as a Table (`application/json;as=Table;v=v1;g=meta.k8s.io`) is printed as the
real server prints it (k8s_table), honouring `includeObject`; a Table of any other resource is not
served here (nothing asks for one): that entry of `Accept` is passed over, as an unserved type is.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import copy
import json
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from job.kube_syntax import Requirement, parse_selector, whole_number
from tests.support import builtin, crds, http_server, k8s_protobuf, k8s_table, objects, typed

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
PROTOBUF = "application/vnd.kubernetes.protobuf"
JSON = "application/json"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
_POD_COLLECTION = re.compile(r"^/api/v1(?:/namespaces/[^/]+)?/pods$")
MAX_CONFIGMAP_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's (or Secret's) data
# The fields the real server lets pods be selected by (pkg/registry/core/pod: PodToSelectableFields).
POD_FIELDS = {
    "metadata.name": lambda p: p["metadata"].get("name", ""),
    "metadata.namespace": lambda p: p["metadata"].get("namespace", ""),
    "spec.nodeName": lambda p: (p.get("spec") or {}).get("nodeName", ""),
    "spec.hostNetwork": lambda p: str(bool((p.get("spec") or {}).get("hostNetwork"))).lower(),
    "spec.restartPolicy": lambda p: (p.get("spec") or {}).get("restartPolicy", ""),
    "spec.schedulerName": lambda p: (p.get("spec") or {}).get("schedulerName", ""),
    "spec.serviceAccountName": lambda p: (p.get("spec") or {}).get("serviceAccountName", ""),
    "status.phase": lambda p: (p.get("status") or {}).get("phase", ""),
    "status.podIP": lambda p: ((p.get("status") or {}).get("podIPs") or [{}])[0].get("ip", ""),
    "status.nominatedNodeName": lambda p: (p.get("status") or {}).get("nominatedNodeName", ""),
}
NO_VERSION = "must be specified for an update"  # the store's words for an update without a resourceVersion
# What strconv.ParseBool reads as true, and as false; anything else is its error.
GO_TRUE, GO_FALSE = ("1", "t", "T", "TRUE", "true", "True"), ("0", "f", "F", "FALSE", "false", "False")
FIELD_VALIDATIONS = ("", "Ignore", "Strict", "Warn")  # what a write's `fieldValidation` may say, sorted
# A delete's preconditions as `rest.BeforeDelete` checks them, in order: field, its name there, and why it differs.
DELETE_PRECONDITIONS = (
    ("uid", "UID", "deleted and then recreated"),
    ("resourceVersion", "ResourceVersion", "modified"),
)
# A pod's grace when its spec names none: the default its spec is given on create (SetDefaults_PodSpec).
POD_GRACE = 30
# Built-in kinds whose store answers a delete with the object deleted (`ReturnDeletedObject`); every
# other kind, custom resources included, answers a `Status` of Success naming it (the store's
# finalizeDelete; the list in kubernetes/kubernetes#78343, from Kubernetes' registries).
RETURNS_DELETED = frozenset({"pods", "namespaces", "serviceaccounts", "persistentvolumes", "persistentvolumeclaims"})
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")
# An object's deletion marks: only a delete sets them; a create clears them, an update keeps the
# stored ones (`rest.BeforeCreate`, `rest.BeforeUpdate`).
DELETION_FIELDS = ("deletionTimestamp", "deletionGracePeriodSeconds")
KINDS = {"nodes": "Node", "configmaps": "ConfigMap", "leases": "Lease", "pods": "Pod"}
# Built-in kinds with a status subresource (their status is written through `/status` only).
STATUS_OWNED = frozenset({"pods", "nodes", "namespaces", "services", "deployments", "daemonsets", "jobs", "cronjobs"})
# Built-in kinds whose strategy keeps a `generation` (1 on create, one on for each change of the
# spec); custom resources all do. Nodes, ConfigMaps, Leases, Events and Namespaces have none.
GENERATION_TRACKED = frozenset({"pods", "deployments", "daemonsets", "statefulsets", "replicasets", "jobs", "cronjobs"})


def _owns_status(crd: crds.Crd | None, plural: str) -> bool:
    """Whether the kind's status is written through `/status` alone (a CRD that declares it)."""
    return crd.status_subresource if crd is not None else plural in STATUS_OWNED


def _keeps_generation(crd: crds.Crd | None, plural: str) -> bool:
    """Whether the kind's strategy keeps a `generation` (every custom resource does)."""
    return crd is not None or plural in GENERATION_TRACKED


_ROUTE = re.compile(
    r"^(?P<collection>/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
    r"|/apis/[^/]+/[^/]+(?:/namespaces/(?P<ns2>[^/]+))?/(?P<plural2>[a-z]+))"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$"
)
_GROUP_VERSION = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/")
_DISCOVERY = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)$")
# The built-in API groups the job calls (a real server serves many more); each at its version here.
BUILTIN_GROUPS = {
    "apps": "v1",
    "authorization.k8s.io": "v1",
    "admissionregistration.k8s.io": "v1",
    "coordination.k8s.io": "v1",
    "discovery.k8s.io": "v1",
    "events.k8s.io": "v1",
}


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


def fields_v1(value: Any) -> dict[str, Any]:
    """The `fieldsV1` set of what a writer set, as the real server records it: `f:<name>` per map
    key (with `.` for the map itself), `k:{"name":...}` for list items keyed by name."""
    if isinstance(value, dict):
        return {".": {}, **{f"f:{k}": fields_v1(v) for k, v in value.items()}}
    if isinstance(value, list) and value and all(isinstance(i, dict) and "name" in i for i in value):
        return {".": {}, **{"k:" + json.dumps({"name": i["name"]}, separators=(",", ":")): fields_v1(i) for i in value}}
    return {}


def managed_entry(
    obj: dict[str, Any], manager: str, operation: str, when: str, subresource: str | None = None, reset: bool = False
) -> dict[str, Any]:
    """A writer's managedFields entry. A write of `/status` owns the status alone and says so
    (`subresource`); with `reset`, a write of the object owns all but the status, which its
    strategy resets (`GetResetFields`: a kind with a status subresource)."""
    if subresource is not None:
        owned = {f"f:{subresource}": fields_v1(obj.get(subresource))}
    else:
        skipped = ("apiVersion", "kind", "metadata", *(("status",) if reset else ()))
        owned = {f"f:{k}": fields_v1(v) for k, v in obj.items() if k not in skipped}
        metadata = {k: v for k, v in obj.get("metadata", {}).items() if k not in (*SERVER_FIELDS, "name", "namespace")}
        if metadata:
            owned["f:metadata"] = {f"f:{k}": fields_v1(v) for k, v in metadata.items()}
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": obj.get("apiVersion", "v1"),
        "time": when,
        "fieldsType": "FieldsV1",
        "fieldsV1": owned,
        **({"subresource": subresource} if subresource is not None else {}),
    }


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
    losses: list[Hook] = field(default_factory=list)  # `lose`: requests served, their answers dropped
    expired_tokens: bool = False
    logs: dict[tuple[str, str], str] = field(default_factory=dict)  # previous container logs by (ns, pod)
    # API groups not installed here (no CRDs): answered 404 as the real server does.
    uninstalled_groups: set[str] = field(default_factory=set)
    # The CRDs installed (Calico's own, where ../shared has them): a group they define serves only
    # their resources, and every write of one is admitted as the real server admits it (crds.py).
    crds: tuple[crds.Crd, ...] = field(default_factory=lambda: crds.calico(crds.V1_FILE))
    # Crash tests: asked at every write to Calico's CRDs, it answers "kill_before" (call `kill`,
    # drop the connection unanswered), "kill_after" (write, then the same), "conflict" (another
    # writer bumps the object's resourceVersion first) or None.
    crd_writes: Callable[[], str | None] | None = None
    kill: Callable[[], None] = lambda: None
    # (verb, resource, name) that RBAC refuses this client; SelfSubjectAccessReviews answer so.
    denied: set[tuple[str, str, str]] = field(default_factory=set)
    # Benchmarks: keep each object's JSON as it is written and build list pages from it, as the
    # real server serves lists from its watch cache. Objects must then not be changed in place.
    cache_lists: bool = False
    # The namespaces that exist: a create in any other is a 404, as NamespaceLifecycle answers it.
    # A new cluster has these four; `add_namespace` makes more, and a seed's namespace exists with it.
    namespaces: set[str] = field(default_factory=lambda: {"default", "kube-system", "kube-public", "kube-node-lease"})
    # Namespaces being deleted (`status.phase: Terminating`): a create in one is NamespaceLifecycle's 403.
    terminating: set[str] = field(default_factory=set)
    # The bearer token every request must carry (the kubeconfig's, `write_kubeconfig`): any other,
    # or none, is a 401, as a server with anonymous requests off (--anonymous-auth=false) answers.
    token: str = "test-token"
    # True: a request without that token is served too, as an anonymous user a server with
    # --anonymous-auth=true and RBAC for it admits. Only `make bench-kdd` asks for it, for its
    # `kubectl get --raw`: kubectl 1.37 sends no bearer token to an http:// server.
    anonymous: bool = False
    # False: JSON only, as an API server behind a proxy (or aggregator) that serves no protobuf.
    serves_protobuf: bool = True
    # False: no Tables either, as a proxy that passes only plain lists.
    serves_tables: bool = True
    # Bytes of every answer body, per format and resource ("json /api/v1/pods"): what the server
    # had to encode, the proxy for what a run costs it (bench-kdd).
    encoded_bytes: Counter[str] = field(default_factory=Counter)
    # Updates that carried no resourceVersion, which a real server applies over whatever is stored
    # (built-in kinds; a custom resource's is a 422): the `kubeapi` fixture fails a test where the
    # job made one, since every write of the job is conditional.
    unconditional_writes: list[tuple[str, str]] = field(default_factory=list)
    # Every warning answered (method, path, text), as `Warning: 299 - "<text>"` headers: a key a
    # write names that its kind does not know, dropped (`fieldValidation` Warn, the default), and
    # any request to a CRD version marked deprecated.
    warned: list[tuple[str, str, str]] = field(default_factory=list)
    _encoded: dict[tuple[str, str], bytes] = field(default_factory=dict)
    _encoded_protobuf: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)
    _rows: dict[tuple[str, str], tuple[tuple[str, str], bytes]] = field(default_factory=dict)
    _listings: dict[str, tuple[tuple[int, int], list[tuple[str, str, str]]]] = field(default_factory=dict)
    _revision: int = 100
    _manager: str = "calico-gc-tests"  # the field manager of the request being served
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _answering: threading.local = field(default_factory=threading.local)  # the warnings of this thread's answer
    _server: ThreadingHTTPServer | None = None

    # Lifecycle

    def start(self) -> KubeApiServer:
        self._server = http_server.serve(_handler(self))
        return self

    def stop(self) -> None:
        if self._server is not None:
            http_server.stop(self._server)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def authorization(self) -> dict[str, str]:
        """The header a client of this server sends (tests that call it without the job)."""
        return {"Authorization": f"Bearer {self.token}"}

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }
        path.write_text(json.dumps(config))
        return path

    # Seeding and inspection

    def put(
        self,
        collection: str,
        obj: dict[str, Any],
        manager: str = "calico-gc-tests",
        admitted: bool = False,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Store a created or replaced object with the metadata the real server assigns. A custom
        resource is admitted first, as through the API, and a built-in kind typed.py knows is
        decoded as the real server decodes it: a seed the real server would refuse fails."""
        crd = self.crd_of(collection)
        plural = collection.rsplit("/", 1)[-1]
        if crd is None and not admitted:
            if problem := typed.decode_problem(plural, obj):
                raise AssertionError(f"the real API server would refuse this seed: {problem}")
            typed.strict_errors(plural, obj, {})  # a key naming no field is dropped, as by the decoder
        if crd is not None and not admitted:
            try:
                stored = crds.admit(crd, obj, self._stored(collection, obj))
            except crds.Invalid as error:
                raise AssertionError(f"the real API server would refuse this seed: {error.message}") from None
            obj.clear()
            obj.update(stored)
        with self._lock:
            if (namespace := _namespace_of(collection)) is not None:
                self.namespaces.add(namespace)  # an object the cluster holds: its namespace is there
            # The decoder's default kind and version where the body names none: every single object
            # the real server answers says both (a typed list's items drop them, `_listed`).
            obj.setdefault("kind", _kind_of(plural, crd))
            obj.setdefault("apiVersion", _api_version_of(collection))
            metadata = obj.setdefault("metadata", {})
            current = self.objects.get(collection, {}).get(metadata.get("name"))
            now = _timestamp(datetime.now(UTC))
            old = (current or {}).get("metadata") or {}
            metadata.setdefault("uid", old.get("uid") or str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", old.get("creationTimestamp") or now)
            if _keeps_generation(crd, plural):
                generation = int(old.get("generation") or 0)
                if current is None or current.get("spec") != obj.get("spec"):
                    generation += 1
                metadata["generation"] = generation
            elif current is not None:  # `rest.BeforeUpdate`: the stored one, whatever was sent
                metadata.pop("generation", None)
                if "generation" in old:
                    metadata["generation"] = old["generation"]
            # else a create: what was sent, if anything (`rest.BeforeCreate` leaves it)
            writer = (manager, subresource)
            entries = [e for e in old.get("managedFields") or [] if (e.get("manager"), e.get("subresource")) != writer]
            entry = managed_entry(obj, manager, "Update", now, subresource, _owns_status(crd, plural))
            metadata["managedFields"] = [*entries, entry]
            metadata["resourceVersion"] = self._next_revision()
            self.objects.setdefault(collection, {})[metadata["name"]] = obj
            if self.cache_lists:  # as a list item (`_list`)
                self._encoded[(collection, metadata["name"])] = json.dumps(_listed(obj, crd is None)).encode()
            return obj

    def install(self, *installed: crds.Crd) -> None:
        """Serve these CRDs from now on, as an upgrade or a downgrade of them does: an object stored
        before reads pruned by its kind's new schema, as the real server's storage decoder prunes
        what it reads from etcd (`crdConversionRESTOptionsGetter`, customresource_handler.go).
        Pruned here once, in storage: a field a later CRD brings back does not come back with it."""
        with self._lock:
            self.crds = installed
            for collection, stored in self.objects.items():
                if (crd := self.crd_of(collection)) is None:
                    continue
                for name, obj in stored.items():
                    stored[name] = crds.pruned(crd, obj)
                    self._uncache(collection, name)

    def change_crd(self, plural: str, change: Callable[[crds.Crd], crds.Crd]) -> None:
        """Install the CRD of `plural` as `change` makes it, the others as they are (`install`)."""
        self.install(*(change(crd) if crd.plural == plural else crd for crd in self.crds))

    def take_encoded_bytes(self) -> Counter[str]:
        """What the server encoded since the last call (`encoded_bytes`), counting anew from here."""
        with self._lock:
            taken, self.encoded_bytes = self.encoded_bytes, Counter()
        return taken

    def get(self, collection: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self.objects.get(collection, {}).get(name)

    def copy_under(self, prefix: str) -> dict[str, dict[str, dict[str, Any]]]:
        """A deep copy of every collection under `prefix`, taken under the server's lock: a read a
        finished run left in flight (a daemon thread, run.py) may still be served while a test looks."""
        with self._lock:
            return {c: copy.deepcopy(objects) for c, objects in self.objects.items() if c.startswith(prefix)}

    def add_namespace(self, name: str) -> None:
        """A namespace created, as an operator or a chart creates the job's own before it runs."""
        with self._lock:
            self.namespaces.add(name)

    def add_node(self, name: str, internal_ip: str | None = None) -> None:
        """A Ready Node as a real cluster holds it (objects.node)."""
        self.put("/api/v1/nodes", objects.node(name, internal_ip))

    def add_pod(self, namespace: str, name: str, node: str | None, *ips: str) -> None:
        """A pod as the kubelet reports it (objects.pod): Running with `ips`, Pending without."""
        self.put(f"/api/v1/namespaces/{namespace}/pods", objects.pod(namespace, name, node, ips))

    def add_calico_node_pod(
        self, node: str, *, ready: bool = True, restarts: int = 0, waiting: str | None = None, log: str | None = None
    ) -> str:
        """A calico-node DaemonSet pod on `node` (kube-system); `log` is its previous container's log."""
        name = f"calico-node-{node.split('.')[0]}"
        self.put("/api/v1/namespaces/kube-system/pods", objects.calico_node_pod(name, node, ready, restarts, waiting))
        if log is not None:
            self.logs[("kube-system", name)] = log
        return name

    def delete_node(self, name: str) -> None:
        with self._lock:
            self._remove("/api/v1/nodes", name)

    def fail(self, method: str, path: str, status: int, times: int = 1, body: dict[str, Any] | None = None) -> None:
        """Answer the next `times` matching requests with `status` instead of serving them."""
        self.faults.append(Fault(method, re.compile(path), status, times, body))

    def lose(self, method: str, path: str, times: int = 1) -> None:
        """Serve the next `times` matching requests, then drop each one's connection unanswered: a
        write carried out whose answer the client never gets (a timeout, a reset)."""
        self.losses.append(Hook(method, re.compile(path), lambda: None, times))

    def on(self, method: str, path: str, action: Callable[[], None], times: int = 1) -> None:
        """Run `action` before serving the next `times` matching requests."""
        self.hooks.append(Hook(method, re.compile(path), action, times))

    def count(self, method: str, path: str) -> int:
        pattern = re.compile(path)
        return sum(1 for m, p in self.requests if m == method and pattern.search(p))

    def crd_of(self, collection: str) -> crds.Crd | None:
        """The CRD serving a collection (`/apis/<group>/<version>[/namespaces/<ns>]/<plural>`)."""
        found = _GROUP_VERSION.match(collection + "/")
        if found is None:
            return None
        plural = collection.rsplit("/", 1)[-1]
        return next(
            (c for c in self.crds if (c.group, c.version, c.plural) == (found["group"], found["version"], plural)),
            None,
        )

    def _defined_by_crds(self, path: str) -> bool:
        """Whether a group/version is one the installed CRDs serve: then it has nothing else."""
        found = _GROUP_VERSION.match(path + "/")
        return found is not None and any((c.group, c.version) == (found["group"], found["version"]) for c in self.crds)

    # Serving

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    def handle(
        self, method: str, raw_path: str, body: bytes, agent: str = "", media: str = JSON, authorized: bool = True
    ) -> tuple[int, dict[str, Any] | str | bytes] | None:
        """The answer in `media` (negotiated), or None to drop the connection unanswered (the
        client was killed). A protobuf answer is `Protobuf` bytes. A request without this
        server's token (`authorized`) is a 401 before anything else, in the negotiated format."""
        if not authorized:
            unauthorized = status_body(401, "Unauthorized")
            return 401, Protobuf(k8s_protobuf.answer(unauthorized)) if media == PROTOBUF else unauthorized
        path = urlsplit(raw_path).path
        self._answering.warnings = []
        action = None
        if (
            self.crd_writes is not None
            and method in ("POST", "PUT", "DELETE", "PATCH")
            and "projectcalico.org/" in path
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
        self._manager = _manager(agent)
        try:
            answer = self._handle(method, raw_path, body, media)
            if media == PROTOBUF and isinstance(answer[1], dict):
                answer = answer[0], Protobuf(k8s_protobuf.answer(answer[1]))
        except k8s_protobuf.Unencodable as error:  # a gap of this server's, never the client's fault
            answer = 500, Protobuf(k8s_protobuf.answer(status_body(500, f"API test server: {error}")))
        if action == "kill_after":
            self.kill()
            return None
        with self._lock:
            loss = next((h for h in self.losses if h.method == method and h.path.search(path) and h.times > 0), None)
            if loss is not None:
                loss.times -= 1
                return None
        return answer

    def _handle(
        self, method: str, raw_path: str, body: bytes, media: str = JSON
    ) -> tuple[int, dict[str, Any] | str | bytes]:
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
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            if method == "POST" and parts.path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
                return _options_problem(method, query) or self._access_review(body, query)
            if method == "GET" and (parts.path == "/apis" or _DISCOVERY.match(parts.path)):
                return self._discovery(parts.path)
            if method == "GET" and parts.path == "/metrics":
                return 200, _metrics()
            route = _ROUTE.match(parts.path)
            if route is None or _group_of(parts.path) in self.uninstalled_groups:
                return 404, status_body(404, f"the server could not find the requested resource {parts.path}")
            collection, name = route.group("collection"), route.group("name")
            plural = route.group("plural") or route.group("plural2")
            crd, sub = self.crd_of(collection), route.group("sub")
            defined = self._defined_by_crds(parts.path)
            if (
                (defined and crd is None)
                or (crd is not None and sub is not None and not (sub == "status" and crd.status_subresource))
                or (crd is None and sub not in (None, "log") and not (sub == "status" and plural in STATUS_OWNED))
            ):
                return 404, status_body(404, f"the server could not find the requested resource {parts.path}")
            if crd is not None and crd.deprecation:  # every request to a deprecated version is warned
                self.warn(method, parts.path, [crd.deprecation])
            if problem := _options_problem(method, query):
                return problem
            if sub == "log" and method == "GET":
                return self._log(route.group("ns") or "", name or "", query)
            try:
                payload, repeats = typed.parse(body) if body else ({}, {})
            except ValueError:
                return 400, status_body(400, "request body is not JSON")
            if not isinstance(payload, dict):
                return 400, status_body(400, "the body of the request is not a JSON object")
            if method == "DELETE":
                problem, payload = _delete_options(payload if body else None, query)
                if problem:
                    return problem
            if method in ("POST", "PUT") and (
                problem := self._decoded(method, parts.path, plural, payload, crd, query, repeats)
                or _version_problem(crd, payload)
            ):
                return 400, status_body(400, problem)  # the decoder's (typed.py) or the handler's: before admission
            try:
                return self._serve(method, collection, plural, name, query, payload, crd, sub == "status", media)
            except crds.Invalid as error:
                return 422, status_body(422, error.message, error.details())

    def _serve(
        self,
        method: str,
        collection: str,
        plural: str,
        name: str | None,
        query: dict[str, str],
        payload: dict[str, Any],
        crd: crds.Crd | None = None,
        status: bool = False,
        media: str = JSON,
    ) -> tuple[int, Any]:
        """One request. With a status subresource (a CRD that declares it; core kinds always), a
        write of the object keeps its status and a write of `/status` changes only the status."""
        items = self.objects.get(collection, {})  # a read stores nothing; a create stores through put()
        kind = _kind_of(plural, crd)
        # The store's errors name the resource with its group (`qualifiedResource`) and say both apart.
        group = _group_of(collection)
        resource = crds.qualified(plural, group)
        details = {"name": name, **({"group": group} if group else {}), "kind": plural}
        if method == "GET" and name is None:
            listing = self._listing(collection, plural)
            return self._list(listing, kind, query, plural, media, _api_version_of(collection), crd is None)
        namespace = _namespace_of(collection)
        if method in ("POST", "PUT") and isinstance(payload.get("metadata"), dict):
            # The request's namespace is the object's (the create and update handlers, before admission).
            sent = payload["metadata"].get("namespace")
            if namespace is None:
                payload["metadata"].pop("namespace", None)  # cluster-scoped: cleared
            elif sent and sent != namespace:
                message = "the namespace of the provided object does not match the namespace sent on the request"
                return 400, status_body(400, message)
            else:
                payload["metadata"]["namespace"] = namespace
        if method == "POST" and namespace is not None and namespace not in self.namespaces:
            # NamespaceLifecycle, an admission plugin: it answers before the object is validated.
            missing = {"name": namespace, "kind": "namespaces"}
            return 404, status_body(404, f'namespaces "{namespace}" not found', missing)
        if method == "POST" and namespace in self.terminating and name is None:
            return 403, self._terminating(namespace, collection, plural, payload)
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
            if crd is None and (causes := list(self._builtin_causes(collection, payload, namespace))):
                raise crds.Invalid(kind, group, new_name, causes)
            if new_name in items:
                exists = status_body(409, f'{resource} "{new_name}" already exists', {**details, "name": new_name})
                return 409, {**exists, "reason": "AlreadyExists"}
            if metadata.get("resourceVersion"):  # as the real storage layer refuses it
                return 500, status_body(500, "resourceVersion should not be set on objects to be created")
            kept = () if _keeps_generation(crd, plural) else ("generation",)
            for server_field in (*SERVER_FIELDS, *DELETION_FIELDS):  # the server's, whatever was sent
                if server_field not in kept:
                    metadata.pop(server_field, None)
            if crd is not None and crd.status_subresource:
                payload.pop("status", None)  # a custom resource's create sets no status where /status owns it
            elif plural == "pods":
                builtin.prepare_pod_for_create(payload)  # Pending, with its QoS class
            elif plural in STATUS_OWNED and plural != "nodes":  # a Node is registered with its status
                payload.pop("status", None)
            return 201, self._write(collection, payload, crd)
        if name is None:
            return 405, status_body(405, "method not allowed")
        current = items.get(name)
        if current is None:
            return 404, status_body(404, f'{resource} "{name}" not found', details)
        if method == "GET":
            return 200, current
        if method == "PUT":
            if crd is None and (causes := list(self._builtin_causes(collection, payload, namespace, update=True))):
                raise crds.Invalid(kind, group, name, causes)
            sent = (payload.get("metadata") or {}).get("resourceVersion")
            if not sent and crd is not None:  # a custom resource's strategy allows no unconditional update
                cause = crds.Cause("FieldValueInvalid", "metadata.resourceVersion", f"Invalid value: 0x0: {NO_VERSION}")
                raise crds.Invalid(plural, crd.group, name, [cause])
            if not sent:  # a built-in kind's: the store writes over whatever is there (AllowUnconditionalUpdate)
                self.unconditional_writes.append((collection, name))
            elif sent != current["metadata"]["resourceVersion"]:
                return 409, status_body(
                    409,
                    f'Operation cannot be fulfilled on {resource} "{name}": the object '
                    "has been modified; please apply your changes to the latest version "
                    "and try again",
                    details,
                )
            if not status and (cause := _new_finalizers(current["metadata"], payload["metadata"])):
                raise crds.Invalid(kind, group, name, [cause])
            if status:  # only the status moves; everything else stays as stored
                if crd is not None:
                    crds.check_kind(crd, payload, name)
                payload = {**copy.deepcopy(current), "status": payload.get("status")}
                if payload["status"] is None:
                    del payload["status"]
            elif _owns_status(crd, plural):
                payload.pop("status", None)
                if "status" in current:
                    payload["status"] = copy.deepcopy(current["status"])
            payload["metadata"]["uid"] = current["metadata"]["uid"]
            for server_field in ("creationTimestamp", "generation", "managedFields", *DELETION_FIELDS):
                payload["metadata"].pop(server_field, None)
            payload["metadata"].update({f: current["metadata"][f] for f in DELETION_FIELDS if f in current["metadata"]})
            written = self._write(collection, payload, crd, "status" if status else None)
            if _emptied(written["metadata"]):
                self._remove(collection, name)
            return 200, written
        if method == "DELETE":
            # Checked first by `rest.BeforeDelete`, which names the kind where the store names the resource.
            preconditions = payload.get("preconditions") or {}
            for field, said, why in DELETE_PRECONDITIONS:
                if preconditions.get(field) and preconditions[field] != (stored := current["metadata"].get(field)):
                    message = (
                        f'Operation cannot be fulfilled on {crds.qualified(kind, group)} "{name}": the {said} '
                        f"in the precondition ({preconditions[field]}) does not match the {said} in record ({stored}). "
                        f"The object might have been {why}"
                    )
                    return 409, status_body(409, message, {**details, "kind": kind})
            if plural == "pods" and (kept := self._graceful(collection, current, payload)) is not None:
                return 200, kept
            if current["metadata"].get("finalizers"):
                return 200, self._finalizing(collection, current)
            self._remove(collection, name)
            if plural in RETURNS_DELETED:
                return 200, current
            deleted = {**details, "uid": current["metadata"].get("uid")}  # the store's finalizeDelete
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": deleted}
        return 405, status_body(405, "method not allowed")

    def _graceful(self, collection: str, pod: dict[str, Any], options: dict[str, Any]) -> dict[str, Any] | None:
        """A pod's graceful deletion (`rest.BeforeDelete` with the pod strategy's
        `CheckGracefulDelete`): the pod kept, marked with `deletionTimestamp` and
        `deletionGracePeriodSeconds` (its generation one on), until a delete of grace 0 (its
        kubelet's, once the containers are gone) removes it; a later delete may only shorten the
        grace. None where it goes now: not scheduled, finished (`Succeeded`, `Failed`), a grace of
        0, or marked with none. Nothing here ends a grace by the clock: a test removes the pod."""
        sent = options.get("gracePeriodSeconds")
        asked = None if sent is None else (sent if sent >= 0 else 1)  # a negative grace is 1 s
        marked = copy.deepcopy(pod)
        metadata = marked["metadata"]
        pending = metadata.get("deletionGracePeriodSeconds")
        if metadata.get("deletionTimestamp"):
            if not pending:
                return None
            if asked is None or asked >= pending:
                return pod  # pending: answered as it is, nothing written
            if asked == 0:
                return None
            ends = datetime.fromisoformat(metadata["deletionTimestamp"]) - timedelta(seconds=pending - asked)
            period = asked
        else:
            spec, phase = pod.get("spec") or {}, (pod.get("status") or {}).get("phase")
            period = spec.get("terminationGracePeriodSeconds", POD_GRACE) if asked is None else asked
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed") or period == 0:
                return None
            ends = datetime.now(UTC) + timedelta(seconds=period)
            if metadata.get("generation"):
                metadata["generation"] += 1
        metadata["deletionTimestamp"] = _timestamp(ends)
        metadata["deletionGracePeriodSeconds"] = period
        return self._mark(collection, marked)

    def _finalizing(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        """An object with finalizers is not deleted but marked (the store's `markAsDeleting`): its
        `deletionTimestamp` now (or kept, if earlier), a grace of 0, its generation one on the first
        time; the delete answers it, 200. Once an update leaves it no finalizer, it goes (`_serve`).
        A delete that changes nothing writes nothing."""
        marked = copy.deepcopy(obj)
        metadata = marked["metadata"]
        if not metadata.get("deletionTimestamp"):
            metadata["deletionTimestamp"] = _timestamp(datetime.now(UTC))
            if metadata.get("generation"):
                metadata["generation"] += 1
        metadata["deletionGracePeriodSeconds"] = 0
        return obj if marked == obj else self._mark(collection, marked)

    def _mark(self, collection: str, marked: dict[str, Any]) -> dict[str, Any]:
        """Store an object a delete has marked, as the write it is (a new resourceVersion)."""
        marked["metadata"]["resourceVersion"] = self._next_revision()
        self.objects[collection][marked["metadata"]["name"]] = marked
        self._uncache(collection, marked["metadata"]["name"])
        return marked

    def _remove(self, collection: str, name: str) -> None:
        """Take an object out of the store: a write, so the collection's resourceVersion moves on."""
        self.objects.get(collection, {}).pop(name, None)
        self._uncache(collection, name)
        self._next_revision()

    def _uncache(self, collection: str, name: str) -> None:
        """Forget an object's encodings (a list item's JSON, protobuf and Table row) once it changes."""
        self._encoded.pop((collection, name), None)
        self._encoded_protobuf.pop((collection, name), None)
        self._rows.pop((collection, name), None)

    @staticmethod
    def _builtin_causes(
        collection: str, obj: dict[str, Any], namespace: str | None, update: bool = False
    ) -> Iterator[crds.Cause]:
        """Why the real server refuses a built-in kind's object: a core Event by its own rules and
        its name as a path segment (builtin.py); any other kind's name on create, as a DNS
        subdomain; a Lease's spec (builtin.py)."""
        metadata = obj.get("metadata") or {}
        if collection == f"/api/v1/namespaces/{namespace}/events":
            yield from builtin.event_causes(obj, namespace or "")
            if not update:
                yield from builtin.path_segment_causes(metadata)
        elif not update:
            yield from crds.name_causes(metadata)
        if collection == f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases":
            yield from builtin.lease_causes(obj)

    @staticmethod
    def _terminating(namespace: str, collection: str, plural: str, payload: dict[str, Any]) -> dict[str, Any]:
        """NamespaceLifecycle's refusal of a create in a namespace being deleted: admission's
        Forbidden for the object (its name, else its generateName: none is generated yet) with a
        NamespaceTerminating cause (`.../admission/plugin/namespace/lifecycle/admission.go`)."""
        metadata = payload.get("metadata") or {}
        name = str(metadata.get("name") or metadata.get("generateName") or "Unknown")
        group = _group_of(collection)
        resource = crds.qualified(plural, group)
        message = f"unable to create new content in namespace {namespace} because it is being terminated"
        cause = {"type": "NamespaceTerminating", "message": f"namespace {namespace} is being terminated"}
        details = {"name": name, "group": group, "kind": plural, "causes": [{**cause, "field": "metadata.namespace"}]}
        return status_body(403, f'{resource} "{name}" is forbidden: {message}', details)

    def _write(
        self, collection: str, obj: dict[str, Any], crd: crds.Crd | None, subresource: str | None = None
    ) -> dict[str, Any]:
        """A write through the API: a custom resource admitted (crds.Invalid: a 422), then stored."""
        admitted = crds.admit(crd, obj, self._stored(collection, obj)) if crd else obj
        return self.put(collection, admitted, self._manager, admitted=True, subresource=subresource)

    def _stored(self, collection: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The object a write of `obj` replaces, if any: the `oldSelf` of its CEL transition rules."""
        return self.objects.get(collection, {}).get(str((obj.get("metadata") or {}).get("name") or ""))

    def _discovery(self, path: str) -> tuple[int, dict[str, Any]]:
        """`/apis` (the groups served) and `/apis/<group>/<version>` (a CRD group's resources), as
        the aggregated discovery's legacy form answers them."""
        served: dict[str, list[str]] = {g: [v] for g, v in BUILTIN_GROUPS.items()}
        if not self.crds:  # without Calico's CRDs at hand, any resource is served: as an install of v1
            served["crd.projectcalico.org"] = ["v1"]
        for crd in self.crds:
            served.setdefault(crd.group, [])
            if crd.version not in served[crd.group]:
                served[crd.group].append(crd.version)
        served = {g: v for g, v in served.items() if g not in self.uninstalled_groups}
        if path == "/apis":
            groups = [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
                }
                for group, versions in sorted(served.items())
            ]
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        found = _DISCOVERY.match(path)
        assert found is not None
        group, version = found["group"], found["version"]
        if version not in served.get(group, ()):
            return 404, status_body(404, f"the server could not find the requested resource {path}")
        verbs = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
        resources: list[dict[str, Any]] = []
        for crd in (c for c in self.crds if (c.group, c.version) == (group, version)):
            entry = {"name": crd.plural, "singularName": crd.kind.lower(), "namespaced": crd.namespaced}
            resources.append({**entry, "kind": crd.kind, "verbs": verbs, "storageVersionHash": ""})
            if crd.status_subresource:
                status = {"name": f"{crd.plural}/status", "singularName": "", "namespaced": crd.namespaced}
                resources.append({**status, "kind": crd.kind, "verbs": ["get", "patch", "update"]})
        return 200, {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}",
            "resources": resources,
        }

    def _decoded(
        self,
        method: str,
        path: str,
        plural: str,
        payload: dict[str, Any],
        crd: crds.Crd | None,
        query: dict[str, str],
        repeats: typed.Repeats,
    ) -> str | None:
        """The decoder's 400, or None. A built-in kind is decoded into its type (typed.py); then a
        key naming no field of the kind is dropped (a custom resource's by pruning, at admission),
        and `fieldValidation` decides what is said of those and of repeated keys: `Strict` refuses
        the write, `Ignore` says nothing, and `Warn` (the default) answers a warning for each (any
        other value is refused before, by `_options_problem`). A built-in kind's are said in the
        order they come; a custom resource's repeats first, then its metadata's unknown keys, then
        what pruning dropped, sorted (the unstructured decoder, ObjectMeta's coercion, pruning)."""
        if crd is None:
            if problem := typed.decode_problem(plural, payload):
                return problem
            if plural == "pods" and (problem := builtin.pod_quantity_problem(payload)):
                return typed.cannot_be_handled(payload, "Pod", problem)
            said, go_kind = typed.strict_errors(plural, payload, repeats), typed.go_kind(plural)
        else:
            said = [f'duplicate field "{p}"' for p in typed.repeated(payload, repeats)]
            said += typed.unknown_metadata(payload)
            said += [f'unknown field "{p}"' for p in crds.unknown_fields(crd, payload)]
            go_kind = crd.kind
        if said and query.get("fieldValidation") == "Strict":
            return typed.strict_problem(payload, go_kind, said)
        if query.get("fieldValidation") != "Ignore":
            self.warn(method, path, said)
        return None

    def warn(self, method: str, path: str, texts: list[str]) -> None:
        """Warnings for the answer this thread is making, each a `Warning: 299` header. Tests call
        it from a hook (`on`) for what an admission webhook or policy adds to an answer."""
        self._answering.warnings += texts
        self.warned += [(method, path, text) for text in texts]

    def take_warnings(self) -> list[str]:
        """The warnings of the answer this thread is making (`handle`), once."""
        taken, self._answering.warnings = getattr(self._answering, "warnings", []), []
        return list(taken)

    def _access_review(self, body: bytes, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """As the real server: the review comes back with `status.allowed`; nothing is stored."""
        review, repeats = typed.parse(body)
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        if problem := self._decoded("POST", path, "selfsubjectaccessreviews", review, None, query, repeats):
            return 400, status_body(400, problem)
        attributes = review.get("spec", {}).get("resourceAttributes", {})
        wanted = (attributes.get("verb"), attributes.get("resource"), attributes.get("name"))
        review["status"] = {"allowed": wanted not in self.denied}
        return 201, review

    def _log(self, namespace: str, pod: str, query: dict[str, str]) -> tuple[int, dict[str, Any] | str]:
        """A previous container's log. PodLogOptions are decoded (a 400 in strconv's words) and
        validated (a negative tailLines is a 422, pkg/registry/core/pod/rest/log.go) before the
        kubelet is asked (a 400 when there is no previous container); tailLines=0 is no line."""
        tail = None
        if "tailLines" in query:
            tail, refused = _int64(query["tailLines"])
            if refused is not None:
                return refused
            if tail < 0:
                message = f"tailLines: Invalid value: {tail}: must be greater than or equal to 0"
                return 422, status_body(422, f'PodLogOptions "{pod}" is invalid: {message}')
        text = self.logs.get((namespace, pod))
        if text is None or query.get("previous") != "true":
            return 400, status_body(400, f'previous terminated container "calico-node" in pod "{pod}" not found')
        lines = text.splitlines()
        lines = lines if tail is None else lines[max(0, len(lines) - tail) :]
        return 200, "".join(line + "\n" for line in lines)

    def _listing(self, collection: str, plural: str) -> list[tuple[str, str, str]]:
        """The collection's objects as (list key, collection, name), sorted by key; a namespaced
        resource listed across namespaces (GET /api/v1/pods) has all of them, keyed ns/name.
        Made once per revision: a list of 100,000 pods is 200 pages."""
        if "/namespaces/" in collection or self.objects.get(collection):
            sources = {collection: ""}
        else:
            api = collection.rsplit("/", 1)[0]
            sources = {
                c: c.split("/namespaces/")[1].split("/")[0] + "/"
                for c in self.objects
                if c.startswith(f"{api}/namespaces/") and c.endswith(f"/{plural}")
            }
        # Tests also add or drop objects in `objects` directly: the count is part of the key.
        version = (self._revision, sum(len(self.objects.get(c, {})) for c in sources))
        cached = self._listings.get(collection)
        if cached is not None and cached[0] == version:
            return cached[1]
        found = sorted((space + n, c, n) for c, space in sources.items() for n in self.objects.get(c, {}))
        self._listings[collection] = (version, found)
        return found

    def _list(
        self,
        listing: list[tuple[str, str, str]],
        kind: str,
        query: dict[str, str],
        plural: str,
        media: str = JSON,
        api_version: str = "v1",
        builtin: bool = True,
    ) -> tuple[int, Any]:
        """A page of `listing`. A built-in kind's list (`builtin`) is encoded from Go's typed list:
        its items carry no `apiVersion` or `kind`, only the list does; a custom resource's items,
        unstructured, keep theirs."""
        token = query.get("continue")
        version, match = query.get("resourceVersion"), query.get("resourceVersionMatch")
        if match and not version:  # as the real server validates list options
            return 400, status_body(400, "resourceVersionMatch is forbidden unless resourceVersion is provided")
        if token and (match or version not in (None, "", "0")):
            return 400, status_body(400, "specifying resource version is not allowed when using continue")
        try:
            wanted = parse_selector(query.get("labelSelector", ""))
            fields = _field_selector(query.get("fieldSelector", ""), plural)
        except ValueError as error:  # SelectorError too: the server's 400, in its words
            return 400, status_body(400, str(error))

        def selected(obj: dict[str, Any]) -> bool:
            labels = obj["metadata"].get("labels") or {}
            return all(_meets(r, labels) for r in wanted) and all(
                (POD_FIELDS[f](obj) == v) == equal for f, equal, v in fields
            )

        start = 0
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
            start = bisect.bisect_right(listing, (last, "\uffff", "\uffff"))
        limit, refused = _int64(query.get("limit") or "0")  # ListOptions' int64; 0 or less: no limit
        if refused is not None:
            return refused
        limit = limit if limit > 0 else len(listing)
        page: list[tuple[str, str, str]] = []
        position, more = start, False
        while position < len(listing):
            entry = listing[position]
            position += 1
            obj = self.objects.get(entry[1], {}).get(entry[2])
            if obj is not None and selected(obj):
                if len(page) == limit:
                    more = True
                    break
                page.append(entry)
        metadata: dict[str, Any] = {"resourceVersion": str(self._revision)}
        if more:
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps({"last": page[-1][0]}).encode()).decode()
            if not wanted and not fields:  # as the real server: unknown under a selector
                metadata["remainingItemCount"] = len(listing) - position + 1
        head = {"kind": f"{kind}List", "apiVersion": api_version, "metadata": metadata}
        if media == TABLE:
            include = query.get("includeObject") or "Metadata"
            if include not in k8s_table.INCLUDE_OBJECT:
                return 400, status_body(400, f"unrecognized includeObject value: {json.dumps(include)}")
            head = json.dumps(k8s_table.table(metadata, [])).encode()
            assert head.endswith(b"[]}")
            rows = b", ".join(self._table_row(c, n, include) for _, c, n in page)
            return 200, TableAnswer(head[:-3] + b"[" + rows + b"]}")
        if media == PROTOBUF:  # an object k8s_protobuf cannot encode raises Unencodable (handle: a 500)
            items = [self._protobuf(c, n, kind) for _, c, n in page]
            return 200, Protobuf(k8s_protobuf.listing(head["kind"], metadata, items))
        if not self.cache_lists:
            return 200, {**head, "items": [_listed(self.objects[c][n], builtin) for _, c, n in page]}
        encoded = [
            self._encoded.get((c, n)) or json.dumps(_listed(self.objects[c][n], builtin)).encode() for _, c, n in page
        ]
        return 200, json.dumps(head).encode()[:-1] + b', "items": [' + b", ".join(encoded) + b"]}"

    def _table_row(self, collection: str, name: str, include: str) -> bytes:
        """One stored pod's Table row; with `cache_lists`, printed once per resourceVersion (its
        Age then as of that print: nothing reads it), as printing is Go's work on a real server
        but a tenth of a bench's job time here."""
        obj = self.objects[collection][name]
        if not self.cache_lists:
            return json.dumps(k8s_table.row(obj, include)).encode()
        key = (obj["metadata"].get("resourceVersion", ""), include)
        cached = self._rows.get((collection, name))
        if cached is None or cached[0] != key:
            cached = key, json.dumps(k8s_table.row(obj, include)).encode()
            self._rows[(collection, name)] = cached
        return cached[1]

    def _protobuf(self, collection: str, name: str, kind: str) -> bytes:
        """One stored object in protobuf; with `cache_lists`, encoded once per resourceVersion."""
        obj = self.objects[collection][name]
        if not self.cache_lists:
            return k8s_protobuf.message(kind, obj)
        version = obj["metadata"].get("resourceVersion", "")
        cached = self._encoded_protobuf.get((collection, name))
        if cached is None or cached[0] != version:
            cached = version, k8s_protobuf.message(kind, obj)
            self._encoded_protobuf[(collection, name)] = cached
        return cached[1]


class Protobuf(bytes):
    """An answer body already encoded as Kubernetes protobuf."""


class TableAnswer(bytes):
    """An answer body already encoded as a JSON Table."""


def negotiate(accept: str, path: str, protobuf: bool = True, tables: bool = True) -> str | None:
    """The media type to answer in: the first type `accept` lists that the resource is served in
    (protobuf: the built-in kinds, here the core group; JSON: everything; a Table: lists of pods
    here); None: 406. `/metrics` is no API resource: its handler answers its text whatever is asked."""
    if path == "/metrics":
        return JSON  # the answer is text (_metrics): what is negotiated here does not shape it
    served = {JSON: JSON, "application/*": JSON, "*/*": JSON}
    if protobuf and path.startswith("/api/"):
        served[PROTOBUF] = PROTOBUF
    for entry in (accept or "*/*").split(","):
        base, *params = (part.strip() for part in entry.split(";"))
        options = dict(p.split("=", 1) for p in params if "=" in p)
        if options.get("as") == "Table":
            table = served.get(base) == JSON and options.get("g") == "meta.k8s.io" and options.get("v") == "v1"
            if table and tables and _POD_COLLECTION.match(path):
                return TABLE
            continue
        media = served.get(base)
        if media:
            return media
    return None


def _meets(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """A label selector's requirement as the real server matches it (apimachinery's
    Requirement.Matches): `notin` and `!=` hold where the label is absent, `gt` and `lt` only
    where it is there and a whole number."""
    value = labels.get(requirement.key)
    operator = requirement.operator
    if operator in ("exists", "!"):
        return (value is not None) == (operator == "exists")
    if operator in ("notin", "!="):
        return value not in requirement.values
    if value is None:
        return False
    if operator in ("gt", "lt"):
        number, (bound,) = whole_number(value), requirement.values
        if number is None:
            return False
        return number > int(bound) if operator == "gt" else number < int(bound)
    return value in requirement.values  # in, =, ==


def _field_selector(text: str, plural: str) -> list[tuple[str, bool, str]]:
    """`a=b,c!=d` as (field, equal, value); only the fields the real server supports (pods)."""
    found = []
    for term in filter(None, text.split(",")):
        negated = "!=" in term
        name, _, value = term.partition("!=" if negated else "=")
        name, value = name.strip(), value.lstrip("=").strip()
        if plural != "pods" or name not in POD_FIELDS:
            raise ValueError(f'"{name}" is not a known field selector: only "metadata.name", "metadata.namespace"')
        found.append((name, not negated, value))
    return found


def _listed(obj: dict[str, Any], builtin: bool) -> dict[str, Any]:
    """An object as an item of its list: a built-in kind's (a typed list's) have no apiVersion or kind."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")} if builtin else obj


def _options_problem(method: str, query: dict[str, str]) -> tuple[int, dict[str, Any]] | None:
    """The 422 for a write's options the real server refuses before it reads the body: a
    `fieldValidation` other than its three (`ValidateCreateOptions`, `ValidateUpdateOptions`)."""
    value = query.get("fieldValidation", "")
    if method not in ("POST", "PUT") or value in FIELD_VALIDATIONS:
        return None
    supported = ", ".join(f'"{v}"' for v in FIELD_VALIDATIONS)
    message = f'Unsupported value: "{value}": supported values: {supported}'
    options = "CreateOptions" if method == "POST" else "UpdateOptions"
    error = crds.Invalid(options, "meta.k8s.io", "", [crds.Cause("FieldValueNotSupported", "fieldValidation", message)])
    return 422, status_body(422, error.message, error.details())


def _delete_options(
    body: dict[str, Any] | None, query: dict[str, str]
) -> tuple[tuple[int, dict[str, Any]] | None, dict[str, Any]]:
    """A DELETE's options (the delete handler's DeleteOptions), or the answer refusing them. They
    come in the body, else in the query, never both. The body's decoder error is passed on as it
    is: a 500 of no reason. A query value its parameter's type does not parse is a 400 BadRequest
    in strconv's words; these are the query's typed parameters."""
    if body is not None:
        if (problem := typed.delete_options_problem(body)) is None:
            return None, body
        refused = status_body(500, problem)
        del refused["reason"]  # StatusReasonUnknown, "": omitted
        return (500, refused), {}
    options: dict[str, Any] = {}
    for key, text in query.items():
        if key == "gracePeriodSeconds":
            seconds, refused = _int64(text)
            if refused is not None:
                return refused, {}
            options[key] = seconds
        elif key == "orphanDependents":
            if text not in (*GO_TRUE, *GO_FALSE):
                return (400, status_body(400, f'strconv.ParseBool: parsing "{text}": invalid syntax')), {}
            options[key] = text in GO_TRUE
        elif key == "propagationPolicy":
            options[key] = text
    return None, options


def _int64(text: str) -> tuple[int, None] | tuple[None, tuple[int, dict[str, Any]]]:
    """A typed query parameter as strconv.ParseInt(text, 10, 64) reads it (whole_number), or the
    400 BadRequest that parameter decoding answers, in strconv's words."""
    number = whole_number(text)
    if number is not None:
        return number, None
    said = "value out of range" if re.fullmatch(r"[+-]?[0-9]+", text) else "invalid syntax"
    return None, (400, status_body(400, f'strconv.ParseInt: parsing "{text}": {said}'))


def _timestamp(when: datetime) -> str:
    """A metav1.Time as the server writes it: RFC 3339, whole seconds, UTC."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _new_finalizers(old: dict[str, Any], new: dict[str, Any]) -> crds.Cause | None:
    """An update may not add a finalizer to an object being deleted (`ValidateNoNewFinalizers`,
    which `ValidateObjectMetaUpdate` applies once `deletionTimestamp` is set)."""
    added = sorted(set(new.get("finalizers") or ()) - set(old.get("finalizers") or ()))
    if not old.get("deletionTimestamp") or not added:
        return None
    found = ", ".join(json.dumps(f) for f in added)
    why = "Forbidden: no new finalizers can be added if the object is being deleted"
    why += f", found new finalizers []string{{{found}}}"
    return crds.Cause("FieldValueForbidden", "metadata.finalizers", why)


def _emptied(metadata: dict[str, Any]) -> bool:
    """An object an update deletes (the store's `shouldDeleteDuringUpdate`): marked by a delete
    with no grace left, and its last finalizer gone."""
    marked, finalizers = metadata.get("deletionTimestamp"), metadata.get("finalizers")
    return bool(marked) and not metadata.get("deletionGracePeriodSeconds") and not finalizers


def _version_problem(crd: crds.Crd | None, payload: dict[str, Any]) -> str | None:
    """The create and update handlers' 400 for a body that names another API version than its
    path, once decoded (the unstructured decoder takes any; its kind is the validator's, in
    `crds.check_kind`). Checked for custom resources: of a built-in kind, a version the scheme
    does not know is the decoder's own 400."""
    sent = payload.get("apiVersion")
    if crd is None or not isinstance(sent, str) or sent in ("", crd.api_version):
        return None
    return f"the API version in the data ({sent}) does not match the expected API version ({crd.api_version})"


def _kind_of(plural: str, crd: crds.Crd | None) -> str:
    """The kind a resource's objects are: its CRD's, else the built-in kind's."""
    return crd.kind if crd is not None else KINDS.get(plural, plural[:-1].capitalize())


def _api_version_of(path: str) -> str:
    """The API version of a request's path: `v1` for `/api/v1/...`, `<group>/<version>` else."""
    parts = path.split("/")
    return parts[2] if parts[1] == "api" else f"{parts[2]}/{parts[3]}"


def _group_of(path: str) -> str:
    """The API group of a request's path: "" for the core group (`/api/v1/...`)."""
    return path.split("/")[2] if path.startswith("/apis/") else ""


def _namespace_of(collection: str) -> str | None:
    """The namespace of a namespaced collection's path, None for a cluster-scoped one."""
    found = _ROUTE.match(collection)
    return (found.group("ns") or found.group("ns2")) if found else None


def _resource(path: str) -> str:
    """A request's resource, as the server's metrics name it: its path without the query, the
    namespace and the object's name (`/api/v1/pods`, `/apis/crd.projectcalico.org/v1/ipamblocks`)."""
    parts = urlsplit(path).path.strip("/").split("/")
    if "namespaces" in parts[:-1]:
        at = parts.index("namespaces")
        parts = parts[:at] + parts[at + 2 :]
    base = 2 if parts[:1] == ["api"] else 3  # api/v1 or apis/<group>/<version>
    return "/" + "/".join(parts[: base + 1])


def _metrics() -> str:
    """`/metrics` in Prometheus' text format, as the real server's gives its process's CPU time:
    here this process's, whose threads serve every request (in bench-kdd, the bench's own, which
    waits on the runs it starts)."""
    return (
        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\n"
        f"process_cpu_seconds_total {time.process_time()}\n"
    )


def _manager(agent: str) -> str:
    """The field manager the real server records for a request: its User-Agent's program name."""
    return agent.split("/", 1)[0] or "unknown"


def _handler(api: KubeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes: without this, Nagle's algorithm and the
            # client's delayed ACK hold every answer back ~40 ms.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _respond(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            accept = self.headers.get("Accept") or ""
            media = negotiate(accept, urlsplit(self.path).path, api.serves_protobuf, api.serves_tables)
            agent = self.headers.get("User-Agent") or ""
            authorized = api.anonymous or self.headers.get("Authorization") == f"Bearer {api.token}"
            answer = (
                api.handle(self.command, self.path, body, agent, media, authorized)
                if media
                else (406, status_body(406, f"only the following media types are accepted: {JSON}, not {accept}"))
            )
            if answer is None:
                self.close_connection = True
                return
            status, body = answer
            if isinstance(body, Protobuf):
                data, form, content_type = bytes(body), "protobuf", PROTOBUF
            elif isinstance(body, TableAnswer):
                data, form, content_type = bytes(body), "table", TABLE
            elif isinstance(body, str):
                data, form, content_type = body.encode(), "text", "text/plain"
            else:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                form, content_type = "json", JSON
            with api._lock:
                api.encoded_bytes[f"{form} {_resource(self.path)}"] += len(data)
            warnings = api.take_warnings()
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for text in warnings:  # RFC 7234's warn-code 299, the text a quoted-string
                    self.send_header("Warning", '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client went away (stopped): as the real server
                self.close_connection = True

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _respond

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
