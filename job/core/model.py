"""Plain data shared by every layer: what was read, what was decided, what was done.

Nothing here talks to a server. Datastore keys are carried as opaque strings: adapters make
them, the planner only passes them through to the report and back to the adapter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from job.config import MAX_IP_COOLDOWN_S
from job.core.kept import Keep

JsonObject = dict[str, Any]


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 time as Kubernetes, Felix and our state write it; None when it is not one. A
    time without a zone (written by hand) is read as UTC, so that it compares with the clock."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def ascii_number(text: str) -> int | None:
    """A whole number written in ASCII digits only, as Go's strconv and ipaddress read one; None
    for anything else. int() alone also reads other scripts' digits (`٣`), `1_0` and spaces,
    and refuses more than 4,300 digits with a ValueError (a prefix or annotation anyone may edit)."""
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts: no number Calico or calico-gc writes
        return None


@dataclass(frozen=True)
class Cooldown:
    """IPAMConfig's `ipCooldownSeconds` (0-1200) and the run's clock: how Calico 3.32+ releases an
    address (libcalico-go/lib/ipam/ipam_block.go, `release`, `garbageCollect`; core/ipam.py).
    `source` says where the seconds come from: `ipamconfig`, `setting`, or `assumed` (the
    longest Calico allows, where it was not read but addresses are seen cooling)."""

    seconds: int
    now: datetime
    source: str = "ipamconfig"


def known_cooldown(read: int | None, setting: int | None, cooling_seen: bool, now: datetime) -> Cooldown | None:
    """The cooldown a run follows. Read (KDD) or set (etcd), it is that. Unknown, it is the
    longest Calico allows once any address is seen cooling: only a Calico with a cooldown writes
    one, and a release held that long is never freed early. Unknown with nothing cooling: None,
    releases free at once, as every Calico before 3.32 expects (a cooling attribute would be a
    handle-less allocation to it)."""
    if read is not None:
        return Cooldown(read, now)
    if setting is not None:
        return Cooldown(setting, now, "setting")
    if cooling_seen:
        return Cooldown(MAX_IP_COOLDOWN_S, now, "assumed")
    return None


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One datastore entry as read: its key, the revision to compare on, the raw value.

    `value` is None for entries only ever deleted whole and too many to hold (workload
    endpoints): the report fetches their values for just the hosts it deletes.
    """

    key: str
    revision: int
    value: str | None


@dataclass(frozen=True, slots=True)
class WorkloadEndpoint:
    item: StoredItem
    node: str
    ips: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BlockAffinity:
    """A host's claim on an IPAM block (the affinity key, not the block)."""

    item: StoredItem
    host: str
    cidr: str


class Owners(Mapping[int, str | None]):
    """Each allocated ordinal of a block and the node it is allocated to, in ordinal order.

    Nearly every ordinal is the affine host's, so those are one bitmask, and only the others a
    dict: a read holds one of these per block (15,000 blocks of 20 pods: 8 MB as plain dicts).
    """

    __slots__ = ("_bits", "_host", "_others")

    def __init__(self, host: str | None, bits: int, others: dict[int, str | None] | None) -> None:
        self._host, self._bits, self._others = host, bits, others

    def __getitem__(self, ordinal: int) -> str | None:
        if self._others and ordinal in self._others:
            return self._others[ordinal]
        if ordinal >= 0 and self._bits >> ordinal & 1:
            return self._host
        raise KeyError(ordinal)

    def _host_ordinals(self) -> list[int]:
        """The ordinals in the bitmask: the affine host's, but where `_others` says otherwise."""
        return [o for o in range(self._bits.bit_length()) if self._bits >> o & 1]

    def __iter__(self) -> Iterator[int]:
        ordinals = self._host_ordinals()
        return iter(sorted([*ordinals, *self._others]) if self._others else ordinals)

    def __len__(self) -> int:
        return self._bits.bit_count() + len(self._others or ())

    def of(self, node: str) -> set[int]:
        """The ordinals allocated to `node` ({o for o, n in self.items() if n == node}, without a
        lookup per ordinal: a plan asks for each host it removes)."""
        found = set(self._host_ordinals()) if node == self._host else set()
        for ordinal, owner in (self._others or {}).items():
            if owner == node:
                found.add(ordinal)
            else:
                found.discard(ordinal)
        return found

    def nodes(self) -> set[str]:
        """The nodes allocated to, none left out (set(self.values()) without None, and without a
        lookup per ordinal: a run indexes every block)."""
        found = {self._host} if self._bits and self._host is not None else set()
        found.update(node for node in (self._others or {}).values() if node is not None)
        return found

    def __repr__(self) -> str:
        return f"Owners({dict(self)!r})"


@dataclass(frozen=True, slots=True)
class IpamBlock:
    """A block as read, its shape checked. The JSON is parsed again only for blocks a release
    edits; the summary is what indexing needs: the affine host and each allocated ordinal's node.
    """

    item: StoredItem
    cidr: str
    affine_host: str | None = None
    owners: Owners = field(default_factory=lambda: Owners(None, 0, None))


@dataclass(frozen=True, slots=True)
class IpamHandle:
    """A handle as read; its JSON is parsed only when a release needs it."""

    item: StoredItem
    handle_id: str


@dataclass(frozen=True, slots=True)
class CalicoHost:
    """A Calico host and everything stored for it that goes when the host goes.

    `node` is its Calico Node entry; None in the Kubernetes datastore, where the Calico Node is
    the Kubernetes Node itself and the host is known only from the data that names it.
    """

    name: str
    node: StoredItem | None
    k8s_node: str | None
    ipv4: str | None = None
    ipv6: str | None = None
    tunnel_ips: tuple[str, ...] = ()
    felix_alive: bool = False
    workload_endpoints: tuple[WorkloadEndpoint, ...] = ()
    affinities: tuple[BlockAffinity, ...] = ()
    owned: tuple[StoredItem, ...] = ()
    problem: str | None = None
    # Keys that tie the host to its Kubernetes Node apart from `node` (Calico 2.x's
    # orchestrator_refs): deleted last, after the Node, so that a run that dies before them
    # still finds the host, and its link, next time.
    link_keys: tuple[StoredItem, ...] = ()
    # False for a name the etcd datastores hold data for (IPAM, endpoints, status) but no Calico
    # Node: what a hand-run clean-up that deleted only the Node leaves. Its name is its link.
    registered: bool = True

    @property
    def known_ips(self) -> tuple[str, ...]:
        """Its workload endpoints' IPs, then its tunnel addresses: where a plan may free an
        allocation that names no other node (ipam._host_ordinals)."""
        return (*(ip for endpoint in self.workload_endpoints for ip in endpoint.ips), *self.tunnel_ips)


@dataclass(frozen=True, slots=True)
class DataProblem:
    """Something in the datastore this tool did not understand; reported, never fatal."""

    kind: str
    key: str
    message: str


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    guid: str | None = None
    datastore_ready: bool | None = None
    migration: str | None = None  # Kubernetes datastore: an unfinished move of Calico's data between groups


@dataclass(frozen=True, slots=True)
class NetworkUnavailable:
    """Why a Node counts as network-unavailable: its condition is True, or it has the taint."""

    since: str | None
    reason: str | None = None
    message: str | None = None
    condition: bool = False
    taint_added: str | None = None
    # Bounds how long where `since` is unknown: a taint is no older than its Node
    node_created: str | None = None


@dataclass(frozen=True, slots=True)
class PodInfo:
    """Where a Pod runs and the IPs it has (none yet while it starts)."""

    node: str | None
    ips: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KubeNode:
    name: str
    internal_ips: tuple[str, ...] = ()
    network_unavailable: NetworkUnavailable | None = None


class Action(StrEnum):
    DELETED = "deleted"
    WOULD_DELETE = "would_delete"
    WAITING_GRACE = "waiting_grace"
    DEFERRED = "deferred"
    SKIPPED = "skipped"
    FAILED = "failed"


CREATE = 0  # a Write at this revision creates its key, and only if the key is absent


@dataclass(frozen=True, slots=True)
class Write:
    """One conditional write: applies only if the key is still at `revision`.

    `value` None means delete; `before` is the value read, for the report (None until
    fetched, for entries read without their value).
    """

    key: str
    revision: int
    value: str | None
    before: str | None
    # For a delete: the value the key holds just before it goes, when this same step changed it
    # first (a block emptied, then deleted). A datastore that marks a key before deleting it
    # (Kubernetes: the `deleted: true` tombstone) writes this, as Calico does, not `before`.
    final: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """Writes that must succeed or fail together: one datastore transaction."""

    purpose: str
    writes: tuple[Write, ...]


@dataclass(frozen=True, slots=True)
class HostDecision:
    host: CalicoHost
    action: Action
    reason: str
    orphaned_since: datetime | None = None
    conflict: bool = False
    steps: tuple[Step, ...] = ()
    error: str | None = None
    # Writes that may have been done all the same: of a failed step, where no answer came to a try
    # of them; or every planned step, in the report kept before a run's first write. Reported
    # apart from `steps`, and restorable, as a restore acts on what it finds.
    in_doubt: tuple[Step, ...] = ()


@dataclass(frozen=True, slots=True)
class IpConflict:
    """Two owners of one IP. `orphan` is None when both owners are live hosts."""

    ip: str
    orphan: str | None
    blocks: str
    kind: str


@dataclass(frozen=True, slots=True)
class GuardFinding:
    name: str
    message: str


@dataclass(frozen=True, slots=True)
class HandleRepair:
    """What a run does about one stale IPAM handle; `step` lowers it when `action` says so."""

    handle_id: str
    action: str
    step: Step | None = None


@dataclass(frozen=True)
class Plan:
    decisions: tuple[HostDecision, ...]
    conflicts: tuple[IpConflict, ...]
    guards: tuple[GuardFinding, ...]
    next_grace_state: Mapping[str, datetime]
    live_hosts: int
    orphans: frozenset[str]
    repairs: tuple[HandleRepair, ...] = ()
    keep: Keep | None = None  # the run's rule for addresses that stay (kept.py): re-plans use it too
    cooldown: Cooldown | None = None  # IP cooldown, where it is known: releases follow it, re-plans too
    # Gone hosts the plan would have taken but the read kept without their data (Inventory.partial):
    # such a plan is never acted on; the run reads again, whole.
    unread: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return bool(self.guards)
