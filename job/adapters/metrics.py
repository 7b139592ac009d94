"""Push one run's metrics to a Prometheus Pushgateway. A failed push warns; it never fails a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = structlog.get_logger("calico_gc.metrics")
JOB = "calico-gc"
PUSH_TIMEOUT_S = 10.0
HEALTH_LEVELS = {"ok": 0, "degraded": 1, "critical": 2}


def registry_for(report: dict[str, Any], duration_s: float, succeeded: bool) -> CollectorRegistry:
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
    Gauge("calico_gc_run_duration_seconds", "Duration of the last run", registry=registry).set(duration_s)
    Gauge("calico_gc_last_run_exit_code", "Exit code of the last run", registry=registry).set(report["exit_code"])
    if succeeded:
        Gauge(
            "calico_gc_last_success_timestamp_seconds", "When a run last succeeded (Unix time)", registry=registry
        ).set_to_current_time()
    return registry


def push(gateway: str, cluster: str, report: dict[str, Any], duration_s: float, succeeded: bool) -> str | None:
    """Push under the stable grouping key {job, cluster}; return the error text on failure."""
    from prometheus_client import pushadd_to_gateway

    try:
        pushadd_to_gateway(
            gateway,
            job=JOB,
            grouping_key={"cluster": cluster},
            registry=registry_for(report, duration_s, succeeded),
            timeout=PUSH_TIMEOUT_S,
        )
        return None
    except (OSError, ValueError) as error:  # urllib errors are OSErrors
        log.warning("metrics_push_failed", gateway=gateway, error=str(error))
        return f"pushing metrics to {gateway} failed: {error}"
