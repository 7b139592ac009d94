"""The IPAM check every run makes, in every datastore (pure): pools and how full they are, the
nodes that hold the most, and the garbage it finds: IPAM-only hosts (which the run removes like
hosts), stale handles (repaired once seen twice, unchanged), allocations whose handle is
missing, and pod IPs that look leaked on live nodes (Kubernetes datastore, where the pods are
read). The last two are reported, never acted on: docs/calico-data.md says why."""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from job.ipam import Held, Networks, StaleHandle, address_in, affinity_host, block_data
from job.leaks import LEAK_RELEASED, LEAK_REPORTED, Allocation, LeakPlan, pod_attribution
from job.model import HandleRepair, Inventory, IpamBlock
from job.plan import HANDLE_REPAIRED
from job.report import timestamp

SAMPLE = 20
NEXT_STEP = (
    "lock the datastore (calicoctl datastore migrate lock), run `calicoctl ipam check -o report.json`, "
    "review it, `calicoctl ipam release --from-report report.json`, then unlock"
)
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _within(block: IpNetwork, pool: IpNetwork) -> bool:
    """Whether a block lies in a pool; never across IP versions (a dual-stack cluster has both)."""
    if isinstance(block, ipaddress.IPv4Network) and isinstance(pool, ipaddress.IPv4Network):
        return block.subnet_of(pool)
    if isinstance(block, ipaddress.IPv6Network) and isinstance(pool, ipaddress.IPv6Network):
        return block.subnet_of(pool)
    return False


def _found(items: list[Any], key: Any = None) -> dict[str, Any]:
    return {"count": len(items), "sample": sorted(items, key=key)[:SAMPLE]}


@dataclass
class BlockScan:
    """What one pass over every block gives the IPAM check, the stale-handle check and the
    leak check, so that each block is parsed once a run (and again only where a leak may be).

    Leak candidates are found in three moves, so that no set of every endpoint IP is needed: `add`
    marks, per block, the ordinals that name a pod on a live node (leaks.pod_attribution);
    `held_by_endpoints` clears those any workload endpoint holds (in the Kubernetes datastore, any
    listed pod); `attribute` turns what is left into `pod_ips`, parsing only those blocks."""

    live_nodes: Set[str] = frozenset()
    calico2: bool = False
    held: Held = field(default_factory=Held)
    allocated: Counter[str] = field(default_factory=Counter)  # cidr -> allocations
    node_blocks: Counter[str] = field(default_factory=Counter)  # node -> blocks affine to it
    node_allocated: Counter[str] = field(default_factory=Counter)  # node -> allocations ("": none named)
    dangling: list[dict[str, str]] = field(default_factory=list)  # allocations whose handle is missing
    unheld: dict[str, int] = field(default_factory=dict)  # cidr -> bits of the ordinals above
    pod_ips: dict[tuple[str, str], list[Allocation]] = field(default_factory=lambda: defaultdict(list))
    attributed: bool = False  # `pod_ips` is made (attribute): what the bits say is final
    _networks: Networks | None = None  # of the blocks with bits in `unheld`, once every block is in
    _pending: list[str] = field(default_factory=list)  # endpoint IPs given before that

    def add(self, cidr: str, data: Mapping[str, Any], handles: Container[str] | None = None) -> None:
        """One block's JSON. `dangling` is filled only when `handles` is given; a read that scans
        blocks before it reads the handles calls find_dangling once it has."""
        assert self._networks is None, "a block added after blocks_read"
        per_node = self.node_allocated
        host = affinity_host(data)
        if host:
            self.node_blocks[host] += 1
        attributes = data.get("attributes") or []
        ip_of = address_in(cidr)
        count = bits = 0
        for ordinal, index in enumerate(data["allocations"]):
            if index is None:
                continue
            count += 1
            attribute = attributes[index]
            handle = attribute.get("handle_id")
            secondary = attribute.get("secondary") or {}
            per_node[secondary.get("node") or host or ""] += 1
            if not handle or not isinstance(handle, str):
                continue
            self.held.add(handle, cidr)
            if handles is not None and handle not in handles:
                self.dangling.append({"ip": ip_of(ordinal), "handle": handle})
            if pod_attribution(attribute, handle, self.live_nodes, self.calico2) is not None:
                bits |= 1 << ordinal
        self.allocated[cidr] = count
        if bits:
            self.unheld[cidr] = bits

    def blocks_read(self) -> None:
        """Every block is added: the endpoint IPs given so far are looked up, later ones at once."""
        self._networks = Networks()
        for cidr in self.unheld:
            self._networks.add(cidr)
        pending, self._pending = self._pending, []
        self.held_by_endpoints(pending)

    def held_by_endpoints(self, ips: Iterable[str]) -> None:
        """Clear the ordinals at these workload endpoint IPs. Those given before blocks_read wait
        for it, so that a read may scan the endpoints beside the blocks."""
        networks = self._networks
        if networks is None:
            self._pending.extend(ips)
            return
        for ip in ips:
            located = networks.locate(ip)
            if located is not None:
                cidr, ordinal = located
                self.unheld[cidr] &= ~(1 << ordinal)

    def attribute(self, blocks: Iterable[IpamBlock]) -> None:
        """`pod_ips` from the ordinals no endpoint holds, in these blocks (those `unheld` names)."""
        self.attributed = True
        for block in blocks:
            bits = self.unheld.get(block.cidr, 0)
            if not bits:
                continue
            data = block_data(block)
            attributes = data["attributes"]
            ip_of = address_in(block.cidr)
            for ordinal, index in enumerate(data["allocations"]):
                if index is not None and bits >> ordinal & 1:
                    attribute = attributes[index]
                    handle = attribute["handle_id"]
                    names = pod_attribution(attribute, handle, self.live_nodes, self.calico2)
                    if names is not None:
                        node, namespace, pod = names
                        allocation = Allocation(ip_of(ordinal), block.cidr, ordinal, handle, node, namespace, pod)
                        self.pod_ips[(namespace, pod)].append(allocation)


def scan_blocks(
    blocks: Sequence[IpamBlock],
    live_nodes: Set[str],
    endpoint_ips: Iterable[str],
    handles: Container[str],
    calico2: bool,
    attribute: bool = True,
) -> BlockScan:
    """One pass over every block (BlockScan.add), and the leak candidates, unless more endpoints
    (the pods, `attribute` False) are still to clear their IPs."""
    scan = BlockScan(live_nodes, calico2)
    for block in blocks:
        scan.add(block.cidr, block_data(block), handles)
    scan.blocks_read()
    scan.held_by_endpoints(endpoint_ips)
    if attribute:
        scan.attribute(blocks)
    return scan


def find_dangling(blocks: Iterable[IpamBlock], missing: Set[int]) -> list[dict[str, str]]:
    """The allocations in `blocks` whose handle id hashes into `missing` (Held's keys that no
    handle key was read for)."""
    found = []
    for block in blocks:
        data = block_data(block)
        attributes = data.get("attributes") or []
        ip_of = address_in(block.cidr)
        for ordinal, index in enumerate(data["allocations"]):
            handle = attributes[index].get("handle_id") if index is not None else None
            if isinstance(handle, str) and hash(handle) in missing:
                found.append({"ip": ip_of(ordinal), "handle": handle})
    return found


def ipam_audit(
    inventory: Inventory,
    live_nodes: Set[str],
    scan: BlockScan,
    stale: Sequence[StaleHandle] = (),
    repairs: Sequence[HandleRepair] = (),
    leaked: Sequence[Allocation] | None = None,
    leak_plan: LeakPlan | None = None,
) -> dict[str, Any]:
    """`scan`: the pass over every block; `repairs`: what this run plans for each stale handle;
    `leaked`: pod IPs no pod holds (None: pods not listed), and `leak_plan` what this run does
    about them."""
    actions = {repair.handle_id: repair.action for repair in repairs}
    held, allocated, dangling = scan.held, scan.allocated, scan.dangling
    empty = [h for h in inventory.handles if h not in held]  # Calico deletes a handle once it holds none
    stale_found = [
        {
            "handle": finding.handle.handle_id,
            "blocks": {key: {"counts": c, "held": h} for key, (c, h) in finding.over.items()},
            "action": actions.get(finding.handle.handle_id, "reported"),
        }
        for finding in stale
    ]
    pools = []
    for cidr in inventory.pools:
        pool = ipaddress.ip_network(cidr, strict=False)
        inside = [b.cidr for b in inventory.blocks if _within(ipaddress.ip_network(b.cidr), pool)]
        used = sum(allocated[c] for c in inside)
        pools.append(
            {
                "cidr": cidr,
                "size": pool.num_addresses,
                "blocks": len(inside),
                "allocated": used,
                "utilisation": round(used / pool.num_addresses, 4),
            }
        )
    ipam_only = [h.name for h in inventory.hosts if not h.registered and h.name not in live_nodes]
    named = sorted({*scan.node_blocks, *scan.node_allocated} - {""})  # "": allocations naming no node
    busiest = sorted(named, key=lambda n: (-scan.node_allocated[n], n))[:SAMPLE]
    return {
        "blocks": len(inventory.blocks),
        "allocated": sum(allocated.values()),
        "pools": pools,
        "nodes": {
            "count": len(named),
            "busiest": [
                {"node": n, "blocks": scan.node_blocks[n], "allocated": scan.node_allocated[n]} for n in busiest
            ],
        },
        "ipam_only_hosts": _found(ipam_only),
        "stale_handles": {**_found(stale_found, key=lambda s: s["handle"]), "repaired": 0},
        "handles_without_allocations": _found(empty),
        "dangling_allocations": _found(dangling, key=lambda d: d["ip"]),
        "leaked_ips": _leaks(leaked, leak_plan),
        "next_step": NEXT_STEP,
    }


def _leaks(leaked: Sequence[Allocation] | None, plan: LeakPlan | None) -> dict[str, Any]:
    if leaked is None:
        return {"count": None, "sample": [], "released": 0}
    sample = [
        {
            "ip": a.ip,
            "node": a.node,
            "pod": f"{a.namespace}/{a.pod}",
            "handle": a.handle,
            "since": timestamp(plan.since.get(a.ip)) if plan else None,
            "action": plan.actions.get(a.ip, LEAK_REPORTED) if plan else LEAK_REPORTED,
        }
        for a in sorted(leaked, key=lambda a: (a.cidr, a.ordinal))[:SAMPLE]
    ]
    return {"count": len(leaked), "sample": sample, "released": 0}


def with_outcomes(
    audit: dict[str, Any] | None, repairs: Sequence[HandleRepair], leak_actions: Mapping[str, str]
) -> dict[str, Any] | None:
    """The audit once the planned handle repairs and leak releases were applied."""
    if audit is None:
        return None
    actions = {repair.handle_id: repair.action for repair in repairs}
    found = audit["stale_handles"]
    sample = [{**entry, "action": actions.get(entry["handle"], entry["action"])} for entry in found["sample"]]
    repaired = sum(1 for repair in repairs if repair.action == HANDLE_REPAIRED)
    leaks = audit["leaked_ips"]
    leak_sample = [{**entry, "action": leak_actions.get(entry["ip"], entry["action"])} for entry in leaks["sample"]]
    released = sum(1 for action in leak_actions.values() if action == LEAK_RELEASED)
    return {
        **audit,
        "stale_handles": {**found, "sample": sample, "repaired": repaired},
        "leaked_ips": {**leaks, "sample": leak_sample, "released": released},
    }
