"""Pure planning: which Calico hosts are orphans, which wait, which are refused, and how each
orphan is removed. A function of what was read, the clock and the grace state; no I/O.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from job.config import Config
from job.core.inventory import Inventory
from job.core.ipam import (
    MAX_TXN_WRITES,
    IpamIndex,
    StaleHandle,
    block_shape_problem,
    dump,
    plan_release,
    summarize_block,
    tunnel_handle_node,
)
from job.core.kept import NO_KUBEVIRT, Keep, KubeVirt
from job.core.model import (
    Action,
    BlockAffinity,
    CalicoHost,
    Cooldown,
    GuardFinding,
    HandleRepair,
    HostDecision,
    IpamBlock,
    IpamHandle,
    IpConflict,
    KubeNode,
    Plan,
    Step,
    StoredItem,
    WorkloadEndpoint,
    Write,
    known_cooldown,
)

# Reasons, machine-readable, as they appear in the report.
K8S_NODE_MISSING = "k8s_node_missing"
NAME_NOT_IN_K8S = "name_not_in_k8s"
NO_K8S_ORCHREF = "no_k8s_orchref"
NO_CALICO_NODE = "no_calico_node"  # IPAM (or other per-host data) under a name with no Calico Node
EXCLUDED = "excluded"
FELIX_ALIVE = "felix_alive"
MALFORMED_DATA = "malformed_data"
GRACE_PERIOD = "grace_period"
CONFLICT_GRACE_PERIOD = "conflict_grace_period"
MAX_DELETIONS = "max_deletions"
ADDRESSES_KEPT = "addresses_kept"  # only addresses that stay are left of it (a VM's: kept.py)
ADDRESSES_COOLING = "addresses_cooling"  # only its blocks are left, holding addresses in IP cooldown
# What a run does about a stale handle (docs/calico-data.md, "Stale handles").
HANDLE_SEEN = "seen_once"  # first seen stale at this revision: repaired if still so, unchanged, later
HANDLE_WOULD_REPAIR = "would_repair"
HANDLE_REPAIRED = "repaired"
HANDLE_LEFT_TO_HOST = "left_to_host"  # a host this run removes writes it anyway
HANDLE_EXCLUDED = "excluded"  # the tunnel handle of an --exclude'd host
HANDLE_DEFERRED = "deferred"  # over --max-deletions, or the run stopped first
HANDLE_CHANGED = "changed"  # written by someone else meanwhile: seen again next run
HANDLE_FAILED = "failed"
# A stale handle is repaired only when seen stale, at the same revision, this long ago or more:
# Calico raises a handle just before it writes the block, so a fresh sighting may be in flight.
HANDLE_MIN_AGE = timedelta(minutes=5)


@dataclass(frozen=True)
class Orphan:
    host: CalicoHost
    reason: str


def k8s_link(host: CalicoHost, config: Config) -> str | None:
    """The Kubernetes Node name whose absence makes this host an orphan, if there is one."""
    if host.k8s_node:
        return host.k8s_node
    return host.name if config.unreferenced == "match-name" or not host.registered else None


def is_live(host: CalicoHost, k8s_names: Set[str], config: Config) -> bool:
    """Whether a Kubernetes Node keeps this host: the one it links to, or, with no usable link,
    the one of its own name. A live host is never planned, so a read may keep less of it."""
    link = k8s_link(host, config) if host.problem is None else None
    return (link or host.name) in k8s_names


def _classify(
    hosts: Iterable[CalicoHost], k8s_names: set[str], config: Config
) -> tuple[list[Orphan], list[HostDecision], int]:
    orphans: list[Orphan] = []
    skipped: list[HostDecision] = []
    live = 0
    for host in hosts:
        link = k8s_link(host, config)
        if is_live(host, k8s_names, config):
            live += 1
        elif host.problem is not None:
            skipped.append(HostDecision(host, Action.SKIPPED, MALFORMED_DATA, error=host.problem))
        elif link is None:
            skipped.append(HostDecision(host, Action.SKIPPED, NO_K8S_ORCHREF))
        elif not host.registered:
            orphans.append(Orphan(host, NO_CALICO_NODE))
        else:
            orphans.append(Orphan(host, K8S_NODE_MISSING if host.k8s_node else NAME_NOT_IN_K8S))
    return orphans, skipped, live


def find_conflicts(
    hosts: Sequence[CalicoHost], orphan_names: Set[str], kube_nodes: Sequence[KubeNode], config: Config
) -> tuple[IpConflict, ...]:
    """IPs held by an orphan that a live node or another host also claims."""
    nodes_by_ip: dict[str, set[str]] = defaultdict(set)
    for kube_node in kube_nodes:
        for ip in kube_node.internal_ips:
            nodes_by_ip[ip].add(kube_node.name)
    hosts_by_ip: dict[str, list[CalicoHost]] = defaultdict(list)
    for host in hosts:
        for address in (host.ipv4, host.ipv6):
            if address is not None:
                hosts_by_ip[address].append(host)
    found: dict[tuple[str, str | None, str], IpConflict] = {}
    for ip, holders in sorted(hosts_by_ip.items()):
        orphans = [h for h in holders if h.name in orphan_names]
        for orphan in orphans:
            for node in nodes_by_ip.get(ip, set()) - {k8s_link(orphan, config)}:
                found[(ip, orphan.name, node)] = IpConflict(ip, orphan.name, node, "orphan_holds_live_node_ip")
            for other in holders:
                if other is not orphan:
                    blocked = other.k8s_node or other.name
                    found.setdefault(
                        (ip, orphan.name, blocked), IpConflict(ip, orphan.name, blocked, "orphan_shares_host_ip")
                    )
        if len(holders) > 1 and not orphans:
            names = ", ".join(sorted(h.name for h in holders))
            found[(ip, None, names)] = IpConflict(ip, None, names, "live_hosts_share_ip")
    return tuple(found[key] for key in sorted(found, key=lambda k: (k[0], k[1] or "", k[2])))


def check_guards(
    inventory: Inventory, kube_nodes: Sequence[KubeNode], orphan_count: int, config: Config
) -> tuple[GuardFinding, ...]:
    """Reasons to refuse the whole run; empty when it may go ahead."""
    guards = []
    if inventory.cluster.datastore_ready is False:
        guards.append(
            GuardFinding(
                "datastore_locked",
                "ClusterInformation says datastoreReady: false (the Calico datastore is locked, e.g. by a migration)",
            )
        )
    if inventory.cluster.migration is not None:
        guards.append(
            GuardFinding(
                "datastore_migrating",
                f"{inventory.cluster.migration}: Calico's data is moving between API groups, and neither is "
                "written until the migration is Complete",
            )
        )
    if not kube_nodes:
        guards.append(
            GuardFinding(
                "empty_k8s_node_list",
                "the Kubernetes API returned no Nodes; refusing to treat every Calico host as orphaned",
            )
        )
        return tuple(guards)
    registered = [h for h in inventory.hosts if h.registered]
    referenced = {h.k8s_node or h.name for h in registered} | {h.name for h in registered}
    covered = sum(1 for node in kube_nodes if node.name in referenced)
    if inventory.hosts_registered and not registered:
        guards.append(
            GuardFinding(
                "foreign_datastore",
                f"the datastore holds no Calico hosts for {len(kube_nodes)} Kubernetes Nodes: check ETCD_ENDPOINTS "
                "and DATASTORE_TYPE (etcdv3 for Calico 3.x on etcd, etcdv2 for Calico 2.x, kubernetes for the "
                "Kubernetes datastore)",
            )
        )
    elif inventory.hosts_registered and covered * 2 < len(kube_nodes):
        guards.append(
            GuardFinding(
                "foreign_datastore",
                f"only {covered} of {len(kube_nodes)} Kubernetes Nodes have a Calico host; this datastore looks "
                "like it belongs to another cluster: check ETCD_ENDPOINTS and DATASTORE_TYPE (etcdv3, etcdv2 or "
                "kubernetes)",
            )
        )
    hosts = len(inventory.hosts)
    if hosts and orphan_count > config.max_orphan_fraction * hosts:
        guards.append(
            GuardFinding(
                "orphan_fraction",
                f"{orphan_count} of {hosts} Calico hosts look orphaned, more than "
                f"--max-orphan-fraction={config.max_orphan_fraction:g}; check the Kubernetes API answer, "
                "then raise --max-orphan-fraction to go ahead",
            )
        )
    return tuple(guards)


def _batched(purpose: str, writes: Sequence[Write]) -> list[Step]:
    return [
        Step(f"{purpose} ({len(writes[i : i + MAX_TXN_WRITES])} keys)", tuple(writes[i : i + MAX_TXN_WRITES]))
        for i in range(0, len(writes), MAX_TXN_WRITES)
    ]


def _delete(item: StoredItem) -> Write:
    return Write(item.key, item.revision, None, item.value)


@dataclass(frozen=True)
class NotRemoved:
    """Why a gone host's removal cannot be planned: the report's reason, and what to say."""

    reason: str
    message: str


def host_steps(host: CalicoHost, index: IpamIndex) -> tuple[tuple[Step, ...], NotRemoved | None]:
    """The ordered transactions that remove a gone host (docs/calico-data.md), or why it cannot be.

    IPAM first (each block with the handles it frees), then the host's own keys, and the Node
    last, so that an interrupted run leaves a host that is still found next time. A host whose
    only data left is addresses that stay (kept.py) has nothing to remove (ADDRESSES_KEPT), nor
    one whose blocks hold only addresses in IP cooldown: they go once cooled (ADDRESSES_COOLING).
    """
    release = plan_release(host, index)
    if release.problem is not None:
        return (), NotRemoved(MALFORMED_DATA, release.problem)
    keys = [_delete(endpoint.item) for endpoint in host.workload_endpoints]
    keys += [_delete(item) for item in host.owned]
    steps = [
        *release.steps,
        *_batched("delete endpoints, per-node config and status", keys),
    ]
    last = ([] if host.node is None else [host.node]) + list(host.link_keys)
    if last:
        steps.append(Step("delete the Calico Node", tuple(_delete(item) for item in last)))
    if not steps and release.kept:
        kept = ", ".join(f"{ip} ({why})" for ip, why in release.kept)
        return (), NotRemoved(
            ADDRESSES_KEPT, f"nothing else left; its addresses stay while their VM or migration does: {kept}"
        )
    if not steps and release.cooling:
        blocks = ", ".join(release.cooling)
        return (), NotRemoved(
            ADDRESSES_COOLING,
            f"nothing else left; block {blocks} keeps its affinity until the addresses released in it have cooled",
        )
    return tuple(steps), None


def build_index(inventory: Inventory, keep: Keep | None = None, cooldown: Cooldown | None = None) -> IpamIndex:
    return IpamIndex.build(inventory.blocks, inventory.handles, inventory.malformed_blocks, keep, cooldown)


def plan_run(
    inventory: Inventory,
    kube_nodes: Sequence[KubeNode],
    grace_state: Mapping[str, datetime],
    now: datetime,
    config: Config,
    reported_conflicts: Sequence[IpConflict] = (),
    stale: Sequence[StaleHandle] = (),
    kubevirt: KubeVirt = NO_KUBEVIRT,
    cooling_seen: bool = False,
) -> Plan:
    """Decide every Calico host that is not live; deterministic for the same inputs.

    `reported_conflicts` are conflicts a crash-looping calico-node named in its log; those
    that name an orphan count like the ones found from addresses. `cooling_seen`: whether any
    block holds an address in IP cooldown (the sign of a Calico with one, model.known_cooldown).
    """
    triage = _triage(inventory.hosts, kube_nodes, grace_state, now, config, reported_conflicts)
    decisions, next_state = triage.decisions, triage.next_state
    guards = check_guards(inventory, kube_nodes, len(triage.orphans), config)
    keep = Keep(frozenset(node.name for node in kube_nodes), kubevirt)
    cooldown = known_cooldown(inventory.ip_cooldown, config.ip_cooldown_seconds, cooling_seen, now)
    index = build_index(inventory, keep, cooldown)
    taken = 0
    unread: list[str] = []
    for orphan, since, is_conflict in triage.eligible:
        if taken >= config.max_deletions or orphan.host.name in inventory.partial:
            # Steps are worked out only for hosts this run deletes, and only from their whole data.
            if taken < config.max_deletions:
                unread.append(orphan.host.name)
            decisions.append(HostDecision(orphan.host, Action.DEFERRED, MAX_DELETIONS, since, is_conflict))
            continue
        steps, problem = host_steps(orphan.host, index)
        if problem is not None:
            decisions.append(
                HostDecision(orphan.host, Action.SKIPPED, problem.reason, since, is_conflict, error=problem.message)
            )
        else:
            taken += 1
            decisions.append(HostDecision(orphan.host, Action.WOULD_DELETE, orphan.reason, since, is_conflict, steps))
    decisions.sort(key=lambda d: d.host.name)
    repairs, sightings = plan_handle_repairs(stale, decisions, grace_state, now, config)
    next_state.update(sightings)
    orphans = frozenset(o.host.name for o in triage.orphans)
    plan = Plan(tuple(decisions), triage.conflicts, guards, next_state, triage.live, orphans, repairs, keep, cooldown)
    return replace(plan, unread=tuple(unread))


@dataclass(frozen=True)
class _Triage:
    """The gone hosts as sorted out before any is planned: what a plan decides of them without
    their data (read_first asks it before that data is read)."""

    decisions: list[HostDecision]  # those skipped or waiting out their grace period
    live: int
    orphans: list[Orphan]
    conflicts: tuple[IpConflict, ...]
    eligible: list[tuple[Orphan, datetime, bool]]  # (orphan, since, in conflict), in the order a plan takes them
    next_state: dict[str, datetime]


def _triage(
    hosts: Sequence[CalicoHost],
    kube_nodes: Sequence[KubeNode],
    grace_state: Mapping[str, datetime],
    now: datetime,
    config: Config,
    reported_conflicts: Sequence[IpConflict],
) -> _Triage:
    k8s_names = {node.name for node in kube_nodes}
    orphans, decisions, live = _classify(hosts, k8s_names, config)
    orphan_names = frozenset(o.host.name for o in orphans)
    found = find_conflicts(hosts, orphan_names, kube_nodes, config)
    seen = {(c.ip, c.orphan, c.blocks) for c in found}
    conflicts = found + tuple(
        c for c in reported_conflicts if c.orphan in orphan_names and (c.ip, c.orphan, c.blocks) not in seen
    )
    conflicted = {c.orphan for c in conflicts if c.orphan is not None}
    next_state: dict[str, datetime] = {}
    eligible: list[tuple[Orphan, datetime, bool]] = []
    for orphan in orphans:
        host = orphan.host
        is_conflict = host.name in conflicted
        if config.is_excluded(host.name):
            decisions.append(HostDecision(host, Action.SKIPPED, EXCLUDED, conflict=is_conflict))
            continue
        if host.felix_alive:
            decisions.append(HostDecision(host, Action.SKIPPED, FELIX_ALIVE, conflict=is_conflict))
            continue
        since = min(grace_state.get(host.name, now), now)
        next_state[host.name] = since
        grace = config.conflict_grace_period if is_conflict else config.grace_period
        if now - since < grace:
            reason = CONFLICT_GRACE_PERIOD if is_conflict else GRACE_PERIOD
            decisions.append(HostDecision(host, Action.WAITING_GRACE, reason, since, is_conflict))
            continue
        eligible.append((orphan, since, is_conflict))
    # Conflicts first (a live node is down until they go), then the longest-orphaned.
    eligible.sort(key=lambda e: (not e[2], e[1], e[0].host.name))
    return _Triage(decisions, live, orphans, conflicts, eligible, next_state)


# How many gone hosts a read keeps whole, for each the run may delete: the rest are for the hosts
# a plan skips (its data malformed, its addresses kept or cooling).
READ_FIRST_PER_DELETION = 2


def read_first(
    hosts: Sequence[CalicoHost],
    kube_nodes: Sequence[KubeNode],
    grace_state: Mapping[str, datetime],
    now: datetime,
    config: Config,
    reported_conflicts: Sequence[IpConflict] = (),
) -> frozenset[str]:
    """The gone hosts a plan of this run may take, as it orders them, READ_FIRST_PER_DELETION for
    each of --max-deletions: `hosts` as their Calico Nodes say (no data filed under them yet).
    A read keeps what removing a host takes (its endpoints, its handles, its blocks' values) of
    these alone, so that memory follows what a run may delete, not how many hosts are gone. A plan
    that reaches a host read without it says so (Plan.unread): the run then reads again, whole."""
    eligible = _triage(hosts, kube_nodes, grace_state, now, config, reported_conflicts).eligible
    return frozenset(orphan.host.name for orphan, _, _ in eligible[: READ_FIRST_PER_DELETION * config.max_deletions])


def handle_sighting(finding: StaleHandle) -> str:
    """The grace-state name of a stale handle at one revision: a write to it starts over."""
    return f"handle:{finding.handle.handle_id}@{finding.handle.item.revision}"


def plan_handle_repairs(
    stale: Sequence[StaleHandle],
    decisions: Sequence[HostDecision],
    grace_state: Mapping[str, datetime],
    now: datetime,
    config: Config,
) -> tuple[tuple[HandleRepair, ...], dict[str, datetime]]:
    """Lower each stale handle to what its blocks hold, once it has been seen stale, unchanged,
    in an earlier run at least HANDLE_MIN_AGE ago; counts are never raised. Handles a host of
    this run writes anyway are left to it. At most --max-deletions repairs per run."""
    busy = {w.key for d in decisions for step in d.steps for w in step.writes} if stale else set()
    repairs: list[HandleRepair] = []
    sightings: dict[str, datetime] = {}
    taken = 0
    for finding in stale:
        handle = finding.handle
        owner = tunnel_handle_node(handle.handle_id)
        if handle.item.key in busy:
            repairs.append(HandleRepair(handle.handle_id, HANDLE_LEFT_TO_HOST))
            continue
        if owner is not None and config.is_excluded(owner):
            repairs.append(HandleRepair(handle.handle_id, HANDLE_EXCLUDED))
            continue
        mark = handle_sighting(finding)
        since = sightings[mark] = min(grace_state.get(mark, now), now)
        if now - since < HANDLE_MIN_AGE:
            repairs.append(HandleRepair(handle.handle_id, HANDLE_SEEN))
        elif taken >= config.max_deletions:
            repairs.append(HandleRepair(handle.handle_id, HANDLE_DEFERRED))
        else:
            taken += 1
            value = None if finding.repaired is None else dump(finding.repaired)
            write = Write(handle.item.key, handle.item.revision, value, handle.item.value)
            step = Step(f"repair IPAM handle {handle.handle_id}", (write,))
            repairs.append(HandleRepair(handle.handle_id, HANDLE_WOULD_REPAIR, step))
    return tuple(repairs), sightings


def replan_host(inventory: Inventory, previous: HostDecision, index: IpamIndex | None = None) -> HostDecision | None:
    """Decide one host again from a fresh read, after a write found its data changed. `index` is
    the inventory's (IpamIndex.updated), when the caller has it: indexing 5,000 blocks again for
    each conflict cost 50 ms.

    None means the host is gone already. The Kubernetes side is re-checked by the caller.
    """
    host = next((h for h in inventory.hosts if h.name == previous.host.name), None)
    if host is None:
        return None
    if host.felix_alive:
        return HostDecision(host, Action.SKIPPED, FELIX_ALIVE, previous.orphaned_since, previous.conflict)
    steps, problem = host_steps(host, index or build_index(inventory))
    if problem is not None:
        since, conflict = previous.orphaned_since, previous.conflict
        return HostDecision(host, Action.SKIPPED, problem.reason, since, conflict, error=problem.message)
    return HostDecision(host, previous.action, previous.reason, previous.orphaned_since, previous.conflict, steps)


def refreshed(inventory: Inventory, now: Mapping[str, StoredItem], keys: Set[str], host: str) -> Inventory:
    """`inventory` with the entries at `keys` as they are now (`now`; a key absent from it is
    gone): its blocks, its handles, and of its hosts only `host`, the one re-planned (the others'
    entries are left as they were read: checking 5,000 hosts for each conflict cost 80 ms). After a
    failed compare only the keys of the host's own steps are read again, not the whole datastore:
    nothing allocates to a gone host, so what can have moved is in its steps. Directories (keys
    ending "/") are kept: they are not read, only removed once empty."""

    def fresh(item: StoredItem) -> StoredItem | None:
        if item.key not in keys or item.key.endswith("/"):
            return item
        return now.get(item.key)

    blocks, malformed = [], list(inventory.malformed_blocks)
    for block in inventory.blocks:
        item = fresh(block.item)
        if item is block.item:
            blocks.append(block)
        elif item is not None:
            summary = _block(item, block.cidr)
            if summary is None:
                malformed.append(block.cidr)
            else:
                blocks.append(summary)
    handles = {}
    for handle_id, handle in inventory.handles.items():
        item = fresh(handle.item)
        if item is not None:
            handles[handle_id] = handle if item is handle.item else IpamHandle(item, handle_id)
    hosts = []
    for each in inventory.hosts:
        if each.name != host or not any(item.key in keys for item in host_items(each)):
            hosts.append(each)
            continue
        endpoints = tuple(
            WorkloadEndpoint(item, e.node, e.ips) for e in each.workload_endpoints if (item := fresh(e.item))
        )
        affinities = tuple(BlockAffinity(item, a.host, a.cidr) for a in each.affinities if (item := fresh(a.item)))
        owned = tuple(item for item in map(fresh, each.owned) if item is not None)
        links = tuple(item for item in map(fresh, each.link_keys) if item is not None)
        node = fresh(each.node) if each.node is not None else None
        changed = replace(
            each, node=node, workload_endpoints=endpoints, affinities=affinities, owned=owned, link_keys=links
        )
        if any(not item.key.endswith("/") for item in host_items(changed)):
            hosts.append(changed)
    return replace(
        inventory, hosts=tuple(hosts), blocks=tuple(blocks), handles=handles, malformed_blocks=tuple(malformed)
    )


def reindexed(index: IpamIndex, inventory: Inventory, keys: Set[str]) -> IpamIndex:
    """`index`, of the inventory before `refreshed` read `keys` again, as `inventory` (the
    refreshed one) would index: only the blocks at `keys` change, some gone, some now unreadable."""
    changed: dict[str, IpamBlock | None] = {c: None for c, block in index.blocks.items() if block.item.key in keys}
    changed.update((block.cidr, block) for block in inventory.blocks if block.item.key in keys)
    unreadable = [cidr for cidr in inventory.malformed_blocks if cidr in index.blocks]
    return index.updated(changed, inventory.handles, unreadable)


def host_items(host: CalicoHost) -> list[StoredItem]:
    """Every entry stored for a host."""
    items = [e.item for e in host.workload_endpoints] + [a.item for a in host.affinities]
    items += list(host.owned) + list(host.link_keys)
    return items + ([host.node] if host.node is not None else [])


def _block(item: StoredItem, cidr: str) -> IpamBlock | None:
    """A block read again: its summary, or None when it cannot be edited safely any more."""
    try:
        data = json.loads(item.value or "")
    except (ValueError, RecursionError):
        return None
    if block_shape_problem(data, cidr) is not None:
        return None
    affine_host, owners = summarize_block(data)
    return IpamBlock(item, cidr, affine_host, owners)
