"""Generate a large Calico etcd-v3 datastore quickly (streamed, values built directly).

Per host: a Node (orchRefs, BGP address, IPIP tunnel IP), one affine /26 block holding its
tunnel IP and its pods' IPs, the block affinity, one handle per allocation, the pods'
workload endpoints, and Felix status keys (live hosts report, orphans do not).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import requests

R = "/calico/resources/v3/projectcalico.org/"


def _dump(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def host_name(index: int) -> str:
    return f"ip-10-{index // 250}-{index % 250}-10.ec2.internal"


def host_keys(index: int, pods: int, orphan: bool) -> Iterator[tuple[str, str]]:
    name = host_name(index)
    a, b = 64 + index // 256, index % 256
    cidr = f"100.{a}.{b}.0/26"
    tunnel = f"100.{a}.{b}.1"
    yield (
        f"{R}nodes/{name}",
        _dump(
            {
                "kind": "Node",
                "apiVersion": "projectcalico.org/v3",
                "metadata": {
                    "name": name,
                    "uid": f"uid-{index}",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "eu-west-1a"},
                },
                "spec": {
                    "bgp": {"ipv4Address": f"10.{index // 250}.{index % 250}.10/19", "ipv4IPIPTunnelAddr": tunnel},
                    "orchRefs": [{"nodeName": name, "orchestrator": "k8s"}],
                },
            }
        ),
    )
    attributes = [{"handle_id": f"ipip-tunnel-addr-{name}", "secondary": {"node": name, "type": "ipipTunnelAddress"}}]
    allocations: list[int | None] = [None] * 64
    allocations[1] = 0
    yield f"/calico/ipam/v2/handle/ipip-tunnel-addr-{name}", _dump({"block": {cidr: 1}, "deleted": False})
    for pod in range(pods):
        ordinal = pod + 2
        ip = f"100.{a}.{b}.{ordinal}"
        container = f"{index:06x}{pod:06x}cafe"
        handle = f"k8s-pod-network.{container}"
        attributes.append(
            {
                "handle_id": handle,
                "secondary": {
                    "namespace": f"team-{pod % 7}",
                    "node": name,
                    "pod": f"app-{index}-{pod}",
                    "timestamp": "2026-01-01 00:00:00.000000000 +0000 UTC",
                },
            }
        )
        allocations[ordinal] = len(attributes) - 1
        yield f"/calico/ipam/v2/handle/{handle}", _dump({"block": {cidr: 1}, "deleted": False})
        wep = f"{name.replace('-', '--')}-k8s-app--{index}--{pod}-eth0"
        yield (
            f"{R}workloadendpoints/team-{pod % 7}/{wep}",
            _dump(
                {
                    "kind": "WorkloadEndpoint",
                    "apiVersion": "projectcalico.org/v3",
                    "metadata": {
                        "name": wep,
                        "namespace": f"team-{pod % 7}",
                        "uid": f"{container}-uid",
                        "creationTimestamp": "2026-01-01T00:00:00Z",
                        "labels": {
                            "app": f"app-{pod}",
                            "projectcalico.org/namespace": f"team-{pod % 7}",
                            "projectcalico.org/orchestrator": "k8s",
                            "projectcalico.org/serviceaccount": "default",
                        },
                    },
                    "spec": {
                        "orchestrator": "k8s",
                        "node": name,
                        "containerID": container,
                        "pod": f"app-{index}-{pod}",
                        "endpoint": "eth0",
                        "serviceAccountName": "default",
                        "ipNetworks": [f"{ip}/32"],
                        "profiles": [f"kns.team-{pod % 7}", "ksa.team.default"],
                        "interfaceName": f"cali{container[:11]}",
                        "mac": "ee:ee:ee:ee:ee:ee",
                    },
                }
            ),
        )
    used = {o for o, v in enumerate(allocations) if v is not None}
    yield (
        f"/calico/ipam/v2/assignment/ipv4/block/{cidr.replace('/', '-')}",
        _dump(
            {
                "cidr": cidr,
                "affinity": f"host:{name}",
                "allocations": allocations,
                "unallocated": [o for o in range(64) if o not in used],
                "attributes": attributes,
                "deleted": False,
                "sequenceNumber": 1_700_000_000_000_000_000 + index,
                "sequenceNumberForAllocation": {str(o): 1_700_000_000_000_000_000 for o in sorted(used)},
                "strictAffinity": False,
            }
        ),
    )
    yield (
        f"/calico/ipam/v2/host/{name}/ipv4/block/{cidr.replace('/', '-')}",
        _dump({"state": "confirmed", "deleted": False}),
    )
    status = _dump({"time": "2026-11-30T05:00:00Z", "uptime": 86400.5, "first_update": False})
    yield f"/calico/felix/v2/no-region/host/{name}/last_reported_status", status
    if not orphan:
        yield f"/calico/felix/v2/no-region/host/{name}/status", status


def datastore(hosts: int, orphans: int, pods_per_host: int) -> Iterator[tuple[str, str]]:
    """Every key; the last `orphans` hosts are the ones whose Kubernetes Node is gone."""
    yield (
        f"{R}clusterinformations/default",
        _dump(
            {
                "kind": "ClusterInformation",
                "apiVersion": "projectcalico.org/v3",
                "metadata": {"name": "default"},
                "spec": {"clusterGUID": "bench", "datastoreReady": True},
            }
        ),
    )
    for index in range(hosts):
        yield from host_keys(index, pods_per_host, orphan=index >= hosts - orphans)


def load(url: str, keys: Iterator[tuple[str, str]]) -> int:
    """Stream keys into etcd in transactions of 128 puts; returns the key count."""
    session = requests.Session()
    session.trust_env = False
    batch: list[dict[str, object]] = []
    count = 0

    def flush() -> None:
        session.post(f"{url}/v3/kv/txn", json={"success": batch}, timeout=60).raise_for_status()
        batch.clear()

    for key, value in keys:
        batch.append(
            {
                "request_put": {
                    "key": base64.b64encode(key.encode()).decode(),
                    "value": base64.b64encode(value.encode()).decode(),
                }
            }
        )
        count += 1
        if len(batch) == 128:
            flush()
    if batch:
        flush()
    return count
