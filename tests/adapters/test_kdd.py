"""The Kubernetes datastore (crd.projectcalico.org/v1) through the Kubernetes API test server:
per-node IPAM and config left behind by a deleted node, removed as Calico would; the audit."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from job.config import Config
from job.core.report import MAX_WARNINGS, SCHEMA_PATH, render_text
from tests.conftest import Harness, down_at_the_first_write, hosts_by_name
from tests.support import crds, objects
from tests.support.calico import CalicoSeed
from tests.support.cut_link import CutLink
from tests.support.groups import V1, V3, Group
from tests.support.kubeapi import KubeApiServer

CRD = "/apis/crd.projectcalico.org/v1"


LIVE_A, LIVE_B, GONE = "live-a", "live-b", "worker-gone"


def cidr_name(cidr: str) -> str:
    return cidr.replace(".", "-").replace(":", "-").replace("/", "-")


def seed_kdd(kubeapi: KubeApiServer, group: Group = V1) -> None:
    api = group.path
    ipam = CalicoSeed()
    for cidr, host in [
        ("100.96.1.0/26", LIVE_A),
        ("100.96.2.0/26", LIVE_B),
        ("100.96.9.0/26", GONE),
        ("100.96.8.0/26", GONE),
    ]:
        ipam.block(cidr, host)
        kubeapi.put(
            f"{api}/blockaffinities",
            {
                "metadata": {
                    "name": f"{host}-{cidr_name(cidr)}",
                    "labels": {"projectcalico.org/affinity-type": "host"},
                },
                "spec": {
                    "cidr": cidr,
                    "node": host,
                    "state": "confirmed",
                    "deleted": group.affinity_deleted,
                    "type": "host",
                },
            },
        )
    pods = [
        (LIVE_A, "default", "web-a", "100.96.1.5"),
        (LIVE_B, "default", "web-b", "100.96.2.5"),
        (GONE, "shop", "cart-1", "100.96.9.5"),
        (GONE, "shop", "cart-2", "100.96.1.40"),  # borrowed
        (GONE, "shop", "cart-3", "100.96.8.5"),
        (LIVE_B, "shop", "api-1", "100.96.8.9"),  # lent by GONE
        (LIVE_A, "default", "ghost", "100.96.1.9"),
    ]  # its pod is gone: a leak on a live node
    for node, namespace, pod, ip in pods:
        ipam.allocate(ip, f"k8s-pod-network.{pod}", node, pod=pod, namespace=namespace)
        if node != GONE and pod != "ghost":
            kubeapi.add_pod(namespace, pod, node, ip)
    ipam.allocate("100.96.9.1", f"ipip-tunnel-addr-{GONE}", GONE, kind="ipipTunnelAddress")
    for cidr, block in ipam.blocks.items():
        kubeapi.put(f"{api}/ipamblocks", {"metadata": {"name": cidr_name(cidr)}, "spec": copy.deepcopy(block)})
    ipam.handles["k8s-pod-network.stale"] = {"block": {"100.96.2.0/26": 1}, "deleted": False}
    for handle_id, handle in ipam.handles.items():
        kubeapi.put(
            f"{api}/ipamhandles",
            {"metadata": {"name": handle_id.lower()}, "spec": {"handleID": handle_id, **copy.deepcopy(handle)}},
        )
    kubeapi.put(
        f"{api}/felixconfigurations", {"metadata": {"name": f"node.{GONE}"}, "spec": {"logSeverityScreen": "Info"}}
    )
    kubeapi.put(f"{api}/felixconfigurations", {"metadata": {"name": "default"}, "spec": {}})
    kubeapi.put(f"{api}/bgpconfigurations", {"metadata": {"name": f"node.{GONE}"}, "spec": {"listenPort": 179}})
    kubeapi.put(
        f"{api}/bgppeers",
        {"metadata": {"name": "tor-gone"}, "spec": {"node": GONE, "peerIP": "10.0.0.1", "asNumber": 65001}},
    )
    kubeapi.put(
        f"{api}/bgppeers",
        {"metadata": {"name": "global"}, "spec": {"nodeSelector": "all()", "peerIP": "10.0.0.2", "asNumber": 65001}},
    )
    kubeapi.put(
        f"{api}/hostendpoints", {"metadata": {"name": f"{GONE}-eth0"}, "spec": {"node": GONE, "interfaceName": "eth0"}}
    )
    for name, node in ((f"{GONE}-status", GONE), (f"{LIVE_A}-status", LIVE_A)):  # statuses as calico-node fills them
        kubeapi.put(
            f"{api}/caliconodestatuses", objects.calico_node_status(name, node, ("10.0.3.11",), group.api_version)
        )
    kubeapi.put(
        f"{api}/clusterinformations",
        {"metadata": {"name": "default"}, "spec": {"clusterGUID": "kdd-guid", "datastoreReady": True}},
    )
    kubeapi.put(f"{api}/ippools", {"metadata": {"name": "default-ipv4-ippool"}, "spec": {"cidr": "100.96.0.0/16"}})
    kubeapi.put(
        f"{api}/kubecontrollersconfigurations",
        {"metadata": {"name": "default"}, "spec": {"controllers": {"node": {"leakGracePeriod": "20m"}}}},
    )
    kubeapi.put(
        "/apis/apps/v1/namespaces/kube-system/deployments",
        {
            "metadata": {"name": "calico-kube-controllers"},
            "status": {"readyReplicas": 1},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "calico-kube-controllers",
                                "env": [{"name": "ENABLED_CONTROLLERS", "value": "node"}],
                            }
                        ]
                    }
                }
            },
        },
    )
    kubeapi.add_node(LIVE_A, "10.0.3.10")
    kubeapi.add_node(LIVE_B, "10.0.3.11")


def snapshot(kubeapi: KubeApiServer, group: Group = V1) -> dict[str, dict[str, Any]]:
    return {
        f"{collection.rsplit('/', 1)[-1]}/{name}": obj
        for collection, objects in kubeapi.copy_under(group.path).items()
        for name, obj in objects.items()
    }


def kdd(harness: Harness, **overrides: Any) -> Any:
    return harness.config(datastore_type="kubernetes", **overrides)


def test_dry_run_plans_the_gone_node_and_changes_nothing(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)
    before = snapshot(harness.kubeapi, group)
    report, code = harness.run(kdd(harness))
    assert code == 0 and snapshot(harness.kubeapi, group) == before
    assert [(h["name"], h["action"], h["reason"]) for h in report["hosts"]] == [
        (GONE, "would_delete", "k8s_node_missing")
    ]
    assert report["datastore"]["type"] == "kubernetes" and report["datastore"]["cluster_guid"] == "kdd-guid"
    assert (report["datastore"]["api_group"], report["datastore"]["api_group_from"]) == (group.api_version, "discovery")
    assert render_text(report).splitlines()[0].startswith(f"dry-run ok (exit 0) in {group.api_version}: ")
    assert {path.split("/")[2] for _, path in harness.kubeapi.requests if path.startswith("/apis/")} >= {
        group.api_version.split("/")[0]
    }
    assert not any(
        path.startswith(f"/apis/{other.api_version}/")
        for other in (V1, V3)
        if other != group
        for _, path in harness.kubeapi.requests
    ), "nothing asked of the other group"
    assert report["datastore"]["kube_controllers"] == {
        "deployment": "kube-system/calico-kube-controllers",
        "ready_replicas": 1,
        "node_controller": True,
        "leak_grace_period": "20m",
    }


def test_apply_removes_the_gone_nodes_data_as_calico_would(harness: Harness, group: Group) -> None:
    api = group.path
    seed_kdd(harness.kubeapi, group)
    before = snapshot(harness.kubeapi, group)
    tombstones: list[list[object]] = []

    def record_tombstone() -> None:
        block = harness.kubeapi.get(f"{api}/ipamblocks", "100-96-9-0-26")
        assert block is not None
        if block["spec"].get("deleted") is True:
            tombstones.append(block["spec"]["allocations"])

    harness.kubeapi.on("DELETE", f"^{api}/ipamblocks/100-96-9-0-26$", record_tombstone)
    report, code = harness.run(kdd(harness, apply=True))
    after = snapshot(harness.kubeapi, group)
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    removed = set(before) - set(after)
    assert removed == {
        "ipamblocks/100-96-9-0-26",  # its own block, holding only its IPs
        f"blockaffinities/{GONE}-100-96-9-0-26",
        f"blockaffinities/{GONE}-100-96-8-0-26",
        "ipamhandles/k8s-pod-network.cart-1",
        "ipamhandles/k8s-pod-network.cart-2",
        "ipamhandles/k8s-pod-network.cart-3",
        f"ipamhandles/ipip-tunnel-addr-{GONE}",
        f"felixconfigurations/node.{GONE}",
        f"bgpconfigurations/node.{GONE}",
        "bgppeers/tor-gone",
        f"hostendpoints/{GONE}-eth0",
        f"caliconodestatuses/{GONE}-status",
    }
    changed = {k for k in after if after[k]["metadata"]["resourceVersion"] != before[k]["metadata"]["resourceVersion"]}
    assert changed == {"ipamblocks/100-96-8-0-26", "ipamblocks/100-96-1-0-26"}
    lending = after["ipamblocks/100-96-8-0-26"]["spec"]
    assert "affinity" not in lending and [a["secondary"]["pod"] for a in lending["attributes"]] == ["api-1"]
    assert lending["deleted"] is False
    borrowed = after["ipamblocks/100-96-1-0-26"]["spec"]
    assert borrowed["allocations"][40] is None and borrowed["affinity"] == f"host:{LIVE_A}"
    assert {a["secondary"]["pod"] for a in borrowed["attributes"]} == {"web-a", "ghost"}, "live allocations kept"
    assert "bgppeers/global" in after and "ipamhandles/k8s-pod-network.stale" in after
    # The empty block went through Calico's tombstone: marked deleted, then deleted with preconditions.
    puts = harness.kubeapi.count("PUT", f"^{api}/ipamblocks/100-96-9-0-26$")
    deletes = harness.kubeapi.count("DELETE", f"^{api}/ipamblocks/100-96-9-0-26$")
    assert (puts, deletes) == (1, 1)
    # As Calico does, the tombstone is the emptied block: a tombstone a crash leaves behind never
    # holds allocations whose handles are already gone.
    (change,) = [c for c in hosts_by_name(report)[GONE]["changes"] if c["key"] == "ipamblocks/100-96-9-0-26"]
    assert change["op"] == "delete" and json.loads(change["before"])["allocations"][5] is not None
    assert tombstones == [[None] * 64]
    assert harness.kubeapi.count("PUT", f"^{api}/blockaffinities/{GONE}-100-96-8-0-26$") == 1, "pendingDeletion first"


def test_an_affinity_whose_cidr_is_no_network_is_said_and_kept(harness: Harness, group: Group) -> None:
    """crd.projectcalico.org/v1 takes any string as a BlockAffinity's `spec.cidr` (projectcalico.org/v3
    checks `format: cidr`): one that is no network is a `malformed_value` naming it, kept, and the
    host's other data goes as before. It ended the run with `unexpected` (exit 1)."""
    api = group.path
    seed_kdd(harness.kubeapi, group)
    odd = {"node": GONE, "state": "confirmed", "deleted": group.affinity_deleted, "type": "host"}
    if group is V3:
        with pytest.raises(AssertionError, match="real API server would refuse"):
            harness.kubeapi.put(f"{api}/blockaffinities", {"metadata": {"name": "odd"}, "spec": {**odd, "cidr": "x"}})
        return
    for name, cidr in (("odd", "not-a-cidr"), ("empty", "")):
        harness.kubeapi.put(f"{api}/blockaffinities", {"metadata": {"name": name}, "spec": {**odd, "cidr": cidr}})
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    assert [(e["kind"], e["key"], e["message"]) for e in report["errors"]] == [
        ("malformed_value", "blockaffinities/empty", "spec.cidr '' is not a network"),
        ("malformed_value", "blockaffinities/odd", "spec.cidr 'not-a-cidr' is not a network"),
    ]
    after = snapshot(harness.kubeapi, group)
    assert {"blockaffinities/odd", "blockaffinities/empty"} <= set(after)
    assert f"blockaffinities/{GONE}-100-96-9-0-26" not in after


def test_an_ip_pool_kept_from_before_its_crd_checked_its_cidr_is_said_not_a_crash(
    harness: Harness, group: Group
) -> None:
    """An IPPool's `spec.cidr` is `format: cidr` in today's CRDs, but a CRD's validation binds
    only writes: a pool stored before it may hold any string. Said as on etcd (`malformed_value`),
    and the audit counts the other pools. It ended the run with `unexpected` (exit 1)."""
    seed_kdd(harness.kubeapi, group)
    spec = {"cidr": "100.96.0.0/1x", "ipipMode": "Never", "vxlanMode": "Never", "natOutgoing": False}
    harness.kubeapi.put(f"{group.path}/ippools", {"metadata": {"name": "old"}, "spec": spec}, admitted=True)
    report, code = harness.run(kdd(harness))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "would_delete"
    assert [(e["kind"], e["key"], e["message"]) for e in report["errors"]] == [
        ("malformed_value", "ippools/old", "IP pool cidr '100.96.0.0/1x' is not a network")
    ]
    assert [p["cidr"] for p in report["audit"]["pools"]] == ["100.96.0.0/16"]


def test_a_warning_the_server_sends_is_logged_once_a_run(harness: Harness, group: Group) -> None:
    """A CRD version marked deprecated: the real server warns at every request to it, and the
    official client drops the header. The job logs the warning once, with the request that drew it."""
    said = f'{group.api_version} IPAMBlock is deprecated; use "another" (a test\'s own words)'
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.change_crd("ipamblocks", lambda crd: dataclasses.replace(crd, deprecation=said))
    with capture_logs() as logs:
        report, code = harness.run(kdd(harness))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "would_delete"
    assert len(harness.kubeapi.warned) >= 2, "every page of the blocks' list was warned"
    (warned,) = [line for line in logs if line["event"] == "api_server_warning"]
    assert warned["warning"] == said and warned["request"] == f"GET {group.path}/ipamblocks"
    assert report["kubernetes"]["warnings"] == [{"warning": said, "request": f"GET {group.path}/ipamblocks"}]
    assert f"the API server warned: {said} (GET {group.path}/ipamblocks)" in render_text(report)


def test_a_report_lists_the_first_warnings_and_the_log_every_one(harness: Harness, group: Group) -> None:
    """Warnings the run cannot bound (an admission webhook's, one per object, say): the report
    lists the first MAX_WARNINGS, each once; the log says every one."""
    seed_kdd(harness.kubeapi, group)
    texts = [f"block {n} is watched" for n in range(MAX_WARNINGS + 5)]
    path = f"{group.path}/ipamblocks"
    harness.kubeapi.on("GET", f"{path}$", lambda: harness.kubeapi.warn("GET", path, [*texts, texts[0]]))
    with capture_logs() as logs:
        report, code = harness.run(kdd(harness))
    assert code == 0
    assert report["kubernetes"]["warnings"] == [{"warning": t, "request": f"GET {path}"} for t in texts[:MAX_WARNINGS]]
    assert [line["warning"] for line in logs if line["event"] == "api_server_warning"] == texts
    schema = json.loads(SCHEMA_PATH.read_text())["properties"]["kubernetes"]["properties"]["warnings"]
    assert schema["maxItems"] == MAX_WARNINGS, "the schema says the cap the report keeps"


def test_a_field_the_clusters_crd_does_not_have_is_refused_not_dropped(harness: Harness, group: Group) -> None:
    """A cluster whose IPAMBlock CRD has no `deleted` (older than the Calico that wrote the data):
    a real server, by default, drops the field with a warning, so the tombstone would be stored
    unmarked and the block then deleted. The job writes with fieldValidation=Strict: the write is
    refused, the run says which field, and the block is as it was."""
    api = group.path
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.change_crd("ipamblocks", lambda crd: crds.without_property(crd, "deleted"))
    block = copy.deepcopy(harness.kubeapi.get(f"{api}/ipamblocks", "100-96-9-0-26"))
    report, code = harness.run(kdd(harness, apply=True))
    gone = hosts_by_name(report)[GONE]
    assert code == 4 and gone["action"] == "failed"
    assert 'a IPAMBlock: strict decoding error: unknown field "spec.deleted"; nothing was written' in gone["error"]
    assert harness.kubeapi.get(f"{api}/ipamblocks", "100-96-9-0-26") == block
    assert harness.kubeapi.warned == []


def test_grace_spans_runs_and_guards_refuse(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)
    config = kdd(harness, apply=True, grace_period=timedelta(minutes=30))
    first, _ = harness.run(config)
    assert hosts_by_name(first)[GONE]["action"] == "waiting_grace"
    harness.now += timedelta(minutes=30)
    harness.kubeapi.delete_node(LIVE_A)
    harness.kubeapi.delete_node(LIVE_B)  # an empty Node list: refused, nothing deleted
    before = snapshot(harness.kubeapi, group)
    refused, code = harness.run(config)
    assert code == 3 and snapshot(harness.kubeapi, group) == before
    assert [g["name"] for g in refused["guards"]] == ["empty_k8s_node_list"]
    harness.kubeapi.add_node(LIVE_A, "10.0.3.10")
    harness.kubeapi.add_node(LIVE_B, "10.0.3.11")
    third, code = harness.run(config)
    assert code == 0 and hosts_by_name(third)[GONE]["action"] == "deleted"


def test_nodes_without_calico_data_are_no_sign_of_a_foreign_datastore(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)
    for index in range(5):  # new nodes with no pods yet have no IPAM data at all in KDD
        harness.kubeapi.add_node(f"fresh-{index}", f"10.0.3.{20 + index}")
    report, code = harness.run(kdd(harness))
    assert code == 0 and report["guards"] == [] and hosts_by_name(report)[GONE]["action"] == "would_delete"


def test_a_409_during_a_block_update_rereads_and_decides_again(harness: Harness, group: Group) -> None:
    api = group.path
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.fail("PUT", f"^{api}/ipamblocks/100-96-1-0-26$", 409)
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    assert snapshot(harness.kubeapi, group)["ipamblocks/100-96-1-0-26"]["spec"]["allocations"][40] is None
    assert harness.kubeapi.count("PUT", f"^{api}/ipamblocks/100-96-1-0-26$") == 2
    # The handle of the borrowed IP went first, in the step the 409 cut short: the report still
    # lists it (with its value before), since it was really written.
    changes = [c["key"] for c in hosts_by_name(report)[GONE]["changes"]]
    assert changes.count("ipamhandles/k8s-pod-network.cart-2") == 1
    assert set(before_keys(report)) >= {"ipamhandles/k8s-pod-network.cart-2", "ipamblocks/100-96-1-0-26"}


@pytest.mark.parametrize("lost", range(1, 18))
def test_a_write_whose_answer_was_lost_and_that_is_tried_again_is_reported_as_written(
    harness: Harness, group: Group, lost: int
) -> None:
    """The API server carries out the host's `lost`-th write (of 17 requests: the writes, a
    tombstone or pendingDeletion before each block or affinity deleted) and the connection drops
    before its answer. The retry then conflicts with that write's own doing (409, or 404 for a
    DELETE): a write done, not a conflict, and the report lists it as the plan had it."""
    seed_kdd(harness.kubeapi, group)
    planned, _ = harness.run(kdd(harness))
    writes: list[int] = []

    def answer_lost() -> str | None:
        writes.append(1)
        return "kill_after" if len(writes) == lost else None  # `kill` is a no-op here: only the answer goes

    harness.kubeapi.crd_writes = answer_lost
    report, code = harness.run(kdd(harness, apply=True))
    entry = hosts_by_name(report)[GONE]
    assert len(writes) > lost, "the write whose answer was lost was tried again"
    assert code == 0 and (entry["action"], entry["reason"]) == ("deleted", "k8s_node_missing")
    assert [(c["key"], c["op"], c["step"]) for c in entry["changes"]] == [
        (c["key"], c["op"], c["step"]) for c in hosts_by_name(planned)[GONE]["changes"]
    ]


def test_a_write_whose_every_answer_was_lost_is_reported_in_doubt(harness: Harness, group: Group) -> None:
    """The lending block's PUT is done at the first try and no try gets its answer: the host
    fails, and the report lists the PUT apart, in doubt, as the last of its writes."""
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.lose("PUT", f"^{group.path}/ipamblocks/100-96-8-0-26$", times=harness.retry.attempts)
    report, code = harness.run(kdd(harness, apply=True))
    entry = hosts_by_name(report)[GONE]
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    assert "it may have been written" in entry["error"]
    doubted = [c for c in entry["changes"] if c.get("in_doubt")]
    assert [c["key"] for c in doubted] == ["ipamblocks/100-96-8-0-26"] and doubted[0]["before"] is not None
    assert doubted[0]["step"] == max(c["step"] for c in entry["changes"])
    stored = snapshot(harness.kubeapi, group)["ipamblocks/100-96-8-0-26"]["spec"]
    assert stored["allocations"] == json.loads(doubted[0]["after"])["allocations"], "it was done"


def test_a_write_whose_answer_was_lost_and_that_cannot_be_read_back_is_reported_in_doubt(
    harness: Harness, group: Group
) -> None:
    """The block's PUT is done, its answer lost; the retry conflicts with it (409), and the GET
    that would tell whether it was this write's own doing keeps failing: the write is in doubt."""
    seed_kdd(harness.kubeapi, group)
    path = f"^{group.path}/ipamblocks/100-96-8-0-26$"
    harness.kubeapi.lose("PUT", path)
    puts: list[int] = []

    def unreadable_once_tried_again() -> None:
        puts.append(1)
        if len(puts) == 2:
            harness.kubeapi.fail("GET", path, 500, times=harness.retry.attempts)

    harness.kubeapi.on("PUT", path, unreadable_once_tried_again, times=2)
    report, code = harness.run(kdd(harness, apply=True))
    entry = hosts_by_name(report)[GONE]
    assert len(puts) == 2 and harness.kubeapi.count("GET", path) >= harness.retry.attempts
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    assert [c["key"] for c in entry["changes"] if c.get("in_doubt")] == ["ipamblocks/100-96-8-0-26"]


@pytest.mark.parametrize("status", [500, 504])
def test_a_write_answered_5xx_at_every_try_is_reported_in_doubt(harness: Harness, group: Group, status: int) -> None:
    """A 5xx does not say whether the write was done ("etcdserver: request timed out" commits
    later, a proxy's 504 hides the answer): a write that only ever got one is in doubt."""
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.fail("PUT", f"^{group.path}/ipamblocks/100-96-8-0-26$", status, times=harness.retry.attempts)
    report, code = harness.run(kdd(harness, apply=True))
    entry = hosts_by_name(report)[GONE]
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    assert [c["key"] for c in entry["changes"] if c.get("in_doubt")] == ["ipamblocks/100-96-8-0-26"]


def test_a_block_tombstoned_whose_delete_is_refused_is_reported_in_doubt(harness: Harness, group: Group) -> None:
    """A block is deleted as Calico deletes it, a tombstone first: where the DELETE after it is
    refused, the block is half deleted, and the report says so (in doubt), not nothing."""
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.fail("DELETE", f"^{group.path}/ipamblocks/100-96-9-0-26$", 422)
    report, code = harness.run(kdd(harness, apply=True))
    entry = hosts_by_name(report)[GONE]
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    doubted = [(c["key"], c["op"]) for c in entry["changes"] if c.get("in_doubt")]
    assert doubted == [("ipamblocks/100-96-9-0-26", "delete")]
    assert snapshot(harness.kubeapi, group)["ipamblocks/100-96-9-0-26"]["spec"]["deleted"] is True


def test_a_write_that_found_no_connection_is_not_in_doubt(harness: Harness, group: Group) -> None:
    """The API server is gone at the host's first write: no try of it reached the server, so the
    failed host's report lists nothing, in doubt or not."""
    seed_kdd(harness.kubeapi, group)
    assert harness.kubeapi._server is not None
    link = CutLink(harness.kubeapi._server.server_port)
    kubeconfig = json.loads(harness.kubeapi.write_kubeconfig(harness.tmp / "kubeconfig-linked").read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{link.port}"
    (harness.tmp / "kubeconfig-linked").write_text(json.dumps(kubeconfig))
    down_at_the_first_write(harness, link.sever)  # every connection dropped, and new ones refused
    try:
        report, code = harness.run(replace(kdd(harness, apply=True), kubeconfig=(harness.tmp / "kubeconfig-linked",)))
    finally:
        link.close()
    entry = hosts_by_name(report)[GONE]
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    assert entry["changes"] == [] and "may have been written" not in entry["error"]


def before_keys(report: dict[str, Any]) -> list[str]:
    return [c["key"] for c in hosts_by_name(report)[GONE]["changes"] if c.get("before")]


def test_a_stale_precondition_is_a_conflict_not_a_blind_delete(harness: Harness, group: Group) -> None:
    api = group.path
    seed_kdd(harness.kubeapi, group)

    def someone_touches_the_peer() -> None:
        peer = harness.kubeapi.get(f"{api}/bgppeers", "tor-gone")
        assert peer is not None
        harness.kubeapi.put(f"{api}/bgppeers", peer)  # new resourceVersion

    harness.kubeapi.on("GET", f"^/api/v1/nodes/{GONE}$", someone_touches_the_peer)
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    assert harness.kubeapi.count("DELETE", f"^{api}/bgppeers/tor-gone$") == 2, "refused once, decided again"


def test_the_audit_counts_leaks_on_live_nodes_empty_handles_and_pool_use(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)
    audit = harness.run(kdd(harness))[0]["audit"]
    assert audit["leaked_ips"]["count"] == 1
    assert audit["leaked_ips"]["sample"] == [
        {
            "ip": "100.96.1.9",
            "node": LIVE_A,
            "pod": "default/ghost",
            "handle": "k8s-pod-network.ghost",
            "since": "2026-11-30T12:00:00Z",
            "action": "waiting_grace",
        }
    ]
    assert audit["handles_without_allocations"] == {"count": 1, "sample": ["k8s-pod-network.stale"]}
    (pool,) = audit["pools"]
    assert (pool["cidr"], pool["blocks"], pool["allocated"]) == ("100.96.0.0/16", 4, 8)
    assert "calicoctl ipam check" in audit["next_step"]


def test_dual_stack_pools_are_audited_and_the_gone_nodes_ipv6_block_goes_too(harness: Harness, group: Group) -> None:
    api = group.path
    seed_kdd(harness.kubeapi, group)
    ipam = CalicoSeed()
    for cidr, host, ip, pod in [
        ("fd00:96::/122", LIVE_A, "fd00:96::5", "web-a"),
        ("fd00:96::40/122", GONE, "fd00:96::45", "cart-1"),
    ]:
        ipam.block(cidr, host)
        ipam.allocate(ip, f"k8s-pod-network.{pod}-v6", host, pod=pod, namespace="shop")
        name = f"{host}-{cidr_name(str(ipaddress.ip_network(cidr)))}"
        spec = {"cidr": cidr, "node": host, "state": "confirmed", "deleted": group.affinity_deleted, "type": "host"}
        harness.kubeapi.put(f"{api}/blockaffinities", {"metadata": {"name": name}, "spec": spec})
    for cidr, block in ipam.blocks.items():
        harness.kubeapi.put(f"{api}/ipamblocks", {"metadata": {"name": cidr_name(cidr)}, "spec": copy.deepcopy(block)})
    for handle_id, handle in ipam.handles.items():
        body = {"metadata": {"name": handle_id.lower()}, "spec": {"handleID": handle_id, **copy.deepcopy(handle)}}
        harness.kubeapi.put(f"{api}/ipamhandles", body)
    v6_pool = {"metadata": {"name": "default-ipv6-ippool"}, "spec": {"cidr": "fd00:96::/48"}}
    harness.kubeapi.put(f"{api}/ippools", v6_pool)
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0, report["errors"]
    pools = {p["cidr"]: (p["blocks"], p["allocated"]) for p in report["audit"]["pools"]}
    assert pools == {"100.96.0.0/16": (4, 8), "fd00:96::/48": (2, 2)}
    left = snapshot(harness.kubeapi, group)
    assert "ipamblocks/fd00-96---40-122" not in left and "ipamblocks/fd00-96---122" in left
    assert not any(GONE in key for key in left)


def test_the_lean_read_decides_exactly_what_the_full_read_does(
    harness: Harness, group: Group, monkeypatch: Any
) -> None:
    """Told the Node names, the read keeps of live nodes only what the block scan counts, and only
    the handles a plan may write; every decision, the audit and the leak plan are still those of
    the full read. Garbage of every kind: a stale handle, an allocation without a handle, a leak
    whose handle is as Calico writes it (so the lean read drops it and it is read when needed), a
    pod still starting, and the gone node's IPAM."""
    api = group.path
    seed_kdd(harness.kubeapi, group)
    block = copy.deepcopy(harness.kubeapi.get(f"{api}/ipamblocks", "100-96-1-0-26"))
    assert block is not None
    spec = block["spec"]
    for ordinal, pod in ((20, "lost"), (21, "starting")):  # lost: its handle is gone; starting: no IP yet
        spec["attributes"].append(
            {"handle_id": f"k8s-pod-network.{pod}", "secondary": {"node": LIVE_A, "namespace": "default", "pod": pod}}
        )
        spec["allocations"][ordinal] = len(spec["attributes"]) - 1
        spec["unallocated"].remove(ordinal)
    harness.kubeapi.put(f"{api}/ipamblocks", block)
    harness.kubeapi.put(
        f"{api}/ipamhandles",
        {
            "metadata": {"name": "k8s-pod-network.starting"},
            "spec": {"handleID": "k8s-pod-network.starting", "block": {"100.96.1.0/26": 1}, "deleted": False},
        },
    )
    harness.kubeapi.add_pod("default", "starting", LIVE_A)  # Pending: no IP yet
    harness.kubeapi.put(  # counts nothing and no block holds anything for it
        f"{api}/ipamhandles",
        {"metadata": {"name": "k8s-pod-network.empty"}, "spec": {"handleID": "k8s-pod-network.empty", "block": {}}},
    )
    web_a = copy.deepcopy(harness.kubeapi.get(f"{api}/ipamhandles", "k8s-pod-network.web-a"))
    assert web_a is not None
    web_a["spec"]["block"]["100.96.1.0/26"] = 2  # counts one more than its block holds
    harness.kubeapi.put(f"{api}/ipamhandles", web_a)
    config = kdd(harness, release_leaked_ips=True, max_deletions=50)
    lean, _ = harness.run(config)
    audit = lean["audit"]
    stale = [e["handle"] for e in audit["stale_handles"]["sample"]]
    assert stale == ["k8s-pod-network.stale", "k8s-pod-network.web-a"]
    assert [e["handle"] for e in audit["dangling_allocations"]["sample"]] == ["k8s-pod-network.lost"]
    assert sorted(e["pod"] for e in audit["leaked_ips"]["sample"]) == ["default/ghost", "default/lost"]
    assert "k8s-pod-network.empty" in audit["handles_without_allocations"]["sample"]

    lean_handles = _as_the_full_read(harness, config, lean, monkeypatch)
    assert "k8s-pod-network.ghost" not in lean_handles, "as Calico writes it: not kept"


def test_allocations_that_name_no_node_keep_no_handle_in_the_lean_read(
    harness: Harness, group: Group, monkeypatch: Any
) -> None:
    """Blocks whose allocations carry no `secondary` (Calico writes it omitempty): no node owns
    one, and in this datastore a gone node leaves no known IP (its pods and its Node are gone), so
    no plan frees one. The lean read keeps none of their handles (it kept every one, as handles
    that a plan may write), and every decision is the full read's. The audit lists those in the
    gone node's blocks that no pod holds: they stay."""
    api = group.path
    seed_kdd(harness.kubeapi, group)
    for cidr in ("100.96.1.0/26", "100.96.2.0/26", "100.96.9.0/26", "100.96.8.0/26"):
        block = copy.deepcopy(harness.kubeapi.get(f"{api}/ipamblocks", cidr_name(cidr)))
        assert block is not None
        for attribute in block["spec"]["attributes"]:
            attribute.pop("secondary", None)
        harness.kubeapi.put(f"{api}/ipamblocks", block)
    config = kdd(harness, max_deletions=50)
    lean, code = harness.run(config)
    assert code == 0, lean["errors"]
    # The gone node's pods' allocations stay, and say so; api-1's, a live pod's, is in use.
    unattributed = lean["audit"]["unattributed_allocations"]["sample"]
    assert [(u["ip"], u["host"], u["handle"]) for u in unattributed] == [
        ("100.96.8.5", "worker-gone", "k8s-pod-network.cart-3"),
        ("100.96.9.5", "worker-gone", "k8s-pod-network.cart-1"),
    ]
    lean_handles = _as_the_full_read(harness, config, lean, monkeypatch)
    assert "k8s-pod-network.web-a" not in lean_handles and "k8s-pod-network.web-b" not in lean_handles


def _as_the_full_read(harness: Harness, config: Config, lean: dict[str, Any], monkeypatch: Any) -> set[str]:
    """That a run whose read is not told the Node names reports what `lean` (the report of one
    that was) does, with more handles read: the handles the lean read keeps."""
    from job.adapters.datastores.kdd import KddDatastore
    from job.adapters.kube import Kube, api_client

    kube_names_given: list[bool] = []
    read = KddDatastore.read
    store = KddDatastore(Kube(api_client(kdd(harness)), harness.retry))
    lean_handles = set(read(store, lambda: {LIVE_A, LIVE_B}).handles)

    def full_read(self: KddDatastore, kube_names: Any = None, scope: Any = None) -> Any:
        kube_names_given.append(kube_names is not None)
        inventory = read(self, None)
        assert inventory.scan is None and len(inventory.handles) > len(lean_handles)
        return inventory

    monkeypatch.setattr(KddDatastore, "read", full_read)
    full, _ = harness.run(config)
    assert kube_names_given == [True]
    for part in ("summary", "hosts", "conflicts", "errors", "audit"):
        assert lean[part] == full[part], part
    return lean_handles


# Answers a proxy might give for what a run reads beside Calico's own lists, and what each leaves.
ODD_ANSWERS = [
    ("GET", r"/deployments/calico-kube-controllers$", {"kind": "Deployment", "spec": {"template": []}}),
    (
        "GET",
        r"/deployments/calico-kube-controllers$",
        {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [{"env": ["ENABLED_CONTROLLERS"]}]}}}},
    ),
    ("GET", r"/ipamconfig(s|urations)/default$", {"kind": "IPAMConfig", "spec": ["ipCooldownSeconds"]}),
    ("POST", r"/selfsubjectaccessreviews$", {"kind": "SelfSubjectAccessReview", "status": ["allowed"]}),
]


@pytest.mark.parametrize(("method", "path", "answer"), ODD_ANSWERS)
def test_an_odd_answer_beside_the_calico_lists_is_not_known_never_a_traceback(
    harness: Harness, group: Group, method: str, path: str, answer: dict[str, Any]
) -> None:
    """kube-controllers' Deployment, the IPAMConfig or an access review answered in a shape no
    server of Kubernetes' gives (a proxy's): what it would have told is not known, said where it
    is reported, and the run plans as without it. Each was a traceback (`unexpected`, exit 1)."""
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.fail(method, path, 200, times=10, body=answer)
    report, code = harness.run(kdd(harness))
    assert code == 0 and [h["action"] for h in report["hosts"]] == ["would_delete"]
    assert not [e for e in report["errors"] if e["kind"] == "unexpected"]
    if "deployments" in path:
        assert report["datastore"]["kube_controllers"]["deployment"] is None
    if "ipamconfig" in path:
        assert {"kind": "malformed_value", "message": "spec is a list", "key": "ipamconfigs/default"} in report[
            "errors"
        ]


def test_a_tombstone_whose_answer_names_no_version_fails_its_host_in_doubt(harness: Harness, group: Group) -> None:
    """The gone node's block marked `deleted`, answered with no resourceVersion (a proxy's): the
    delete that follows cannot be guarded, so it is not sent; the host fails with the write in
    doubt, in one line, and the next run finishes it. It was a KeyError mid-apply."""
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.fail(
        "PUT", f"{group.path}/ipamblocks/100-96-9-0-26$", 200, body={"kind": "IPAMBlock", "metadata": {}}
    )
    report, code = harness.run(kdd(harness, apply=True))
    gone = hosts_by_name(report)[GONE]
    assert (code, gone["action"]) == (4, "failed"), report["errors"]
    assert "names no resourceVersion to delete at" in gone["error"]
    assert harness.kubeapi.count("DELETE", "/ipamblocks/100-96-9-0-26$") == 0
    assert not [e for e in report["errors"] if e["kind"] == "unexpected"]
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    assert harness.kubeapi.get(f"{group.path}/ipamblocks", "100-96-9-0-26") is None


def test_an_odd_deployment_in_one_namespace_leaves_kube_controllers_to_the_other(harness: Harness) -> None:
    """kube-system's answer for kube-controllers is no Deployment (a proxy's): not known there, as
    where it may not be read, so calico-system's is still looked at and found."""
    seed_kdd(harness.kubeapi)
    deployment = harness.kubeapi.get("/apis/apps/v1/namespaces/kube-system/deployments", "calico-kube-controllers")
    assert deployment is not None
    harness.kubeapi.put("/apis/apps/v1/namespaces/calico-system/deployments", deployment)
    harness.kubeapi.fail(
        "GET", "/namespaces/kube-system/deployments/calico-kube-controllers$", 200, body={"spec": {"template": []}}
    )
    report, code = harness.run(kdd(harness))
    assert (
        code == 0 and report["datastore"]["kube_controllers"]["deployment"] == "calico-system/calico-kube-controllers"
    )
