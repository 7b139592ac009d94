"""Every call this job makes to the Kubernetes API, through the official client.

Responses are read as raw bytes (`_preload_content=False`): faster than model objects for
thousands of nodes, and tolerant of fields newer than the client. The large lists are decoded
typed, page by page (`list_all` with a `page` decoder), skipping every field the job does not
name (`managedFields`, most of a pod) without building it: Calico's kinds as JSON (msgspec), Pods
and Nodes as protobuf where the server speaks it (kube_protobuf), which costs it far less to
encode, and as JSON where it does not.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import structlog
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from job.adapters import kube_protobuf
from job.adapters.retry import ANSWERED, UNANSWERED, RetryPolicy, network_reason, never_sent, one_line
from job.config import Config
from job.core.kept import NO_KUBEVIRT, KubeVirt
from job.core.leaks import ANY_NAMESPACE
from job.core.model import KubeNode, NetworkUnavailable, PodInfo
from job.core.report import MAX_WARNINGS
from job.kube_syntax import is_dns_label, is_dns_subdomain

log = structlog.get_logger("calico_gc.kube")
T = TypeVar("T")
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_LIST_RESTARTS = 5
NETWORK_UNAVAILABLE_TAINT = "node.kubernetes.io/network-unavailable"
REQUEST_TIMEOUT_S = 30
# Connections kept to the API server: the client's default is 5 a CPU of the machine (5 on one
# core), and a run may hold 8 previous-log reads (adapters/health.LOG_READERS), its Lease renewal
# and the lists at once; past the pool each request opens and drops a connection, with a warning.
POOL_CONNECTIONS = 16
# The pods the leak check lists: host-network pods hold their node's IP, never a Calico one, and a
# pod that has finished (Failed or Succeeded) holds none, as Calico has it (docs/calico-data.md).
FINISHED_PHASES = ("Failed", "Succeeded")
POD_NETWORK_PODS = ",".join(["spec.hostNetwork=false", *(f"status.phase!={phase}" for phase in FINISHED_PHASES)])
JSON = "application/json, */*"
# Pods as a Table of their printed columns, without the objects (includeObject=None): the API
# server prints a pod's name, IP and node from its cache and encodes no pod, so neither its spec,
# its status nor its managedFields (docs/kubernetes-wire.md). Only the first of a pod's IPs is
# printed, so a cluster with blocks of both families asks for the pods themselves.
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
TABLE_NONE = "<none>"  # what the printer writes for an empty IP or node
Page = Callable[[bytes], tuple[Sequence[Any], str | None]]  # a list page's items and continue token


class ListMeta(msgspec.Struct, frozen=True):
    """A list's metadata, as far as paging needs it (typed_page)."""

    continue_: str | None = msgspec.field(default=None, name="continue")


class _Named(msgspec.Struct, frozen=True):
    name: str = ""
    namespace: str = ""


class _PodSpec(msgspec.Struct, frozen=True):
    nodeName: str | None = None  # the API's names


class _PodIP(msgspec.Struct, frozen=True):
    ip: str | None = None


class _PodStatus(msgspec.Struct, frozen=True):
    podIP: str | None = None
    podIPs: list[_PodIP] | None = None
    phase: str | None = None  # read of a pod fetched by name (FINISHED_PHASES); a list leaves those out


class _Pod(msgspec.Struct, frozen=True):
    metadata: _Named = _Named()
    spec: _PodSpec = _PodSpec()
    status: _PodStatus = _PodStatus()


_POD = msgspec.json.Decoder(_Pod)


class _Address(msgspec.Struct, frozen=True):
    type: str = ""
    address: str = ""


class _Condition(msgspec.Struct, frozen=True):
    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None
    lastTransitionTime: str | None = None  # the API's names


class _Taint(msgspec.Struct, frozen=True):
    key: str = ""
    timeAdded: str | None = None


class _NodeSpec(msgspec.Struct, frozen=True):
    taints: list[_Taint] | None = None


class _NodeStatus(msgspec.Struct, frozen=True):
    addresses: list[_Address] | None = None
    conditions: list[_Condition] | None = None


class _OwnerReference(msgspec.Struct, frozen=True):
    kind: str = ""


class _VmMeta(msgspec.Struct, frozen=True):
    name: str = ""
    namespace: str = ""
    ownerReferences: list[_OwnerReference] | None = None  # the API's names


class _VirtualMachine(msgspec.Struct, frozen=True):
    """What the job reads of a KubeVirt VirtualMachine or VirtualMachineInstance: who it is, and
    (of an instance) whether a VirtualMachine owns it; the rest (spec, status) is skipped."""

    metadata: _VmMeta = _VmMeta()


class _NodeMeta(msgspec.Struct, frozen=True):
    name: str = ""
    creationTimestamp: str | None = None  # the API's names


class _Node(msgspec.Struct, frozen=True):
    """What the job uses of a Node; its status (images, volumes) and managedFields are skipped."""

    metadata: _NodeMeta = _NodeMeta()
    spec: _NodeSpec = _NodeSpec()
    status: _NodeStatus = _NodeStatus()


class _ConfigMapMeta(msgspec.Struct, frozen=True):
    resourceVersion: str  # the API's names; a write back must carry it
    name: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _ConfigMap(msgspec.Struct, frozen=True):
    """What the job reads of its own ConfigMaps (grace state, kept reports), checked before they
    are used as read: one of another shape is a `bad_answer`, never a traceback."""

    metadata: _ConfigMapMeta
    data: dict[str, str] | None = None
    binaryData: dict[str, str] | None = None


class UnreadableItem(ValueError):
    """A list that is a Kubernetes list, one of whose items holds a field the job reads in a shape
    it cannot read: the message names the object and the field."""


_ITEM_AT = re.compile(r"`\$\.items\[(\d+)\]([^`]*)`")
# One warning of a `Warning` header (RFC 7234): a code, an agent, the text as a quoted-string.
_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def _located(raw: bytes, said: str) -> ValueError:
    """msgspec's complaint (`... - at $.items[3].spec.nodeName`), told of the object it is in."""
    found = _ITEM_AT.search(said)
    try:
        page = json.loads(raw) if found else None
    except (ValueError, RecursionError):
        page = None
    if (
        found is None
        or not isinstance(page, dict)
        or not isinstance(items := page.get("items"), list)
        or int(found[1]) >= len(items)
    ):
        return ValueError(said)
    item = items[int(found[1])]
    metadata = (item.get("metadata") if isinstance(item, dict) else None) or {}
    named = "/".join(str(metadata[k]) for k in ("namespace", "name") if isinstance(metadata, dict) and metadata.get(k))
    own, listed = (item.get("kind") if isinstance(item, dict) else None), page.get("kind")
    if isinstance(own, str) and own:
        kind = own
    elif isinstance(listed, str) and listed.endswith("List"):
        kind = listed.removesuffix("List")  # a typed list's items carry no kind: the list does
    else:
        kind = "item"
    reason = said.split(" - at ", 1)[0]
    return UnreadableItem(f"{kind} {named or '#' + found[1]}: {found[2].lstrip('.') or 'the object'}: {reason}")


def typed_page(item: type[msgspec.Struct]) -> Page:
    """A page decoder for a list of `item`s: its items, decoded as `item`, and its continue token.
    Fields `item` does not name are skipped whatever they hold; one it names in another shape is an
    UnreadableItem naming the object and the field."""
    listed = msgspec.defstruct(
        f"{item.__name__}List",
        [("metadata", ListMeta, ListMeta()), ("items", list[item] | None, None)],  # type: ignore[valid-type]
    )
    decoder = msgspec.json.Decoder(listed)

    def decode(raw: bytes) -> tuple[Sequence[Any], str | None]:
        try:
            page: Any = decoder.decode(raw)
        except msgspec.DecodeError as error:
            raise _located(raw, str(error)) from None
        except RecursionError:  # nested past Python's limit: a page that is a ValueError, said as one
            raise ValueError("nested deeper than calico-gc reads") from None
        return page.items or (), page.metadata.continue_ or None

    return decode


def json_page(raw: bytes) -> tuple[Sequence[Any], str | None]:
    try:
        page = json.loads(raw)
    except RecursionError:  # nested past Python's limit: a page it cannot read, as any other
        raise ValueError("nested deeper than calico-gc reads") from None
    if not isinstance(page, dict) or not isinstance(page.get("items") or [], list):
        raise ValueError("not a list")
    return page.get("items") or (), (page.get("metadata") or {}).get("continue") or None


def either(
    kind: str,
    protobuf_record: Callable[[Any], Any],
    json_page: Page,
    json_record: Callable[[Any], Any] | None = None,
    message: str | None = None,
) -> Page:
    """A page decoder for a core kind asked for as protobuf (kube_protobuf.ACCEPT), whose items
    are the same records whichever the server answered: protobuf items (read as `message`) made
    into them by `protobuf_record`, or the JSON page's items by `json_record` (None: as they are)."""

    def decode(raw: bytes) -> tuple[Sequence[Any], str | None]:
        if raw.startswith(kube_protobuf.MAGIC):
            items, token = kube_protobuf.decode_list(raw, kind, message)
            return [protobuf_record(item) for item in items], token
        items, token = json_page(raw)
        return (items if json_record is None else [json_record(item) for item in items]), token

    return decode


# (namespace, name) and where the pod runs; a Table's rows name no namespace (leaks.ANY_NAMESPACE)
PodEntry = tuple[tuple[str, str], PodInfo]


class _Kind(msgspec.Struct, frozen=True):
    kind: str = ""


class _Column(msgspec.Struct, frozen=True):
    name: str = ""


class _Row(msgspec.Struct, frozen=True):
    cells: list[Any] = []


class _Table(msgspec.Struct, frozen=True):
    metadata: ListMeta = ListMeta()
    columnDefinitions: list[_Column] | None = None
    rows: list[_Row] | None = None


_KIND, _TABLE = msgspec.json.Decoder(_Kind), msgspec.json.Decoder(_Table)
_POD_COLUMNS = ("Name", "IP", "Node")


def _pod_rows(raw: bytes) -> tuple[Sequence[PodEntry], str | None]:
    """A page of pods printed as a Table: each row's name, first IP and node, found by the columns'
    names (their order is the printer's to change). A row without those three is an
    UnreadableItem; a page without rows needs no columns."""
    page = _TABLE.decode(raw)
    if not page.rows:
        return (), page.metadata.continue_ or None
    columns = [column.name for column in page.columnDefinitions or ()]
    missing = [name for name in _POD_COLUMNS if name not in columns]
    if missing:
        raise UnreadableItem(f"a Table of pods without the column(s) {', '.join(missing)} (it has {columns})")
    at_name, at_ip, at_node = (columns.index(name) for name in _POD_COLUMNS)
    entries: list[PodEntry] = []
    for number, row in enumerate(page.rows):
        cells = row.cells
        try:
            name, ip, node = cells[at_name], cells[at_ip], cells[at_node]
        except IndexError:
            raise UnreadableItem(f"row {number} of a Table of pods has {len(cells)} cells") from None
        if not (isinstance(name, str) and name and isinstance(ip, str) and isinstance(node, str)):
            raise UnreadableItem(
                f"a Table of pods, row {number}: name {name!r}, IP {ip!r}, node {node!r} (text expected)"
            )
        ips = (ip,) if ip and ip != TABLE_NONE else ()
        entries.append(((ANY_NAMESPACE, name), PodInfo(node if node and node != TABLE_NONE else None, ips)))
    return entries, page.metadata.continue_ or None


def _pods_json(raw: bytes) -> tuple[Sequence[Any], str | None]:
    """A JSON page of pods: a Table (asked for first) or, from a server that serves none, a PodList."""
    if _KIND.decode(raw).kind == "Table":
        return _pod_rows(raw)
    items, token = _POD_LIST(raw)
    return [_pod_entry(item) for item in items], token


def _pod_ips(listed: Iterable[Any], single: Any) -> tuple[str, ...]:
    """A pod's IPs: its `podIPs`, or its `podIP` where only that is set."""
    ips = tuple(ip for ip in listed if ip and isinstance(ip, str))
    return ips or ((single,) if single and isinstance(single, str) else ())


def _pod_entry(pod: Any) -> PodEntry:
    """A pod decoded from JSON (_Pod) or protobuf (kube_protobuf's Pod, whose fields have the same
    names; an unset string is empty there, None here)."""
    status = pod.status
    ips = _pod_ips((entry.ip for entry in status.podIPs or ()), status.podIP)
    return (pod.metadata.namespace, pod.metadata.name), PodInfo(pod.spec.nodeName or None, ips)


def _node_of_protobuf(node: Any) -> KubeNode:
    """As _kube_node reads a JSON Node; of the conditions and taints, only those it acts on are
    made records (a Node has half a dozen conditions, each with times to format)."""
    status, when = node.status, kube_protobuf.when
    conditions = [
        _Condition(c.type, c.status, c.reason or None, c.message or None, when(c, "lastTransitionTime"))
        for c in status.conditions
        if c.type == "NetworkUnavailable" and c.status == "True"
    ]
    taints = [_Taint(t.key, when(t, "timeAdded")) for t in node.spec.taints if t.key == NETWORK_UNAVAILABLE_TAINT]
    addresses = [_Address(address.type, address.address) for address in status.addresses]
    created = when(node.metadata, "creationTimestamp") if conditions or taints else None  # read only then
    return _kube_node(
        _Node(
            _NodeMeta(node.metadata.name, created),
            _NodeSpec(taints or None),
            _NodeStatus(addresses or None, conditions or None),
        )
    )


_VM_PAGE = typed_page(_VirtualMachine)
KUBEVIRT = "/apis/kubevirt.io/v1"


class KubeError(Exception):
    """The Kubernetes API failed for good (after retries where they make sense): the one error
    this boundary raises. `status` is the HTTP status, None when no answer came."""

    def __init__(self, message: str, status: int | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind or ("unauthorized" if status in (401, 403) else "unavailable")
        self.in_doubt = False  # a write (Kube.write) that may have been done: a try went unanswered


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
    """In a pod, the in-cluster configuration; elsewhere --kubeconfig, KUBECONFIG (its files
    merged, as kubectl merges them) or ~/.kube/config, as kubectl looks. Any unusable
    configuration is one KubeError line."""
    paths = config.kubeconfig
    if not paths and "KUBERNETES_SERVICE_HOST" not in os.environ:
        default = Path.home() / ".kube" / "config"
        paths = (default,) if default.is_file() else ()
    if not paths:
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as error:
            raise KubeError(
                f"no Kubernetes configuration: not in a pod ({error}) and no kubeconfig; set --kubeconfig or "
                "KUBECONFIG",
                kind="config",
            ) from error
        return _pooled(configuration)
    configuration = k8s.Configuration()
    named = os.pathsep.join(map(str, paths))  # as KUBECONFIG lists them: the client merges them
    try:
        k8s_config.load_kube_config(config_file=named, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except Exception as error:  # YAML errors, wrong types, missing files: all the same to an operator
        first = " ".join(str(error).split())[:200] or type(error).__name__
        raise KubeError(
            f"kubeconfig {named} is not usable: {first}; check --kubeconfig or KUBECONFIG", kind="config"
        ) from error
    return _pooled(configuration)


def _pooled(configuration: k8s.Configuration) -> k8s.ApiClient:
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, POOL_CONNECTIONS)
    # Every retry is the job's own (RetryPolicy: logged, bounded, and counted where a write tried
    # again may have been done at the first try): urllib3's would resend a write whose answer was
    # lost unseen, and the job would take the write's own doing for someone else's.
    configuration.retries = False
    return k8s.ApiClient(configuration)


def _status(error: ApiException) -> dict[str, Any]:
    """The Status object an error answer carries, or {} where it carries none."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _status_message(error: ApiException) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    return " ".join(str(_status(error).get("message") or error.reason or "").split())[:300]


# How the API server words a refusal by admission: a webhook's (webhook errors' ToStatusErr) and a
# ValidatingAdmissionPolicy's (its validating admission plugin); either may come as any 4xx.
_ADMISSION_REFUSALS = (
    re.compile(r'(admission webhook "[^"]*") denied the request'),
    re.compile(r"(ValidatingAdmissionPolicy '[^']*')(?: with binding '[^']*')? denied request"),
)


def _admission_refuser(message: str) -> str | None:
    """The webhook or policy a refusal names, if an admission check refused the request."""
    found = next((m for m in (p.search(message) for p in _ADMISSION_REFUSALS) if m), None)
    return found.group(1) if found else None


def _missing_namespace(error: ApiException) -> str | None:
    """The namespace a create was refused for because it does not exist (NamespaceLifecycle
    answers 404 with the namespace as the Status's details), else None."""
    details = _status(error).get("details")
    if error.status != 404 or not isinstance(details, dict) or details.get("kind") != "namespaces":
        return None
    return str(details.get("name") or "") or None


def _terminating_namespace(error: ApiException, path: str) -> str | None:
    """The namespace a create was refused in because it is being deleted (NamespaceLifecycle
    answers 403 with a NamespaceTerminating cause), else None."""
    details = _status(error).get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if error.status != 403 or not isinstance(causes, list):
        return None
    if not any(isinstance(c, dict) and c.get("type") == "NamespaceTerminating" for c in causes):
        return None
    found = re.search(r"/namespaces/([^/]+)/", path)
    return found.group(1) if found else None


def _now() -> datetime:
    return datetime.now(UTC)


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
        self._groups: frozenset[str] | None = None
        self._groups_lock = threading.Lock()  # the datastore read and the Kubernetes read both ask
        self._warned: dict[str, str] = {}  # each warning the server sent, and the request that drew it first
        self._warned_lock = threading.Lock()

    def request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        tries: list[int] | None = None,
    ) -> dict[str, Any]:
        """One API call with retries; a non-2xx answer raises KubeError with its status. `tries`,
        where given, gets an entry at each attempt: UNANSWERED where it may have reached the
        server and no answer came that says what was done (none, a 5xx, or not JSON: a write so
        may have been done, its answer lost), else ANSWERED."""
        text = self.request_bytes(method, path, query, body, tries=tries).decode(errors="replace")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            if tries:
                tries[-1] = UNANSWERED  # an answer, but not one that says what was done
            raise KubeError(
                f"{method} {path}: {self.host} answered something that is not a Kubernetes JSON object "
                f"({one_line(text, 60)!r}); is it the API server, or a proxy in between?",
                kind="bad_answer",
            )
        return data

    def _failure(self, method: str, path: str, error: BaseException) -> KubeError:
        """Every way a call can fail, as one line that says what to check."""
        if isinstance(error, ApiException):
            status, message = error.status, _status_message(error)
            if status == 401:
                text = f"unauthorized (HTTP 401): {self.host} refused {self._credential()}"
            elif refuser := _admission_refuser(message):
                text = (
                    f"refused by {refuser} (HTTP {status}) {method} {path}: {message}; the cluster's admission "
                    "policy must let calico-gc write this (exempt its namespace or its service account)"
                )
                return KubeError(text, status, kind="admission")
            elif namespace := _terminating_namespace(error, path):
                text = (
                    f'namespace "{namespace}" is being deleted ({method} {path}): nothing can be created in it; '
                    "if calico-gc is being reinstalled, install it again once the namespace is gone"
                )
                return KubeError(text, status, kind="config")
            elif status == 403:
                text = f"forbidden (HTTP 403) {method} {path}: {message}; grant it in the RBAC of manifests/base"
                if "projectcalico.org/" in path:
                    text += " (DATASTORE_TYPE=kubernetes needs manifests/kdd, which grants both Calico API groups)"
            elif method == "POST" and (namespace := _missing_namespace(error)):
                text = (
                    f'namespace "{namespace}" does not exist ({method} {path}): create it, or set --namespace '
                    "(POD_NAMESPACE) to the namespace the job runs in"
                )
                return KubeError(text, status, kind="config")
            elif status == 400 and method in ("POST", "PUT") and "strict decoding error" in message:
                text = (
                    f"the API server does not know a field calico-gc wrote (HTTP 400) {method} {path}: {message}; "
                    "nothing was written: the cluster's definition of this kind lacks it (are Calico's CRDs "
                    "older than the Calico that wrote the data?)"
                )
                return KubeError(text, status, kind="invalid")
            elif status in (400, 422) and method in ("POST", "PUT"):
                text = (
                    f"the API server refused what calico-gc wrote (HTTP {status}) {method} {path}: {message}; a bug "
                    "in calico-gc, unless the cluster's rules for this object changed: please report it"
                )
                return KubeError(text, status, kind="invalid")
            else:
                text = f"{method} {path}: HTTP {status} {message}"
            return Conflict(text) if status == 409 else KubeError(text, status)
        if _is_tls(error):
            reason = getattr(error, "reason", error)
            return KubeError(
                f"TLS to the Kubernetes API at {self.host} failed: {one_line(str(reason), 160)}; check the CA and "
                "client certificate of --kubeconfig (or the service account's ca.crt)",
                kind="tls",
            )
        reason = getattr(error, "reason", None) or error
        return KubeError(
            f"cannot reach the Kubernetes API at {self.host}: {network_reason(reason)}; check --kubeconfig or "
            "KUBECONFIG (in a pod: the kubernetes service)"
        )

    def _heed(self, headers: list[str], method: str, path: str) -> None:
        """Log each warning the server sends (a deprecated API version, say) once a run, with the
        request that drew it first: kubectl and client-go show them; the official client drops them."""
        for header in headers:
            for quoted in _WARNING.findall(header):
                text = re.sub(r"\\(.)", r"\1", quoted)
                with self._warned_lock:
                    if text in self._warned:
                        continue
                    self._warned[text] = f"{method} {path}"
                log.warning("api_server_warning", warning=one_line(text, 300), request=f"{method} {path}")

    def warnings(self) -> list[dict[str, str]]:
        """The run's warnings from the server so far, for the report: each once, in the order
        they came, the first MAX_WARNINGS of them (the log has every one)."""
        with self._warned_lock:
            taken = list(self._warned.items())[:MAX_WARNINGS]
        return [{"warning": one_line(text, 300), "request": request} for text, request in taken]

    def _credential(self) -> str:
        """Which credential was used, never its value."""
        configuration = self._api.configuration
        if (configuration.api_key or {}).get("authorization") or (configuration.api_key or {}).get("BearerToken"):
            return "the bearer token in use (the service account token, or the kubeconfig user's token)"
        if configuration.cert_file:
            return f"the client certificate {configuration.cert_file}"
        return "the anonymous request: the configuration carries no credential"

    def request_bytes(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        retry: bool = True,
        accept: str = JSON,
        tries: list[int] | None = None,
    ) -> bytes:
        # A write names only fields the server knows, or is refused: by default a real server drops
        # an unknown field with a warning, and a Calico object written so would be stored without it.
        sent = {**(query or {}), "fieldValidation": "Strict"} if method in ("POST", "PUT") else query or {}

        def attempt() -> bytes:
            if tries is not None:
                tries.append(ANSWERED)
            headers = {"Accept": accept}
            if body is not None:
                headers["Content-Type"] = "application/json"
            _, url, headers, payload, _ = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=[(k, v) for k, v in sent.items() if v is not None],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            try:
                response: Any = self._api.call_api(
                    method, url, header_params=headers, body=payload, _request_timeout=REQUEST_TIMEOUT_S
                )
                raw: bytes = response.read()
            except (urllib3.exceptions.HTTPError, OSError) as error:
                if tries is not None and not never_sent(error):
                    tries[-1] = UNANSWERED
                raise
            self._heed(response.headers.getlist("Warning"), method, path)
            if response.status >= 500 and tries is not None:  # "etcdserver: request timed out", a proxy's 504
                tries[-1] = UNANSWERED  # an answer that does not say whether the write was done
            if not 200 <= response.status <= 299:
                said = kube_protobuf.status_json(raw) or raw.decode(errors="replace")
                raise ApiException.from_response(http_resp=response, body=said, data=None)
            return raw

        try:
            return self._retry.call(attempt, is_transient) if retry else attempt()
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            raise self._failure(method, path, error) from error

    def list_all(
        self,
        path: str,
        parse: Callable[[Any], T | None],
        query: dict[str, Any] | None = None,
        page: Page = json_page,
        accept: str = JSON,
    ) -> list[T]:
        """Every item of a collection, paged, each parsed as its page arrives (a page of full Pod
        objects is large; what is kept of them is small; `parse` returning None keeps nothing).
        `page` decodes a page (default: JSON objects) of the media `accept` asks for. A 410
        (expired continue) restarts it, so `parse` may see an item twice."""
        for _ in range(MAX_LIST_RESTARTS):
            items: list[T] = []
            token: str | None = None
            try:
                while True:
                    query_now = {**(query or {}), "limit": self._page_size, "continue": token}
                    raw = self.request_bytes("GET", path, query_now, accept=accept)
                    sent = token
                    try:
                        listed, token = page(raw)
                    except UnreadableItem as error:
                        raise KubeError(
                            f"GET {path}: {one_line(str(error), 200)}; calico-gc reads that field and cannot read "
                            "this value",
                            kind="bad_answer",
                        ) from None
                    except ValueError as error:
                        raise KubeError(
                            f"GET {path}: {self.host} answered with something that is not a Kubernetes list "
                            f"({one_line(str(error), 80)}); is it the API server, or a proxy in between?",
                            kind="bad_answer",
                        ) from None
                    if token is not None and token == sent:  # a server's token names the page after it
                        raise KubeError(
                            f"GET {path}: {self.host} answered the continue token it was sent, so the list would "
                            "never end; is a proxy in between answering from its cache, whatever the query?",
                            kind="bad_answer",
                        )
                    items.extend(kept for kept in map(parse, listed) if kept is not None)
                    if token is None:
                        return items
            except KubeError as error:
                if error.status != 410:
                    raise
                log.warning("list_restarted", path=path, reason="continue token expired (410)")
        raise KubeError(f"listing {path} kept expiring ({MAX_LIST_RESTARTS} restarts)")

    def served_groups(self) -> frozenset[str]:
        """The API groups the server serves (discovery, `/apis`): asked once per Kube, so that a
        run asks once however many readers want it (the Calico group, KubeVirt)."""
        with self._groups_lock:
            if self._groups is None:
                listed = self.request("GET", "/apis").get("groups")
                named = (g.get("name") for g in listed if isinstance(g, dict)) if isinstance(listed, list) else ()
                self._groups = frozenset(name for name in named if isinstance(name, str))
            return self._groups

    def kubevirt(self) -> KubeVirt:
        """KubeVirt's VMs that hold their addresses (core/kept.py): each VirtualMachine, and each
        VirtualMachineInstance no VirtualMachine owns. Without `kubevirt.io` served, nothing more is
        asked; where the VMs cannot be listed, calico-gc cannot tell, and says why."""
        try:
            served = "kubevirt.io" in self.served_groups()
        except KubeError as error:
            return KubeVirt(False, None, f"the API server's groups could not be read: {error}")
        if not served:
            return NO_KUBEVIRT
        live: set[tuple[str, str]] = set()
        try:
            self.list_all(f"{KUBEVIRT}/virtualmachines", lambda vm: live.add(_vm_key(vm)), page=_VM_PAGE)
            self.list_all(f"{KUBEVIRT}/virtualmachineinstances", lambda vmi: _standalone(vmi, live), page=_VM_PAGE)
        except KubeError as error:
            return KubeVirt(True, None, f"KubeVirt's VMs could not be listed: {error}")
        return KubeVirt(True, frozenset(live))

    def list_nodes(self) -> tuple[KubeNode, ...]:
        """All Nodes, with their addresses and network-unavailable state: decoded typed, a Node is
        only those (a real one is 10-20 KB, most of it status and managedFields)."""
        return tuple(self.list_all("/api/v1/nodes", _same, page=_NODE_PAGE, accept=kube_protobuf.ACCEPT))

    def each_pod(self, take: Callable[[tuple[str, str], PodInfo], None], one_ip_each: bool = False) -> None:
        """Every Pod on the pod network, page by page, handed to `take` as (namespace, name) and
        where it runs: a pod is decoded as those few fields, nothing else of it is built, and
        only what the caller keeps stays in memory. Host-network pods and finished ones are left
        out by the API server itself (POD_NETWORK_PODS). The list asks for the most recent state (no
        resourceVersion): a pod that existed when the caller began is in it.

        `one_ip_each` (no pod can hold two of the caller's IPs): the pods are asked for as a Table
        of their rows alone (TABLE), which names no namespace; else, and from a server that
        prints no Table, as protobuf, then JSON."""

        def one(entry: PodEntry) -> None:
            take(*entry)

        query = {"fieldSelector": POD_NETWORK_PODS}
        accept = kube_protobuf.ACCEPT
        if one_ip_each:
            query["includeObject"] = "None"
            accept = f"{TABLE}, {accept}"
        self.list_all("/api/v1/pods", one, query, _POD_PAGE, accept)

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        """A fresh GET of one Pod; None on 404 or where it has finished (it holds no IP, as the
        pods list leaves it out), and without a request for names no pod can have (a namespace is
        a DNS label, a pod's name a DNS subdomain): the names come from the datastore's
        allocations, and one of another shape must not become another path."""
        if not (is_dns_label(namespace) and is_dns_subdomain(name)):
            return None
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            raw = self.request_bytes("GET", path)
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        try:
            pod = _POD.decode(raw)
        except (msgspec.DecodeError, RecursionError) as error:
            raise KubeError(
                f"GET {path}: {self.host} answered with something that is not a Pod ({one_line(str(error), 80)}); "
                "is it the API server, or a proxy in between?",
                kind="bad_answer",
            ) from None
        return None if pod.status.phase in FINISHED_PHASES else _pod_entry(pod)[1]

    def node_exists(self, name: str) -> bool:
        """A fresh GET of one Node: False only on 404."""
        try:
            self.request("GET", f"/api/v1/nodes/{name}")
            return True
        except KubeError as error:
            if error.status == 404:
                return False
            raise

    def allowed(self, verb: str, group: str, resource: str, namespace: str, name: str) -> bool | None:
        """What RBAC says of one request (a SelfSubjectAccessReview, which every authenticated
        user may create); None when the server does not say."""
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "namespace": namespace,
                    "name": name,
                }
            },
        }
        answer = self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=body)
        status = answer.get("status")
        allowed = status.get("allowed") if isinstance(status, dict) else None
        return allowed if isinstance(allowed, bool) else None

    # ConfigMaps (grace state)

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap as read (None: there is none), its shape checked (_ConfigMap)."""
        path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
        try:
            answer = self.request("GET", path)
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        try:
            msgspec.convert(answer, _ConfigMap)
        except msgspec.ValidationError as error:
            raise KubeError(f"GET {path}: the answer is not a ConfigMap: {error}", kind="bad_answer") from None
        return answer

    def write(
        self, method: str, path: str, body: dict[str, Any], at: str, done: Callable[[dict[str, Any] | None], bool]
    ) -> dict[str, Any]:
        """A conditional write (`request`): its answer. A write tried again after a try went
        unanswered may have been done at that try, and then conflicts with itself (409, or 404 for
        a DELETE). Where one does, the object at `at` is read (None: gone), and where `done` says
        it is as the write leaves it, it is the answer ({} for a DELETE); else the conflict stands.
        A write that fails for good says whether it may have been done all the same (`in_doubt`)."""
        tries: list[int] = []
        try:
            return self.request(method, path, body=body, tries=tries)
        except KubeError as conflict:
            if conflict.status not in (404, 409) or UNANSWERED not in tries:
                conflict.in_doubt = UNANSWERED in tries
                raise
            try:
                now: dict[str, Any] | None = self.request("GET", at)
            except KubeError as error:
                if error.status != 404:
                    error.in_doubt = True  # the first try may have been done, and this cannot tell
                    raise
                now = None
            if not done(now):
                raise conflict
            return now or {}

    def write_config_map(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create (no resourceVersion) or replace guarded by its resourceVersion; the object as
        written, whose resourceVersion the next write must carry. A lost race raises Conflict."""
        name = body["metadata"]["name"]
        collection = f"/api/v1/namespaces/{namespace}/configmaps"
        method, path = (
            ("PUT", f"{collection}/{name}") if body["metadata"].get("resourceVersion") else ("POST", collection)
        )
        written = self.write(method, path, body, f"{collection}/{name}", partial(_same_config_map, body))
        try:
            msgspec.convert(written, _ConfigMap)
        except msgspec.ValidationError as error:  # done, or not: the next write could not build on it
            raise KubeError(f"{method} {path}: the answer is not a ConfigMap: {error}", kind="bad_answer") from None
        return written

    @property
    def host(self) -> str:
        """The API server URL, for the report."""
        return str(self._api.configuration.host)

    def now(self) -> datetime:
        return self._clock()


def _same_config_map(written: dict[str, Any], now: dict[str, Any] | None) -> bool:
    """`now` holds what `written` wrote: its data, labels and annotations."""
    try:
        read = msgspec.convert(now, _ConfigMap)
    except msgspec.ValidationError:
        return False  # None (gone), or no ConfigMap: not what was written
    wrote = written["metadata"]
    return all(
        [
            (read.data or {}) == (written.get("data") or {}),
            (read.binaryData or {}) == (written.get("binaryData") or {}),
            (read.metadata.labels or {}) == (wrote.get("labels") or {}),
            (read.metadata.annotations or {}) == (wrote.get("annotations") or {}),
        ]
    )


def _same(item: T) -> T:
    return item


def _vm_key(vm: _VirtualMachine) -> tuple[str, str]:
    return vm.metadata.namespace, vm.metadata.name


def _standalone(vmi: _VirtualMachine, live: set[tuple[str, str]]) -> None:
    """A VirtualMachineInstance holds its address itself only where no VirtualMachine owns it."""
    if not any(ref.kind == "VirtualMachine" for ref in vmi.metadata.ownerReferences or ()):
        live.add(_vm_key(vmi))


def _kube_node(node: _Node) -> KubeNode:
    status = node.status
    internal = tuple(a.address for a in status.addresses or () if a.type == "InternalIP" and a.address)
    condition = next(
        (c for c in status.conditions or () if c.type == "NetworkUnavailable" and c.status == "True"), None
    )
    taint = next((t for t in node.spec.taints or () if t.key == NETWORK_UNAVAILABLE_TAINT), None)
    unavailable = None
    if condition or taint:
        unavailable = NetworkUnavailable(
            since=(condition.lastTransitionTime if condition else None) or (taint.timeAdded if taint else None),
            reason=condition.reason if condition else None,
            message=condition.message if condition else None,
            condition=condition is not None,
            taint_added=taint.timeAdded if taint else None,
            node_created=node.metadata.creationTimestamp,
        )
    return KubeNode(node.metadata.name, internal, unavailable)


# The core kinds' page decoders, here where _kube_node is defined: records alike from protobuf or JSON.
_POD_LIST = typed_page(_Pod)
_POD_PAGE = either("PodList", _pod_entry, _pods_json)
_NODE_PAGE = either("NodeList", _node_of_protobuf, typed_page(_Node), _kube_node)
