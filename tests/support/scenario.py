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
