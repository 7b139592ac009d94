"""Calico 3.x on etcd v3, through etcd's gRPC API (job/adapters/datastores/etcd_grpc.py).

The key layout (docs/calico-data.md) is known only here: reading turns keys into
the shared model, committing turns conditional writes back into etcd transactions.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import ipaddress
import queue
import socket
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, AnyStr, Protocol, TypeVar

import msgspec

from job.adapters.datastores.base import DatastoreError, DatastoreMismatch, Scope, ip_number
from job.adapters.retry import RetryPolicy
from job.config import Config
from job.core.inventory import Inventory
from job.core.ipam import (
    TUNNEL_HANDLE_PREFIXES,
    Held,
    attribute_at,
    block_data,
    block_shape_problem,
    normal_cidr,
    parse_cidr,
    parse_handle,
    summarize_block,
    tunnel_handle_node,
)
from job.core.model import (
    BlockAffinity,
    CalicoHost,
    ClusterInfo,
    DataProblem,
    IpamBlock,
    IpamHandle,
    Step,
    StoredItem,
    WorkloadEndpoint,
    ascii_number,
)
from job.core.plan import is_live
from job.core.scan import BlockScan, dangling_blocks, find_dangling

if TYPE_CHECKING:
    from job.adapters.datastores.etcd_grpc import EtcdGrpc

T = TypeVar("T")
R = TypeVar("R")

RESOURCES = "/calico/resources/v3/projectcalico.org/"
NODES = RESOURCES + "nodes/"
WORKLOAD_ENDPOINTS = RESOURCES + "workloadendpoints/"
NODE_FELIX_CONFIGS = RESOURCES + "felixconfigurations/node."
NODE_BGP_CONFIGS = RESOURCES + "bgpconfigurations/node."
BGP_PEERS = RESOURCES + "bgppeers/"
HOST_ENDPOINTS = RESOURCES + "hostendpoints/"
NODE_STATUSES = RESOURCES + "caliconodestatuses/"
# kube-controllers keeps a Profile `kns.<namespace>` per Kubernetes namespace (etcd mode): where
# each namespace's endpoints start, which bounds the endpoints' page windows (scan).
NAMESPACE_PROFILES = RESOURCES + "profiles/kns."
CLUSTER_INFORMATION = RESOURCES + "clusterinformations/default"
IP_POOLS = RESOURCES + "ippools/"
BLOCKS = "/calico/ipam/v2/assignment/"
AFFINITIES = "/calico/ipam/v2/host/"
HANDLES = "/calico/ipam/v2/handle/"
FELIX_STATUS = "/calico/felix/v2/"

# Everything one run reads, each as a paged range; never one range over /calico/.
PREFIXES = (
    NODES,
    WORKLOAD_ENDPOINTS,
    NODE_FELIX_CONFIGS,
    NODE_BGP_CONFIGS,
    BGP_PEERS,
    HOST_ENDPOINTS,
    NODE_STATUSES,
    CLUSTER_INFORMATION,
    IP_POOLS,
    BLOCKS,
    AFFINITIES,
    HANDLES,
    FELIX_STATUS,
)
# The small prefixes, which name the hosts, first. Then, judged by which hosts are live, the
# blocks followed by the handles (a handle is judged against every block), beside the endpoints
# (whose IPs wait in the block scan until the last block is in: BlockScan.blocks_read).
HOST_GROUPS = (tuple(p for p in PREFIXES if p not in (WORKLOAD_ENDPOINTS, BLOCKS, HANDLES)),)
IPAM_GROUPS = ((BLOCKS, HANDLES), (WORKLOAD_ENDPOINTS,))
READ_QUEUE_PAGES = 2
# While the workers wait on pages and this thread parses them, a worker with an answer needs the
# GIL back to ask for its next page; at Python's default (5 ms) etcd sat idle meanwhile.
READ_SWITCH_INTERVAL = 0.001
WINDOW_PAGES = 8  # a page's range is guessed to hold this many pages (Window)
# The endpoints' pages also stop where some hosts' endpoints start in each namespace (NamespaceStarts):
# one bound for every 100 pods the blocks place in it (1,000 bounds at 100,000 pods, 0.1 MB). Where
# the blocks say nothing, every 50th host in each of at most 32 namespaces.
ENDPOINTS_PER_BOUND = 100
HOSTS_PER_BOUND = 50
FEW_NAMESPACES = 32
# The blocks' pages stop where every 200th block a host's affinity names starts (block_starts): a
# block's key is a CIDR as text, whose numbers windows misread (dual stack: 12.4x counted). A span
# of one bound is about a page (blocks of 7.5 KB); every 50th made twice the ranges, which cost
# etcd more than the keys they spared it counting (docs/development.md).
BLOCKS_PER_BOUND = 200
TUNNEL_FIELDS = (
    ("bgp", "ipv4IPIPTunnelAddr"),
    ("ipv4VXLANTunnelAddr",),
    ("ipv6VXLANTunnelAddr",),
    ("wireguard", "interfaceIPv4Address"),
    ("wireguard", "interfaceIPv6Address"),
)
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
# Exact-key reads in flight at once (_at): 10,000 endpoints' values in 0.10 s, against 0.16-0.23 s
# one transaction after another (5,000 hosts, this machine).
TXNS_AT_ONCE = 4
# Bytes a page holds at most, after the first (see scan): 2,000 endpoints or 10,000 handles. Pages
# of up to 3 MiB peaked 12 MB higher at 15,000 hosts, and saved etcd no CPU (bench, 2026-12-03).
PAGE_BYTES = 3 << 19
# A prefix's first page, before its keys' size is known: 1,000 blocks are 5 MB. Past it pages are
# sized by bytes, up to --page-size keys. Against pages of at most 2,000 keys, the first included,
# and 3 MiB, at 5,000 hosts (`namespaces`): 191 ranges not 218, etcd counted 2.65x the keys it
# returned not 3.85x, and the peak fell from 130.3 to 117.5 MB (bench, docs/development.md).
FIRST_PAGE_KEYS = 1000
# The values of gone hosts' workload endpoints a lean read keeps (_collect_endpoints): what their
# deletes remove, so that neither the report nor an apply reads them again. VALUE_BYTES_PER_HOST for
# each host the run may delete (--max-deletions), ORPHAN_VALUE_BYTES at most: 500 gone hosts of 20
# pods hold ~7.2 MB. Past the budget a value is fetched before the writes (apply.with_befores). At
# 15,000 hosts with 1,500 gone, 16 MB of them took the peak from 186 to 198 MB (goal 200).
ORPHAN_VALUE_BYTES = 8 << 20
VALUE_BYTES_PER_HOST = 32 << 10


def _bytes(text: str) -> bytes:
    # surrogateescape: a key read with bytes that are not UTF-8 is asked for again as it was.
    return text.encode("utf-8", errors="surrogateescape")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


class KeyValue(Protocol):
    """One key of a range answer (etcd's mvccpb.KeyValue, as the gRPC stubs decode it)."""

    @property
    def key(self) -> bytes: ...
    @property
    def mod_revision(self) -> int: ...
    @property
    def value(self) -> bytes: ...


@dataclass(frozen=True)
class Window:
    """Where a page's range ends: `base` followed by the 8-byte number `at`, and the step a
    window is wide. Keys are compared as numbers: the 8 bytes after two keys' common prefix."""

    base: bytes
    at: int
    step: int

    def end(self, limit: bytes) -> bytes | None:
        """The range end, a carry past the 8 bytes going into `base`; None when it is not before
        `limit` (the prefix's end, which the caller then asks for)."""
        width = len(self.base) + 8
        number = (int.from_bytes(self.base, "big") << 64) + self.at
        if number >= 1 << (8 * width):
            return None
        end = number.to_bytes(width, "big")
        return end if end < limit else None

    def wider(self, factor: int) -> Window:
        """The window after this one, `factor` times as wide."""
        return Window(self.base, self.at + self.step * factor, self.step * factor)

    @staticmethod
    def after(first: bytes, last: bytes, keys: int, wanted: int) -> Window | None:
        """The window past `last` that holds about `wanted` keys, if keys go on as densely as the
        `keys` keys from `first` to `last` did; None when there is no telling (read to the end).
        A wrong guess costs a short page or a larger count, never a key: windows meet end to end."""
        common = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first))

        def number(key: bytes) -> int:
            return int.from_bytes(key[common : common + 8].ljust(8, b"\0"), "big")

        low, high = number(first), number(last)
        if keys < 2 or high <= low:
            return None
        step = max(1, (high - low) * wanted // (keys - 1))
        return Window(first[:common], high + step, step)


def _side_by_side(work: Callable[[T], R], items: Sequence[T], at_once: int) -> list[R]:
    """`work` on each item, at most `at_once` in flight, the results in the items' order; the
    first failure is raised. Daemon threads: a call that hangs never holds the process at exit."""
    if len(items) < 2:
        return [work(item) for item in items]
    results: dict[int, R] = {}
    failures: list[tuple[int, BaseException]] = []

    def stripe(first: int) -> None:
        for index in range(first, len(items), at_once):
            try:
                results[index] = work(items[index])
            except BaseException as error:  # handed to the caller's thread, which raises it
                failures.append((index, error))
                return

    threads = [threading.Thread(target=stripe, args=(n,), daemon=True) for n in range(min(at_once, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise min(failures, key=lambda failure: failure[0])[1]
    return [results[index] for index in range(len(items))]


def _bound_after(bounds: Sequence[bytes], start: bytes, end: bytes | None, span: int) -> bytes | None:
    """The `span`-th of the sorted `bounds` after `start` and before `end`, or the last of them
    when fewer lie there (None: none does)."""
    if end is None:
        return None
    first = bisect.bisect_right(bounds, start)
    last = bisect.bisect_left(bounds, end, first) - 1
    return bounds[min(first + span - 1, last)] if last >= first else None


def _next_span(span: int, keys: int, target: int) -> int:
    """How many bounds the next range may cross, after `span` of them held `keys`: as many as
    should hold `target` keys if the next ones are as full, at most twice as many as before."""
    return max(1, min(2 * span, span * target // keys if keys else 2 * span))


Bounds = Sequence[bytes] | Callable[[], Sequence[bytes]]  # a scan's page-window bounds (scan)


def _usable(name: str) -> bool:
    """Whether a key's bound can be made of a name: an empty one, or one with a `/`, would be
    another kind of key."""
    return bool(name) and "/" not in name


class KnownKeys:
    """Keys the read knows lie under a prefix before it reads them (`prefix` + name + `suffix`):
    scan's `bounds` for that prefix. Called for those known so far; a scan on another thread gets
    a tuple that is replaced whole, never changed. `awaited`: the prefix is read (_items) only once
    `complete` is set, as a first page without bounds makes etcd count the whole prefix."""

    def __init__(self, prefix: str, suffix: str = "", names: Iterable[str] = (), awaited: bool = False) -> None:
        self._prefix, self._suffix = prefix, suffix
        self._names: set[str] = set()
        self._keys: tuple[bytes, ...] = ()
        self._remaking = threading.Lock()  # the filing thread and the prefix's scan both learn
        self.complete = threading.Event()
        if not awaited:
            self.complete.set()
        self.learn(names)

    def __call__(self) -> Sequence[bytes]:
        return self._keys

    def learn(self, names: Iterable[str], remake: bool = False) -> None:
        """Names found since; `remake`: the bounds are made anew even if none is new."""
        with self._remaking:
            new = {name for name in names if _usable(name)} - self._names
            if new or remake:
                self._names |= new
                self._keys = tuple(sorted(self._bounds()))

    def _bounds(self) -> list[bytes]:
        """The keys the names known so far give."""
        return [_bytes(f"{self._prefix}{name}{self._suffix}") for name in self._names]

    def seen(self, keys: Sequence[KeyValue]) -> None:
        """A page of the prefix's keys, as its scan reads it (before it asks for the next)."""

    def gap_ends(self, start: bytes) -> Sequence[bytes]:
        """Where the ranges from `start` should end, one after another while they come back empty,
        when no bound or window says: none here, so the next range is the rest of the prefix."""
        return ()


class NamespaceStarts(KnownKeys):
    """Where each namespace's workload endpoints start, as far as the read knows: the namespace
    profiles' (kube-controllers keeps one per namespace in etcd mode), and the namespaces the
    IPAM blocks' pod allocations name, learnt as the blocks are filed beside the endpoints, for a
    cluster without the profiles. The endpoints' pages stop at them (small namespaces side by
    side share a range, or 10,000 namespaces took 10,064 ranges): across a hundred namespaces of
    any size, windows that did not made etcd count 6.8 times the keys it returned; 3.85 times with
    the profiles' starts (docs/development.md).

    A namespace's endpoints are also bounded where the endpoints of some of its hosts start
    (`hosts`, the Calico Node names): an endpoint's name starts with its node's, dashes doubled,
    then `-k8s-` (libcalico-go/lib/names/workloadendpoint.go). Windows guessed from a page's keys
    overshoot on host names (in one namespace, etcd counted 6 to 11.5 times the keys it
    returned); with these it counts about what it returns. How many: one for every
    ENDPOINTS_PER_BOUND pods the blocks' allocations place in the namespace so far (learn_sizes),
    so the bounds follow the pods, however many namespaces there are. Until the blocks say (or
    where they never do: a read that keeps every block whole), every HOSTS_PER_BOUND-th host, in
    each of at most FEW_NAMESPACES namespaces."""

    def __init__(self, names: Iterable[str] = (), hosts: Iterable[str] = (), awaited: bool = False) -> None:
        self._hosts = sorted(host.replace("-", "--") for host in hosts)
        self._per_namespace: dict[str, int] = {}  # host bounds per namespace, by the blocks
        self._reading: str | None = None  # the namespace the last page ended in, where nothing else named it
        super().__init__(WORKLOAD_ENDPOINTS, "/", names, awaited)

    def learn_sizes(self, sizes: Mapping[str, int], share: float) -> None:
        """The namespaces the blocks' pod allocations name, with how many they name in the `share`
        of the blocks filed so far (the endpoints' first pages go out after the first page of blocks)."""
        per_namespace = {name: int(n / share) // ENDPOINTS_PER_BOUND for name, n in sizes.items() if _usable(name)}
        per_namespace = {name: bounds for name, bounds in per_namespace.items() if bounds}
        changed, self._per_namespace = per_namespace != self._per_namespace, per_namespace
        self.learn(sizes, remake=changed)

    def _bounds(self) -> list[bytes]:
        hosts, prefix = self._hosts, self._prefix
        per_namespace = self._per_namespace
        if not per_namespace and len(self._names) <= FEW_NAMESPACES:
            per_namespace = dict.fromkeys(self._names, len(hosts) // HOSTS_PER_BOUND)
        reading = self._reading
        if reading is not None and reading not in per_namespace:
            # Found in the endpoints themselves: its sampled hosts, and where it ends ('0' follows '/').
            per_namespace = {**per_namespace, reading: len(hosts) // HOSTS_PER_BOUND}
            ends = [_bytes(f"{prefix}{reading}0")]
        else:
            ends = []
        sampled = [
            _bytes(f"{prefix}{name}/{host}-k8s-")
            for name, count in per_namespace.items()
            for host in _spaced(hosts, count)
        ]
        return super()._bounds() + sampled + ends

    def seen(self, keys: Sequence[KeyValue]) -> None:
        """The namespace the page ends in: where neither the profiles nor the blocks name the
        namespaces (a keyspace without either), the endpoints' own keys are all that says where
        the pages are (docs/development.md)."""
        if not keys:
            return
        name = _text(keys[-1].key[len(self._prefix) :].partition(b"/")[0])
        if name != self._reading and name not in self._names and _usable(name):
            self._reading = name
            self.learn((), remake=True)

    def gap_ends(self, start: bytes) -> Sequence[bytes]:
        """Past a namespace's end, the next one's name is unknown: a range to the end of the prefix
        would have etcd count every endpoint left. The ranges end instead where the namespace's
        name (or the one `start` is in, from its end on) goes up by one, its last character first:
        empty ones cost etcd nothing, and the first that holds keys holds only names near it.
        Only where the pages found a namespace nothing named: elsewhere the rest is short, and the
        ends cost the read a dozen empty ranges after the last namespace."""
        if self._reading is None:
            return ()
        name, slash, _ = start[len(self._prefix) :].partition(b"/")
        base = name + b"0" if slash else name
        ends = [self._prefix.encode() + base] if slash else []
        for at in reversed(range(len(base))):
            if base[at] < 0xFF:
                ends.append(self._prefix.encode() + base[:at] + bytes([base[at] + 1]) + base[at + 1 :])
        return ends


def _spaced(ordered: Sequence[AnyStr], count: int) -> Sequence[AnyStr]:
    """About `count` of the sorted `ordered`, evenly spaced (_every)."""
    return _every(max(1, len(ordered) // count), ordered) if count > 0 else ()


def block_starts(affinity_keys: Iterable[str]) -> tuple[bytes, ...]:
    """Where every BLOCKS_PER_BOUND-th block the affinity keys name starts: the blocks' page-window
    bounds (scan). Calico writes a block's key as its affinity's, the `<host>/` part left out
    (libcalico-go/lib/backend/model/block.go, block_affinity.go); the IPAM host key names none. A
    block with no affinity is read like any other: a bound is a hint."""
    tails = (key[len(AFFINITIES) :].partition("/")[2] for key in affinity_keys)
    return tuple(_every(BLOCKS_PER_BOUND, sorted(_bytes(BLOCKS + tail) for tail in tails if tail)))


def _every(step: int, ordered: Sequence[AnyStr]) -> Sequence[AnyStr]:
    """Every `step`-th of the sorted `ordered`, from the middle of the first `step`: a bound at the
    very first key would make a range of nothing."""
    return ordered[step // 2 :: step]


def prefix_end(prefix: str) -> bytes:
    """The first key after every key starting with `prefix` (etcd's range_end)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw)


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), repr(value))


def _dig(value: Any, *path: str) -> Any:
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value


class _EndpointSpec(msgspec.Struct, frozen=True):
    node: str = ""
    ipNetworks: list[str] = []  # Calico's name


class _Endpoint(msgspec.Struct, frozen=True):
    spec: _EndpointSpec


_ENDPOINT = msgspec.json.Decoder(_Endpoint)


def endpoint_spec(value: str | bytes) -> tuple[str, list[str]] | None:
    """A workload endpoint's `spec.node` and `spec.ipNetworks`, building nothing else: its
    metadata (pod labels) often outweighs its spec, and there are 20 endpoints to a host. None
    for a value of another shape, which the caller parses whole to say what is wrong with it."""
    try:
        spec = _ENDPOINT.decode(value).spec
    # UnicodeEncodeError: text with surrogates (_text); RecursionError: nested past Python's limit
    except (msgspec.DecodeError, UnicodeEncodeError, RecursionError):
        return None
    return (spec.node, spec.ipNetworks) if spec.node else None


def bare_ip(text: Any) -> str | None:
    """`10.0.1.23/19` or `10.0.1.23` as `10.0.1.23`; None for anything else."""
    if not isinstance(text, str) or not text:
        return None
    address, slash, length = text.partition("/")
    prefix = ascii_number(length)  # as ipaddress reads a prefix
    if "." in address and ":" not in address and (not slash or (prefix is not None and prefix <= 32)):
        try:  # IPv4, as nearly all are: without building ipaddress objects (thousands of Nodes)
            return socket.inet_ntop(socket.AF_INET, socket.inet_pton(socket.AF_INET, address))
        except (OSError, ValueError):  # ValueError: a NUL in the text, which the C library refuses
            return None
    if not slash or (prefix is not None and prefix <= 128):
        try:  # IPv6 read by the C library and written by ipaddress, as it writes any: 4 us, not 13
            return str(ipaddress.IPv6Address(socket.inet_pton(socket.AF_INET6, address)))
        except (OSError, ValueError):
            pass  # a zone (`%eth0`), or no IPv6 address: ipaddress decides
    try:
        return str(ipaddress.ip_interface(text).ip)
    except ValueError:
        return None


def k8s_node_name(collected: Collected, key: str, refs: Any) -> str | None:
    """The Kubernetes Node named by the first `k8s` orchRef, as Calico decides; an empty name
    means "not Kubernetes". A value of the wrong type is reported, not silently skipped."""
    if refs is None:
        return None
    if not isinstance(refs, list):
        collected.problem("malformed_value", key, f"orchRefs is a {type(refs).__name__}, not a list; read as none")
        return None
    for ref in refs:
        if isinstance(ref, dict) and ref.get("orchestrator") == "k8s":
            name = ref.get("nodeName")
            if name is not None and not isinstance(name, str):
                collected.problem("malformed_value", key, f"orchRefs nodeName is {name!r}, not a name; read as none")
                return None
            return name or None
    return None


def _cidr_from_key(segment: str) -> str | None:
    """Calico writes a block CIDR in keys with its `/` as `-` (`10.0.0.0-26`)."""
    address, _, length = segment.rpartition("-")
    network = parse_cidr(f"{address}/{length}")
    return None if network is None else network.text


@dataclass
class Collected:
    """What one read found, grouped by host name before hosts are assembled."""

    nodes: dict[str, StoredItem] = field(default_factory=dict)
    endpoints: dict[str, list[WorkloadEndpoint]] = field(default_factory=lambda: defaultdict(list))
    owned: dict[str, list[StoredItem]] = field(default_factory=lambda: defaultdict(list))
    affinities: dict[str, list[BlockAffinity]] = field(default_factory=lambda: defaultdict(list))
    felix_alive: set[str] = field(default_factory=set)
    blocks: list[IpamBlock] = field(default_factory=list)
    malformed_blocks: list[str] = field(default_factory=list)
    handles: dict[str, IpamHandle] = field(default_factory=dict)
    pools: list[str] = field(default_factory=list)
    cluster: ClusterInfo = field(default_factory=ClusterInfo)
    problems: list[DataProblem] = field(default_factory=list)
    # Set once the hosts are read, when the Kubernetes Node names are known (Calico name -> live).
    # Then a live host's endpoints are kept as their IPs only, and only the handles a plan may
    # write are kept: the blocks are read before the handles, so each handle is judged on arrival.
    live: Callable[[str], bool] | None = None
    k8s_names: Set[str] = frozenset()
    scan: BlockScan | None = None
    named_read: int = 0  # handle keys read that some allocation names (fewer: some are missing)
    value_budget: int = 0  # bytes of gone hosts' endpoint values still to keep
    # Gone hosts a plan of this run will not take (plan.read_first): kept as their Nodes, per-node
    # keys and affinities only, like a live host's, with none of their endpoints, handles or blocks.
    partial: frozenset[str] = frozenset()
    identities: dict[str, CalicoHost] = field(default_factory=dict)  # parsed Nodes (identify)

    def problem(self, kind: str, key: str, message: str) -> None:
        self.problems.append(DataProblem(kind, key, message))

    def json(self, item: StoredItem) -> Any:
        """A value's JSON, None (and said) when it is not JSON. msgspec, as Python objects: a
        5,000-block read decoded in 46 ms, against json's 114 ms. Bytes that are not UTF-8 (kept
        as surrogates, _text) make a value no JSON decoder reads: Calico writes none."""
        try:
            return msgspec.json.decode(item.value or "")
        except msgspec.DecodeError as error:
            self.problem("malformed_value", item.key, f"not valid JSON: {error}")
        except RecursionError:  # Go's decoder reads 10,000 levels; Python's stop near 1,000
            self.problem("malformed_value", item.key, "not valid JSON: nested deeper than calico-gc reads")
        except UnicodeEncodeError:
            self.problem("malformed_value", item.key, "not valid JSON: bytes that are not UTF-8")
        return None


def collect_key(collected: Collected, item: StoredItem) -> None:
    """File one key under the host it belongs to (docs/calico-data.md). The most numerous keys
    (handles, then endpoints) are tested for first."""
    key = item.key
    if key.startswith(HANDLES):
        collect_handle(collected, key, item.revision, item.value)
    elif key.startswith(WORKLOAD_ENDPOINTS):
        collect_endpoint(collected, key, item.revision, item.value or "")
    elif key.startswith(NODES):
        name = key[len(NODES) :]
        if not name or "/" in name:
            collected.problem("unknown_key", key, "not a Calico Node key")
        else:
            collected.nodes[name] = item
    elif key.startswith((NODE_FELIX_CONFIGS, NODE_BGP_CONFIGS)):
        prefix = NODE_FELIX_CONFIGS if key.startswith(NODE_FELIX_CONFIGS) else NODE_BGP_CONFIGS
        collected.owned[key[len(prefix) :]].append(item)
    elif key.startswith((BGP_PEERS, HOST_ENDPOINTS, NODE_STATUSES)):
        value = collected.json(item)
        spec = _dig(value, "spec")
        node = _dig(spec, "node")
        if isinstance(node, str) and node:
            collected.owned[node].append(item)  # peers without spec.node are global: kept
        elif value is not None and (not isinstance(spec, dict) or node not in (None, "")):
            # Not bound to a node we can name: kept, and said, since it may be a host's after all.
            shown = "spec" if not isinstance(spec, dict) else "spec.node"
            collected.problem(
                "malformed_value", key, f"{shown} is {_type_name(node if shown == 'spec.node' else spec)}; kept"
            )
    elif key == CLUSTER_INFORMATION:
        spec = _dig(collected.json(item), "spec")
        ready = _dig(spec, "datastoreReady")
        guid = _dig(spec, "clusterGUID")
        collected.cluster = ClusterInfo(
            guid if isinstance(guid, str) else None, ready if isinstance(ready, bool) else None
        )
    elif key.startswith(IP_POOLS):
        collect_pool(collected, item, "spec", "cidr")
    elif key.startswith(BLOCKS):
        _collect_block(collected, item)
    elif key.startswith(AFFINITIES):
        _collect_affinity(collected, item)
    elif key.startswith(FELIX_STATUS):
        parts = key[len(FELIX_STATUS) :].split("/", 3)
        if len(parts) < 4 or parts[1] != "host" or not parts[2]:
            collected.problem("unknown_key", key, "not a Felix status key")
            return
        host, rest = parts[2], parts[3]
        if rest == "status":
            collected.felix_alive.add(host)
        collected.owned[host].append(item)


def collect_page(collected: Collected, prefix: str, kvs: Sequence[KeyValue]) -> None:
    """collect_key for a page of `prefix`'s keys as etcd v3 answers them, making no StoredItem of
    what is not kept: an endpoint's value stays bytes (nothing of it is kept but its node and
    IPs), and a handle becomes an item only when a plan may write it (at 5,000 hosts, 200,000
    values and items). The prefix is known, so no key is tested for it."""
    if prefix == HANDLES:
        _collect_handles(collected, ((_text(kv.key), kv.mod_revision, _text(kv.value)) for kv in kvs))
    elif prefix == WORKLOAD_ENDPOINTS:
        _collect_endpoints(collected, ((kv.key, kv.mod_revision, kv.value) for kv in kvs))
    else:
        for kv in kvs:
            collect_key(collected, StoredItem(_text(kv.key), kv.mod_revision, _text(kv.value)))


def collect_handle(collected: Collected, key: str, revision: int, value: str | None) -> None:
    """A handle, kept only when a plan may write it (a lean read) and parsed only when a release
    needs it: nearly all handles belong to live pods."""
    _collect_handles(collected, [(key, revision, value)])


def _collect_handles(collected: Collected, entries: Iterable[tuple[str, int, str | None]]) -> None:
    """Handles, a page at a time (105,000 at 5,000 hosts), kept only when a plan may write them:
    a handle that counts other than what the blocks hold (stale, or holding nothing), or counts
    an allocation that no live host owns, or is the tunnel handle of a host that is not live.
    Every block has been read by now (the handles follow the blocks in one scan, IPAM_GROUPS)."""
    live, partial = collected.live, collected.partial
    if live is None:
        for key, revision, value in entries:
            collected.handles[key[len(HANDLES) :]] = IpamHandle(StoredItem(key, revision, value), key[len(HANDLES) :])
        return
    scan = scanning(collected)
    held, wanted, named = scan.held, scan.wanted, 0
    for key, revision, value in entries:
        handle_id = key[len(HANDLES) :]
        exact = held.exact(handle_id, value)
        counted = exact or handle_id in held  # one an allocation names (exact: the blocks hold it)
        named += counted
        if exact or (counted and _counts_what_is_held(held, handle_id, value)):
            node = tunnel_handle_node(handle_id) if handle_id.startswith(TUNNEL_HANDLE_PREFIXES) else None
            if handle_id not in wanted and (node is None or live(node) or node in partial):
                continue  # a live pod's, as nearly every handle is: no plan writes it
        collected.handles[handle_id] = IpamHandle(StoredItem(key, revision, value), handle_id)
    collected.named_read += named


def collect_endpoint(collected: Collected, key: str, revision: int, value: str | bytes) -> None:
    """A workload endpoint filed under its node, as its key, its IPs, and no value."""
    _collect_endpoints(collected, [(_bytes(key), revision, value)])


def _collect_endpoints(collected: Collected, entries: Iterable[tuple[bytes, int, str | bytes]]) -> None:
    """Workload endpoints filed under their nodes, as their keys and IPs; of a live host's, only
    the IPs are kept, for the block scan (its key is never made text). A gone host's keeps its
    value too, within the read's budget (ORPHAN_VALUE_BYTES); before the Kubernetes names are
    known none does (100,000 endpoints would hold ~75 MB). A page at a time: there are 20
    endpoints to a host, and a call per endpoint was a fifth of their filing."""
    live, endpoints, partial = collected.live, collected.endpoints, collected.partial
    held: list[str] = []  # the IPs of the page's endpoints, for the block scan
    slashes = WORKLOAD_ENDPOINTS.count("/") + 1  # <namespace>/<name>
    for key, revision, value in entries:
        if key.count(b"/") != slashes:
            collected.problem("unknown_key", _text(key), "not a workload endpoint key")
            continue
        # Another shape is parsed whole, to say what is wrong with it.
        typed = endpoint_spec(value) or _endpoint_of_any_shape(collected, _text(key), revision, value)
        if typed is None:
            continue
        node, networks = typed
        # Kept as text: the block scan numbers them (ip_number), and a plan validates an orphan's.
        ips = [n.split("/", 1)[0] for n in networks]
        node = sys.intern(node)
        kept: str | None = None  # without it, an apply fetches the value (apply.with_befores)
        if live is not None:
            held += ips  # all the leak check needs of an endpoint
            if live(node) or node in partial:
                continue  # a live host's, or one not planned this run
            if len(value) <= collected.value_budget:
                collected.value_budget -= len(value)
                kept = value if isinstance(value, str) else _text(value)
        endpoints[node].append(WorkloadEndpoint(StoredItem(_text(key), revision, kept), node, tuple(ips)))
    if held:
        scanning(collected).held_by_endpoints(held)


def _endpoint_of_any_shape(
    collected: Collected, key: str, revision: int, value: str | bytes
) -> tuple[str, list[str]] | None:
    """A workload endpoint's node and networks from its JSON however shaped, or None (said,
    unless the value is not JSON, which Collected.json says)."""
    text = value if isinstance(value, str) else _text(value)
    spec = _dig(collected.json(StoredItem(key, revision, text)), "spec")
    node = _dig(spec, "node")
    if not isinstance(node, str) or not node:
        if spec is not None:
            collected.problem("malformed_value", key, "workload endpoint without spec.node")
        return None
    listed = _dig(spec, "ipNetworks")
    return node, [n for n in listed if isinstance(n, str)] if isinstance(listed, list) else []


def collect_pool(collected: Collected, item: StoredItem, *path: str) -> None:
    """An IP pool's CIDR at `path`, for the IPAM check's utilisation (etcd v3 `spec.cidr`, v2
    `cidr`). A value that is no JSON was said as such already."""
    value = collected.json(item)
    if value is None:
        return
    cidr = _dig(value, *path)
    try:
        collected.pools.append(str(ipaddress.ip_network(str(cidr), strict=False)))
    except ValueError:
        collected.problem("malformed_value", item.key, f"IP pool cidr {cidr!r} is not a network")


def _collect_block(collected: Collected, item: StoredItem) -> None:
    parts = item.key[len(BLOCKS) :].split("/")
    cidr = _cidr_from_key(parts[2]) if len(parts) == 3 and parts[1] == "block" else None
    if cidr is None:
        collected.problem("unknown_key", item.key, "not an IPAM block key")
        return
    value = collected.json(item)
    if value is None:
        collected.malformed_blocks.append(cidr)
        return
    problem = block_shape_problem(value, cidr)
    if problem is not None:
        collected.malformed_blocks.append(cidr)
        collected.problem("malformed_value", item.key, problem)
        return
    if collected.live is None:
        collected.blocks.append(IpamBlock(item, cidr, *summarize_block(value)))
        return
    affine_host, owners, touched = scanning(collected).add(cidr, value)
    # A block no orphan touches keeps only its summary; its value is read again if a plan needs it.
    kept = item if touched else StoredItem(item.key, item.revision, None)
    collected.blocks.append(IpamBlock(kept, cidr, affine_host, owners))


def _handles_at(block: IpamBlock, ordinals: Iterable[int]) -> Iterator[str]:
    """The handle ids of a block's allocations at `ordinals` (its value, read again)."""
    data = block_data(block)
    for ordinal in ordinals:
        handle = attribute_at(data, ordinal).get("handle_id")
        if isinstance(handle, str):
            yield handle


def scanning(collected: Collected) -> BlockScan:
    """The block scan of a read that knows which hosts are live (IPAM_GROUPS)."""
    if collected.scan is None:
        collected.scan = BlockScan(
            collected.k8s_names,
            owner_live=collected.live,
            parse_ip=ip_number,
            defer_unowned=True,
            partial=collected.partial,
        )
    return collected.scan


class _HandleValue(msgspec.Struct, frozen=True):
    block: dict[str, int] = {}
    deleted: bool = False


_HANDLE_VALUE = msgspec.json.Decoder(_HandleValue)


def _counts_what_is_held(held: Held, handle_id: str, value: str | None) -> bool:
    """A handle whose text is not what Calico's Go encoder writes (another writer's spacing or field
    order) that counts exactly what its blocks hold: judged by what it says, not by its bytes, or a
    datastore written by another tool would have every handle kept (5,000 hosts: 121 -> 192 MB).
    Asked only of a handle that some allocation names."""
    if value is None:
        return False
    try:
        handle = _HANDLE_VALUE.decode(value)
    # UnicodeEncodeError: bytes that are not UTF-8 (_text); RecursionError: nested past Python's limit
    except (msgspec.DecodeError, UnicodeEncodeError, RecursionError):
        return False  # another shape: kept, for the planner to say what is wrong with it
    return not handle.deleted and held.holds_exactly(handle_id, handle.block)


def _collect_affinity(collected: Collected, item: StoredItem) -> None:
    parts = item.key[len(AFFINITIES) :].split("/")
    if len(parts) == 1 and parts[0]:
        collected.owned[parts[0]].append(item)  # the IPAM host key itself
        return
    cidr = _cidr_from_key(parts[3]) if len(parts) == 4 and parts[2] == "block" else None
    if cidr is None or parts[1] not in ("ipv4", "ipv6"):
        collected.problem("unknown_key", item.key, "not a block affinity key")
        return
    # Affinity values ({"state": ...} or, in old data, empty) are only ever deleted, never read.
    collected.affinities[parts[0]].append(BlockAffinity(item, parts[0], cidr))


def _filed(name: str, node: StoredItem | None, collected: Collected) -> CalicoHost:
    """The host `name` with everything filed under it; registered when it has a Calico Node."""
    return CalicoHost(name, node, None, registered=node is not None, **_filed_under(name, collected))


def _filed_under(name: str, collected: Collected) -> dict[str, Any]:
    """What is filed under `name`, as CalicoHost's fields, taken out of `collected`."""
    return {
        # Sorted by key: prefixes are read side by side, so arrival order is not stable.
        "workload_endpoints": tuple(sorted(collected.endpoints.pop(name, ()), key=lambda e: e.item.key)),
        "affinities": tuple(sorted(collected.affinities.pop(name, ()), key=lambda a: a.item.key)),
        "owned": tuple(sorted(collected.owned.pop(name, ()), key=lambda i: i.key)),
        "felix_alive": name in collected.felix_alive,
    }


def _identity(name: str, node: StoredItem, collected: Collected) -> CalicoHost:
    """A registered host as its Calico Node says: its Kubernetes link and addresses, or why its
    value could not be read; without the data filed under it (_filed)."""
    value = collected.json(node)
    spec = _dig(value, "spec")
    if not isinstance(spec, dict):
        if value is not None:
            collected.problem("malformed_value", node.key, "Calico Node without a spec")
        return CalicoHost(name, node, None, problem="its Calico Node value could not be parsed")
    return CalicoHost(
        name,
        node,
        k8s_node_name(collected, node.key, spec.get("orchRefs")),
        ipv4=bare_ip(_dig(spec, "bgp", "ipv4Address")),
        ipv6=bare_ip(_dig(spec, "bgp", "ipv6Address")),
        tunnel_ips=tuple(ip for ip in (bare_ip(_dig(spec, *path)) for path in TUNNEL_FIELDS) if ip),
    )


def _host(name: str, node: StoredItem, collected: Collected) -> CalicoHost:
    """A registered host: its identity (as parsed once, _identity), with the Node as the read
    keeps it (a live host's without its value) and what is filed under it."""
    identity = collected.identities.pop(name, None) or _identity(name, node, collected)
    return replace(identity, node=node, **_filed_under(name, collected))


def unregistered_names(collected: Collected, registered: set[str]) -> set[str]:
    """Names that data is stored for (IPAM affinities, blocks, allocations, tunnel handles,
    endpoints, per-node config, status) but that have no Calico Node."""
    named = set(collected.endpoints) | set(collected.owned) | set(collected.affinities)
    named |= {b.affine_host for b in collected.blocks if b.affine_host}
    named = named.union(*(b.owners.nodes() for b in collected.blocks))
    named |= {node for node in map(tunnel_handle_node, collected.handles) if node}
    return named - registered


def build_inventory(items: Iterator[StoredItem], revision: Callable[[], int]) -> Inventory:
    """Turn etcd key-values into the shared model. Pure; unknown shapes become problems.

    `revision` is asked for once the items are consumed: a streamed read learns it on the way.
    """
    collected = Collected()
    for item in items:
        collect_key(collected, item)
    return assemble(collected, revision())


def identify(collected: Collected) -> None:
    """Parse every Calico Node read so far (for liveness and _host, which would parse it again)."""
    for name, node in collected.nodes.items():
        if name not in collected.identities:
            collected.identities[name] = _identity(name, node, collected)


def left_out(collected: Collected, scope: Scope) -> frozenset[str]:
    """The gone hosts known once the hosts' own keys are read (their Calico Nodes, per-node keys and
    affinities) that `scope` leaves out: those a plan of this run will not take. It is given the
    live hosts too, as a plan is: an orphan sharing a live host's IP is a conflict, taken first. A
    name first seen later (an allocation's, an endpoint's) is read whole."""
    live = collected.live
    assert live is not None
    names = sorted({*collected.nodes, *collected.owned, *collected.affinities})
    hosts = [collected.identities.get(name) or CalicoHost(name, None, None, registered=False) for name in names]
    # An identity is parsed from its Node alone (felix_alive False): replaced only where Felix is
    # (dataclasses.replace is 3 us, and there are as many hosts as Nodes).
    hosts = [replace(h, felix_alive=True) if h.name in collected.felix_alive else h for h in hosts]
    return frozenset(name for name in names if not live(name)) - scope(hosts)


def liveness(collected: Collected, k8s_names: Set[str], config: Config) -> Callable[[str], bool]:
    """Whether a Calico name is a live host (plan.is_live), once every Calico Node is read."""
    identify(collected)
    known: dict[str, bool] = {}
    for name, node in collected.nodes.items():
        identity = collected.identities[name]
        known[name] = is_live(identity, k8s_names, config)
        if known[name]:  # a live host's Node is never written: its value is not kept
            collected.nodes[name] = StoredItem(node.key, node.revision, None)

    def live(name: str) -> bool:
        found = known.get(name)
        if found is None:
            found = known[name] = is_live(CalicoHost(name, None, None, registered=False), k8s_names, config)
        return found

    return live


def assemble(collected: Collected, revision: int) -> Inventory:
    """The inventory from what was collected: hosts with what is filed under them."""
    hosts = [_host(name, node, collected) for name, node in sorted(collected.nodes.items())]
    # Names with data but no Calico Node (docs/calico-data.md, "IPAM-only hosts"): removed like a
    # host once no Kubernetes Node has that name, minus the Node they do not have.
    hosts += [_filed(name, None, collected) for name in sorted(unregistered_names(collected, set(collected.nodes)))]
    return inventory_of(collected, hosts, collected.cluster, revision)


def inventory_of(collected: Collected, hosts: Sequence[CalicoHost], cluster: ClusterInfo, revision: int) -> Inventory:
    """The Inventory of assembled `hosts` and what else was collected (etcd v3 and v2 alike)."""
    return Inventory(
        hosts=tuple(hosts),
        blocks=tuple(collected.blocks),
        handles=collected.handles,
        malformed_blocks=tuple(collected.malformed_blocks),
        pools=tuple(sorted(collected.pools)),
        cluster=cluster,
        problems=tuple(sorted(collected.problems, key=lambda p: (p.key, p.kind))),
        revision=revision,
    )


class EtcdV3Datastore:
    """Reads in pinned-revision pages; writes only through mod-revision-guarded txns."""

    type = "etcdv3"

    def __init__(self, config: Config, retry: RetryPolicy, explain_empty: Callable[[], bool] | None = None) -> None:
        self._explain_empty = explain_empty
        # gRPC comes with the first etcd v3 datastore, not with this module: the etcd v2 adapter
        # shares this module's key layout, and it and the Kubernetes datastore do without
        # gRPC's 11.5 MB.
        from job.adapters.datastores.etcd_grpc import EtcdGrpc

        self._etcd: EtcdGrpc = EtcdGrpc(config, retry)
        self._config = config
        self._page_size = config.page_size
        # What the ranges cost etcd: keys it returned, and keys it counted (every key from a
        # range's start to its end, whatever its limit: the work windows spare it).
        self._ranges = {"requests": 0, "keys": 0, "keys_counted": 0}
        self._ranges_lock = threading.Lock()

    def describe(self) -> dict[str, object]:
        with self._ranges_lock:
            ranges = dict(self._ranges)
        return {"type": self.type, "endpoints": self._etcd.endpoints, "ranges": ranges}

    def range(
        self, start: str | bytes, end: bytes | None, revision: int | None, limit: int = 0, keys_only: bool = False
    ) -> tuple[Any, int]:
        """Keys from `start` to `end` (None: `start` alone) at `revision` (None: now): etcd's
        RangeResponse, and its size in bytes."""
        key = _bytes(start) if isinstance(start, str) else start
        answer, size = self._etcd.range(key, end or b"", limit or self._page_size, revision or 0, keys_only)
        with self._ranges_lock:
            self._ranges["requests"] += 1
            self._ranges["keys"] += len(answer.kvs)
            self._ranges["keys_counted"] += answer.count
        if answer.header.revision <= 0:
            raise DatastoreError(
                "etcd answered a range without a revision: not etcd? check ETCD_ENDPOINTS (--etcd-endpoints)",
                "bad_answer",
            )
        kvs = answer.kvs
        # Keys before the start (or past the end) asked for: the next page would start where this
        # one did, again and again (a server answering one page whatever it is asked).
        if kvs and (kvs[0].key < key or (kvs[-1].key >= end if end else kvs[-1].key != key)):
            raise DatastoreError(
                f"etcd answered a range from {key!r} with keys outside it: not etcd? check ETCD_ENDPOINTS "
                "(--etcd-endpoints)",
                "bad_answer",
            )
        return answer, size

    def scan(
        self, prefix: str, revision: int | None = None, keys_only: bool = False, bounds: Bounds = ()
    ) -> Iterator[tuple[Sequence[KeyValue], int]]:
        """Pages of raw key-values under `prefix`, all at one revision (the first page's).

        A page holds at most page_size keys: the first at most FIRST_PAGE_KEYS, the others
        about PAGE_BYTES.
        etcd counts every key from a page's start to its range end, so a plain paged read of N
        keys makes etcd count ~N²/2 keys per page size (at 5,000 hosts, a quarter of etcd's
        work). Each page after the first therefore asks for a Window that should hold about
        WINDOW_PAGES pages, not for the rest of the prefix. A window that holds fewer keys ends
        the page early and the next one is wider; after an empty one (a gap in the keys) the
        next page asks for the rest again, or first for the gap's ends that `bounds` gives
        (KnownKeys.gap_ends). Windows meet end to end: every key is read once.

        `bounds` (sorted keys) are where the keys' density may change: a window never crosses
        the bound the pages read up to, and a range from a bound ends at a later one, so its count
        is only what lies between. It crosses as many bounds as the keys of the last span say
        should hold a page (at most twice as many, fewer when it held more): where bounds
        are close (a thousand namespaces of a few endpoints each) a range per bound would cost a
        round trip each. Keys between bounds are read like any others: a bound is a hint, never a
        filter. A callable gives the bounds known so far, asked again when a span is chosen."""
        end = prefix_end(prefix) if prefix.endswith(("/", ".")) else None
        start, limit = _bytes(prefix), min(self._page_size, FIRST_PAGE_KEYS)
        window: Window | None = None  # where the next page's range ends (None: the prefix's end)
        cap: bytes | None = None  # the bound the pages read up to, `span` bounds past where they began
        span, spanned = 1, 0  # spanned: the keys read since they began
        known = bounds if isinstance(bounds, KnownKeys) else None
        gap: list[bytes] | None = None  # the ends still to try from where a range found no keys
        while True:
            bound = None if window is None or end is None else window.end(end)
            if cap is None or cap <= start:
                cap = _bound_after(bounds() if callable(bounds) else bounds, start, end, span)
            capped = cap is not None and (bound is None or cap < bound)
            if capped:
                bound, gap = cap, None
            elif bound is None and end is not None and known is not None:
                if gap is None:
                    gap = [e for e in known.gap_ends(start) if start < e < end]
                bound = gap.pop(0) if gap else None
            response, size = self.range(start, bound or end, revision, limit, keys_only)
            if revision is None:  # the header says the store's current revision, not the one asked for
                revision = response.header.revision
            kvs = response.kvs
            spanned += len(kvs)
            if kvs or bound is None:
                yield kvs, revision
            if end is None:
                return
            if kvs:  # the next page is sized by this one's bytes per key
                limit = max(1, min(self._page_size, PAGE_BYTES * len(kvs) // size)) if size else self._page_size
                gap = None
                if known is not None:
                    known.seen(kvs)
            if response.more and kvs:
                last = kvs[-1].key
                start = last + b"\0"
                window = Window.after(kvs[0].key, last, len(kvs), WINDOW_PAGES * limit)
            elif bound is None:
                return
            elif capped:  # the keys up to a bound are read: from it, a range to the next bounds
                start, window = bound, None
                span, spanned = _next_span(span, spanned, limit), 0
            else:  # a window or a gap's range held less than a page: the next one starts where it ended
                start = bound
                # A window wider by what it missed; after an empty one (a gap in the keys) the gap's
                # next end (KnownKeys.gap_ends), else the rest of the prefix.
                window = window.wider(max(2, min(16, WINDOW_PAGES * limit // len(kvs)))) if kvs and window else None

    @contextlib.contextmanager
    def _items(
        self,
        revision: int,
        groups: Sequence[tuple[str, ...]],
        prefix_read: Callable[[str], None] | None = None,
        bounds: Mapping[str, Bounds] | None = None,
    ) -> Iterator[Iterator[tuple[str, Sequence[KeyValue]]]]:
        """Every page of every prefix at `revision`, with its prefix, each group's prefixes
        scanned in turn, the groups side by side. `prefix_read` is called with each prefix once
        all its pages are yielded and handled; `bounds` are a prefix's page-window bounds (scan).
        The workers start on entry, so that etcd serves the first pages while the caller still
        waits on something else; they stop on exit.

        Within a prefix pages must follow one another; across prefixes they need not, so the
        large prefixes are scanned by their own workers while this thread files the pages: etcd
        serialises the next pages while Python parses this one. At most READ_QUEUE_PAGES pages
        wait in memory. The GIL is passed on more often meanwhile, so that a worker with an answer
        asks for its next page soon (READ_SWITCH_INTERVAL).
        """
        pages: queue.Queue[tuple[str, Sequence[KeyValue]] | str | BaseException | None] = queue.Queue(READ_QUEUE_PAGES)
        stop = threading.Event()

        def deliver(page: tuple[str, Sequence[KeyValue]] | str | BaseException | None) -> None:
            while not stop.is_set():
                try:
                    pages.put(page, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def scan_all(prefixes: tuple[str, ...]) -> None:
            try:
                for prefix in prefixes:
                    known = (bounds or {}).get(prefix, ())
                    while isinstance(known, KnownKeys) and not known.complete.wait(0.1):
                        if stop.is_set():
                            return
                    for kvs, _ in self.scan(prefix, revision, bounds=known):
                        deliver((prefix, kvs))
                    deliver(prefix)  # after its last page: every key of it is filed
                deliver(None)
            except BaseException as error:  # handed to the reading thread, which raises it
                deliver(error)

        def items() -> Iterator[tuple[str, Sequence[KeyValue]]]:
            running = len(groups)
            while running:
                page = pages.get()
                if page is None:
                    running -= 1
                elif isinstance(page, BaseException):
                    raise page
                elif isinstance(page, str):
                    if prefix_read is not None:
                        prefix_read(page)
                else:
                    yield page

        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(READ_SWITCH_INTERVAL)
        try:
            for group in groups:
                threading.Thread(target=scan_all, args=(group,), name="etcd-scan", daemon=True).start()
            yield items()
        finally:
            stop.set()
            sys.setswitchinterval(switch_interval)

    def read(self, kube_names: Callable[[], Set[str]] | None = None, scope: Scope | None = None) -> Inventory:
        inventory = self._read(kube_names, scope)
        if not any(h.registered for h in inventory.hosts) and self._explain_empty is not None and self._explain_empty():
            raise DatastoreMismatch(
                "the etcd v3 keyspace holds no Calico hosts but the etcd v2 keyspace does: this looks like "
                "Calico 2.x; set DATASTORE_TYPE=etcdv2 (or --datastore-type etcdv2)"
            )
        return inventory

    def _read(self, kube_names: Callable[[], Set[str]] | None, scope: Scope | None) -> Inventory:
        """The hosts first; then the blocks and the handles beside the endpoints. Told the
        Kubernetes Node names, it keeps of live hosts only what the block scan needs
        (Collected.live, docs/design.md): memory then follows hosts and orphans, not keys."""
        # One revision for every prefix: a consistent snapshot of the whole datastore.
        revision = self.range(CLUSTER_INFORMATION, None, None)[0].header.revision
        collected = Collected(value_budget=min(ORPHAN_VALUE_BYTES, self._config.max_deletions * VALUE_BYTES_PER_HOST))
        # Hundreds of thousands of small objects and no cycles: the cyclic GC only slows this down.
        # What is made meanwhile is frozen before it resumes: resumed first, its next pass walked
        # all of it once (0.1 s at 2,500 gone hosts); the inventory lives to the run's end anyway.
        gc.disable()
        try:
            with self._items(revision, HOST_GROUPS) as items:
                for prefix, kvs in items:
                    collect_page(collected, prefix, kvs)
            # Without profiles the endpoints wait for the first page of blocks, which names the
            # namespaces: a first page with no bound made etcd count every endpoint. With them they
            # start at once (waiting cost a one-namespace dry run 0.2 s), and the bounds that
            # follow each namespace's pods come as the blocks are filed.
            profiles = self._namespace_profiles(revision)
            starts = NamespaceStarts(profiles, collected.nodes, awaited=not profiles)
            # Handles the blocks name, a sample (BlockScan.handle_samples): the handles' pages stop
            # at them, as their keys (random container ids, tunnel handles by node) give
            # windows no density to go by. The handles are read once the blocks are filed.
            handle_keys = KnownKeys(HANDLES, awaited=True)

            def prefix_read(prefix: str) -> None:
                if prefix != BLOCKS:
                    return
                if collected.live is not None:
                    scan = scanning(collected)
                    handle_keys.learn(scan.handle_samples)
                    scan.blocks_read()
                handle_keys.complete.set()
                starts.complete.set()  # every block is filed (there may be none): the endpoints wait no longer

            affine = [a.item.key for host in collected.affinities.values() for a in host]
            blocks = block_starts(affine)
            bounds: dict[str, Bounds] = {WORKLOAD_ENDPOINTS: starts, BLOCKS: blocks, HANDLES: handle_keys}
            # Entered before the Kubernetes Node names are awaited: etcd serves the first pages meanwhile.
            with self._items(revision, IPAM_GROUPS, prefix_read, bounds) as items:
                identify(collected)  # while the names may still be on their way
                names = None if kube_names is None else kube_names()
                if names is not None:
                    collected.live, collected.k8s_names = liveness(collected, names, self._config), names
                    for name in [n for n in {*collected.owned, *collected.affinities} if collected.live(n)]:
                        collected.owned.pop(name, None)  # a live host's: never planned
                        collected.affinities.pop(name, None)
                    if scope is not None:
                        collected.partial = left_out(collected, scope)
                else:
                    starts.complete.set()  # a full read scans no block as it files it
                for prefix, kvs in items:
                    collect_page(collected, prefix, kvs)
                    if prefix == BLOCKS and collected.scan is not None:
                        filed = min(1, max(1, len(collected.blocks)) / max(1, len(affine)))
                        starts.learn_sizes(collected.scan.namespaces, filed)
                        starts.complete.set()
            inventory = assemble(collected, revision)
            return inventory if collected.live is None else self._completed(inventory, collected)
        finally:
            gc.freeze()
            gc.enable()

    def _namespace_profiles(self, revision: int) -> list[str]:
        """The namespaces kube-controllers keeps a profile for (a read of their keys only)."""
        pages = self.scan(NAMESPACE_PROFILES, revision, keys_only=True)
        return [_text(kv.key)[len(NAMESPACE_PROFILES) :] for kvs, _ in pages for kv in kvs]

    def _completed(self, inventory: Inventory, collected: Collected) -> Inventory:
        """A lean read (Collected.live) with what a plan may still need read again at its
        revision: the blocks that may hold leaked IPs, the handles of those, and the blocks that
        a plan may edit or count in."""
        assert collected.live is not None
        live, scan, revision, partial = collected.live, scanning(collected), inventory.revision, collected.partial
        planned = [host for host in inventory.hosts if not live(host.name) and host.name not in partial]
        # Allocations that name no node, at a gone host's known IPs: a plan may free them (BlockScan.unowned).
        unowned = scan.unowned_at(ip for host in planned for ip in host.known_ips)
        leaky = {c for c, bits in scan.unheld.items() if bits}
        blocks = self._with_values(inventory.blocks, leaky | set(unowned), revision)
        scan.attribute(blocks)
        leaked = {a.handle for found in scan.pod_ips.values() for a in found}
        leaked |= {h for b in blocks if b.cidr in unowned for h in _handles_at(b, unowned[b.cidr])}
        handles = dict(inventory.handles)
        for item in self._at([HANDLES + h for h in sorted(leaked - set(handles))], revision).values():
            handles[item.key[len(HANDLES) :]] = IpamHandle(item, item.key[len(HANDLES) :])
        # The blocks a plan may edit or count in: those its handles hold IPs in (a leaked IP's
        # included) or count (ipam._held_after), those an orphan has an affinity key for; and
        # those that hold the audit's sample of allocations without a handle (dangling_blocks),
        # or allocations naming no node that no endpoint holds (BlockScan.unclaimed: the audit
        # names their handles; a gone host read lean, Inventory.partial, kept no value of its own).
        needed = {a.cidr for host in planned for a in host.affinities}
        needed.update(cidr for cidr, bits in scan.unclaimed.items() if bits)
        for handle_id, handle in handles.items():
            node = tunnel_handle_node(handle_id)
            if node is not None and (live(node) or node in partial):
                continue  # a live host's, or one not planned: written by no plan
            needed.update(scan.held.counts(handle_id))
            if scan.held.exact(handle_id, handle.item.value):
                continue  # it counts just what the blocks hold for it: no other block to add
            counted = parse_handle(handle.item.value or "")
            if isinstance(counted, dict) and isinstance(counted.get("block"), dict):
                needed.update(c for c in map(normal_cidr, counted["block"]) if c)
        missing: set[int] = set()
        sampled: set[str] = set()
        if collected.named_read < len(scan.held):  # some allocation names a handle that is not there
            missing = scan.held.hashes() - {hash(key[len(HANDLES) :]) for key in self._keys(HANDLES, revision)}
            scan.dangling_count, sampled = dangling_blocks(scan.held, missing)
            needed.update(sampled)
        blocks = self._with_values(blocks, needed, revision)
        if missing:
            scan.dangling = find_dangling((b for b in blocks if b.cidr in sampled), missing)
        return replace(inventory, blocks=blocks, handles=handles, scan=scan, partial=partial)

    def _with_values(self, blocks: tuple[IpamBlock, ...], cidrs: Set[str], revision: int) -> tuple[IpamBlock, ...]:
        """`blocks` with the values of those in `cidrs` that were kept as summaries read again."""
        wanted = [b.item.key for b in blocks if b.item.value is None and b.cidr in cidrs]
        if not wanted:
            return blocks
        read = self._at(wanted, revision)
        return tuple(replace(b, item=read[b.item.key]) if b.item.key in read else b for b in blocks)

    def _keys(self, prefix: str, revision: int) -> Iterator[str]:
        """Every key under `prefix` at `revision`, without values."""
        for kvs, _ in self.scan(prefix, revision, keys_only=True):
            yield from (_text(kv.key) for kv in kvs)

    def _at(self, keys: Sequence[str], revision: int | None) -> dict[str, StoredItem]:
        """Exact keys at `revision` (None: now), in transactions of 128 reads, TXNS_AT_ONCE of them
        in flight; absent keys left out."""
        chunks = [
            [_bytes(key) for key in keys[start : start + MAX_TXN_OPS]] for start in range(0, len(keys), MAX_TXN_OPS)
        ]
        found: dict[str, StoredItem] = {}
        for kvs in _side_by_side(lambda chunk: self._etcd.get(chunk, revision or 0), chunks, TXNS_AT_ONCE):
            for kv in kvs:
                key = _text(kv.key)
                found[key] = StoredItem(key, kv.mod_revision, _text(kv.value))
        return found

    def current(self, keys: Sequence[str]) -> dict[str, StoredItem]:
        return self._at(keys, None)

    def handles(self, ids: Iterable[str]) -> dict[str, IpamHandle]:
        found = self._at([HANDLES + handle_id for handle_id in ids], None)
        return {key[len(HANDLES) :]: IpamHandle(item, key[len(HANDLES) :]) for key, item in found.items()}

    def commit(self, step: Step) -> int:
        # An absent key's mod_revision compares as 0 (CREATE): a create is "still absent".
        writes = [(_bytes(w.key), w.revision, None if w.value is None else _bytes(w.value)) for w in step.writes]
        try:
            return len(step.writes) if self._etcd.write_if_unchanged(writes) else 0
        except DatastoreError as error:
            error.in_doubt = len(writes) if error.in_doubt else 0  # one transaction: all of it, or none
            raise

    def close(self) -> None:
        self._etcd.close()
