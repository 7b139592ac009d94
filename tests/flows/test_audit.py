"""The IPAM check every run makes, on etcd v3 and v2 (the Kubernetes datastore: test_kdd.py):
pools, nodes, IPAM-only hosts, stale handles, allocations without a handle; and its metrics."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from job.cli import main
from job.core.report import render_text
from tests.adapters.test_etcdv2 import seeded
from tests.adapters.test_health import cli_env
from tests.conftest import Harness
from tests.support import calico, calico2
from tests.support import scenario as s
from tests.support.prometheus import Pushgateway

HOSTS_ASIDE = (re.escape(s.CONFLICT_ORPHAN), re.escape(s.POD_ORPHAN))
WEB0_HANDLE_PREFIX = "/calico/ipam/v2/handle/k8s-pod-network."


def garbage(harness: Harness) -> tuple[str, str]:
    """The kops cluster with an IP pool, a handle counting one IP too many and a live pod's
    allocation whose handle was deleted (both what a writer's crash leaves)."""
    scenario = s.kops_cluster()
    scenario.seed.resource("ippools", "default-ipv4-ippool", "IPPool", {"cidr": "100.96.0.0/16", "ipipMode": "Always"})
    harness.seed(scenario)
    keys = harness.dump()
    handles = sorted(k for k in keys if k.startswith(WEB0_HANDLE_PREFIX))
    stale, dangling = handles[0], handles[1]
    value = json.loads(keys[stale][0])
    (cidr,) = value["block"]
    value["block"][cidr] += 1
    calico.load(harness.etcd.url, {stale: json.dumps(value)})
    calico.delete(harness.etcd.url, dangling)
    return stale.rsplit("/", 1)[1], dangling.rsplit("/", 1)[1]


def test_every_etcd_v3_run_checks_ipam_and_reports_what_it_finds(harness: Harness) -> None:
    stale, dangling = garbage(harness)
    calico.delete(harness.etcd.url, f"/calico/resources/v3/projectcalico.org/nodes/{s.POD_ORPHAN}")
    before = harness.dump()
    report, code = harness.run()
    assert code == 0 and harness.dump() == before
    audit = report["audit"]
    assert audit["blocks"] == 6 and audit["pools"] == [
        {"cidr": "100.96.0.0/16", "size": 65536, "blocks": 6, "allocated": audit["allocated"], "utilisation": 0.0002}
    ]
    assert audit["ipam_only_hosts"] == {"count": 1, "sample": [s.POD_ORPHAN]}
    (finding,) = audit["stale_handles"]["sample"]
    assert finding["handle"] == stale and list(finding["blocks"].values()) == [{"counts": 2, "held": 1}]
    (allocation,) = audit["dangling_allocations"]["sample"]
    assert allocation["handle"] == dangling and audit["dangling_allocations"]["count"] == 1
    assert audit["leaked_ips"]["count"] == 0  # every pod IP here has its workload endpoint
    assert audit["nodes"]["count"] == 6 and audit["nodes"]["busiest"][0]["allocated"] >= 3


def test_etcd_v2_pools_and_blocks_are_checked(harness: Harness) -> None:
    seeded(harness)
    report, code = harness.run(harness.config(datastore_type="etcdv2"))
    audit = report["audit"]
    assert code == 0 and [p["cidr"] for p in audit["pools"]] == ["100.96.0.0/11"]
    assert audit["pools"][0]["blocks"] == audit["blocks"] > 0
    assert audit["stale_handles"]["count"] == 0 and audit["dangling_allocations"]["count"] == 0


def test_on_calico_2_an_allocation_whose_handle_names_a_pod_is_the_leak_checks_not_unattributed(
    harness: Harness,
) -> None:
    """Calico 2.x records no node on any allocation: in a gone host's block, one whose handle
    names a pod (`<namespace>.<pod>`) is judged by that pod (the leak check); only one whose
    handle names none, and that no endpoint holds, is listed as staying."""
    from tests.support.calico2 import ORPHAN, kops_18_cluster

    seed, k8s = kops_18_cluster()
    seed.allocate("100.96.20.7", "shop.gone-pod")
    seed.allocate("100.96.20.8", "by-hand")
    seed.load(harness.etcd.url)
    for name, ip in k8s:
        harness.kubeapi.add_node(name, ip)
    report, code = harness.run(harness.config(datastore_type="etcdv2"))
    assert code == 0
    unattributed = report["audit"]["unattributed_allocations"]["sample"]
    assert [(u["ip"], u["host"], u["handle"]) for u in unattributed] == [("100.96.20.8", ORPHAN, "by-hand")]


def test_the_ipam_check_is_pushed_as_metrics(
    harness: Harness,
    tmp_path: Path,
    pushgateway: Pushgateway,
    capsys: pytest.CaptureFixture[str],
) -> None:
    garbage(harness)
    assert main(["--pushgateway", pushgateway.url], cli_env(harness, tmp_path)) == 0
    capsys.readouterr()
    runs = pushgateway.group(job="calico-gc", cluster="default")
    assert runs is not None

    def metric(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return Pushgateway.samples(runs, name)

    assert metric("calico_gc_ipam_pool_utilisation")[(("pool", "100.96.0.0/16"),)] == 0.0002
    assert metric("calico_gc_ipam_stale_handles")[()] == 1
    assert metric("calico_gc_ipam_dangling_allocations")[()] == 1
    assert metric("calico_gc_ipam_unattributed_allocations")[()] == 0
    assert metric("calico_gc_ipam_only_hosts")[()] == 0
    assert metric("calico_gc_ipam_leaked_ips")[()] == 0


def over_counted(harness: Harness) -> tuple[str, dict[str, object]]:
    """A live pod's handle counting one IP more than its block holds: the kops cluster otherwise clean."""
    harness.seed(s.kops_cluster())
    harness.kubeapi.delete_node(s.NEW_NODE)  # nothing else for this test to think about
    keys = harness.dump()
    key = sorted(k for k in keys if k.startswith(WEB0_HANDLE_PREFIX))[0]
    right = json.loads(keys[key][0])
    wrong = {**right, "block": {cidr: count + 1 for cidr, count in right["block"].items()}}
    calico.load(harness.etcd.url, {key: json.dumps(wrong)})
    return key, right


def stale_entry(report: dict[str, object], key: str) -> dict[str, object]:
    audit = report["audit"]
    assert isinstance(audit, dict)
    (entry,) = [e for e in audit["stale_handles"]["sample"] if e["handle"] == key.rsplit("/", 1)[1]]
    return entry


def test_a_stale_handle_is_repaired_once_seen_twice_unchanged(harness: Harness) -> None:
    key, right = over_counted(harness)
    config = harness.config(apply=True, exclude=HOSTS_ASIDE)  # only the handle is at stake
    first, _ = harness.run(config)
    assert stale_entry(first, key)["action"] == "seen_once"
    assert json.loads(harness.dump()[key][0]) != right, "never on one sighting: it may be in flight"
    harness.now += timedelta(minutes=2)
    early, _ = harness.run(config)
    assert stale_entry(early, key)["action"] == "seen_once", "nor on a second one too soon after"
    harness.now += timedelta(minutes=8)
    dry, _ = harness.run(harness.config(exclude=HOSTS_ASIDE))
    assert stale_entry(dry, key)["action"] == "would_repair"
    second, code = harness.run(config)
    assert code == 0 and stale_entry(second, key)["action"] == "repaired"
    assert second["audit"]["stale_handles"]["repaired"] == 1
    assert json.loads(harness.dump()[key][0]) == right
    assert calico.ipam_problems({k: v for k, (v, _) in harness.dump().items()}) == []
    third, _ = harness.run(config)
    assert third["audit"]["stale_handles"]["count"] == 0


def test_a_handle_written_between_sightings_is_seen_afresh(harness: Harness) -> None:
    key, _ = over_counted(harness)
    config = harness.config(apply=True, exclude=HOSTS_ASIDE)
    harness.run(config)
    value = harness.dump()[key][0]
    calico.load(harness.etcd.url, {key: value})  # the same value, written again: a new revision
    harness.now += timedelta(minutes=10)
    report, _ = harness.run(config)
    assert stale_entry(report, key)["action"] == "seen_once"
    assert harness.dump()[key][0] == value


def test_a_handle_a_deleted_host_writes_anyway_is_left_to_it(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    keys = harness.dump()
    tunnel = f"/calico/ipam/v2/handle/ipip-tunnel-addr-{s.POD_ORPHAN}"
    value = json.loads(keys[tunnel][0])
    calico.load(harness.etcd.url, {tunnel: json.dumps({**value, "block": {"100.96.20.0/26": 2}})})
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and stale_entry(report, tunnel)["action"] == "left_to_host"
    assert tunnel not in harness.dump()


def test_dual_stack_on_etcd_v3_pools_of_each_version_and_the_orphans_ipv6_block(harness: Harness) -> None:
    scenario = s.kops_cluster()
    seed = scenario.seed
    seed.resource("ippools", "default-ipv4-ippool", "IPPool", {"cidr": "100.96.0.0/16"})
    seed.resource("ippools", "default-ipv6-ippool", "IPPool", {"cidr": "fd00:96::/48"})
    seed.block("fd00:96::/122", s.LIVE[0])
    seed.block("fd00:96::40/122", s.POD_ORPHAN)
    seed.pod(s.LIVE[0], "default", "dual-0", "100.96.0.7", ipv6="fd00:96::7")
    seed.pod(s.POD_ORPHAN, "shop", "dual-1", "100.96.20.7", ipv6="fd00:96::47")
    seed.pod(s.LIVE[1], "shop", "dual-2", "100.96.1.8", ipv6="fd00:96::48")  # borrowed from the orphan's block
    harness.seed(scenario)
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2
    pools = {p["cidr"]: (p["blocks"], p["allocated"]) for p in report["audit"]["pools"]}
    assert set(pools) == {"100.96.0.0/16", "fd00:96::/48"} and pools["fd00:96::/48"] == (2, 3)
    after = {k: v for k, (v, _) in harness.dump().items()}
    lending = json.loads(after["/calico/ipam/v2/assignment/ipv6/block/fd00:96::40-122"])
    assert lending["affinity"] is None, "it still lends dual-2 its IPv6 address"
    assert [a["secondary"]["pod"] for a in lending["attributes"]] == ["dual-2"]
    assert f"/calico/ipam/v2/host/{s.POD_ORPHAN}/ipv6/block/fd00:96::40-122" not in after
    assert "/calico/ipam/v2/assignment/ipv6/block/fd00:96::-122" in after
    assert calico.ipam_problems(after) == []


def bench_fleet_deleted(harness: Harness, pods: int, **layout: Any) -> tuple[dict[str, str], dict[str, str]]:
    """bench.generate's fleet of 24 hosts (`namespaces`, hashed ids, GKE names) in `layout`, read
    whole and applied: no problem found in it, every gone host's keys deleted and every live
    host's kept, and what is left is IPAM `calicoctl ipam check` accepts. Gives the keys before
    and after."""
    from bench.generate import datastore, host_name, load, orphan_indexes

    hosts, orphans = 24, 4
    gone = orphan_indexes(hosts, orphans, "namespaces")
    for index in set(range(hosts)) - gone:
        harness.kubeapi.add_node(host_name(index, "gke"), f"10.0.{index}.10")
    load(harness.etcd.url, datastore(hosts, orphans, pods, shape="namespaces", hashed=True, names="gke", **layout))
    before = {k: v for k, (v, _) in harness.dump().items()}
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["errors"] == [] and report["audit"]["leaked_ips"]["count"] == 0
    assert report["summary"]["deleted"] == orphans == report["summary"]["orphaned"]
    after = {k: v for k, (v, _) in harness.dump().items()}
    for index in range(hosts):
        name = host_name(index, "gke")
        held = {k for k in after if name in k or name.replace("-", "--") in k}
        assert bool(held) is (index not in gone), name
    assert calico.ipam_problems(after) == []
    return before, after


def test_the_benchs_dual_stack_fleet_is_read_whole_and_its_orphans_go_from_both_families(harness: Harness) -> None:
    """bench.generate's dual-stack layout (what `make bench` times): every gone host's IPv4 and
    IPv6 blocks, affinities, handles and endpoints go (bench_fleet_deleted)."""
    before, after = bench_fleet_deleted(harness, 3, families="dual")
    assert sum("/ipv6/block/" in k for k in before) == 2 * 24, "a block and an affinity per host"
    assert sum("/ipv6/block/" in k for k in after) == 2 * (24 - 4)


def test_the_benchs_ipv6_fleet_is_read_whole_and_its_orphans_go_with_their_ipv6_tunnel(harness: Harness) -> None:
    """bench.generate's IPv6-only layout (`--ip-families ipv6`): no IPv4 block, each host's
    VXLAN tunnel address (`ipv6VXLANTunnelAddr`, handle `vxlan-v6-tunnel-addr-<node>`) in its
    /122; every gone host's block, affinity, tunnel handle and endpoints go (bench_fleet_deleted)."""
    before, after = bench_fleet_deleted(harness, 3, families="ipv6")
    assert not any("/ipv4/" in k for k in before)
    assert sum("/ipv6/block/" in k for k in before) == 2 * 24, "a block and an affinity per host"
    assert sum("/ipv6/block/" in k for k in after) == 2 * (24 - 4)
    tunnels = [k for k in after if "/handle/vxlan-v6-tunnel-addr-" in k]
    assert len(tunnels) == 24 - 4


def test_the_benchs_fleet_of_small_blocks_is_read_whole_and_its_orphans_go_with_every_block(harness: Harness) -> None:
    """bench.generate's hosts with as many /28 blocks as their pods need (`make bench`'s
    `--block-size 28`): every gone host's blocks go (bench_fleet_deleted)."""
    from bench.generate import orphan_indexes, pods_on

    before, after = bench_fleet_deleted(harness, 20, block_size=28)
    needed = [-(-(pods_on(index, 20, "namespaces") + 2) // 16) for index in range(24)]  # the tunnel, ordinal 0
    blocks = [k for k in before if "/assignment/ipv4/block/" in k]
    assert len(blocks) == sum(needed) > 24 and all(k.endswith("-28") for k in blocks), "one to three /28s a host"
    kept = sum(n for index, n in enumerate(needed) if index not in orphan_indexes(24, 4, "namespaces"))
    assert sum("/assignment/ipv4/block/" in k for k in after) == kept


def test_dual_stack_on_etcd_v2_the_orphans_ipv6_block_goes_and_the_v6_pool_is_checked(harness: Harness) -> None:
    from tests.support.calico2 import LIVE, ORPHAN, kops_18_cluster

    seed, k8s = kops_18_cluster()
    seed.put("/calico/v1/ipam/v6/pool/fd00:96::-48", json.dumps({"cidr": "fd00:96::/48"}))
    seed.block("fd00:96::/122", LIVE[0])
    seed.block("fd00:96::40/122", ORPHAN)
    seed.pod(LIVE[0], "default", "dual-0", "100.96.0.7", ipv6="fd00:96::7")
    seed.pod(ORPHAN, "shop", "dual-1", "100.96.20.7", ipv6="fd00:96::47")
    seed.load(harness.etcd.url)
    for name, ip in k8s:
        harness.kubeapi.add_node(name, ip)
    report, code = harness.run(harness.config(datastore_type="etcdv2", apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2
    assert {p["cidr"] for p in report["audit"]["pools"]} == {"100.96.0.0/11", "fd00:96::/48"}
    after = {k: v for k, (v, _) in calico2.dump(harness.etcd.url).items()}
    assert "/calico/ipam/v2/assignment/ipv6/block/fd00:96::40-122" not in after, "emptied, so deleted"
    assert f"/calico/ipam/v2/host/{ORPHAN}/ipv6/block/fd00:96::40-122" not in after
    assert "/calico/ipam/v2/assignment/ipv6/block/fd00:96::-122" in after
    assert calico.ipam_problems(after) == []


def test_the_shipped_alert_rules_use_only_metrics_a_run_pushes(harness: Harness) -> None:
    """Every series a rule reads is one a run pushes (or the Pushgateway's own push_time_seconds)."""
    import yaml

    from job.adapters.metrics import nodes_registry_for, registry_for

    garbage(harness)
    report, _ = harness.run()
    registries = (registry_for(report, 1.0, succeeded=True, grace_s=1800.0), nodes_registry_for(report))
    pushed = {metric.name for registry in registries for metric in registry.collect()} | {"push_time_seconds"}
    rules_file = Path(__file__).resolve().parents[2] / "charts" / "calico-gc" / "files" / "calico-gc.rules.yaml"
    rules = [rule for group in yaml.safe_load(rules_file.read_text())["groups"] for rule in group["rules"]]
    assert {"CalicoIpPoolAlmostFull", "CalicoNodeStuckNetworkUnavailable"} <= {rule.get("alert") for rule in rules}
    pushed |= {rule["record"] for rule in rules if "record" in rule}  # what the rules record themselves
    for rule in rules:
        expr = re.sub(  # a name regex, spelled out: calico_gc_ipam_(a|b) is calico_gc_ipam_a and calico_gc_ipam_b
            r"(calico_gc_[a-z_]*)\(([a-z_|]+)\)",
            lambda m: " ".join(m[1] + alternative for alternative in m[2].split("|")),
            rule["expr"],
        )
        used = set(re.findall(r"\b(?:calico_gc[_:][a-z_]+|push_time_seconds)\b", expr))
        assert used and used <= pushed, (rule.get("alert") or rule["record"], used - pushed)


def test_an_allocation_naming_no_node_in_a_gone_hosts_block_stays_with_it_and_is_reported(harness: Harness) -> None:
    """The block's affinity is no proof of whose an allocation without `secondary.node` is (a
    live node's pod may hold an address borrowed from the block), and Calico's own IPAM garbage
    collection files such an allocation under no node and never frees it. So one in a gone
    host's own block stays when the host goes, the block with it (without its affinity), and the
    audit says so, unless an endpoint holds it (a live pod's: in use); one at the host's known IP
    (its endpoint's) goes with the host."""
    scenario = s.kops_cluster()
    seed = scenario.seed
    seed.pod(s.POD_ORPHAN, "shop", "cart-4", "100.96.20.7")
    seed.allocate("100.96.20.8", "k8s-pod-network.unknown", s.POD_ORPHAN)
    harness.seed(scenario)
    key = "/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"
    block = json.loads(harness.dump()[key][0])
    for ordinal in (7, 8, 9):  # 9: api-1's, a live node's pod borrowing from the block
        del block["attributes"][block["allocations"][ordinal]]["secondary"]
    calico.load(harness.etcd.url, {key: json.dumps(block)})
    dry, code = harness.run()
    assert code == 0
    # A run that may delete none reads every gone host lean (plan.read_first): the audit is the same.
    lean, code = harness.run(harness.config(max_deletions=0))
    assert code == 0 and lean["audit"]["unattributed_allocations"] == dry["audit"]["unattributed_allocations"]
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and s.POD_ORPHAN in [h["name"] for h in report["hosts"] if h["action"] == "deleted"]
    left = {"ip": "100.96.20.8", "block": "100.96.20.0/26", "host": s.POD_ORPHAN, "handle": "k8s-pod-network.unknown"}
    assert dry["audit"]["unattributed_allocations"] == report["audit"]["unattributed_allocations"]
    assert report["audit"]["unattributed_allocations"] == {"count": 1, "sample": [left]}
    assert "allocations naming no node that stay in gone hosts' blocks 1" in render_text(report)
    after = {k: v for k, (v, _) in harness.dump().items()}
    kept = json.loads(after[key])
    assert kept["affinity"] is None and kept["allocations"][7] is None and kept["allocations"][9] is not None
    assert kept["attributes"][kept["allocations"][8]]["handle_id"] == "k8s-pod-network.unknown"
    assert "/calico/ipam/v2/handle/k8s-pod-network.unknown" in after
    assert calico.ipam_problems(after) == []
