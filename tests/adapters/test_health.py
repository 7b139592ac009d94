"""Network health diagnosis against the Kubernetes API test server, and --fail-on exit codes
(metrics and alerts on a real Pushgateway and Prometheus: tests/flows/test_alerting.py)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from job.cli import main
from job.core.health import selector_matches
from job.core.report import render_text
from tests.conftest import Harness, hosts_by_name
from tests.support import scenario as s
from tests.support.kubeapi import KubeApiServer

PODS = "/api/v1/namespaces/kube-system/pods"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
V3_CONFLICT = (
    "2026-11-30 11:58:01.123 [WARNING][9] startup/startup.go 1021: "
    "Calico node '{holder}' is already using the IPv4 address {ip}."
)
V2_CONFLICT = (
    "2026-11-30 11:58:01.123 [ERROR][9] startup.go 603: Calico node '{holder}' is already using the IPv4 address {ip}:"
)
API_TIMEOUT = (
    "2026-11-30 11:58:01.123 [ERROR][9] startup/utils.go 43: Failed to set NetworkUnavailable; will retry "
    'error=Patch "https://100.64.0.1:443/api/v1/nodes/{node}/status?timeout=2s": net/http: request canceled '
    "(Client.Timeout exceeded while awaiting headers)"
)


def crash_looping(kubeapi: KubeApiServer, node: str, log: str, restarts: int = 7) -> str:
    return kubeapi.add_calico_node_pod(node, ready=False, restarts=restarts, waiting="CrashLoopBackOff", log=log)


def healthy_pods(harness: Harness, scenario: s.Scenario) -> None:
    for name, _ in scenario.k8s_nodes:
        harness.kubeapi.add_calico_node_pod(name)


def network_unavailable(kubeapi: KubeApiServer, name: str, since: str, taint: bool = False) -> None:
    node = kubeapi.get("/api/v1/nodes", name)
    assert node is not None
    if taint:
        node.setdefault("spec", {})["taints"] = [
            {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule", "timeAdded": since}
        ]
    else:  # as the node's controllers set it: the one condition changes, the kubelet's stay
        stuck = {
            "type": "NetworkUnavailable",
            "status": "True",
            "reason": "NoRouteCreated",
            "message": "Node created without a route",
            "lastTransitionTime": since,
        }
        others = [c for c in node["status"].get("conditions") or [] if c["type"] != "NetworkUnavailable"]
        node["status"]["conditions"] = [stuck, *others]


def webhook(
    kubeapi: KubeApiServer,
    name: str,
    *,
    service: str = "gatekeeper",
    policy: str = "Fail",
    namespace_selector: dict[str, Any] | None = None,
    resources: tuple[str, ...] = ("pods",),
    operations: tuple[str, ...] = ("CREATE",),
    mutating: bool = False,
) -> None:
    hook: dict[str, Any] = {
        "name": f"{name}.example.com",
        "failurePolicy": policy,
        "clientConfig": {"service": {"namespace": "gatekeeper-system", "name": service}},
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations), "resources": list(resources)}
        ],
    }
    if namespace_selector is not None:
        hook["namespaceSelector"] = namespace_selector
    kubeapi.put(MUTATING if mutating else VALIDATING, {"metadata": {"name": name}, "webhooks": [hook]})


def endpoints(kubeapi: KubeApiServer, service: str, ready: bool) -> None:
    kubeapi.put(
        "/apis/discovery.k8s.io/v1/namespaces/gatekeeper-system/endpointslices",
        {
            "metadata": {"name": f"{service}-abc", "labels": {"kubernetes.io/service-name": service}},
            "endpoints": [{"addresses": ["100.96.0.9"], "conditions": {"ready": ready}}],
        },
    )


def test_a_healthy_cluster_is_ok_with_no_findings(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    report, code = harness.run()
    health = report["health"]
    assert code == 0 and health["status"] == "ok"
    assert health["network_unavailable"] == health["calico_node"] == health["webhooks"] == []
    assert health["nodes_without_calico_node"] == [] and health["recommendations"] == []


def test_network_unavailable_nodes_are_transient_or_stuck(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    network_unavailable(harness.kubeapi, s.LIVE[0], "2026-11-30T11:59:00Z")
    network_unavailable(harness.kubeapi, s.LIVE[1], "2026-11-30T11:40:00Z", taint=True)
    health = harness.run()[0]["health"]
    states = {n["node"]: (n["state"], n["duration_seconds"]) for n in health["network_unavailable"]}
    assert states == {s.LIVE[0]: ("transient", 60), s.LIVE[1]: ("stuck", 1200)}
    assert health["status"] == "critical"
    assert any("stuck NetworkUnavailable" in r for r in health["recommendations"])


def test_a_taint_that_says_no_time_is_bounded_by_its_nodes_age(harness: Harness) -> None:
    """A taint without timeAdded (a kubelet's --register-with-taints, `kubectl taint`) and no
    condition: a Node registered 2 minutes ago is not stuck, one created 3 hours ago is stuck for
    at most 3 hours, and that bound is its series' value, so that the alert can fire."""
    from job.adapters.metrics import nodes_registry_for

    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    for name, created in ((s.LIVE[0], "2026-11-30T11:58:00Z"), (s.LIVE[1], "2026-11-30T09:00:00Z")):
        node = harness.kubeapi.get("/api/v1/nodes", name)
        assert node is not None
        node["metadata"]["creationTimestamp"] = created
        node["spec"]["taints"] = [{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]
    report = harness.run()[0]
    found = {n["node"]: (n["state"], n["duration_at_most_seconds"]) for n in report["health"]["network_unavailable"]}
    assert found == {s.LIVE[0]: ("transient", 120), s.LIVE[1]: ("stuck", 10800)}
    series = {
        sample.labels["node"]: sample.value
        for metric in nodes_registry_for(report).collect()
        if metric.name == "calico_gc_node_network_unavailable_seconds"
        for sample in metric.samples
    }
    assert series == {s.LIVE[0]: 120, s.LIVE[1]: 10800}


def test_only_transient_unavailability_is_degraded_not_critical(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    network_unavailable(harness.kubeapi, s.LIVE[0], "2026-11-30T11:59:30Z")
    assert harness.run()[0]["health"]["status"] == "degraded"


@pytest.mark.parametrize("wording", [V3_CONFLICT, V2_CONFLICT])
def test_crash_loop_from_an_orphans_ip_is_linked_to_the_orphan(harness: Harness, wording: str) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    log = "starting\n" + wording.format(holder=s.CONFLICT_ORPHAN, ip="10.0.1.13") + "\nTerminating\n"
    crash_looping(harness.kubeapi, s.NEW_NODE, log, restarts=7)
    health = harness.run()[0]["health"]
    (finding,) = health["calico_node"]
    assert (finding["node"], finding["cause"], finding["holder"], finding["ip"]) == (
        s.NEW_NODE,
        "ip_conflict_orphan",
        s.CONFLICT_ORPHAN,
        "10.0.1.13",
    )
    assert finding["crash_looping"] and finding["restarts"] == 7 and "already using" in finding["evidence"][0]
    assert finding["last_termination"]["exit_code"] == 1
    assert health["status"] == "critical"
    assert any(s.CONFLICT_ORPHAN in r and "--apply" in r for r in health["recommendations"])


def test_after_an_apply_the_readable_summary_says_what_is_true_now(harness: Harness) -> None:
    """The orphan holding a crash-looping node's IP is deleted by the run: its advice says so, and
    the IPAM and health figures, read before the writes, are labelled so."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    log = V3_CONFLICT.format(holder=s.CONFLICT_ORPHAN, ip="10.0.1.13")
    crash_looping(harness.kubeapi, s.NEW_NODE, log, restarts=7)
    dry, _ = harness.run()
    assert "(as read before" not in render_text(dry)
    report, code = harness.run(harness.config(apply=True, conflict_grace_period=timedelta(0)))
    assert code == 0 and hosts_by_name(report)[s.CONFLICT_ORPHAN]["action"] == "deleted"
    (finding,) = report["health"]["calico_node"]
    assert finding["holder_deleted"] is True
    (advice,) = [r for r in report["health"]["recommendations"] if s.CONFLICT_ORPHAN in r]
    assert "this run deleted it" in advice and "--apply" not in advice
    text = render_text(report)
    assert "ipam (as read before this run's writes):" in text
    assert "network health (as read before this run's writes): critical" in text
    assert "deletes it with --apply" not in text


@pytest.mark.parametrize("wording", [V3_CONFLICT, V2_CONFLICT])
def test_crash_loop_from_a_live_hosts_ip_is_reported_not_acted_on(harness: Harness, wording: str) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    log = wording.format(holder=s.LIVE[2], ip="10.0.1.12")
    crash_looping(harness.kubeapi, s.NEW_NODE, log, restarts=9)
    report, _ = harness.run(harness.config(apply=True))
    (finding,) = report["health"]["calico_node"]
    assert (finding["cause"], finding["holder"]) == ("ip_conflict_live", s.LIVE[2])
    assert any("nothing is deleted" in r for r in report["health"]["recommendations"])
    assert s.LIVE[2] not in hosts_by_name(report)
    assert all(c["orphan"] != s.LIVE[2] for c in report["conflicts"]), "a live host is never a conflict orphan"


def test_an_orphan_named_in_a_crash_log_gets_the_conflict_grace(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    # 10.0.1.20 is no Node's InternalIP: only the crash log links the orphan to the broken node.
    crash_looping(harness.kubeapi, s.LIVE[0], V3_CONFLICT.format(holder=s.POD_ORPHAN, ip="10.0.1.20"), restarts=3)
    report, _ = harness.run(harness.config(grace_period=timedelta(hours=1)))
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    assert (entry["action"], entry["conflict"]) == ("would_delete", True)
    assert {
        "ip": "10.0.1.20",
        "orphan": s.POD_ORPHAN,
        "blocks": s.LIVE[0],
        "kind": "calico_node_reports_conflict",
    } in report["conflicts"]


def test_api_server_timeout_at_start_up_is_its_own_cause(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    crash_looping(harness.kubeapi, s.NEW_NODE, API_TIMEOUT.format(node=s.NEW_NODE), restarts=12)
    (finding,) = harness.run()[0]["health"]["calico_node"]
    assert finding["cause"] == "apiserver_unreachable" and "Client.Timeout" in finding["evidence"][0]


@pytest.mark.parametrize(
    ("selector", "found"),
    [("k8s-app in (calico-node, calico-node-windows)", False), ("k8s-app notin (kube-dns)", True), ("!legacy", False)],
)
def test_a_set_based_calico_node_selector_reads_only_the_pods_it_selects(
    harness: Harness, selector: str, found: bool
) -> None:
    """The selector is the operator's; the server applies it whole (set-based terms too)."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    # NEW_NODE's pod crash-loops, labelled as an old DaemonSet's: the selector may leave it out.
    name = crash_looping(harness.kubeapi, s.NEW_NODE, API_TIMEOUT.format(node=s.NEW_NODE), restarts=12)
    stale = harness.kubeapi.get(PODS, name)
    assert stale is not None
    stale["metadata"]["labels"] = {"k8s-app": "calico-node-old", "legacy": "true"}
    health = harness.run(harness.config(calico_node_selector=selector))[0]["health"]
    assert [f["pod"] for f in health["calico_node"]] == ([name] if found else [])
    assert health["nodes_without_calico_node"] == ([] if found else [s.NEW_NODE])


def test_nodes_without_a_calico_node_pod_are_a_finding(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    harness.kubeapi.add_calico_node_pod(s.LIVE[0])
    health = harness.run()[0]["health"]
    assert health["nodes_without_calico_node"] == sorted([s.LIVE[1], s.LIVE[2], s.NEW_NODE])
    assert health["status"] == "degraded"


def test_fail_closed_webhooks_on_calico_nodes_path_are_blocking_or_risky(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    webhook(harness.kubeapi, "gatekeeper", service="gatekeeper")
    endpoints(harness.kubeapi, "gatekeeper", ready=False)
    webhook(
        harness.kubeapi,
        "kyverno",
        service="kyverno",
        resources=("nodes/status",),
        operations=("UPDATE",),
        mutating=True,
    )
    endpoints(harness.kubeapi, "kyverno", ready=True)
    webhook(
        harness.kubeapi,
        "excluded",
        namespace_selector={
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "calico-system"]}
            ]
        },
    )
    webhook(harness.kubeapi, "lenient", policy="Ignore")
    webhook(harness.kubeapi, "deployments-only", resources=("deployments",))
    health = harness.run()[0]["health"]
    found = {(w["name"], w["state"]): w for w in health["webhooks"]}
    assert set(found) == {("gatekeeper", "blocking"), ("kyverno", "risk")}
    assert found[("gatekeeper", "blocking")]["matches"] == ["CREATE pods in kube-system"]
    assert found[("kyverno", "risk")]["matches"] == ["UPDATE nodes/status"]
    assert "failurePolicy: Ignore" in found[("gatekeeper", "blocking")]["fix"]
    assert health["status"] == "critical" and health["summary"]["webhooks_blocking"] == 1


@pytest.mark.parametrize(
    ("path", "check"),
    [(f"^{PODS}$", "calico_node"), (f"^{VALIDATING}$", "webhooks"), (f"^{MUTATING}$", "webhooks")],
)
def test_forbidden_reads_skip_their_check_and_the_run_goes_on(harness: Harness, path: str, check: str) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    harness.kubeapi.fail("GET", path, 403, times=10)
    report, code = harness.run()
    assert code == 0 and report["summary"]["would_delete"] == 2
    assert report["health"]["checks"][check] == "skipped: forbidden"


def test_forbidden_logs_and_endpoints_still_give_findings(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    crash_looping(harness.kubeapi, s.NEW_NODE, "x", restarts=7)
    webhook(harness.kubeapi, "gatekeeper")
    harness.kubeapi.fail("GET", r"/log$", 403, times=10)
    harness.kubeapi.fail("GET", r"/endpointslices$", 403, times=10)
    health = harness.run()[0]["health"]
    entry = health["calico_node"][0]
    assert entry["cause"] == "unknown" and len(entry["evidence"]) == 1
    assert "forbidden (HTTP 403)" in entry["evidence"][0]
    assert [(w["state"], w["ready_endpoints"]) for w in health["webhooks"]] == [("risk", None)]


def test_a_log_the_kubelet_cannot_serve_costs_only_that_pods_cause(harness: Harness) -> None:
    """Without a reachable kubelet (the node whose network is broken) pods/log is a 500: that one
    pod's cause is unknown, with the error; the crash loop is still reported, and not retried."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    crash_looping(harness.kubeapi, s.NEW_NODE, "x", restarts=7)
    harness.kubeapi.fail("GET", r"/log$", 500, times=10)
    report, code = harness.run()
    assert code == 0 and report["health"]["checks"].get("calico_node") != "skipped: HTTP 500"
    (entry,) = report["health"]["calico_node"]
    assert entry["node"] == s.NEW_NODE and entry["cause"] == "unknown"
    assert "HTTP 500" in entry["evidence"][0]
    assert harness.kubeapi.count("GET", r"/log$") == 1, "a kubelet that cannot answer is asked once"


def test_a_crash_looping_pods_log_is_held_as_its_digest(harness: Harness) -> None:
    """Every crash-looping pod's previous log is held until the run ends; a fail-closed webhook
    stops calico-node on every node. Held whole, 200 lines of 5,000 characters are 1 MB a pod; the
    digest keeps the lines the causes read, cut, and the cause is the same."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    noise = [f"2026-11-30 11:57:{n % 60:02d}.000 [INFO][9] felix/config.go 12: " + "k=v " * 1250 for n in range(199)]
    log = "\n".join([*noise, V3_CONFLICT.format(holder=s.CONFLICT_ORPHAN, ip="10.0.1.13")]) + "\n"
    crash_looping(harness.kubeapi, s.NEW_NODE, log, restarts=7)
    config = harness.config()
    inputs = harness.dependencies(config).health(config)
    (pod,) = [p for p in inputs.pods or () if p.node == s.NEW_NODE]
    assert len(log) > 1_000_000 and pod.previous_log is not None and len(pod.previous_log) < 10_000
    (finding,) = harness.run()[0]["health"]["calico_node"]
    assert (finding["cause"], finding["holder"]) == ("ip_conflict_orphan", s.CONFLICT_ORPHAN)


def test_previous_logs_are_read_eight_at_a_time(harness: Harness) -> None:
    """When calico-node crash-loops everywhere, every pod's log is a request the API server passes
    to a kubelet: one at a time, 5,000 of them could outlast the Job's deadline. Each log request
    here waits at a barrier of eight, which only eight reads at once pass (one at a time, the
    first waits out the barrier's timeout and every log is a 500)."""
    harness.seed(s.kops_cluster())
    nodes = [f"worker-{index}" for index in range(12)]
    for node in nodes:
        crash_looping(harness.kubeapi, node, API_TIMEOUT.format(node=node) + "\n")
    barrier = threading.Barrier(8, timeout=30)
    harness.kubeapi.on("GET", r"/log$", barrier.wait, times=8)
    report, code = harness.run()
    causes = {entry["node"]: entry["cause"] for entry in report["health"]["calico_node"]}
    assert code == 0 and causes == dict.fromkeys(nodes, "apiserver_unreachable")
    assert not barrier.broken


@pytest.mark.parametrize("budget", [timedelta(seconds=0.5), timedelta(0)])
def test_logs_not_read_within_the_budget_leave_their_cause_unknown(harness: Harness, budget: timedelta) -> None:
    """Kubelets that never answer (held here until the test ends) cost the run its budget, not
    30 s a pod: the run ends while every read still hangs. With a budget of 0 no log is asked."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    crash_looping(harness.kubeapi, s.NEW_NODE, V3_CONFLICT.format(holder=s.CONFLICT_ORPHAN, ip="10.0.1.13"))
    hung = threading.Event()
    harness.kubeapi.on("GET", r"/log$", hung.wait, times=10)
    try:
        report, code = harness.run(harness.config(log_read_budget=budget))
        asked = harness.kubeapi.count("GET", r"/log$")
    finally:
        hung.set()
    (entry,) = report["health"]["calico_node"]
    assert code == 0 and entry["crash_looping"] and entry["cause"] == "unknown" and asked == (1 if budget else 0)
    assert entry["evidence"] == [
        f"previous log not readable: not read: --log-read-budget ({budget.total_seconds():g}s) ran out, 0 of 1 read"
    ]


def test_label_selectors_follow_kubernetes_semantics() -> None:
    labels = {"kubernetes.io/metadata.name": "kube-system", "tier": "system"}
    assert selector_matches(None, labels) and selector_matches({}, labels)
    assert selector_matches({"matchLabels": {"tier": "system"}}, labels)
    assert not selector_matches({"matchLabels": {"tier": "apps"}}, labels)
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["system"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, labels)


# --fail-on, through main() (metrics and alerts on real parts: tests/flows/test_alerting.py)


def cli_env(harness: Harness, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a run through main() against the test servers."""
    return {
        "ETCD_ENDPOINTS": harness.etcd.url,
        "POD_NAMESPACE": "calico-gc",
        "KUBECONFIG": str(harness.kubeapi.write_kubeconfig(tmp_path / "kubeconfig")),
        "CALICO_GC_LOCK": "none",
        "CALICO_GC_STATE_FILE": str(tmp_path / "state.json"),
        "CALICO_GC_GRACE_PERIOD": "0s",
        "CALICO_GC_OUTPUT": "json",
        **extra,
    }


@pytest.mark.parametrize(
    ("fail_on", "crash", "expected"),
    [("never", True, 0), ("critical", True, 5), ("degraded", True, 5), ("critical", False, 0), ("degraded", False, 0)],
)
def test_fail_on_turns_bad_health_into_exit_5(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str], fail_on: str, crash: bool, expected: int
) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    if crash:
        crash_looping(harness.kubeapi, s.NEW_NODE, "boom", restarts=7)
    assert main(["--fail-on", fail_on], cli_env(harness, tmp_path)) == expected
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == expected and (report["outcome"] == "unhealthy") == (expected == 5)


def test_a_conflict_found_both_ways_is_listed_once_and_recovery_is_recognised(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    crash_looping(harness.kubeapi, s.NEW_NODE, V3_CONFLICT.format(holder=s.CONFLICT_ORPHAN, ip="10.0.1.13"), restarts=7)
    report, _ = harness.run(harness.config(apply=True))
    assert [c["orphan"] for c in report["conflicts"]] == [s.CONFLICT_ORPHAN]
    after, _ = harness.run(harness.config(apply=True))
    (finding,) = after["health"]["calico_node"]
    assert (finding["cause"], finding["holder_in_datastore"]) == ("ip_conflict", False)
    assert "next restart" in after["health"]["recommendations"][0]


# Kubernetes Events


def events(harness: Harness, namespace: str) -> list[dict[str, Any]]:
    return list(harness.kubeapi.objects.get(f"/api/v1/namespaces/{namespace}/events", {}).values())


def test_events_say_what_was_done_where_kubectl_describe_looks(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    network_unavailable(harness.kubeapi, s.NEW_NODE, "2026-11-30T11:00:00Z")
    crash_looping(harness.kubeapi, s.NEW_NODE, V3_CONFLICT.format(holder=s.CONFLICT_ORPHAN, ip="10.0.1.13"))
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2 and report["errors"] == []
    on_nodes = {(e["involvedObject"]["name"], e["reason"], e["type"]): e for e in events(harness, "default")}
    stuck = on_nodes[(s.NEW_NODE, "CalicoNetworkUnavailable", "Warning")]
    assert "NetworkUnavailable for 60m" in stuck["message"] and "ip_conflict_orphan" in stuck["message"]
    assert "next: " in stuck["message"] and stuck["metadata"]["name"].startswith(f"{s.NEW_NODE}.")
    removed = on_nodes[(s.NEW_NODE, "CalicoOrphanRemoved", "Normal")]
    assert s.CONFLICT_ORPHAN in removed["message"] and "10.0.1.13" in removed["message"]
    on_pod = [e for e in events(harness, "calico-gc") if e["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "calico-gc-test-pod", "namespace": "calico-gc"}]  # fmt: skip
    assert sorted(e["reason"] for e in on_pod) == ["CalicoHostDeleted", "CalicoHostDeleted"]
    assert any(s.POD_ORPHAN in e["message"] and "16 keys" in e["message"] for e in on_pod)


def test_stuck_nodes_get_events_the_longest_stuck_first_and_at_most_fifty(harness: Harness) -> None:
    """When calico-node fails everywhere, an Event on every stuck Node every run is one write per
    Node: the 50 stuck longest get one, and the run's Pod one saying how many there are. A taint
    without timeAdded (`kubectl taint`) and no condition is stuck for at most its Node's age, and
    counted so (its Event ended the run in a TypeError); one whose Node's age is unknown too
    counts as stuck longest."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    for name, created in ((s.NEW_NODE, "2026-11-30T09:00:00Z"), (s.LIVE[0], None)):
        node = harness.kubeapi.get("/api/v1/nodes", name)
        assert node is not None
        node["metadata"]["creationTimestamp"] = created  # None: Go's zero time, as JSON writes it
        node["spec"]["taints"] = [{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]
    for index in range(60):
        name = f"worker-{index:02d}"
        harness.kubeapi.add_node(name, f"10.1.0.{index + 10}")
        network_unavailable(harness.kubeapi, name, f"2026-11-30T10:{index:02d}:00Z")
    report, code = harness.run(harness.config())
    # 60 Nodes without a Calico host: the run is refused as a foreign datastore, its Events posted all the same.
    assert (code, [g["name"] for g in report["guards"]], report["errors"]) == (3, ["foreign_datastore"], [])
    on_nodes = [e for e in events(harness, "default") if e["reason"] == "CalicoNetworkUnavailable"]
    named = sorted(e["involvedObject"]["name"] for e in on_nodes)
    assert named == sorted([s.LIVE[0], s.NEW_NODE] + [f"worker-{index:02d}" for index in range(48)])
    messages = {e["involvedObject"]["name"]: e["message"] for e in on_nodes}
    assert messages[s.LIVE[0]].startswith("NetworkUnavailable for an unknown time; calico-node cause: ")
    assert messages[s.NEW_NODE].startswith("NetworkUnavailable for at most 180m (the Node's age; nothing says since")
    (many,) = [e for e in events(harness, "calico-gc") if e["reason"] == "CalicoNetworkUnavailableNodes"]
    assert many["message"].startswith("62 Nodes stuck NetworkUnavailable; Events on the 50 stuck longest")
    assert len(report["health"]["network_unavailable"]) == 62


def test_a_refused_run_says_why_on_its_pod_and_events_can_be_switched_off(harness: Harness) -> None:
    scenario = s.kops_cluster()
    scenario.k8s_nodes = []
    harness.seed(scenario)
    _, code = harness.run(harness.config(apply=True))
    assert code == 3
    (refused,) = events(harness, "calico-gc")
    assert refused["reason"] == "CalicoGcRefused" and "empty_k8s_node_list" in refused["message"]
    harness.kubeapi.objects.clear()
    harness.seed(scenario)
    harness.run(harness.config(apply=True, events=False))
    assert events(harness, "calico-gc") == []


def test_an_event_whose_answer_was_lost_is_posted_once(harness: Harness) -> None:
    """The API server creates the first Event and its answer is lost: the retry finds the name
    taken (409) by that very Event, which is posted, once, and no error."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    harness.kubeapi.lose("POST", "/events$")
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["errors"] == [] and harness.kubeapi.losses[0].times == 0
    posted = events(harness, "calico-gc") + events(harness, "default")
    assert sorted(e["reason"] for e in posted) == ["CalicoHostDeleted", "CalicoHostDeleted", "CalicoOrphanRemoved"]
    assert len({e["metadata"]["name"] for e in posted}) == 3
    assert harness.kubeapi.count("POST", "/events$") == 4, "the first tried twice"


def test_events_that_cannot_be_posted_only_warn(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    harness.kubeapi.fail("POST", "/events$", 403, times=10)
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2
    assert [e["kind"] for e in report["errors"]] == ["events"] and "forbidden" in report["errors"][0]["message"]


def test_a_check_whose_answer_is_not_json_is_skipped_with_its_kind(harness: Harness) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    harness.kubeapi.fail(
        "GET",
        r"/validatingwebhookconfigurations$",
        200,
        times=10,
        body="<html>proxy</html>",  # type: ignore[arg-type]
    )
    report, code = harness.run()
    assert code == 0 and report["health"]["checks"]["webhooks"] == "skipped: bad_answer"


# Answers a proxy (or a server without protobuf) might give in JSON, each with a field calico-gc
# reads in a shape it cannot read, and the field the skipped check's warning names.
NOT_CALICO_NODE_PODS = [
    ({"kind": "PodList", "items": [5]}, "Pod #0: the object"),
    ({"kind": "PodList", "items": [{"metadata": []}]}, "metadata"),
    ({"kind": "PodList", "items": [{"status": {"conditions": "Ready"}}]}, "status.conditions"),
    ({"kind": "PodList", "items": [{"status": {"containerStatuses": ["calico-node"]}}]}, "containerStatuses[0]"),
    (
        {"kind": "PodList", "items": [{"status": {"containerStatuses": [{"restartCount": "many"}]}}]},
        "containerStatuses[0].restartCount",
    ),
]
NOT_WEBHOOKS = [
    (VALIDATING, {"kind": "ValidatingWebhookConfigurationList", "items": ["x"]}, "#0: the object"),
    (VALIDATING, {"kind": "ValidatingWebhookConfigurationList", "items": [{"webhooks": [5]}]}, "webhooks[0]"),
    (
        MUTATING,
        {"kind": "MutatingWebhookConfigurationList", "items": [{"webhooks": [{"name": "w", "rules": 5}]}]},
        "webhooks[0].rules",
    ),
    (
        VALIDATING,
        {"kind": "ValidatingWebhookConfigurationList", "items": [{"webhooks": [{"clientConfig": []}]}]},
        "clientConfig",
    ),
    (r"/endpointslices$", {"kind": "EndpointSliceList", "items": [{"endpoints": ["10.0.0.1"]}]}, "endpoints[0]"),
]


@pytest.mark.parametrize(
    ("path", "answer", "field", "check"),
    [(f"^{PODS}$", answer, field, "calico_node") for answer, field in NOT_CALICO_NODE_PODS]
    + [(path, answer, field, "webhooks") for path, answer, field in NOT_WEBHOOKS],
)
def test_a_health_read_the_job_cannot_read_skips_its_check_in_one_line(
    harness: Harness, capfd: pytest.CaptureFixture[str], path: str, answer: dict[str, Any], field: str, check: str
) -> None:
    """A server that answers JSON (no protobuf) with a field the diagnosis reads in another shape:
    that check is skipped as `bad_answer`, its warning naming the field, and the run goes on (it
    was a traceback that ended the run, exit 1)."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    healthy_pods(harness, scenario)
    webhook(harness.kubeapi, "gatekeeper")
    endpoints(harness.kubeapi, "gatekeeper", ready=True)
    harness.kubeapi.serves_protobuf = False
    harness.kubeapi.fail("GET", path, 200, times=10, body=answer)
    report, code = harness.run()
    assert code == 0 and report["summary"]["would_delete"] == 2
    assert report["health"]["checks"][check] == "skipped: bad_answer"
    # The log line, as JSON or text (whichever an earlier test's run set up): one, naming the field.
    [warning] = [line for line in capfd.readouterr().err.splitlines() if "health_check_skipped" in line]
    assert field in warning, warning
