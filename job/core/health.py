"""Network health diagnosis, pure: NetworkUnavailable nodes, calico-node pods and the causes
in their logs, admission webhooks that can block calico-node. Read-only by design: findings
and recommendations, never a patch.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from job.core.model import CalicoHost, IpConflict, KubeNode, parse_time

FORBIDDEN = "skipped: forbidden"
BACKOFF_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)
# Calico 3.x and 2.6.12 end the sentence with ".", 2.4-2.6.5 with ":"; IPv6 addresses hold ":".
# A node's name holds no white space, so a match never runs from one line into the next.
CONFLICT_LINE = re.compile(
    r"Calico node '(?P<holder>[^'\s]+)' is already using the IPv(?P<version>[46]) address "
    r"(?P<ip>[0-9A-Fa-f.:]+)"
)
APISERVER_LINE = re.compile(
    r"Failed to set NetworkUnavailable|Client\.Timeout exceeded|"
    r"dial tcp \S+: i/o timeout|context deadline exceeded"
)
ERROR_LINE = re.compile(r"\b(error|fatal|panic|fail)", re.IGNORECASE)
EVIDENCE_LINES = 5  # a cause's evidence: the last lines of one kind
CONFLICT_LINES = 10  # calico-node exits at the first; more is a log of many starts
LOG_LINE_CHARS = 1000  # calico-node writes ~200; a longer line is cut here, before it is matched
STATUS_ORDER = ("ok", "degraded", "critical")


@dataclass(frozen=True)
class CalicoNodePod:
    namespace: str
    name: str
    node: str | None
    phase: str | None
    ready: bool
    restarts: int
    waiting_reason: str | None = None
    last_exit_code: int | None = None
    last_reason: str | None = None
    last_finished_at: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    previous_log: str | None = None
    log_error: str | None = None  # why the previous log could not be read (kubelet unreachable, ...)


@dataclass(frozen=True)
class Webhook:
    configuration: str
    name: str
    kind: str
    failure_policy: str
    rules: Sequence[Mapping[str, Any]]
    namespace_selector: Mapping[str, Any] | None
    object_selector: Mapping[str, Any] | None
    service: tuple[str, str] | None


@dataclass
class HealthInputs:
    """What the Kubernetes API said; None for a check it was not allowed to read."""

    pods: tuple[CalicoNodePod, ...] | None = ()
    webhooks: tuple[Webhook, ...] | None = ()
    ready_endpoints: Mapping[tuple[str, str], int | None] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)


def is_crash_looping(pod: CalicoNodePod, restart_threshold: int) -> bool:
    return not pod.ready and (pod.waiting_reason in BACKOFF_REASONS or pod.restarts >= restart_threshold)


def network_unavailable(nodes: Iterable[KubeNode], now: datetime, threshold_s: float) -> list[dict[str, Any]]:
    findings = []
    for node in sorted(nodes, key=lambda n: n.name):
        info = node.network_unavailable
        if info is None:
            continue
        since = parse_time(info.since)
        seconds = (now - since).total_seconds() if since else None
        # Where nothing says since when (a taint without timeAdded, no condition), the Node's age
        # bounds it: a kubelet registering with the taint makes a new Node tainted at once.
        created = parse_time(info.node_created) if since is None else None
        at_most = max((now - created).total_seconds(), 0.0) if created else None
        known = seconds if seconds is not None else at_most
        stuck = known is None or known >= threshold_s
        findings.append(
            {
                "node": node.name,
                "since": info.since,
                "state": "stuck" if stuck else "transient",
                "duration_seconds": int(seconds) if seconds is not None else None,
                "duration_at_most_seconds": int(at_most) if at_most is not None else None,
                "node_created": info.node_created,
                "condition": info.condition,
                "reason": info.reason,
                "message": info.message,
                "taint_added": info.taint_added,
            }
        )
    return findings


def unavailable_seconds(finding: Mapping[str, Any]) -> int | None:
    """How long a `network_unavailable` finding has lasted: exactly, or at most its Node's age
    where nothing says since when; None where not even the age is known."""
    exact = finding.get("duration_seconds")
    return exact if exact is not None else finding.get("duration_at_most_seconds")


def _cause(
    pod: CalicoNodePod, hosts_by_ip: Mapping[str, CalicoHost], orphans: set[str], live_k8s: set[str]
) -> tuple[str, list[str], dict[str, Any]]:
    """The cause of a crash loop from its previous log: (cause, evidence lines, details)."""
    lines = (pod.previous_log or "").splitlines()
    for line in reversed(lines):
        match = CONFLICT_LINE.search(line)
        ip = _conflict_ip(match)
        if match and ip:
            holder = match.group("holder")
            host = hosts_by_ip.get(ip)
            details = {"ip": ip, "holder": holder, "holder_in_datastore": host is not None}
            if holder in orphans:
                return "ip_conflict_orphan", [line.strip()], details
            if host is not None and (host.k8s_node or host.name) in live_k8s:
                return "ip_conflict_live", [line.strip()], details
            return "ip_conflict", [line.strip()], details
    timeouts = [line.strip() for line in lines if APISERVER_LINE.search(line)]
    if timeouts:
        return "apiserver_unreachable", timeouts[-EVIDENCE_LINES:], {}
    errors = [line.strip() for line in lines if ERROR_LINE.search(line)]
    if pod.log_error is not None:
        return "unknown", [f"previous log not readable: {pod.log_error}"], {}
    return "unknown", (errors or [line.strip() for line in lines])[-EVIDENCE_LINES:], {}


def log_digest(text: str) -> str:
    """The lines of a previous log that `_cause` and `log_conflicts` read, in its order, each cut
    at LOG_LINE_CHARS: the last CONFLICT_LINES naming a conflict and the last EVIDENCE_LINES;
    without a conflict, the last EVIDENCE_LINES naming the API server, and without those, the
    last naming an error. Both decide on it as on the whole log, and it is searched as far as
    `_cause` searches (the errors' pattern costs 30 ns a character). Every crash-looping pod's
    log is held until the run ends, and a fail-closed webhook stops calico-node on every node:
    4,500 logs of 200 lines held whole were 87 MB of a run's peak (make bench-crash-loop), their
    digests a few KB each."""
    lines = text.splitlines()
    if max(map(len, lines), default=0) > LOG_LINE_CHARS:
        lines = [line[:LOG_LINE_CHARS] for line in lines]
    joined = "\n".join(lines)  # searched whole, in C: no match crosses a line

    def last(pattern: re.Pattern[str], most: int) -> list[int]:
        """The last `most` lines the pattern matches, counted from match to match."""
        found: dict[int, None] = {}
        line = at = 0
        for match in pattern.finditer(joined):
            line, at = line + joined.count("\n", at, match.start()), match.start()
            found[line] = None
        return list(found)[-most:]

    conflicts = last(CONFLICT_LINE, CONFLICT_LINES)
    kept = {*range(max(0, len(lines) - EVIDENCE_LINES), len(lines)), *conflicts}
    if not any(_conflict_ip(CONFLICT_LINE.search(lines[i])) for i in conflicts):
        kept.update(last(APISERVER_LINE, EVIDENCE_LINES) or last(ERROR_LINE, EVIDENCE_LINES))
    return "".join(lines[i] + "\n" for i in sorted(kept))  # "\n".join would lose a last empty line


def _conflict_ip(match: re.Match[str] | None) -> str | None:
    """The IP of a conflict line, normalised; the wordings end it with "." or ":"."""
    if match is None:
        return None
    try:
        return str(ipaddress.ip_address(match.group("ip").rstrip(":.")))
    except ValueError:
        return None


def log_conflicts(pods: Iterable[CalicoNodePod], restart_threshold: int) -> tuple[IpConflict, ...]:
    """Conflicts crash-looping calico-nodes name in their logs. The planner keeps those whose
    holder is an orphan and gives it the conflict grace even if no Node reports the IP."""
    found = []
    for pod in pods:
        if not is_crash_looping(pod, restart_threshold) or not pod.node:
            continue
        for match in CONFLICT_LINE.finditer(pod.previous_log or ""):
            holder, ip = match.group("holder"), _conflict_ip(match)
            if ip and holder != pod.node:
                found.append(IpConflict(ip, holder, pod.node, "calico_node_reports_conflict"))
    return tuple(sorted(set(found), key=lambda c: (c.ip, c.orphan or "", c.blocks)))


def calico_node_findings(
    pods: Sequence[CalicoNodePod],
    nodes: Sequence[KubeNode],
    hosts: Sequence[CalicoHost],
    orphans: set[str],
    restart_threshold: int,
) -> tuple[list[dict[str, Any]], list[str]]:
    hosts_by_ip = {ip: h for h in hosts for ip in (h.ipv4, h.ipv6) if ip}
    live_k8s = {n.name for n in nodes}
    findings = []
    for pod in sorted(pods, key=lambda p: (p.node or "", p.namespace, p.name)):
        looping = is_crash_looping(pod, restart_threshold)
        if pod.ready and not looping:
            continue
        entry: dict[str, Any] = {
            "node": pod.node,
            "pod": pod.name,
            "namespace": pod.namespace,
            "phase": pod.phase,
            "ready": pod.ready,
            "restarts": pod.restarts,
            "waiting_reason": pod.waiting_reason,
            "last_termination": {
                "exit_code": pod.last_exit_code,
                "reason": pod.last_reason,
                "finished_at": pod.last_finished_at,
            }
            if pod.last_exit_code is not None
            else None,
            "crash_looping": looping,
            "cause": None,
            "evidence": [],
        }
        if looping:
            cause, evidence, details = _cause(pod, hosts_by_ip, orphans, live_k8s)
            entry.update(cause=cause, evidence=evidence, **details)
        findings.append(entry)
    with_pod = {p.node for p in pods if p.node}
    missing = sorted(n.name for n in nodes if n.name not in with_pod)
    return findings, missing


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics; an empty or absent selector matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if (
            (operator == "In" and (not present or labels[key] not in values))
            or (operator == "NotIn" and present and labels[key] in values)
            or (operator == "Exists" and not present)
            or (operator == "DoesNotExist" and present)
        ):
            return False
    return True


def _rule_matches(rule: Mapping[str, Any], operation: str, resource: str) -> bool:
    operations = rule.get("operations") or []
    groups = rule.get("apiGroups") or []
    resources = rule.get("resources") or []
    base = resource.split("/")[0]
    subresource = "/" in resource
    resource_ok = any(
        r == resource
        or r == "*/*"
        or (r == "*" and not subresource)
        or r == f"{base}/*"
        or (subresource and r == "*/" + resource.split("/", 1)[1])
        for r in resources
    )
    return (operation in operations or "*" in operations) and ("" in groups or "*" in groups) and resource_ok


def webhook_findings(
    webhooks: Sequence[Webhook],
    calico_namespaces: Sequence[str],
    pod_labels: Mapping[str, str],
    ready_endpoints: Mapping[tuple[str, str], int | None],
) -> list[dict[str, Any]]:
    """Fail-closed webhooks served in-cluster whose rules catch what calico-node start-up needs."""
    findings = []
    for webhook in sorted(webhooks, key=lambda w: (w.configuration, w.name)):
        if webhook.failure_policy != "Fail" or webhook.service is None:
            continue
        matches = []
        for rule in webhook.rules:
            for namespace in calico_namespaces:
                namespace_labels = {"kubernetes.io/metadata.name": namespace}
                if (
                    _rule_matches(rule, "CREATE", "pods")
                    and selector_matches(webhook.namespace_selector, namespace_labels)
                    and selector_matches(webhook.object_selector, pod_labels)
                ):
                    matches.append(f"CREATE pods in {namespace}")
            for resource in ("nodes", "nodes/status"):
                if _rule_matches(rule, "UPDATE", resource):
                    matches.append(f"UPDATE {resource}")
        if not matches:
            continue
        ready = ready_endpoints.get(webhook.service)
        state = "blocking" if ready == 0 else "risk"
        findings.append(
            {
                "name": webhook.configuration,
                "webhook": webhook.name,
                "kind": webhook.kind,
                "state": state,
                "matches": sorted(set(matches)),
                "service": "/".join(webhook.service),
                "ready_endpoints": ready,
                "fix": f"exclude the calico-node namespace ({', '.join(calico_namespaces)}) with a namespaceSelector, "
                "or set failurePolicy: Ignore: its backend needs the pod network that calico-node provides",
            }
        )
    return findings


def recommendations(health: Mapping[str, Any]) -> list[str]:
    advice = []
    for item in health["calico_node"]:
        cause, node = item.get("cause"), item["node"]
        if cause == "ip_conflict_orphan" and item.get("holder_deleted"):
            advice.append(
                f"{node}: calico-node failed because orphaned Calico host {item['holder']} held "
                f"{item['ip']}; this run deleted it: calico-node starts at its next restart"
            )
        elif cause == "ip_conflict_orphan":
            advice.append(
                f"{node}: calico-node fails because orphaned Calico host {item['holder']} holds "
                f"{item['ip']}; calico-gc deletes it with --apply (conflict grace applies)"
            )
        elif cause == "ip_conflict_live":
            advice.append(
                f"{node}: Calico host {item['holder']}, whose Kubernetes Node exists, also uses "
                f"{item['ip']}; fix the node addresses (or set IP autodetection), nothing is deleted"
            )
        elif cause == "ip_conflict" and not item["holder_in_datastore"]:
            advice.append(
                f"{node}: its last crash named Calico host {item['holder']} for {item['ip']}, which is no "
                "longer in the datastore; calico-node should start on its next restart"
            )
        elif cause == "ip_conflict":
            advice.append(
                f"{node}: Calico host {item['holder']} holds {item['ip']}; check it with "
                f"`calicoctl get node {item['holder']} -o yaml`"
            )
        elif cause == "apiserver_unreachable":
            advice.append(
                f"{node}: calico-node cannot reach the API server at start-up; check the node's "
                "route to the kubernetes service and kube-proxy"
            )
        elif item.get("crash_looping"):
            advice.append(f"{node}: calico-node {item['pod']} crash-loops for an unknown reason; see its evidence")
    for webhook in health["webhooks"]:
        verb = "blocks" if webhook["state"] == "blocking" else "can block"
        advice.append(
            f"webhook {webhook['name']}/{webhook['webhook']} {verb} calico-node "
            f"({', '.join(webhook['matches'])}): {webhook['fix']}"
        )
    for node in health["nodes_without_calico_node"]:
        advice.append(f"{node}: no calico-node pod; check the DaemonSet's nodeSelector and tolerations")
    stuck = [n["node"] for n in health["network_unavailable"] if n["state"] == "stuck"]
    if stuck:
        advice.append(
            f"{len(stuck)} node(s) stuck NetworkUnavailable ({', '.join(stuck[:5])}): see calico_node "
            "findings for their cause"
        )
    return advice


def diagnose(
    inputs: HealthInputs,
    nodes: Sequence[KubeNode],
    hosts: Sequence[CalicoHost],
    orphans: set[str],
    now: datetime,
    threshold_s: float,
    restart_threshold: int,
    calico_namespaces: Sequence[str],
) -> dict[str, Any]:
    """The report's `health` section: findings, an overall status and one recommendation each."""
    unavailable = network_unavailable(nodes, now, threshold_s)
    pods = inputs.pods or ()
    findings, missing = calico_node_findings(pods, nodes, hosts, orphans, restart_threshold) if pods else ([], [])
    if inputs.pods is None:
        missing = []
    pod_labels = next((dict(p.labels) for p in pods), {"k8s-app": "calico-node"})
    namespaces = sorted({p.namespace for p in pods}) or list(calico_namespaces)
    webhooks = webhook_findings(inputs.webhooks or (), namespaces, pod_labels, inputs.ready_endpoints)
    health: dict[str, Any] = {
        "checks": {"nodes": "ok", "calico_node": "ok", "webhooks": "ok", **inputs.checks},
        "network_unavailable": unavailable,
        "calico_node": findings,
        "nodes_without_calico_node": missing,
        "webhooks": webhooks,
    }
    critical = (
        any(n["state"] == "stuck" for n in unavailable)
        or any(f["crash_looping"] for f in findings)
        or any(w["state"] == "blocking" for w in webhooks)
    )
    degraded = bool(unavailable or findings or missing or webhooks)
    health["status"] = "critical" if critical else "degraded" if degraded else "ok"
    health["summary"] = {
        "network_unavailable": len(unavailable),
        "network_unavailable_stuck": sum(1 for n in unavailable if n["state"] == "stuck"),
        "calico_node_crash_looping": sum(1 for f in findings if f["crash_looping"]),
        "nodes_without_calico_node": len(missing),
        "webhooks_blocking": sum(1 for w in webhooks if w["state"] == "blocking"),
        "webhooks_risk": sum(1 for w in webhooks if w["state"] == "risk"),
    }
    health["recommendations"] = recommendations(health)
    return health


def after_writes(health: dict[str, Any] | None, deleted: set[str]) -> dict[str, Any] | None:
    """The diagnosis once the run's writes are done: a conflict whose orphan this run deleted
    says so, and its advice is what is true now (the rest was read before the writes)."""
    if health is None or not deleted:
        return health
    findings = [
        {**item, "holder_deleted": True}
        if item.get("cause") == "ip_conflict_orphan" and item.get("holder") in deleted
        else item
        for item in health["calico_node"]
    ]
    updated = {**health, "calico_node": findings}
    return {**updated, "recommendations": recommendations(updated)}


def at_or_above(status: str, level: str) -> bool:
    return level != "never" and STATUS_ORDER.index(status) >= STATUS_ORDER.index(level)
