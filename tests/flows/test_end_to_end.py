"""The whole run against a real etcd and the Kubernetes API test server."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from job.core import report as report_module
from tests.adapters.test_kubeapi_server import call
from tests.conftest import Harness, hosts_by_name
from tests.support import calico
from tests.support import scenario as s

ORPHAN_MARKERS = (
    s.CONFLICT_ORPHAN,
    s.POD_ORPHAN,
    "tor-ip-10-0-1-20",
    "ip-10-0-1-20-eth0",
    "ip--10--0--1--20",
    "block/100.96.13.0-26",
)


def test_dry_run_reports_the_plan_and_changes_nothing(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()
    report, code = harness.run()
    assert code == 0
    assert harness.dump() == before
    hosts = hosts_by_name(report)
    assert hosts[s.CONFLICT_ORPHAN]["action"] == "would_delete"
    assert hosts[s.POD_ORPHAN]["action"] == "would_delete"
    assert hosts[s.UNREFERENCED]["reason"] == "no_k8s_orchref"
    assert report["conflicts"] == [
        {"ip": "10.0.1.13", "orphan": s.CONFLICT_ORPHAN, "blocks": s.NEW_NODE, "kind": "orphan_holds_live_node_ip"}
    ]
    assert report["mode"] == "dry-run" and report["summary"]["would_delete"] == 2


def test_dry_run_lists_every_key_it_would_remove_with_its_value(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()
    report, _ = harness.run()
    changes = hosts_by_name(report)[s.POD_ORPHAN]["changes"]
    for change in changes:
        assert change["before"] == before[change["key"]][0]
        assert change["revision"] == before[change["key"]][1]


def test_apply_removes_exactly_the_orphans_data_and_leaves_every_other_key_identical(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()
    report, code = harness.run(harness.config(apply=True))
    after = harness.dump()
    assert code == 0 and report["summary"]["deleted"] == 2
    removed = set(before) - set(after)
    changed = {k for k in after if after[k] != before[k]}
    assert not set(after) - set(before), "nothing is created"
    reported = {c["key"]: c for h in report["hosts"] for c in h["changes"]}
    assert removed | changed == set(reported)
    assert {k for k, c in reported.items() if c["op"] == "update"} == changed
    assert all(
        any(m in key for m in ORPHAN_MARKERS)
        for key in removed - {k for k in removed if k.startswith("/calico/ipam/v2/handle/k8s-pod-network.")}
    )
    # Only IPAM blocks change in place: the orphan's own block (lending an IP) and a live
    # node's block (which lent one to the orphan).
    assert changed == {
        "/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26",
        "/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26",
    }
    lending = json.loads(after["/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"][0])
    assert lending["affinity"] is None
    assert [a["secondary"]["pod"] for a in lending["attributes"]] == ["api-1"]
    assert not any(s.UNREFERENCED in key for key in removed)
    assert "/calico/resources/v3/projectcalico.org/bgppeers/rr-global" in after


def test_second_apply_run_finds_nothing_left(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.run(harness.config(apply=True))
    after_first = harness.dump()
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["summary"]["deleted"] == 0
    assert harness.dump() == after_first


def test_match_name_cleans_the_backlog_without_orchrefs(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    report, code = harness.run(harness.config(apply=True, unreferenced="match-name"))
    assert code == 0
    assert hosts_by_name(report)[s.UNREFERENCED]["action"] == "deleted"
    assert not [k for k in harness.dump() if s.UNREFERENCED in k]


def test_grace_period_spans_runs(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    config = harness.config(apply=True, grace_period=timedelta(minutes=30), conflict_grace_period=timedelta(minutes=30))
    first, _ = harness.run(config)
    assert {h["action"] for h in first["hosts"] if h["reason"] != "no_k8s_orchref"} == {"waiting_grace"}
    before = harness.dump()
    harness.now += timedelta(minutes=29)
    second, _ = harness.run(config)
    assert second["summary"]["deleted"] == 0 and harness.dump() == before
    assert hosts_by_name(second)[s.POD_ORPHAN]["orphaned_since"] == "2026-11-30T12:00:00Z"
    harness.now += timedelta(minutes=1)
    third, _ = harness.run(config)
    assert third["summary"]["deleted"] == 2


def test_lost_state_only_restarts_the_wait(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    config = harness.config(apply=True, grace_period=timedelta(minutes=30), conflict_grace_period=timedelta(hours=1))
    harness.run(config)
    assert config.state_file is not None
    config.state_file.write_text("{not json")
    harness.now += timedelta(hours=2)
    report, code = harness.run(config)
    assert code == 0 and report["summary"]["deleted"] == 0 and report["summary"]["waiting_grace"] == 2


def test_max_deletions_defers_the_rest_conflict_first(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    report, code = harness.run(harness.config(apply=True, max_deletions=1))
    hosts = hosts_by_name(report)
    assert code == 0
    assert hosts[s.CONFLICT_ORPHAN]["action"] == "deleted"
    assert hosts[s.POD_ORPHAN]["action"] == "deferred"
    assert any(s.POD_ORPHAN in k for k in harness.dump())


def test_hosts_held_back_are_logged_together_and_the_others_each_on_a_line(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog is decided on every run: each deferred or waiting host on a line of its own was
    most of a run's log. Those go in one `held_back` event for each action and reason, naming the
    first few; a host to delete, one skipped, and one in an IP conflict (waiting or not) keep
    their own `decision` line."""
    monkeypatch.setattr(report_module, "HELD_BACK_NAMED", 3)
    harness.seed(s.cross_borrowing_fleet(6))
    with capture_logs() as logs:
        report, code = harness.run(harness.config(max_deletions=1, max_orphan_fraction=1.0))
    assert code == 0
    # The readable summary: a row for the host to delete, one line for the five deferred.
    text = report_module.render_text(report).splitlines()
    assert [line.split()[:2] for line in text if line.startswith("gone-")] == [["gone-0", "would_delete"]]
    assert "5 deferred (max_deletions): gone-1, gone-2, gone-3 and 2 more" in text
    assert len(report["hosts"]) == 6  # the JSON report lists each
    assert [(e["host"], e["action"]) for e in logs if e["event"] == "decision"] == [("gone-0", "would_delete")]
    held = [{k: e[k] for k in ("action", "reason", "hosts", "first")} for e in logs if e["event"] == "held_back"]
    assert held == [
        {"action": "deferred", "reason": "max_deletions", "hosts": 5, "first": ["gone-1", "gone-2", "gone-3"]}
    ]


def test_an_orphan_in_an_ip_conflict_keeps_its_own_line_while_it_waits(harness: Harness) -> None:
    harness.seed(s.kops_cluster())  # the renamed node's orphan waits in the conflict grace period
    with capture_logs() as logs:
        report, code = harness.run(
            harness.config(grace_period=timedelta(hours=1), conflict_grace_period=timedelta(hours=1))
        )
    assert code == 0
    lines = {e["host"]: (e["action"], e["reason"]) for e in logs if e["event"] == "decision"}
    assert lines == {
        s.CONFLICT_ORPHAN: ("waiting_grace", "conflict_grace_period"),
        s.UNREFERENCED: ("skipped", "no_k8s_orchref"),
    }
    held = [(e["action"], e["reason"], e["first"]) for e in logs if e["event"] == "held_back"]
    assert held == [("waiting_grace", "grace_period", [s.POD_ORPHAN])]
    text = report_module.render_text(report)
    assert f"1 waiting_grace (grace_period): {s.POD_ORPHAN}" in text.splitlines()
    assert any(line.startswith(s.CONFLICT_ORPHAN) and "holds 10.0.1.13" in line for line in text.splitlines())


@pytest.mark.parametrize("skipped", [0, 2])
def test_a_run_reads_whole_the_hosts_it_may_take_and_reads_again_when_it_skips_them(
    harness: Harness, skipped: int
) -> None:
    """(issue 31, memory with many gone hosts) The read keeps whole only the gone hosts a plan may
    take first (plan.read_first: twice --max-deletions); the others as lean as live ones. Where
    the plan skips those it read whole (here their blocks are malformed), it reaches one it kept
    lean: the run reads again, whole, and deletes that one with everything it left behind."""
    scenario = s.cross_borrowing_fleet(6)
    for i in range(skipped):
        scenario.seed.keys[f"/calico/ipam/v2/assignment/ipv4/block/100.64.{i}.0-26"] = f'{{"cidr": "100.64.{i}.0/26"}}'
    harness.seed(scenario)
    report, code = harness.run(harness.config(apply=True, max_deletions=1, max_orphan_fraction=1.0))
    assert code == 0
    actions = {name: (h["action"], h["reason"]) for name, h in hosts_by_name(report).items()}
    taken = f"gone-{skipped}"
    assert actions == {
        **{f"gone-{i}": ("skipped", "malformed_data") for i in range(skipped)},
        taken: ("deleted", "k8s_node_missing"),
        **{f"gone-{i}": ("deferred", "max_deletions") for i in range(skipped + 1, 6)},
    }
    assert ("datastore_read_again" in report["timings"]) is (skipped > 0)
    left = harness.dump()
    assert not [key for key in left if taken in key or taken.replace("-", "--") in key]  # its endpoints too
    assert all(any(f"gone-{i}" in key for key in left) for i in range(6) if f"gone-{i}" != taken)


def test_a_node_held_by_a_finalizer_is_live_until_it_is_gone(harness: Harness) -> None:
    """A Node whose delete waits on a finalizer (Karpenter's, while it drains and ends the
    instance) is still there, marked, and calico-node may still run on it: its Calico data is
    kept, however long that takes. Once its last finalizer is gone, so is the Node, and its data
    is an orphan's like any other."""
    harness.seed(s.kops_cluster())
    node, nodes = s.LIVE[2], "/api/v1/nodes"
    stored = harness.kubeapi.get(nodes, node)
    assert stored is not None
    harness.kubeapi.put(
        nodes, {**stored, "metadata": {**stored["metadata"], "finalizers": ["karpenter.sh/termination"]}}
    )
    marked = call(harness.kubeapi, "DELETE", f"{nodes}/{node}").json()
    assert marked["metadata"]["deletionTimestamp"], "being deleted, not gone"
    config = harness.config(apply=True)
    report, code = harness.run(config)
    assert code == 0 and node not in hosts_by_name(report), "a live host: never planned"
    assert any(node in key for key in harness.dump())
    call(harness.kubeapi, "PUT", f"{nodes}/{node}", {**marked, "metadata": {**marked["metadata"], "finalizers": []}})
    assert harness.kubeapi.get(nodes, node) is None
    calico.delete(harness.etcd.url, f"/calico/felix/v2/no-region/host/{node}/status")  # its lease ran out with it
    report, _ = harness.run(config)
    assert hosts_by_name(report)[node]["action"] == "deleted"
    assert not any(node in key for key in harness.dump())


def test_felix_still_reporting_protects_a_host(harness: Harness) -> None:
    scenario = s.kops_cluster()
    scenario.seed.felix(s.POD_ORPHAN, alive=True)
    harness.seed(scenario)
    report, _ = harness.run(harness.config(apply=True))
    assert hosts_by_name(report)[s.POD_ORPHAN]["reason"] == "felix_alive"
    assert any(s.POD_ORPHAN in k for k in harness.dump())


def test_excluded_hosts_are_never_touched(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    report, _ = harness.run(harness.config(apply=True, exclude=(r"ip-10-0-1-20\..*",)))
    assert hosts_by_name(report)[s.POD_ORPHAN]["reason"] == "excluded"
    assert f"/calico/resources/v3/projectcalico.org/nodes/{s.POD_ORPHAN}" in harness.dump()


@pytest.mark.parametrize("guard", ["empty_k8s_node_list", "foreign_datastore", "orphan_fraction", "datastore_locked"])
def test_each_guard_refuses_with_exit_3_and_deletes_nothing(harness: Harness, guard: str) -> None:
    scenario = s.kops_cluster()
    if guard == "datastore_locked":
        scenario.seed.cluster_information(ready=False)
    if guard == "empty_k8s_node_list":
        scenario.k8s_nodes = []
    if guard == "foreign_datastore":
        scenario.k8s_nodes = [(f"other-{i}", f"10.9.0.{i}") for i in range(6)] + scenario.k8s_nodes[:1]
    harness.seed(scenario)
    config = harness.config(apply=True)
    if guard == "orphan_fraction":
        config = replace(config, max_orphan_fraction=0.2)
    before = harness.dump()
    report, code = harness.run(config)
    assert code == 3 and report["outcome"] == "refused"
    assert guard in [g["name"] for g in report["guards"]]
    assert harness.dump() == before
    assert report["hosts"], "the refused run still reports its plan"
    assert config.state_file is not None and not config.state_file.exists(), "no grace clock starts"


def test_kubernetes_429_and_5xx_are_retried_and_410_restarts_the_listing(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.fail("GET", r"^/api/v1/nodes$", 429)
    harness.kubeapi.fail("GET", r"^/api/v1/nodes$", 503)
    harness.kubeapi.expired_tokens = True
    harness.kubeapi.on("GET", r"^/api/v1/nodes$", lambda: setattr(harness.kubeapi, "expired_tokens", False), times=2)
    report, code = harness.run()
    assert code == 0 and report["kubernetes"]["node_count"] == 4
    assert harness.kubeapi.count("GET", r"^/api/v1/nodes$") >= 4


def test_kubernetes_down_for_good_is_a_clear_error(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.fail("GET", r"^/api/v1/nodes$", 503, times=100)
    report, code = harness.run()
    assert code == 1 and report["outcome"] == "error"
    assert "503" in report["errors"][0]["message"]


def test_malformed_values_and_unknown_keys_are_reported_not_fatal(harness: Harness) -> None:
    scenario = s.kops_cluster()
    seed = scenario.seed
    seed.keys["/calico/resources/v3/projectcalico.org/nodes/broken-node"] = "{not json"
    seed.keys["/calico/resources/v3/projectcalico.org/nodes/a/b"] = "{}"
    seed.keys["/calico/ipam/v2/assignment/ipv4/block/banana"] = "{}"
    seed.keys["/calico/felix/v2/no-region/weird"] = "{}"
    seed.keys["/calico/resources/v3/projectcalico.org/workloadendpoints/ns/x"] = '{"spec": 5}'
    harness.seed(scenario)
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2
    kinds = {(e["kind"], e.get("key", "").rsplit("/", 1)[-1]) for e in report["errors"]}
    assert ("malformed_value", "broken-node") in kinds
    assert ("unknown_key", "b") in kinds and ("unknown_key", "banana") in kinds and ("unknown_key", "weird") in kinds
    assert hosts_by_name(report)["broken-node"]["action"] == "skipped"
    assert "/calico/resources/v3/projectcalico.org/nodes/broken-node" in harness.dump()


def test_orphan_whose_block_is_malformed_is_skipped_untouched(harness: Harness) -> None:
    scenario = s.kops_cluster()
    scenario.seed.keys["/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"] = '{"cidr": "100.96.20.0/26"}'
    harness.seed(scenario)
    before = harness.dump()
    report, code = harness.run(harness.config(apply=True))
    assert code == 0
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    assert (entry["action"], entry["reason"]) == ("skipped", "malformed_data")
    assert {k: v for k, v in harness.dump().items() if s.POD_ORPHAN in k} == {
        k: v for k, v in before.items() if s.POD_ORPHAN in k
    }


def test_unreachable_etcd_is_a_clear_error(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.etcd.stop()
    report, code = harness.run()
    assert code == 1
    assert report["errors"][0]["kind"] == "unavailable"
    message = report["errors"][0]["message"]
    assert "did not answer: Connection refused" in message and "ETCD_ENDPOINTS" in message and "\n" not in message


def test_report_endpoints_carry_no_credentials_and_the_cluster_guid(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    report, _ = harness.run()
    assert report["datastore"]["cluster_guid"] == "a1b2c3d4e5f6"
    assert report["datastore"]["endpoints"] == [harness.etcd.url]


def test_many_keys_are_deleted_in_transactions_of_at_most_128(harness: Harness) -> None:
    scenario = s.kops_cluster()
    seed = scenario.seed
    seed.block("100.97.0.0/24", s.POD_ORPHAN)
    for i in range(2, 202):
        seed.pod(s.POD_ORPHAN, "batch", f"job-{i}", f"100.97.0.{i}")
    harness.seed(scenario)
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and hosts_by_name(report)[s.POD_ORPHAN]["action"] == "deleted"
    assert not [k for k in harness.dump() if "batch/" in k or "100.97.0.0" in k]
    calico.wipe(harness.etcd.url)


def test_endpoints_of_a_namespace_without_a_profile_are_read_all_the_same(harness: Harness) -> None:
    """The namespace profiles only bound the endpoints' page windows (etcdv3.scan): the gone
    node's endpoints in `shop`, which has none (a namespace Kubernetes no longer has), go too."""
    scenario = s.kops_cluster()
    for namespace in ("default", "kube-system", "zz-last"):
        scenario.seed.namespace_profile(namespace)
    harness.seed(scenario)
    assert any("/workloadendpoints/shop/" in key for key in harness.dump())
    report, code = harness.run(harness.config(apply=True, page_size=1))
    assert code == 0 and hosts_by_name(report)[s.POD_ORPHAN]["action"] == "deleted"
    left = [key for key in harness.dump() if "/workloadendpoints/shop/" in key]
    assert left and not any("ip--10--0--1--20" in key for key in left), left
