"""The IPAM check every run makes, in every datastore (pure): pools and how full they are, the
nodes that hold the most, and the garbage it finds: IPAM-only hosts (which the run removes like
hosts), stale handles (repaired once seen twice, unchanged), allocations whose handle is
missing, and pod IPs that look leaked on live nodes (Kubernetes datastore, where the pods are
read). The last two are reported, never acted on: docs/calico-data.md says why."""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence, Set
from typing import Any

from job.ipam import StaleHandle, affinity_host, block_data
from job.model import HandleRepair, Inventory
from job.plan import HANDLE_REPAIRED

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


def ipam_audit(
    inventory: Inventory,
    live_nodes: Set[str],
    held: Mapping[str, Counter[str]],
    stale: Sequence[StaleHandle] = (),
    repairs: Sequence[HandleRepair] = (),
) -> dict[str, Any]:
    """`held`: handle -> block -> allocations (ipam.held_counts); `repairs`: what this run
    plans for each stale handle."""
    actions = {repair.handle_id: repair.action for repair in repairs}
    leaked: list[dict[str, str]] = []
    dangling: list[dict[str, str]] = []
    allocated: Counter[str] = Counter()
    per_node: dict[str, Counter[str]] = defaultdict(Counter)
    for block in inventory.blocks:
        data = block_data(block)
        network = ipaddress.ip_network(block.cidr)
        host = affinity_host(data)
        if host:
            per_node[host]["blocks"] += 1
        for ordinal, index in enumerate(data["allocations"]):
            if index is None:
                continue
            allocated[block.cidr] += 1
            attribute = data["attributes"][index]
            handle = attribute.get("handle_id")
            secondary = attribute.get("secondary") or {}
            node = secondary.get("node") or host
            per_node[str(node)]["allocated"] += 1
            ip = str(network.network_address + ordinal)
            if isinstance(handle, str) and handle and handle not in inventory.handles:
                dangling.append({"ip": ip, "handle": handle})
            pod, namespace = secondary.get("pod"), secondary.get("namespace")
            known = inventory.pods is not None and node in live_nodes and pod and namespace
            if known and (namespace, pod) not in (inventory.pods or ()):
                leaked.append({"ip": ip, "node": str(node), "pod": f"{namespace}/{pod}", "handle": str(handle)})
    empty = [h for h in inventory.handles if not held.get(h)]  # Calico deletes a handle once it holds none
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
    busiest = sorted(per_node.items(), key=lambda item: (-item[1]["allocated"], item[0]))[:SAMPLE]
    return {
        "blocks": len(inventory.blocks),
        "allocated": sum(allocated.values()),
        "pools": pools,
        "nodes": {
            "count": len(per_node),
            "busiest": [{"node": n, "blocks": c["blocks"], "allocated": c["allocated"]} for n, c in busiest],
        },
        "ipam_only_hosts": _found(ipam_only),
        "stale_handles": {**_found(stale_found, key=lambda s: s["handle"]), "repaired": 0},
        "handles_without_allocations": _found(empty),
        "dangling_allocations": _found(dangling, key=lambda d: d["ip"]),
        "leaked_ips": {
            "count": len(leaked) if inventory.pods is not None else None,
            "sample": sorted(leaked, key=lambda x: x["ip"])[:SAMPLE],
        },
        "next_step": NEXT_STEP,
    }


def with_repairs(audit: dict[str, Any] | None, repairs: Sequence[HandleRepair]) -> dict[str, Any] | None:
    """The audit once the planned handle repairs were applied: each one's outcome."""
    if audit is None:
        return None
    actions = {repair.handle_id: repair.action for repair in repairs}
    found = audit["stale_handles"]
    sample = [{**entry, "action": actions.get(entry["handle"], entry["action"])} for entry in found["sample"]]
    repaired = sum(1 for repair in repairs if repair.action == HANDLE_REPAIRED)
    return {**audit, "stale_handles": {**found, "sample": sample, "repaired": repaired}}
