"""Kubernetes Events, where `kubectl describe` users look: a Warning on each Node stuck
NetworkUnavailable (the MAX_NODE_EVENTS stuck longest, and past those one on this run's Pod)
with its diagnosed cause and next step; on the blocked Node when the orphan
holding its IP is removed; and on this run's Pod for each host deleted, failed or refused.

`events_for` is pure (built from the finished report); `post_events` writes them through
`Kube`, and a failure to post only warns: Events are help, never the run's outcome.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from job.adapters.kube import Kube, KubeError
from job.adapters.retry import UNANSWERED
from job.core.health import unavailable_seconds

COMPONENT = "calico-gc"
MAX_MESSAGE = 1024  # the API server truncates longer Event messages anyway
MAX_NAME = 253  # an object name, a DNS subdomain
# Stuck Nodes given an Event a run, the longest stuck first: when calico-node fails everywhere
# (a fail-closed webhook), an Event on each of 5,000 Nodes every run is 5,000 writes to the API
# server and 30,000 Events an hour in etcd, and says nothing one more than the report does.
MAX_NODE_EVENTS = 50


def events_for(report: dict[str, Any], namespace: str, pod: str | None, now: datetime) -> list[dict[str, Any]]:
    """The Events a finished run leaves. Node Events go to `default`, as for every Node; host
    Events go to this run's Pod, when the run has one (POD_NAME)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    nanos = int(now.timestamp()) * 1_000_000_000 + now.microsecond * 1000
    found: list[dict[str, Any]] = []

    def add(on: tuple[str, str], reason: str, message: str, warning: bool) -> None:
        kind, name = on
        where = "default" if kind == "Node" else namespace
        # Named as client-go's recorder names an Event (`<object>.<hex nanoseconds>`), one
        # nanosecond apart within a run: a create tried again is then refused (409) rather than
        # posted twice, and taken as done (post_events).
        named = f"{name[: MAX_NAME - 17]}.{nanos + len(found):x}"  # "." and 16 hex digits
        found.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": named, "namespace": where},
                "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name}
                | ({"namespace": where} if kind == "Pod" else {}),
                "reason": reason,
                "message": message[:MAX_MESSAGE],
                "type": "Warning" if warning else "Normal",
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "reportingInstance": pod or COMPONENT,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
        )

    health = report.get("health") or {}
    causes = {entry["node"]: entry.get("cause") for entry in health.get("calico_node") or [] if entry.get("node")}
    advice = health.get("recommendations") or []
    run = f"run {report['run_id']} ({report['mode']})"
    stuck = [entry for entry in health.get("network_unavailable") or [] if entry.get("state") == "stuck"]
    # Since when is unknown for a taint without timeAdded (`kubectl taint`, a kubelet's
    # --register-with-taints; the node controller's taints have one) and no condition: the Node's
    # age bounds it, and a Node of no known age counts as stuck longest.
    stuck.sort(key=lambda entry: (unavailable_seconds(entry) is not None, -(unavailable_seconds(entry) or 0)))
    for entry in stuck[:MAX_NODE_EVENTS]:
        node, seconds = entry["node"], unavailable_seconds(entry)
        since = "an unknown time" if seconds is None else f"{seconds // 60}m"
        if seconds is not None and entry.get("duration_seconds") is None:
            since = f"at most {since} (the Node's age; nothing says since when)"
        message = f"NetworkUnavailable for {since}; calico-node cause: "
        message += causes.get(node) or "not diagnosed"
        steps = [text for text in advice if text.startswith(f"{node}:")]
        if steps:
            message += f"; next: {steps[0]}"
        add(("Node", node), "CalicoNetworkUnavailable", message, True)
    if len(stuck) > MAX_NODE_EVENTS and pod:
        message = (
            f"{len(stuck)} Nodes stuck NetworkUnavailable; Events on the {MAX_NODE_EVENTS} stuck longest, "
            f"every one in the report's health.network_unavailable; {run}"
        )
        add(("Pod", pod), "CalicoNetworkUnavailableNodes", message, True)
    conflicts = {c["orphan"]: c for c in report.get("conflicts") or [] if c.get("orphan")}
    for host in report.get("hosts") or []:
        name = host["name"]
        if host["action"] == "deleted":
            conflict = conflicts.get(name)
            if conflict:
                message = f"removed orphaned Calico host {name}, which held this node's IP {conflict['ip']}; {run}"
                add(("Node", conflict["blocks"]), "CalicoOrphanRemoved", message, False)
            if pod:
                message = f"deleted Calico host {name} ({host['reason']}): {len(host['changes'])} keys; {run}"
                add(("Pod", pod), "CalicoHostDeleted", message, False)
        elif host["action"] == "failed" and pod:
            message = f"could not delete Calico host {name} ({host['reason']}): {host.get('error')}; {run}"
            add(("Pod", pod), "CalicoHostDeleteFailed", message, True)
    if pod:
        for guard in report.get("guards") or []:
            add(
                ("Pod", pod),
                "CalicoGcRefused",
                f"refused by the {guard['name']} guard: {guard['message']}; {run}",
                True,
            )
    return found


def post_events(kube: Kube, events: list[dict[str, Any]]) -> str | None:
    """Post every Event; the first failure, as one line, or None."""
    failure = None
    for event in events:
        path = f"/api/v1/namespaces/{event['metadata']['namespace']}/events"
        tries: list[int] = []
        try:
            kube.request("POST", path, body=event, tries=tries)
        except KubeError as error:
            # Its name is this run's: a create tried again and refused as taken (409) meets its
            # own first try, done, its answer lost. (Asked nothing more: the Role grants create only.)
            if not (error.status == 409 and UNANSWERED in tries):
                failure = failure or f"Events not posted: {error}"
    return failure


def publish(kube: Kube, namespace: str, pod: str | None, report: dict[str, Any]) -> str | None:
    """Build and post the Events of a finished run (wired by the CLI)."""
    return post_events(kube, events_for(report, namespace, pod, kube.now()))
