"""The kops-like cluster of the incidents that drive this project, as seed data."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.support.calico import CalicoSeed

LIVE = ("ip-10-0-1-10.ec2.internal", "ip-10-0-1-11.ec2.internal", "ip-10-0-1-12.ec2.internal")
# A node renamed by a DHCP-domain change: its old Calico host still holds 10.0.1.13.
CONFLICT_ORPHAN = "ip-10-0-1-13.custom.example.com"
NEW_NODE = "ip-10-0-1-13.ec2.internal"
# A deleted node with pods, its own block, an IP borrowed from a live node's block, and a
# block that still lends an IP to a live node's pod.
POD_ORPHAN = "ip-10-0-1-20.ec2.internal"
# Registered before CALICO_K8S_NODE_REF existed: no orchRefs.
UNREFERENCED = "legacy-worker-7"


@dataclass
class Scenario:
    seed: CalicoSeed
    k8s_nodes: list[tuple[str, str]] = field(default_factory=list)


def kops_cluster() -> Scenario:
    seed = CalicoSeed()
    seed.cluster_information()
    for index, name in enumerate(LIVE):
        seed.block(f"100.96.{index}.0/26", name)
        seed.node(name, ipv4=f"10.0.1.{10 + index}", tunnel_ip=f"100.96.{index}.1")
        seed.felix(name, alive=True)
        seed.pod(name, "default", f"web-{index}", f"100.96.{index}.5")
    seed.peer("rr-global", None)

    seed.block("100.96.13.0/26", CONFLICT_ORPHAN)
    seed.node(CONFLICT_ORPHAN, ipv4="10.0.1.13", tunnel_ip="100.96.13.1")
    seed.felix(CONFLICT_ORPHAN, alive=False)

    seed.block("100.96.20.0/26", POD_ORPHAN)
    seed.node(POD_ORPHAN, ipv4="10.0.1.20", tunnel_ip="100.96.20.1")
    seed.pod(POD_ORPHAN, "shop", "cart-1", "100.96.20.5")
    seed.pod(POD_ORPHAN, "shop", "cart-2", "100.96.20.6")
    seed.pod(POD_ORPHAN, "shop", "cart-3", "100.96.0.40")  # borrowed from a live node's block
    seed.pod(LIVE[1], "shop", "api-1", "100.96.20.9")  # a live pod in the orphan's block
    seed.felix(POD_ORPHAN, alive=False)
    seed.node_config(POD_ORPHAN)
    seed.peer("tor-ip-10-0-1-20", POD_ORPHAN)
    seed.host_endpoint("ip-10-0-1-20-eth0", POD_ORPHAN)

    seed.block("100.96.30.0/26", UNREFERENCED)
    seed.node(UNREFERENCED, ipv4="10.0.1.30", k8s_node=None)
    seed.pod(UNREFERENCED, "default", "old-1", "100.96.30.4")

    k8s = [(name, f"10.0.1.{10 + i}") for i, name in enumerate(LIVE)] + [(NEW_NODE, "10.0.1.13")]
    return Scenario(seed, k8s)


# The pod whose IP cross_borrowing_fleet(leak=True) leaves a leak candidate: a run reads it.
LEAK_CANDIDATES_POD = "^/api/v1/namespaces/default/pods/web-0$"


def cross_borrowing_fleet(orphans: int, leak: bool = False) -> Scenario:
    """Live nodes and `orphans` deleted ones whose IPAM is entangled as it is after churn.

    Each orphan has its own IPv4 and IPv6 block, a tunnel address, a dual-stack pod (one handle
    in two blocks), a dual-stack pod whose IPs it borrowed from others' blocks, per-node config and
    a node-bound peer. A live pod holds an IP in an orphan's block, so that block must be kept
    without its affinity. With `leak`, a live pod's endpoint is gone (its CNI DEL lost): its IP
    is a leak candidate, so a run reads that pod (LEAK_CANDIDATES_POD; without one it reads none).
    """
    seed = CalicoSeed()
    seed.cluster_information()
    live = [f"live-{i}" for i in range(3)]
    for i, name in enumerate(live):
        seed.block(f"100.64.{100 + i}.0/26", name)
        seed.node(name, ipv4=f"10.1.0.{10 + i}", tunnel_ip=f"100.64.{100 + i}.1")
        seed.felix(name, alive=True)
        endpoint = seed.pod(name, "default", f"web-{i}", f"100.64.{100 + i}.5")
        if leak and i == 0:
            del seed.keys[endpoint]
    names = [f"gone-{i}" for i in range(orphans)]
    for i, name in enumerate(names):
        seed.block(f"100.64.{i}.0/26", name)
        seed.block(f"fd00:64:{i}::/122", name)
        seed.node(name, ipv4=f"10.1.1.{10 + i}", tunnel_ip=f"100.64.{i}.1")
        seed.felix(name, alive=False)
        seed.node_config(name)
        seed.peer(f"tor-{name}", name)
    for i, name in enumerate(names):
        seed.pod(name, "shop", f"cart-{i}", f"100.64.{i}.5", ipv6=f"fd00:64:{i}::5")
        # A dual-stack pod with both IPs borrowed: IPv4 from the next orphan's block (even i) or
        # a live node's, IPv6 from the previous orphan's. So a later host may commit its own block
        # and then find a block that an earlier host already changed, and be planned again.
        ipv4 = f"100.64.{i + 1}.40" if i % 2 == 0 and i + 1 < orphans else f"100.64.{100 + i % 3}.{40 + i}"
        seed.pod(name, "shop", f"borrower-{i}", ipv4, ipv6=f"fd00:64:{(i - 1) % orphans}::{40 + i:x}")
    seed.pod(live[1], "shop", "api-1", f"100.64.{orphans - 1}.9")
    return Scenario(seed, [(name, f"10.1.0.{10 + i}") for i, name in enumerate(live)])
