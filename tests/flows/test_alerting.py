"""Alerts on real parts: the job's real runs push to a real Pushgateway, a real Prometheus scrapes
it with the shipped rules, and Prometheus's own promtool unit-tests the rules over the incident's
timelines (tests/prometheus/calico-gc.rules.test.yaml)."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from job.cli import main
from tests.adapters.test_health import cli_env, crash_looping, healthy_pods, network_unavailable
from tests.conftest import Harness
from tests.support import prometheus as prom
from tests.support import scenario as s

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "calico-gc" / "files" / "calico-gc.rules.yaml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "calico-gc.rules.test.yaml"
CONFLICT_LOG = "Calico node '{holder}' is already using the IPv4 address {ip}."


def run(harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str, **env: str) -> dict[str, Any]:
    code = main(list(argv), cli_env(harness, tmp_path, **{"CALICO_GC_RETRY_ATTEMPTS": "1", **env}))
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == code
    return report


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    prom.needs(prom.PROMTOOL, "promtool")
    checked = subprocess.run([prom.PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0 and "SUCCESS: 10 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run(
        [prom.PROMTOOL, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True, text=True
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_a_rule_that_does_not_hold_fails_its_unit_test(tmp_path: Path) -> None:
    """The unit tests can fail: with the stuck-node threshold at 20 seconds, the rolling update fires."""
    prom.needs(prom.PROMTOOL, "promtool")
    (tmp_path / "rules.yaml").write_text(
        RULES.read_text().replace(
            "calico_gc_node_network_unavailable_seconds >= 600", "calico_gc_node_network_unavailable_seconds >= 20"
        )
    )
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = ["rules.yaml"]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    tested = subprocess.run(
        [prom.PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode != 0 and "a rolling Calico update" in tested.stdout + tested.stderr


def test_every_alert_has_severity_summary_description_and_a_runbook_entry() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", runbook, re.M)}
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == 9
    for rule in alerts:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), rule["alert"]
        assert rule["annotations"]["runbook_url"].split("#")[1] in anchors, rule["alert"]


def test_metrics_go_to_a_real_pushgateway_in_both_push_modes_under_one_cluster_group(
    harness: Harness, tmp_path: Path, pushgateway: prom.Pushgateway, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    network_unavailable(harness.kubeapi, s.NEW_NODE, "2026-11-29T00:00:00Z")
    crash_looping(harness.kubeapi, s.NEW_NODE, CONFLICT_LOG.format(holder=s.CONFLICT_ORPHAN, ip="10.0.1.13"))
    warnings = ["a deprecated version", "a webhook's word"]  # sent with the Nodes' list, both
    harness.kubeapi.on("GET", "^/api/v1/nodes$", lambda: harness.kubeapi.warn("GET", "/api/v1/nodes", warnings))
    report = run(harness, tmp_path, capsys, "--pushgateway", pushgateway.url, "--cluster-name", "prod-eu")
    assert report["exit_code"] == 0
    runs = pushgateway.group(job="calico-gc", cluster="prod-eu")
    nodes = pushgateway.group(job="calico-gc", cluster="prod-eu", scope="nodes")
    assert runs is not None and nodes is not None
    samples = prom.Pushgateway.samples
    assert samples(runs, "calico_gc_hosts")[(("action", "would_delete"),)] == 2
    assert samples(runs, "calico_gc_ip_conflicts")[()] == 1
    assert samples(runs, "calico_gc_api_server_warnings")[()] == 2
    assert samples(runs, "calico_gc_last_run_exit_code")[()] == 0
    success = samples(runs, "calico_gc_last_success_timestamp_seconds")[()]
    assert success > 1.7e9 and samples(runs, "calico_gc_grace_period_seconds")[()] == 0
    assert samples(runs, "calico_gc_info") == {(("cluster_guid", "a1b2c3d4e5f6"), ("datastore", "etcdv3")): 1}
    (stuck,) = samples(nodes, "calico_gc_node_network_unavailable_seconds").items()
    assert stuck[0] == (("cause", "ip_conflict_orphan"), ("node", s.NEW_NODE)) and stuck[1] > 86400
    restarts = samples(nodes, "calico_gc_calico_node_restarts")
    assert list(restarts) == [(("namespace", "kube-system"), ("node", s.NEW_NODE), ("pod", "calico-node-ip-10-0-1-13"))]

    # A run that cannot read the datastore lands in the same group: its exit code, the last success kept.
    failed = run(
        harness,
        tmp_path,
        capsys,
        "--pushgateway",
        pushgateway.url,
        "--cluster-name",
        "prod-eu",
        ETCD_ENDPOINTS="http://127.0.0.1:9",
    )
    assert failed["exit_code"] == 1 and failed["health"] is None
    runs = pushgateway.group(job="calico-gc", cluster="prod-eu")
    assert runs is not None and samples(runs, "calico_gc_last_run_exit_code")[()] == 1
    assert samples(runs, "calico_gc_last_success_timestamp_seconds")[()] == success
    assert pushgateway.group(job="calico-gc", cluster="unknown") is None
    assert pushgateway.group(job="calico-gc", cluster="prod-eu", scope="nodes") == nodes, "not diagnosed: kept"

    # The node recovers: at the next push its series is gone (the nodes group is replaced whole).
    node = harness.kubeapi.get("/api/v1/nodes", s.NEW_NODE)
    assert node is not None
    node["status"]["conditions"] = [c for c in node["status"]["conditions"] if c["type"] != "NetworkUnavailable"]
    harness.kubeapi.add_calico_node_pod(s.NEW_NODE)
    run(harness, tmp_path, capsys, "--pushgateway", pushgateway.url, "--cluster-name", "prod-eu")
    nodes = pushgateway.group(job="calico-gc", cluster="prod-eu", scope="nodes")
    assert nodes is not None and not samples(nodes, "calico_gc_node_network_unavailable_seconds")
    assert not samples(nodes, "calico_gc_calico_node_restarts")


def test_without_a_cluster_name_the_group_is_default_whatever_the_run_read(
    harness: Harness, tmp_path: Path, pushgateway: prom.Pushgateway, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.seed(s.kops_cluster())
    run(harness, tmp_path, capsys, "--pushgateway", pushgateway.url)
    run(harness, tmp_path, capsys, "--pushgateway", pushgateway.url, ETCD_ENDPOINTS="http://127.0.0.1:9")
    groups = {tuple(sorted(g["labels"].items())) for g in pushgateway.groups()}
    assert groups == {
        (("cluster", "default"), ("job", "calico-gc")),
        (("cluster", "default"), ("job", "calico-gc"), ("scope", "nodes")),
    }


def test_a_refused_run_pushes_its_refusal_and_no_success(
    harness: Harness, tmp_path: Path, pushgateway: prom.Pushgateway, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = s.kops_cluster()
    scenario.k8s_nodes = []  # the empty-list guard refuses: exit 3
    harness.seed(scenario)
    report = run(harness, tmp_path, capsys, "--pushgateway", pushgateway.url)
    assert report["exit_code"] == 3
    runs = pushgateway.group(job="calico-gc", cluster="default")
    assert runs is not None and "calico_gc_last_success_timestamp_seconds" not in runs
    assert prom.Pushgateway.samples(runs, "calico_gc_refused")[()] == 1
    assert prom.Pushgateway.samples(runs, "calico_gc_last_run_exit_code")[()] == 3


def test_a_pushgateway_that_is_down_is_a_warning_not_a_failed_run(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.seed(s.kops_cluster())
    report = run(harness, tmp_path, capsys, "--pushgateway", f"http://127.0.0.1:{prom.free_port()}")
    assert report["exit_code"] == 0 and report["errors"][-1]["kind"] == "metrics_push"


def test_a_real_prometheus_scrapes_the_pushed_series_and_a_stuck_node_fires(
    harness: Harness, tmp_path: Path, pushgateway: prom.Pushgateway, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped rules, their `for` shortened in a test copy, loaded in a real Prometheus that
    scrapes the real Pushgateway the job pushed to. Two Nodes carry the taint without timeAdded
    (no condition): the one created 3 hours ago fires as stuck for its age, the one registered 2
    minutes ago does not."""
    prom.needs(prom.PROMETHEUS, "prometheus")
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    network_unavailable(harness.kubeapi, s.NEW_NODE, "2026-11-29T00:00:00Z")
    now = datetime.now(UTC)  # the command's clock, not the harness's
    for name, age in ((s.LIVE[0], timedelta(hours=3)), (s.LIVE[1], timedelta(minutes=2))):
        node = harness.kubeapi.get("/api/v1/nodes", name)
        assert node is not None
        node["metadata"]["creationTimestamp"] = (now - age).strftime("%Y-%m-%dT%H:%M:%SZ")
        node["spec"]["taints"] = [{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]
    run(harness, tmp_path, capsys, "--pushgateway", pushgateway.url, "--cluster-name", "prod-eu")
    copy = tmp_path / "rules.yaml"
    copy.write_text(re.sub(r"for: \d+m", "for: 0s", RULES.read_text()))
    server = prom.prometheus(tmp_path, f"127.0.0.1:{pushgateway.port}", [copy])
    server.start()
    try:
        series = prom.until(
            "the pushed series scraped", lambda: server.query("calico_gc_node_network_unavailable_seconds")
        )
        by_node = {each["metric"]["node"]: each for each in series}
        stuck = by_node[s.NEW_NODE]
        assert {k: stuck["metric"][k] for k in ("job", "cluster", "scope", "node", "cause")} == {
            "job": "calico-gc",
            "cluster": "prod-eu",
            "scope": "nodes",
            "node": s.NEW_NODE,
            "cause": "unknown",
        }
        ages = {node: float(each["value"][1]) for node, each in by_node.items() if node != s.NEW_NODE}
        assert ages.keys() == {s.LIVE[0], s.LIVE[1]}
        assert 10800 <= ages[s.LIVE[0]] < 10800 + 300 and 120 <= ages[s.LIVE[1]] < 120 + 300
        for name in (
            "calico_gc_last_success_timestamp_seconds",
            "calico_gc_grace_period_seconds",
            "calico_gc_ip_conflicts",
            "calico_gc_webhooks_blocking",
        ):
            (found,) = server.query(name)
            assert (found["metric"]["job"], found["metric"]["cluster"]) == ("calico-gc", "prod-eu"), name

        def firing() -> list[dict[str, Any]]:
            return [a for a in server.alerts() if a["state"] == "firing"]

        def stuck_alerts() -> list[dict[str, Any]]:
            found = [a for a in firing() if a["labels"]["alertname"] == "CalicoNodeStuckNetworkUnavailable"]
            return found if len(found) >= 2 else []

        alerts = prom.until("CalicoNodeStuckNetworkUnavailable firing for both stuck Nodes", stuck_alerts)
        assert sorted(a["labels"]["node"] for a in alerts) == sorted([s.NEW_NODE, s.LIVE[0]])
        for alert in alerts:
            assert alert["labels"]["severity"] == "critical"
            assert alert["labels"]["node"] in alert["annotations"]["description"]
        conflict = prom.until(
            "CalicoIpConflict firing", lambda: [a for a in firing() if a["labels"]["alertname"] == "CalicoIpConflict"]
        )
        assert conflict[0]["labels"]["cluster"] == "prod-eu"
        assert not [a for a in firing() if a["labels"]["alertname"] in ("CalicoGcNotRunning", "CalicoGcNotSucceeding")]
    finally:
        server.stop()
