"""Generate a large Calico etcd-v3 datastore quickly (streamed, values built directly).

Per host: a Node (orchRefs, BGP address, IPIP tunnel IP), affine blocks holding its tunnel IP
and its pods' IPs (one /26 by default; as many blocks of another size as its pods need, in the
host's own /24), the blocks' affinities, one handle per allocation, the pods' workload endpoints,
and Felix status keys (live hosts report, orphans do not). Optionally each orphan has a pod whose
IP is in a live host's block (as after churn), live hosts have more pods, and (dual stack) each
host has an affine IPv6 /122 block too, each pod an address in both.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import random
from collections.abc import Callable, Iterable, Iterator

import requests

R = "/calico/resources/v3/projectcalico.org/"


def _dump(value: object) -> str:
    """As Calico's Go encoder writes (the "spread" shape rewrites it as another tool would)."""
    return json.dumps(value, separators=(",", ":"))


# How the fleet is laid out, so that a change cannot tune to one layout. "together": the orphans
# are the last hosts, live hosts' Felix reports (a `status` key), values as Calico writes them.
# "spread": every tenth host is an orphan, no host has a Felix `status` key (only
# `last_reported_status`), endpoints in 10 namespaces, values written by another JSON encoder.
# "namespaces": endpoints in 100 namespaces of very different sizes (a few large, a long tail),
# hosts with anything from no pods to twice the average, orphans picked at random.
SHAPES = ("together", "spread", "namespaces")
NAMESPACES = {"together": 7, "spread": 10, "namespaces": 100}


def orphan_indexes(hosts: int, orphans: int, shape: str) -> set[int]:
    if shape == "spread":
        step = max(1, hosts // max(orphans, 1))
        return {index * step + step - 1 for index in range(orphans)}
    if shape == "namespaces":
        return set(random.Random(hosts).sample(range(hosts), orphans))
    return set(range(hosts - orphans, hosts))


def namespace(index: int, pod: int, namespaces: int) -> str:
    """A pod's namespace: round robin over a few; over many, skewed as in real clusters (the
    square of an even draw puts a quarter of the pods in the first 6 of 100 namespaces)."""
    if namespaces < NAMESPACES["namespaces"]:
        return f"team-{pod % namespaces}"
    draw = (index * 2654435761 + pod * 40503) % 1000003 / 1000003
    return f"team-{int(namespaces * draw * draw)}"


def pods_on(index: int, pods_per_host: int, shape: str) -> int:
    """How many pods a host runs: as many on each, or (shape "namespaces") 0 to twice that."""
    return (index * 7919) % (2 * pods_per_host + 1) if shape == "namespaces" else pods_per_host


def host_name(index: int, names: str = "aws") -> str:
    """A host's name as its cloud gives it: "aws" (`ip-10-<a>-<b>-10.ec2.internal`, in the order of
    the hosts' addresses) or "gke" (`gke-<cluster>-<pool>-<group hash>-<host hash>`: hosts in pools
    and instance groups, in no order of the hosts within one, as a GKE node pool names them)."""
    if names == "gke":
        group = hashlib.sha256(f"group-{index // 50}".encode()).hexdigest()[:8]
        return f"gke-prod-pool-{index % 7}-{group}-{index * 40503 % 65536:04x}"  # odd factor: unique below 65,536
    return f"ip-10-{index // 250}-{index % 250}-10.ec2.internal"


HOST_NAMES = ("aws", "gke")


# The IP families of the pods: IPv4 alone, dual stack (an IPv4 and an IPv6 address each, one
# handle counting both; Calico's CNI plugin allocates them under one handle), or IPv6 alone (a
# /122 a host, its VXLAN tunnel address at ordinal 1 as calico-node's IPv6 VXLAN tunnel takes one).
FAMILIES = ("ipv4", "dual", "ipv6")
IPV6_POOL = ipaddress.IPv6Address("fd00:96::")


def _block(index: int, version: int = 4) -> tuple[str, Callable[[int], str]]:
    """A host's first block of 64 addresses (a /26, or an IPv6 /122), and its address at an ordinal."""
    if version == 6:
        base = IPV6_POOL + index * 64
        return f"{base}/122", lambda ordinal: str(base + ordinal)
    return _ipv4_blocks(index, 26, 1)[0]


def _ipv4_blocks(index: int, block_size: int, used: int) -> list[tuple[str, Callable[[int], str]]]:
    """A host's IPv4 blocks of prefix length `block_size` (Calico's IPPool blockSize, 20-32), as
    many as hold ordinals 0 to `used` - 1 of its own /24, each with its address at an ordinal."""
    size = 2 ** (32 - block_size)
    assert used <= 256, "a host's blocks lie in its own /24"
    a, b = 64 + index // 256, index % 256

    def block(first: int) -> tuple[str, Callable[[int], str]]:
        return f"100.{a}.{b}.{first}/{block_size}", lambda ordinal: f"100.{a}.{b}.{first + ordinal}"

    return [block(first) for first in range(0, max(used, 1), size)]


def _block_key(cidr: str) -> str:
    """A block's key: its family and its cidr with `-` for `/` (`fd00:96::40-122`)."""
    return f"ipv{ipaddress.ip_network(cidr).version}/block/{cidr.replace('/', '-')}"


BORROWER = 999  # the pod number of an orphan's pod whose IP it borrowed from a live host's block
BORROWED_ORDINAL = 63


def _container_id(index: int, pod: int, hashed: bool) -> str:
    """A pod's container id: counted up by host (a handle's key then sorts with its host's), or
    `hashed` as a container runtime makes them (64 hexadecimal digits, in no order of hosts: the
    handles' keys then say nothing of where a host's lie)."""
    if hashed:
        return hashlib.sha256(f"{index}/{pod}".encode()).hexdigest()
    return f"{index:06x}{pod:06x}cafe"


def _pod_handle(index: int, pod: int, hashed: bool) -> str:
    return f"k8s-pod-network.{_container_id(index, pod, hashed)}"


def _pod_attribute(index: int, pod: int, namespaces: int, hashed: bool, names: str) -> dict[str, object]:
    return {
        "handle_id": _pod_handle(index, pod, hashed),
        "secondary": {
            "namespace": namespace(index, pod, namespaces),
            "node": host_name(index, names),
            "pod": f"app-{index}-{pod}",
            "timestamp": "2026-01-01 00:00:00.000000000 +0000 UTC",
        },
    }


def _pod_keys(
    index: int, pod: int, addresses: list[tuple[str, str]], namespaces: int, hashed: bool, names: str
) -> Iterator[tuple[str, str]]:
    """A pod's handle and workload endpoint, for its (address, block cidr) in each family (its
    allocations are in the blocks' values)."""
    name, container, team = (
        host_name(index, names),
        _container_id(index, pod, hashed),
        namespace(index, pod, namespaces),
    )
    counts = {cidr: 1 for _, cidr in sorted(addresses, key=lambda a: a[1])}  # Go writes a map's keys sorted
    yield f"/calico/ipam/v2/handle/{_pod_handle(index, pod, hashed)}", _dump({"block": counts, "deleted": False})
    wep = f"{name.replace('-', '--')}-k8s-app--{index}--{pod}-eth0"
    yield (
        f"{R}workloadendpoints/{team}/{wep}",
        _dump(
            {
                "kind": "WorkloadEndpoint",
                "apiVersion": "projectcalico.org/v3",
                "metadata": {
                    "name": wep,
                    "namespace": team,
                    "uid": f"{container}-uid",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "labels": {
                        "app": f"app-{pod}",
                        "projectcalico.org/namespace": team,
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
                    "ipNetworks": [f"{ip}/{32 if '.' in ip else 128}" for ip, _ in addresses],
                    "profiles": [f"kns.{team}", "ksa.team.default"],
                    "interfaceName": f"cali{container[:11]}",
                    "mac": "ee:ee:ee:ee:ee:ee",
                },
            }
        ),
    )


def host_keys(
    index: int,
    pods: int,
    orphan: bool,
    lends_to: int | None = None,
    borrows_from: int | None = None,
    felix_reports: bool = True,
    namespaces: int = NAMESPACES["together"],
    hashed: bool = False,
    names: str = "aws",
    families: str = "ipv4",
    block_size: int = 26,
) -> Iterator[tuple[str, str]]:
    """One host's keys. `lends_to`: the orphan whose borrower pod has an IP in this host's block;
    `borrows_from`: the live host whose block holds this orphan's borrower pod's IP; `hashed`:
    container ids as a runtime makes them (_container_id); `names`: host_name's; `families`: one
    of FAMILIES (borrowing is IPv4 only); `block_size`: the IPv4 blocks' prefix length (the
    IPv6 block is a /122, holding 62 pods)."""
    name = host_name(index, names)
    size = 2 ** (32 - block_size)
    ipv4 = [] if families == "ipv6" else _ipv4_blocks(index, block_size, pods + 2)
    blocks = ipv4 + ([_block(index, 6)] if families != "ipv4" else [])
    (cidr, address), *_ = blocks
    bgp: dict[str, str] = {}
    if families != "ipv6":
        bgp.update(ipv4Address=f"10.{index // 250}.{index % 250}.10/19", ipv4IPIPTunnelAddr=address(1))
    if families != "ipv4":
        bgp["ipv6Address"] = f"fd00:10::{index:x}:10/64"
    spec: dict[str, object] = {"bgp": bgp}
    if families == "ipv6":
        spec["ipv6VXLANTunnelAddr"] = address(1)
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
                "spec": {**spec, "orchRefs": [{"nodeName": name, "orchestrator": "k8s"}]},
            }
        ),
    )
    # Each block's attributes and allocations: the pods at ordinals 2 on of the host's addresses
    # in every family; the tunnel (ordinal 1) and a borrowed IP (BORROWED_ORDINAL) in the first
    # block only (the IPv4 one, where there is one).
    kind, type_ = ("vxlan-v6", "vxlanV6TunnelAddress") if families == "ipv6" else ("ipip", "ipipTunnelAddress")
    tunnel = {"handle_id": f"{kind}-tunnel-addr-{name}", "secondary": {"node": name, "type": type_}}
    yield f"/calico/ipam/v2/handle/{kind}-tunnel-addr-{name}", _dump({"block": {cidr: 1}, "deleted": False})
    held: list[dict[int, dict[str, object]]] = [{1: tunnel}] + [{} for _ in blocks[1:]]
    for pod in range(pods):
        ordinal = pod + 2
        places = [(ordinal // size, ordinal % size)] if ipv4 else []
        places += [(len(ipv4), ordinal)] * (len(blocks) - len(ipv4))
        for number, within in places:
            held[number][within] = _pod_attribute(index, pod, namespaces, hashed, names)
        addresses = [(blocks[number][1](within), blocks[number][0]) for number, within in places]
        yield from _pod_keys(index, pod, addresses, namespaces, hashed, names)
    if lends_to is not None:
        held[0][BORROWED_ORDINAL] = _pod_attribute(lends_to, BORROWER, namespaces, hashed, names)
    if borrows_from is not None:
        lender_cidr, lender_at = _block(borrows_from)
        yield from _pod_keys(index, BORROWER, [(lender_at(BORROWED_ORDINAL), lender_cidr)], namespaces, hashed, names)
    for (block, _), ordinals in zip(blocks, held, strict=True):
        allocations: list[int | None] = [None] * ipaddress.ip_network(block).num_addresses
        for position, ordinal in enumerate(sorted(ordinals)):
            allocations[ordinal] = position
        yield (
            f"/calico/ipam/v2/assignment/{_block_key(block)}",
            _dump(
                {
                    "cidr": block,
                    "affinity": f"host:{name}",
                    "allocations": allocations,
                    "unallocated": [o for o in range(len(allocations)) if o not in ordinals],
                    "attributes": [ordinals[o] for o in sorted(ordinals)],
                    "deleted": False,
                    "sequenceNumber": 1_700_000_000_000_000_000 + index,
                    "sequenceNumberForAllocation": {str(o): 1_700_000_000_000_000_000 for o in sorted(ordinals)},
                    "strictAffinity": False,
                }
            ),
        )
        yield f"/calico/ipam/v2/host/{name}/{_block_key(block)}", _dump({"state": "confirmed", "deleted": False})
    status = _dump({"time": "2026-11-30T05:00:00Z", "uptime": 86400.5, "first_update": False})
    yield f"/calico/felix/v2/no-region/host/{name}/last_reported_status", status
    if not orphan and felix_reports:
        yield f"/calico/felix/v2/no-region/host/{name}/status", status


def datastore(
    hosts: int,
    orphans: int,
    pods_per_host: int,
    borrow: bool = False,
    extra_endpoints: int = 0,
    shape: str = "together",
    namespaces: int | None = None,
    hashed: bool = False,
    names: str = "aws",
    families: str = "ipv4",
    block_size: int = 26,
) -> Iterator[tuple[str, str]]:
    """Every key; `orphan_indexes` are the hosts whose Kubernetes Node is gone (`shape`). `borrow`
    (shape "together" only): each orphan has one more pod, whose IP it borrowed from a live host's
    block (at most one per live host). `extra_endpoints`: that many more pods, spread over the live
    hosts. `namespaces`: that many instead of the shape's (100 or more: skewed sizes). `hashed`:
    container ids as a runtime makes them (_container_id). `names`: how hosts are named (host_name).
    `families`: the pods' IP families (FAMILIES). `block_size`: the IPv4 blocks' prefix length;
    a host has as many as its pods need, in its own /24 (up to 254 pods)."""
    live = hosts - orphans
    namespaces = namespaces or NAMESPACES[shape]
    assert not borrow or (orphans <= live and shape == "together"), "each orphan borrows from its own live host"
    assert not borrow or families == "ipv4", "borrowed IPs are IPv4"
    gone = orphan_indexes(hosts, orphans, shape)
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
    # The Profile kube-controllers keeps for each namespace (etcd mode), as it writes it.
    for team in (f"team-{n}" for n in range(namespaces)):  # every name `namespace` gives
        yield (
            f"{R}profiles/kns.{team}",
            _dump(
                {
                    "kind": "Profile",
                    "apiVersion": "projectcalico.org/v3",
                    "metadata": {"name": f"kns.{team}", "creationTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {
                        "ingress": [{"action": "Allow", "source": {}, "destination": {}}],
                        "egress": [{"action": "Allow", "source": {}, "destination": {}}],
                        "labelsToApply": {"pcns.projectcalico.org/name": team},
                    },
                }
            ),
        )
    for index in range(hosts):
        orphan = index in gone
        pods = pods_on(index, pods_per_host, shape)
        if not orphan and extra_endpoints:
            pods += extra_endpoints // live + (index < extra_endpoints % live)
        if borrow or families != "ipv4":
            assert pods + 2 < BORROWED_ORDINAL, "a /26 (or /122) holds the tunnel, the pods and one borrowed IP"
            assert block_size == 26, "a borrowed IP is in a lender's first /26, the IPv6 block a /122 of 62 pods"
        lends_to = live + index if borrow and index < orphans else None
        borrows_from = index - live if borrow and orphan else None
        keys = host_keys(
            index,
            pods,
            orphan,
            lends_to,
            borrows_from,
            shape == "together",
            namespaces,
            hashed,
            names,
            families,
            block_size,
        )
        # Another tool's encoder: spaces after the separators (Python's default).
        yield from keys if shape == "together" else ((k, json.dumps(json.loads(v))) for k, v in keys)


def unattributed(keys: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """The keys with no allocation's `secondary` attributes (as where an allocation has none): blocks
    that name no pod's namespace, node or name, as a generator that writes only handles may."""
    for key, value in keys:
        if key.startswith("/calico/ipam/v2/assignment/"):
            block = json.loads(value)
            for attribute in block.get("attributes") or []:
                attribute.pop("secondary", None)
            value = json.dumps(block)
        yield key, value


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
