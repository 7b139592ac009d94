"""The IPAM check every run makes, in every datastore (pure): pools and how full they are, the
nodes that hold the most, and the garbage it finds: IPAM-only hosts (which the run removes like
hosts), stale handles, allocations whose handle is missing, and pod IPs that look leaked on live
nodes (Kubernetes datastore, where the pods are read). The last three are reported, never
acted on: docs/calico-data.md says why."""

from __future__ import annotations

import ipaddress
from collections import Counter, defaultdict
from collections.abc import Set
from typing import Any

from job.ipam import affinity_host, block_data, handle_problem, normal_cidr, parse_handle
from job.model import Inventory

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


def ipam_audit(inventory: Inventory, live_nodes: Set[str]) -> dict[str, Any]:
    leaked: list[dict[str, str]] = []
    dangling: list[dict[str, str]] = []
    held: dict[str, Counter[str]] = defaultdict(Counter)  # handle -> block cidr -> allocations
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
            if isinstance(handle, str) and handle:
                held[handle][block.cidr] += 1
                if handle not in inventory.handles:
                    dangling.append({"ip": ip, "handle": handle})
            pod, namespace = secondary.get("pod"), secondary.get("namespace")
            known = inventory.pods is not None and node in live_nodes and pod and namespace
            if known and (namespace, pod) not in (inventory.pods or ()):
                leaked.append({"ip": ip, "node": str(node), "pod": f"{namespace}/{pod}", "handle": str(handle)})
    stale, empty = _stale_handles(inventory, held)
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
        "stale_handles": _found(stale, key=lambda s: s["handle"]),
        "handles_without_allocations": _found(empty),
        "dangling_allocations": _found(dangling, key=lambda d: d["ip"]),
        "leaked_ips": {
            "count": len(leaked) if inventory.pods is not None else None,
            "sample": sorted(leaked, key=lambda x: x["ip"])[:SAMPLE],
        },
        "next_step": NEXT_STEP,
    }


def _stale_handles(inventory: Inventory, held: dict[str, Counter[str]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Handles that count more IPs in a block than the block holds for them, and (a subset)
    those that count IPs but hold none at all. A handle counting fewer is never listed: Calico
    raises the handle before it writes the block, so that is an allocation in flight."""
    stale: list[dict[str, Any]] = []
    empty: list[str] = []
    unparsable = set(inventory.malformed_blocks)
    for handle_id, handle in inventory.handles.items():
        data = parse_handle(handle.item.value or "")
        if data is None or handle_problem(data) is not None:
            continue
        counts: dict[str, int] = data.get("block") or {}
        holds = held.get(handle_id, Counter())
        over = {
            cidr: {"counts": count, "held": holds.get(normal_cidr(cidr) or cidr, 0)}
            for cidr, count in counts.items()
            if (normal_cidr(cidr) or cidr) not in unparsable and count > holds.get(normal_cidr(cidr) or cidr, 0)
        }
        if over:
            stale.append({"handle": handle_id, "blocks": over})
        if not holds:
            empty.append(handle_id)  # Calico deletes a handle once it holds nothing
    return stale, empty
