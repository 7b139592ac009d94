"""IPAM-only hosts: names the etcd datastores hold data for (IPAM, endpoints, config, status)
but no Calico Node, which is what a hand-run clean-up that deleted only the Node leaves. Treated
as orphans (reason `no_calico_node`) under the same guards, grace and re-checks as hosts."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from job.adapters.datastores.etcdv2 import EtcdV2Datastore
from job.adapters.datastores.etcdv3 import EtcdV3Datastore
from tests.adapters.test_etcdv2 import seeded
from tests.conftest import Harness, hosts_by_name
from tests.support import calico, calico2
from tests.support import scenario as s

NODE = f"/calico/resources/v3/projectcalico.org/nodes/{s.POD_ORPHAN}"


def values(harness: Harness) -> dict[str, str]:
    return {k: v for k, (v, _) in harness.dump().items()}


def hand_cleaned(harness: Harness) -> None:
    """The kops cluster after someone ran `etcdctl del` on one orphan's Calico Node only."""
    harness.seed(s.kops_cluster())
    calico.delete(harness.etcd.url, NODE)


def test_an_ipam_only_host_is_removed_exactly_as_the_host_would_have_been(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    report, code = harness.run(harness.config(apply=True, keep_reports=0))
    assert code == 0 and hosts_by_name(report)[s.POD_ORPHAN]["reason"] == "k8s_node_missing"
    with_node = values(harness)
    calico.wipe(harness.etcd.url)

    hand_cleaned(harness)
    dry, code = harness.run()
    host = hosts_by_name(dry)[s.POD_ORPHAN]
    assert code == 0 and (host["action"], host["reason"]) == ("would_delete", "no_calico_node")
    assert host["ipv4"] is None and host["k8s_node"] is None
    report, code = harness.run(harness.config(apply=True, keep_reports=0))
    assert code == 0 and hosts_by_name(report)[s.POD_ORPHAN]["action"] == "deleted"
    after = values(harness)
    # The same keyspace as removing the registered host: its endpoints, config, status, BGP peer,
    # tunnel handle and pod handles, the IP it borrowed, its block kept for the live pod it lends to.
    assert calico.semantic(after) == calico.semantic(with_node)
    assert calico.ipam_problems(after) == []
    assert not any(s.POD_ORPHAN in key for key in after)


def test_a_name_whose_kubernetes_node_exists_is_live_even_without_a_calico_node(harness: Harness) -> None:
    hand_cleaned(harness)
    harness.kubeapi.add_node(s.POD_ORPHAN, "10.0.1.20")  # calico-node has not registered it (yet)
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and s.POD_ORPHAN not in hosts_by_name(report)
    assert any(s.POD_ORPHAN in key for key in values(harness))


def test_an_ipam_only_host_waits_its_grace_and_can_be_excluded(harness: Harness) -> None:
    hand_cleaned(harness)
    before = harness.dump()
    report, code = harness.run(harness.config(apply=True, grace_period=timedelta(minutes=30)))
    assert code == 0 and hosts_by_name(report)[s.POD_ORPHAN]["action"] == "waiting_grace"
    report, code = harness.run(harness.config(apply=True, exclude=(r"ip-10-0-1-20\..*",)))
    assert hosts_by_name(report)[s.POD_ORPHAN]["reason"] == "excluded"
    assert {k: v for k, v in harness.dump().items() if s.POD_ORPHAN in k} == {
        k: v for k, v in before.items() if s.POD_ORPHAN in k
    }


def test_a_node_registering_while_etcd_v3_is_read_is_not_seen_half(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read is pinned to one revision: a Calico Node and the IPAM it claims, written after
    the pin, are both invisible to this run, never the IPAM alone."""
    harness.seed(s.kops_cluster())
    newcomer = calico.CalicoSeed()
    newcomer.block("100.96.50.0/26", "newcomer")
    newcomer.node("newcomer", ipv4="10.0.1.50", tunnel_ip="100.96.50.1")
    real = EtcdV3Datastore.range
    calls = []

    def range_then_register(self: Any, start: str, end: bytes | None, revision: int | None, *rest: Any) -> Any:
        answer = real(self, start, end, revision, *rest)
        if not calls:  # right after the revision is pinned
            calico.load(harness.etcd.url, newcomer.keys)
        calls.append(start)
        return answer

    monkeypatch.setattr(EtcdV3Datastore, "range", range_then_register)
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and "newcomer" not in hosts_by_name(report)
    assert set(newcomer.keys) <= set(values(harness))


def test_a_node_registering_while_etcd_v2_is_read_is_never_ipam_only(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd v2 reads subtree by subtree with no pinned revision. The host trees, with `metadata`,
    are read last, so a host that registers (and claims a block) in between is seen registered."""
    seeded(harness)
    newcomer = calico2.Calico2Seed()
    newcomer.block("100.96.50.0/26", "newcomer")
    # Registered without orchestrator_refs, under a name no Kubernetes Node has: a host a run
    # skips (no_k8s_orchref). Seen without its metadata it would be IPAM-only, and deleted.
    newcomer.host("newcomer", "10.0.2.50", k8s_node=None, tunnel_ip="100.96.50.1")
    real = EtcdV2Datastore._get
    calls: list[str] = []

    def get_then_register(self: Any, key: str, recursive: bool = False) -> Any:
        answer = real(self, key, recursive)
        if recursive:
            if not calls:  # after the first subtree, whichever it is
                newcomer.load(harness.etcd.url)
            calls.append(key)
        return answer

    monkeypatch.setattr(EtcdV2Datastore, "_get", get_then_register)
    report, _ = harness.run(harness.config(datastore_type="etcdv2", apply=True))
    assert hosts_by_name(report)["newcomer"]["reason"] == "no_k8s_orchref"
    assert "/calico/ipam/v2/host/newcomer/ipv4/block/100.96.50.0-26" in calico2.dump(harness.etcd.url)


def test_etcd_v2_after_a_hand_deleted_host_tree_the_ipam_and_bgp_leftovers_go(harness: Harness) -> None:
    """The kops 1.8 clean-up: `etcdctl rm -r /calico/v1/host/<name>` left the host's IPAM
    affinity, its blocks and its BGP keys. Calico 2.x records no node on an allocation, so what
    is attributed to the name is its affinity and its BGP and Felix keys; its block keeps living
    without affinity while it lends an IP to a live pod."""
    from tests.support.calico2 import LIVE, ORPHAN, _session

    seeded(harness)
    _session().delete(
        f"{harness.etcd.url}/v2/keys/calico/v1/host/{ORPHAN}", params={"recursive": "true"}, timeout=10
    ).raise_for_status()
    report, code = harness.run(harness.config(datastore_type="etcdv2", apply=True))
    host = hosts_by_name(report)[ORPHAN]
    assert code == 0 and (host["action"], host["reason"]) == ("deleted", "no_calico_node")
    after = calico2.dump(harness.etcd.url)
    assert not any(f"/{ORPHAN}/" in key or key.endswith(f"/{ORPHAN}") for key in after)
    assert not [d for d in calico2.directories(harness.etcd.url) if ORPHAN in d], "its directories go too"
    lending = after["/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"][0]
    assert '"affinity": null' in lending or '"affinity":null' in lending
    assert f"/calico/v1/host/{LIVE[0]}/metadata" in after
    assert calico.ipam_problems({k: v for k, (v, _) in after.items()}) == []


def test_etcd_v2_a_hand_deleted_hosts_tunnel_ip_goes_with_it_and_a_live_hosts_never(harness: Harness) -> None:
    """Calico 2.6 allocated the IPIP address without a handle, and only the host's own
    config/IpInIpTunnelAddr named it, which the hand clean-up deleted. A handle-less allocation in a
    block still affine to the dead name, that no host's tunnel key names and no endpoint holds, is
    its tunnel IP: shown by the dry run, released with it. One that a live host names, or that an
    endpoint holds, stays."""
    from tests.support.calico2 import LIVE, ORPHAN, _session, kops_18_cluster

    seed, k8s = kops_18_cluster()
    seed.allocate("100.96.20.2", None)  # a live host's tunnel IP, in the dead host's block
    seed.put(f"/calico/v1/host/{LIVE[0]}/config/IpInIpTunnelAddr", "100.96.20.2")
    seed.allocate("100.96.20.3", None)  # held by a live workload endpoint
    seed.put(
        f"/calico/v1/host/{LIVE[1]}/workload/k8s/shop.odd/endpoint/eth0",
        json.dumps({"state": "active", "ipv4_nets": ["100.96.20.3/32"], "ipv6_nets": []}),
    )
    lonely = "ip-10-0-2-21.ec2.internal"  # a second dead host whose block holds only its tunnel IP
    seed.block("100.96.21.0/26", lonely)
    seed.host(lonely, "10.0.2.21", tunnel_ip="100.96.21.1")
    seed.load(harness.etcd.url)
    for name, ip in k8s:
        harness.kubeapi.add_node(name, ip)
    for dead in (ORPHAN, lonely):  # the seed incident's script: the host tree, nothing else
        _session().delete(
            f"{harness.etcd.url}/v2/keys/calico/v1/host/{dead}", params={"recursive": "true"}, timeout=10
        ).raise_for_status()
    dry, _ = harness.run(harness.config(datastore_type="etcdv2"))
    assert hosts_by_name(dry)[ORPHAN]["tunnel_ips"] == ["100.96.20.1"], "the dry run shows the IP before it goes"
    assert hosts_by_name(dry)[lonely]["tunnel_ips"] == ["100.96.21.1"]
    block_key = "/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"
    change = next(c for c in hosts_by_name(dry)[ORPHAN]["changes"] if c["key"] == block_key)
    assert json.loads(change["before"])["allocations"][1] is not None
    assert json.loads(change["after"])["allocations"][1] is None

    report, code = harness.run(harness.config(datastore_type="etcdv2", apply=True))
    assert code == 0 and {hosts_by_name(report)[h]["action"] for h in (ORPHAN, lonely)} == {"deleted"}
    after = calico2.dump(harness.etcd.url)
    assert "/calico/ipam/v2/assignment/ipv4/block/100.96.21.0-26" not in after, "emptied by its tunnel IP: deleted"
    shared = json.loads(after[block_key][0])
    assert shared["affinity"] is None and shared["allocations"][1] is None and 1 in shared["unallocated"]
    assert shared["allocations"][2] is not None, "a live host's tunnel IP is never touched"
    assert shared["allocations"][3] is not None, "an IP an endpoint holds is never touched"
    assert shared["allocations"][9] is not None, "the live pod keeps its IP"
