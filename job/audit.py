"""A read-only IPAM audit (Kubernetes datastore): what looks leaked on nodes that still exist,
and how full the pools are. Reported with the next step; never acted on (pure)."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Set
from typing import Any

from job.ipam import affinity_host, block_data
from job.model import Inventory

SAMPLE = 20
NEXT_STEP = (
    "lock the datastore (calicoctl datastore migrate lock), run `calicoctl ipam check -o report.json`, "
    "review it, `calicoctl ipam release --from-report report.json`, then unlock"
)


def _within(
    block: ipaddress.IPv4Network | ipaddress.IPv6Network, pool: ipaddress.IPv4Network | ipaddress.IPv6Network
) -> bool:
    """Whether a block lies in a pool; never across IP versions (a dual-stack cluster has both)."""
    if isinstance(block, ipaddress.IPv4Network) and isinstance(pool, ipaddress.IPv4Network):
        return block.subnet_of(pool)
    if isinstance(block, ipaddress.IPv6Network) and isinstance(pool, ipaddress.IPv6Network):
        return block.subnet_of(pool)
    return False


def ipam_audit(inventory: Inventory, live_nodes: Set[str]) -> dict[str, Any]:
    leaked: list[dict[str, str]] = []
    referenced: set[str] = set()
    allocated: Counter[str] = Counter()
    for block in inventory.blocks:
        data = block_data(block)
        network = ipaddress.ip_network(block.cidr)
        host = affinity_host(data)
        for ordinal, index in enumerate(data["allocations"]):
            if index is None:
                continue
            allocated[block.cidr] += 1
            attribute = data["attributes"][index]
            handle = attribute.get("handle_id")
            if isinstance(handle, str):
                referenced.add(handle)
            secondary = attribute.get("secondary") or {}
            node = secondary.get("node") or host
            pod, namespace = secondary.get("pod"), secondary.get("namespace")
            if (
                inventory.pods is not None
                and node in live_nodes
                and pod
                and namespace
                and (namespace, pod) not in inventory.pods
            ):
                leaked.append(
                    {
                        "ip": str(network.network_address + ordinal),
                        "node": str(node),
                        "pod": f"{namespace}/{pod}",
                        "handle": str(handle),
                    }
                )
    empty_handles = sorted(h for h in inventory.handles if h not in referenced)
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
    return {
        "leaked_ips": {
            "count": len(leaked) if inventory.pods is not None else None,
            "sample": sorted(leaked, key=lambda x: x["ip"])[:SAMPLE],
        },
        "handles_without_allocations": {"count": len(empty_handles), "sample": empty_handles[:SAMPLE]},
        "pools": pools,
        "next_step": NEXT_STEP,
    }
