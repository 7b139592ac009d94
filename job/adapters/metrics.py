"""Push one run's metrics to a Prometheus Pushgateway. A failed push warns; it never fails a run.

Two groups, both under {job="calico-gc", cluster}: the run's own (`pushadd`: a failed run replaces
only what it pushes, so the last success stays), and the affected nodes' (`scope="nodes"`, `push`:
replaced whole each run that diagnosed health, so a node that recovered has no series any more).
Rules: manifests/prometheus/calico-gc.rules.yaml (docs/runbook.md, "Alerts")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from job.core.health import unavailable_seconds
from job.core.model import parse_time
from job.core.report import MAX_WARNINGS

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = structlog.get_logger("calico_gc.metrics")
JOB = "calico-gc"
DEFAULT_CLUSTER = "default"  # the `cluster` label when --cluster-name is unset: never from the datastore
PUSH_TIMEOUT_S = 10.0
HEALTH_LEVELS = {"ok": 0, "degraded": 1, "critical": 2}


def registry_for(report: dict[str, Any], duration_s: float, succeeded: bool, grace_s: float) -> CollectorRegistry:
    """The run's gauges; `last_success` is only in the registry when the run succeeded, and
    pushadd (POST) replaces only the metrics pushed, so a failed run keeps the last value."""
    # Imported by a run that pushes, not by every run: prometheus_client costs 24 ms to import.
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    summary, health = report["summary"], report.get("health") or {}
    hosts = Gauge("calico_gc_hosts", "Calico hosts that are not live, by action", ["action"], registry=registry)
    for action in ("deleted", "would_delete", "waiting_grace", "deferred", "skipped", "failed"):
        hosts.labels(action=action).set(summary.get(action, 0))
    Gauge("calico_gc_orphaned_hosts", "Calico hosts whose Kubernetes Node is gone", registry=registry).set(
        summary.get("orphaned") or 0
    )
    Gauge("calico_gc_ip_conflicts", "IPs an orphan holds that a node or host needs", registry=registry).set(
        summary.get("conflicts", 0)
    )
    Gauge("calico_gc_refused", "1 when a safety guard refused the run", registry=registry).set(
        int(bool(summary.get("refused")))
    )
    Gauge(
        "calico_gc_api_server_warnings",
        f"Distinct warnings the Kubernetes API server sent during the run (at most {MAX_WARNINGS})",
        registry=registry,
    ).set(len(report["kubernetes"]["warnings"]))
    counts = health.get("summary") or {}
    for name, key, text in (
        ("calico_gc_nodes_network_unavailable", "network_unavailable", "Nodes NetworkUnavailable (condition or taint)"),
        (
            "calico_gc_nodes_network_unavailable_stuck",
            "network_unavailable_stuck",
            "Nodes NetworkUnavailable for longer than the threshold",
        ),
        ("calico_gc_calico_node_crash_looping", "calico_node_crash_looping", "calico-node pods crash-looping"),
        ("calico_gc_webhooks_blocking", "webhooks_blocking", "Fail-closed webhooks blocking calico-node"),
    ):
        Gauge(name, text, registry=registry).set(counts.get(key, 0))
    audit = report.get("audit") or {}
    for name, key, text in (
        ("calico_gc_ipam_only_hosts", "ipam_only_hosts", "Names with IPAM or other data but no Calico Node or Node"),
        ("calico_gc_ipam_stale_handles", "stale_handles", "IPAM handles counting more IPs than their blocks hold"),
        ("calico_gc_ipam_dangling_allocations", "dangling_allocations", "IPAM allocations whose handle is missing"),
        (
            "calico_gc_ipam_unattributed_allocations",
            "unattributed_allocations",
            "IPAM allocations naming no node in gone hosts' blocks (they stay)",
        ),
        ("calico_gc_ipam_leaked_ips", "leaked_ips", "Pod IPs allocated on live nodes to pods that do not exist"),
    ):
        count = (audit.get(key) or {}).get("count")
        if count is not None:  # unknown (leaks where pods are not read): no sample rather than a 0
            Gauge(name, text, registry=registry).set(count)
    utilisation = Gauge(
        "calico_gc_ipam_pool_utilisation", "Share of an IP pool allocated (0-1)", ["pool"], registry=registry
    )
    for pool in audit.get("pools") or []:
        utilisation.labels(pool=pool["cidr"]).set(pool["utilisation"])
    Gauge("calico_gc_health_status", "Network health: 0 ok, 1 degraded, 2 critical", registry=registry).set(
        HEALTH_LEVELS.get(health.get("status", "ok"), 0)
    )
    Gauge("calico_gc_grace_period_seconds", "The grace period an orphan waits", registry=registry).set(grace_s)
    oldest = _oldest_orphan_seconds(report)
    if oldest is not None:  # none left: no sample, rather than a 0 that reads as "just orphaned"
        Gauge(
            "calico_gc_oldest_orphan_seconds", "How long the longest-waiting orphan has been seen", registry=registry
        ).set(oldest)
    guid = report["datastore"].get("cluster_guid")
    if guid:
        info = Gauge(
            "calico_gc_info",
            "The datastore this cluster label stands for",
            ["cluster_guid", "datastore"],
            registry=registry,
        )
        info.labels(cluster_guid=guid, datastore=report["datastore"]["type"]).set(1)
    Gauge("calico_gc_run_duration_seconds", "Duration of the last run", registry=registry).set(duration_s)
    Gauge("calico_gc_last_run_exit_code", "Exit code of the last run", registry=registry).set(report["exit_code"])
    if succeeded:
        Gauge(
            "calico_gc_last_success_timestamp_seconds", "When a run last succeeded (Unix time)", registry=registry
        ).set_to_current_time()
    return registry


def _oldest_orphan_seconds(report: dict[str, Any]) -> float | None:
    """Seconds since the longest-waiting orphan that is still there was first seen."""
    finished = parse_time(report.get("finished_at"))
    seen = [parse_time(h.get("orphaned_since")) for h in report["hosts"] if h["action"] != "deleted"]
    oldest = min((s for s in seen if s is not None), default=None)
    return None if finished is None or oldest is None else max((finished - oldest).total_seconds(), 0.0)


def nodes_registry_for(report: dict[str, Any]) -> CollectorRegistry:
    """The affected nodes' series, one per node (never all nodes): NetworkUnavailable ones, with
    how long and the diagnosed cause, and calico-node pods not ready or crash-looping, with their
    restart counts (rules take their increase)."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    health = report.get("health") or {}
    causes = {f["node"]: f.get("cause") or "unknown" for f in health.get("calico_node") or [] if f.get("node")}
    unavailable = Gauge(
        "calico_gc_node_network_unavailable_seconds",
        "How long a Node has been NetworkUnavailable (condition or taint; the Node's age where nothing "
        "says since when), and the diagnosed cause",
        ["node", "cause"],
        registry=registry,
    )
    for node in health.get("network_unavailable") or []:
        seconds = unavailable_seconds(node)
        if seconds is not None:
            unavailable.labels(node=node["node"], cause=causes.get(node["node"], "unknown")).set(seconds)
    # No cause label here: a cause found later would start a new series, and the rules take the
    # increase of this one (the cause is on the NetworkUnavailable series and in the report).
    restarts = Gauge(
        "calico_gc_calico_node_restarts",
        "Restarts of a calico-node pod that is not ready or crash-looping",
        ["node", "namespace", "pod"],
        registry=registry,
    )
    for finding in health.get("calico_node") or []:
        restarts.labels(node=finding.get("node") or "", namespace=finding["namespace"], pod=finding["pod"]).set(
            finding["restarts"]
        )
    return registry


def push(
    gateway: str, cluster: str, report: dict[str, Any], duration_s: float, succeeded: bool, grace_s: float
) -> str | None:
    """Push under the stable grouping keys (module docstring); return the error text on failure."""
    from prometheus_client import push_to_gateway, pushadd_to_gateway

    try:
        pushadd_to_gateway(
            gateway,
            job=JOB,
            grouping_key={"cluster": cluster},
            registry=registry_for(report, duration_s, succeeded, grace_s),
            timeout=PUSH_TIMEOUT_S,
        )
        if report.get("health") is not None:  # diagnosed this run: what it says now replaces the last
            push_to_gateway(
                gateway,
                job=JOB,
                grouping_key={"cluster": cluster, "scope": "nodes"},
                registry=nodes_registry_for(report),
                timeout=PUSH_TIMEOUT_S,
            )
        return None
    except (OSError, ValueError) as error:  # urllib errors are OSErrors
        log.warning("metrics_push_failed", gateway=gateway, error=str(error))
        return f"pushing metrics to {gateway} failed: {error}"
