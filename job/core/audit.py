"""The IPAM check every run makes, in every datastore (pure): pools and how full they are, the
nodes that hold the most, and the garbage it finds: IPAM-only hosts (which the run removes like
hosts), stale handles (repaired once seen twice, unchanged), allocations whose handle is
missing, and pod IPs that look leaked on live nodes (Kubernetes datastore, where the pods are
read). The last two are reported, never acted on: docs/calico-data.md says why."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence, Set
from datetime import timedelta
from typing import Any

from job.core.inventory import Inventory
from job.core.ipam import StaleHandle, address_in, address_number, attribute_at, block_data
from job.core.kept import ALTERNATE, ALTERNATE_GONE, Keep, owner, vm_of
from job.core.leaks import LEAK_RELEASED, LEAK_REPORTED, Allocation, LeakPlan
from job.core.model import Cooldown, HandleRepair
from job.core.plan import HANDLE_REPAIRED
from job.core.report import timestamp
from job.core.scan import SAMPLE, BlockScan, address_order

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


def ipam_audit(
    inventory: Inventory,
    live_nodes: Set[str],
    scan: BlockScan,
    stale: Sequence[StaleHandle] = (),
    repairs: Sequence[HandleRepair] = (),
    leaked: Sequence[Allocation] | None = None,
    leak_plan: LeakPlan | None = None,
    keep: Keep | None = None,
    cooldown: Cooldown | None = None,
    orphans: Set[str] = frozenset(),
) -> dict[str, Any]:
    """`scan`: the pass over every block; `repairs`: what this run plans for each stale handle;
    `leaked`: pod IPs no pod holds (None: pods not listed), and `leak_plan` what this run does
    about them; `orphans`: the hosts the plan takes for gone."""
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
        "dangling_allocations": {
            **_found(dangling, key=lambda d: address_order(d["ip"])),
            "count": len(dangling) if scan.dangling_count is None else scan.dangling_count,
        },
        "unattributed_allocations": _found(
            _unattributed(inventory, scan, orphans), key=lambda u: address_order(u["ip"])
        ),
        "leaked_ips": _leaks(leaked, leak_plan),
        "vm_addresses": _owned_specially(scan, keep or Keep(live_nodes)),
        "cooling": _cooling(scan, cooldown),
        "next_step": NEXT_STEP,
    }


def _unattributed(inventory: Inventory, scan: BlockScan, orphans: Set[str]) -> list[dict[str, Any]]:
    """Allocations in a gone host's own blocks that name no node (no `secondary.node`, no tunnel
    handle), that no endpoint holds (`scan.unclaimed`) and that are none of the host's known IPs:
    they stay when the host goes, its block with them (without its affinity). The affinity is
    no proof of whose they are, since a live node's pod may hold an address borrowed from the
    block; Calico's own IPAM garbage collection files such an allocation under no node and never
    frees it (docs/calico-data.md)."""
    unclaimed = scan.unclaimed
    blocks = [b for b in inventory.blocks if unclaimed.get(b.cidr) and b.affine_host in orphans] if unclaimed else []
    hosts = {b.affine_host for b in blocks}  # their known IPs only: a run may have thousands of orphans
    known = {host.name: {address_number(ip) for ip in host.known_ips} for host in inventory.hosts if host.name in hosts}
    found = []
    for block in blocks:
        cidr, host, bits = block.cidr, block.affine_host, unclaimed[block.cidr]
        data, at = block_data(block), address_in(cidr)  # a gone host's block: read with its value
        for ordinal in (o for o in range(bits.bit_length()) if bits >> o & 1):
            ip, handle = at(ordinal), attribute_at(data, ordinal).get("handle_id")
            if address_number(ip) not in known.get(host or "", ()):
                found.append(
                    {"ip": ip, "block": cidr, "host": host, "handle": handle if isinstance(handle, str) else None}
                )
    return found


def _cooling(scan: BlockScan, cooldown: Cooldown | None) -> dict[str, Any]:
    """Addresses in IP cooldown: released, not yet free, never anyone's garbage. A block whose
    cooled addresses nothing has freed for twice the cooldown is listed: Calico frees them on
    its next write of the block, and kube-controllers' backstop writes such blocks."""
    count = sum(found for found, _ in scan.cooling.values())
    oldest = min((first for _, first in scan.cooling.values() if first is not None), default=None)
    stuck = []
    if cooldown is not None:
        limit = cooldown.now - 2 * timedelta(seconds=cooldown.seconds)
        for cidr, (found, first) in sorted(scan.cooling.items()):
            if first is not None and first < limit:
                stuck.append({"cidr": cidr, "cooling": found, "oldest_released_at": timestamp(first)})
    return {
        "count": count,
        "cooldown_s": None if cooldown is None else cooldown.seconds,
        "cooldown_source": None if cooldown is None else cooldown.source,
        "oldest_released_at": timestamp(oldest),
        "oldest_age_s": None if oldest is None or cooldown is None else int((cooldown.now - oldest).total_seconds()),
        "blocks_not_collected": _found(stuck, key=lambda b: b["cidr"]),
    }


def _owned_specially(scan: BlockScan, keep: Keep) -> dict[str, Any]:
    """The addresses a KubeVirt VM or a live migration owns, each with whether it stays and why
    (kept.py), and what KubeVirt said: they outlive their pods, so an operator sees them apart."""
    found = []
    for cidr, ordinal, attribute in scan.owned_specially:
        vm = vm_of(attribute)
        state = keep.reason(attribute)
        if state is None:
            state = keep.vm_state(vm) if vm is not None else ALTERNATE_GONE
        found.append(
            {
                "ip": address_in(cidr)(ordinal),
                "vm": "/".join(vm) if isinstance(vm, tuple) else None,
                "node": owner(attribute.get("secondary"))[0],
                "alternate_node": owner(attribute.get(ALTERNATE))[0],
                "state": state,
            }
        )
    kubevirt = keep.kubevirt
    vms = None if kubevirt.vms is None else len(kubevirt.vms)
    return {
        **_found(found, key=lambda f: f["ip"]),
        "kubevirt": {"served": kubevirt.served, "vms": vms, "why": kubevirt.why},
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
