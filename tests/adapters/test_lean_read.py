"""The etcd v3 read told the Kubernetes Node names (issue 11, memory): it keeps of live hosts only
what the block scan needs, and every decision is the one the full read gives. Against the real
etcd, on the kops cluster with every kind of IPAM garbage at once."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence, Set
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from job.adapters.datastores import etcdv3
from job.adapters.datastores.etcdv3 import HANDLES, EtcdV3Datastore
from job.adapters.retry import RetryPolicy
from job.core.audit import ipam_audit
from job.core.inventory import Inventory
from job.core.ipam import stale_handles
from job.core.leaks import plan_leaks
from job.core.model import CalicoHost, KubeNode, Step, Write
from job.core.plan import plan_run, read_first
from job.core.scan import scan_blocks
from tests.conftest import Harness
from tests.flows.test_audit import garbage
from tests.support import calico
from tests.support import scenario as s

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def decisions(
    inventory: Inventory, kube_nodes: list[KubeNode], harness: Harness, max_deletions: int = 50
) -> dict[str, Any]:
    """Everything a run decides from a read: the plan, the stale handles, the leaks and the audit."""
    config = harness.config(grace_period=timedelta(0), release_leaked_ips=True, max_deletions=max_deletions)
    live = {node.name for node in kube_nodes}
    scan = inventory.scan
    if scan is None:
        ips = {ip for host in inventory.hosts for endpoint in host.workload_endpoints for ip in endpoint.ips}
        scan = scan_blocks(inventory.blocks, live, ips, inventory.handles, calico2=False)
    stale = stale_handles(inventory.handles, scan.held, inventory.malformed_blocks)
    seen_long_ago = {f"handle:{f.handle.handle_id}@{f.handle.item.revision}": NOW - timedelta(hours=1) for f in stale}
    plan = plan_run(inventory, kube_nodes, seen_long_ago, NOW, config, (), stale)
    leaked = [a for found in scan.pod_ips.values() for a in found]
    leak_state = {f"leak:{a.ip}@{a.handle}": NOW - timedelta(hours=1) for a in leaked}
    blocks = {block.cidr: block for block in inventory.blocks}
    leak_plan = plan_leaks(leaked, blocks, inventory.handles, leak_state, NOW, config, set())
    assert not plan.unread, "a plan that reached a host read lean is never acted on"
    return {
        "hosts": {d.host.name: (d.action, d.reason, _unread(d.steps)) for d in plan.decisions},
        "live": plan.live_hosts,
        "conflicts": plan.conflicts,
        "repairs": plan.repairs,
        "leaks": leak_plan.releases,
        "audit": ipam_audit(inventory, live, scan, stale, plan.repairs, leaked, leak_plan, orphans=plan.orphans),
    }


def _unread(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """The steps with the before-values of endpoints left to be fetched, as the full read leaves
    them: the lean one holds those of gone hosts (ORPHAN_VALUE_BYTES)."""

    def unread(write: Write) -> Write:
        return replace(write, before=None) if "/workloadendpoints/" in write.key else write

    return tuple(replace(step, writes=tuple(map(unread, step.writes))) for step in steps)


@pytest.mark.parametrize("page_size", [2, 500])
def test_the_lean_read_decides_exactly_what_the_full_read_does(harness: Harness, page_size: int) -> None:
    stale, dangling = garbage(harness)  # a stale handle and an allocation whose handle is gone
    calico.delete(harness.etcd.url, f"/calico/resources/v3/projectcalico.org/nodes/{s.POD_ORPHAN}")  # IPAM-only
    keys = harness.dump()
    attributes = [a for k, (v, _) in keys.items() if "/assignment/" in k for a in json.loads(v)["attributes"]]
    live_pods = [a for a in attributes if "pod" in a["secondary"] and a["secondary"]["node"] in s.LIVE]
    pods = {a["secondary"]["pod"]: a["handle_id"] for a in live_pods}
    pod, leaked = next((p, h) for p, h in sorted(pods.items()) if h not in (stale, dangling))
    endpoint = next(k for k in keys if "/workloadendpoints/" in k and f"-k8s-{pod.replace('-', '--')}-" in k)
    calico.delete(harness.etcd.url, endpoint)  # its pod IP leaks
    kube_nodes = [KubeNode(name) for name, _ in s.kops_cluster().k8s_nodes]
    store = EtcdV3Datastore(harness.config(page_size=page_size), RetryPolicy())
    try:
        full = store.read()
        lean = store.read(lambda: {node.name for node in kube_nodes})
    finally:
        store.close()

    assert full.scan is None and lean.scan is not None
    assert decisions(lean, kube_nodes, harness) == decisions(full, kube_nodes, harness)
    held = {e.item.key: e.item for h in lean.hosts if h.name not in s.LIVE for e in h.workload_endpoints}
    assert held and all((item.value, item.revision) == keys[key] for key, item in held.items())
    # ...while it keeps less: no live host's endpoint, and of the handles only those a plan may write.
    live = {h.name: h for h in lean.hosts if h.name in s.LIVE}
    assert live and not any(h.workload_endpoints for h in live.values())
    assert any(h.workload_endpoints for h in full.hosts if h.name in s.LIVE)
    assert stale in lean.handles and leaked in lean.handles  # stale; a leaked IP's (read again)
    assert [d["handle"] for d in lean.scan.dangling] == [dangling]
    dropped = set(full.handles) - set(lean.handles)
    tunnels = {h for h in dropped if h.startswith("ipip-tunnel-addr-")}  # only live hosts' tunnel handles go
    assert dropped - tunnels and tunnels == {f"ipip-tunnel-addr-{name}" for name in s.LIVE}
    assert all(HANDLES + h in keys for h in dropped)


def _read_both(harness: Harness, scenario: s.Scenario) -> tuple[Inventory, Inventory]:
    """The scenario in etcd, read whole and lean (pages of 3 keys): each decides what the other does."""
    harness.seed(scenario)
    kube_nodes = [KubeNode(name) for name, _ in scenario.k8s_nodes]
    store = EtcdV3Datastore(harness.config(page_size=3), RetryPolicy())
    try:
        full = store.read()
        lean = store.read(lambda: {node.name for node in kube_nodes})
    finally:
        store.close()
    assert decisions(lean, kube_nodes, harness) == decisions(full, kube_nodes, harness)
    return full, lean


def test_the_lean_read_of_an_entangled_fleet_reads_again_every_block_a_plan_edits(harness: Harness) -> None:
    """Dual-stack handles in two blocks and IPs borrowed across blocks; and live nodes' blocks that
    no orphan's allocation is in but a plan still reads: one with a leaked IP, one an orphan's
    handle still counts in, one an orphan still has an affinity key for, one with an allocation
    whose handle is gone (for the audit's sample). Those are read again at the read's revision;
    only the block no plan needs stays a summary."""
    scenario = s.cross_borrowing_fleet(6)
    seed = scenario.seed
    blocks = {"quiet": "100.64.200.0/26", "leaky": "100.64.201.0/26", "counted": "100.64.202.0/26"}
    blocks.update(claimed="100.64.203.0/26", dangling="100.64.204.0/26")
    endpoints = {}
    for number, (role, cidr) in enumerate(blocks.items()):
        name = f"live-{role}"
        seed.block(cidr, name)
        seed.node(name, ipv4=f"10.1.0.{20 + number}", tunnel_ip=cidr.replace(".0/26", ".1"))
        endpoints[role] = seed.pod(name, "default", f"web-{role}", cidr.replace(".0/26", ".5"))
        scenario.k8s_nodes.append((name, f"10.1.0.{20 + number}"))
    del seed.keys[endpoints["leaky"]]  # its pod IP leaks
    (lost,) = (h for h, entry in seed.handles.items() if blocks["dangling"] in entry["block"] and "pod" in h)
    del seed.keys[f"/calico/ipam/v2/handle/{lost}"]  # an allocation without its handle
    cart = next(h for h, entry in seed.handles.items() if "100.64.0.0/26" in entry["block"])
    seed.handles[cart]["block"][blocks["counted"]] = 1  # gone-0's pod handle counts one IP too many there
    seed.keys[f"/calico/ipam/v2/handle/{cart}"] = json.dumps(seed.handles[cart])
    seed.keys["/calico/ipam/v2/host/gone-1/ipv4/block/100.64.203.0-26"] = json.dumps({"state": "confirmed"})
    _, lean = _read_both(harness, scenario)
    assert {b.cidr for b in lean.blocks if b.item.value is None} == {blocks["quiet"]}
    assert [d["handle"] for d in lean.scan.dangling] == [lost]  # type: ignore[union-attr]


def test_without_handles_only_the_blocks_of_the_audits_sample_are_read_again(harness: Harness) -> None:
    """A keyspace with no handle keys (a tool that writes only blocks): every allocation names a
    handle that is not there. The audit says how many (from what the blocks hold for each handle)
    and lists the first 20 by address, so the lean read reads again only the blocks that hold
    those, not every block (at 5,000 hosts that doubled the read). Count and sample are the full
    read's."""
    scenario = s.cross_borrowing_fleet(6)
    seed = scenario.seed
    seed.block("100.64.250.0/26", "live-busy")
    seed.node("live-busy", ipv4="10.1.0.40", tunnel_ip="100.64.250.1")
    for number in range(25):
        seed.pod("live-busy", "default", f"web-{number}", f"100.64.250.{10 + number}")
    scenario.k8s_nodes.append(("live-busy", "10.1.0.40"))
    seed.keys = {k: v for k, v in seed.keys.items() if not k.startswith(HANDLES)}
    full, lean = _read_both(harness, scenario)
    audit = decisions(full, [KubeNode(name) for name, _ in scenario.k8s_nodes], harness)["audit"]
    dangling = audit["dangling_allocations"]
    assert dangling["count"] == sum(sum(entry["block"].values()) for entry in seed.handles.values()) > 20
    assert len(dangling["sample"]) == 20 and not any(d["ip"].startswith("100.64.250.") for d in dangling["sample"])
    assert "100.64.250.0/26" in {b.cidr for b in lean.blocks if b.item.value is None}


def test_allocations_that_name_no_node_are_read_again_only_where_a_gone_host_holds_their_ip(harness: Harness) -> None:
    """Allocations without `secondary` (absent, or etcd's `null`): no node owns one, so a plan
    frees it only at a gone host's known IP (here a gone host's pods borrowed IPs from live nodes'
    blocks). The lean read keeps neither their blocks nor their handles as it files them, and
    reads again, at its revision, the blocks where a gone host's IP is one of them and those
    allocations' handles: every decision is the full read's. A live block that no gone host's IP
    is in stays a summary, and its pods' handles are not kept (they were all kept, every block
    whole, and a 5,000-host run peaked at 206 MB)."""
    from bench.generate import unattributed

    scenario = s.cross_borrowing_fleet(6)
    seed = scenario.seed
    seed.block("100.64.200.0/26", "live-quiet")
    seed.node("live-quiet", ipv4="10.1.0.30", tunnel_ip="100.64.200.1")
    seed.pod("live-quiet", "default", "web-quiet", "100.64.200.5")
    scenario.k8s_nodes.append(("live-quiet", "10.1.0.30"))
    seed.keys = dict(unattributed(seed.keys.items()))
    full, lean = _read_both(harness, scenario)
    summaries = {b.cidr for b in lean.blocks if b.item.value is None}
    borrowed_from = {"100.64.100.0/26", "100.64.101.0/26", "100.64.102.0/26"}  # each lent a gone host an IP
    assert summaries == {"100.64.200.0/26"} and not borrowed_from & summaries, summaries
    (quiet,) = (h for h, entry in seed.handles.items() if "100.64.200.0/26" in entry["block"] and "pod" in h)
    assert quiet in full.handles and quiet not in lean.handles


def test_handles_another_tool_wrote_are_judged_by_what_they_count_not_by_their_bytes(harness: Harness) -> None:
    """A handle is kept only when a plan may write it. One written by another encoder (spaces,
    another field order) that counts exactly what its blocks hold is no such handle: judged by
    its text, every handle of such a datastore was kept (5,000 hosts: 121 -> 192 MB)."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    names = {name for name, _ in scenario.k8s_nodes}
    store = EtcdV3Datastore(harness.config(), harness.retry)
    try:
        as_calico_writes = set(store.read(lambda: names).handles)
        handles = {k: v for k, (v, _) in harness.dump().items() if k.startswith(HANDLES)}
        rewritten = {k: json.dumps(dict(reversed(list(json.loads(v).items())))) for k, v in handles.items()}
        calico.load(harness.etcd.url, rewritten)
        assert set(store.read(lambda: names).handles) == as_calico_writes
    finally:
        store.close()
    assert len(as_calico_writes) < len(handles) / 2, "the lean read keeps few handles"


@pytest.mark.parametrize(("deletions", "kept"), [(0, 0), (1, 1), (2, 3), (3, 4)])
def test_the_read_keeps_gone_hosts_endpoint_values_by_the_deletions_a_run_may_make(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, deletions: int, kept: int
) -> None:
    """So much a host the run may delete (--max-deletions), each value whole or not at all, in key
    order: a host's share holds the smallest of the four gone hosts' endpoints and not a second."""
    harness.seed(s.kops_cluster())
    stored = harness.dump()
    gone = [
        key for key in stored if "/workloadendpoints/" in key and not any(n.replace("-", "--") in key for n in s.LIVE)
    ]
    sizes = sorted(len(stored[key][0]) for key in gone)
    assert len(sizes) == 4
    monkeypatch.setattr(etcdv3, "VALUE_BYTES_PER_HOST", sizes[0] + sizes[1] - 1)
    names = {name for name, _ in s.kops_cluster().k8s_nodes}
    store = EtcdV3Datastore(harness.config(max_deletions=deletions), harness.retry)
    try:
        inventory = store.read(lambda: names)
    finally:
        store.close()
    endpoints = [e.item for h in inventory.hosts for e in h.workload_endpoints]
    assert sorted(e.key for e in endpoints) == sorted(gone)
    held = [e for e in endpoints if e.value is not None]
    assert len(held) == kept and all(e.value == stored[e.key][0] for e in held)


def test_a_read_told_which_gone_hosts_a_plan_may_take_keeps_the_others_as_lean_as_live_ones(harness: Harness) -> None:
    """(issue 31, memory with many gone hosts) Told the plan's scope (plan.read_first: twice
    --max-deletions of the gone hosts, in the plan's order), the read keeps the other gone hosts
    as it keeps live ones: their Nodes, per-node keys and affinities, and none of their endpoints,
    handles or blocks' values. Memory then follows what a run may delete. On the entangled fleet
    (IPs borrowed across the gone hosts' blocks) the plan is the whole read's."""
    scenario = s.cross_borrowing_fleet(6)
    harness.seed(scenario)
    kube_nodes = [KubeNode(name) for name, _ in scenario.k8s_nodes]
    names = {node.name for node in kube_nodes}
    config = harness.config(grace_period=timedelta(0), max_deletions=1)
    told: list[str] = []

    def scope(hosts: Sequence[CalicoHost]) -> Set[str]:
        told.extend(host.name for host in hosts)
        return read_first(hosts, kube_nodes, {}, NOW, config)

    store = EtcdV3Datastore(harness.config(page_size=3), RetryPolicy())
    try:
        whole = store.read(lambda: names)
        lean = store.read(lambda: names, scope)
    finally:
        store.close()
    gone = [f"gone-{i}" for i in range(6)]
    assert sorted(told) == sorted([*names, *gone]) and lean.partial == set(gone[2:]) and not whole.partial
    assert decisions(lean, kube_nodes, harness, max_deletions=1) == decisions(
        whole, kube_nodes, harness, max_deletions=1
    )
    hosts = {host.name: host for host in lean.hosts}
    assert all(hosts[name].workload_endpoints for name in gone[:2])
    assert not any(hosts[name].workload_endpoints for name in gone[2:])
    assert all(hosts[name].node and hosts[name].affinities and hosts[name].owned for name in gone)  # kept, as small
    # Of the lean hosts' handles, none: their pods' (each pod's one handle) and their tunnel addresses'.
    lean_ones = {f"k8s-pod-network.{pod_container(name, pod)}" for name in gone[2:] for pod in ("cart", "borrower")}
    lean_ones |= {f"ipip-tunnel-addr-{name}" for name in gone[2:]}
    assert lean_ones <= set(whole.handles) and set(whole.handles) - set(lean.handles) == lean_ones
    # gone-4's own IPv4 block holds its allocations alone: a summary, as a live host's.
    block = {b.cidr: b for b in lean.blocks}["100.64.4.0/26"]
    assert block.item.value is None and {b.cidr: b for b in whole.blocks}[block.cidr].item.value is not None


def test_the_scope_is_told_which_gone_hosts_felix_still_reports_for(harness: Harness) -> None:
    """A gone host whose Felix still reports is skipped by a plan (felix_alive): the scope must
    see it so, or read_first spends a whole read on it, and a plan whose whole-read hosts are all
    skipped reads the datastore again."""
    scenario = s.cross_borrowing_fleet(3)
    scenario.seed.felix("gone-0", alive=True)
    harness.seed(scenario)
    kube_nodes = [KubeNode(name) for name, _ in scenario.k8s_nodes]
    config = harness.config(grace_period=timedelta(0), max_deletions=1)
    told: dict[str, bool] = {}

    def scope(hosts: Sequence[CalicoHost]) -> Set[str]:
        told.update((host.name, host.felix_alive) for host in hosts)
        return read_first(hosts, kube_nodes, {}, NOW, config)

    store = EtcdV3Datastore(harness.config(), RetryPolicy())
    try:
        lean = store.read(lambda: {node.name for node in kube_nodes}, scope)
    finally:
        store.close()
    assert {name for name, alive in told.items() if alive} == {"gone-0", "live-0", "live-1", "live-2"}
    assert lean.partial == {"gone-0"}  # the two read whole are the two a plan may take


def pod_container(host: str, pod: str) -> str:
    """The container id CalicoSeed.pod gives the pod `pod`-<index of host> of the cross-borrowing fleet."""
    index = host.rsplit("-", 1)[1]
    return hashlib.sha256(f"{host}/shop/{pod}-{index}".encode()).hexdigest()[:16]
