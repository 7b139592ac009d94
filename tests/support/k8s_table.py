"""Pods as the API server prints them into a Table (`Accept: application/json;as=Table;v=v1;
g=meta.k8s.io`), for the API test server.

The rules are Kubernetes' own server-side printer for pods (pkg/printers/internalversion,
printPod, which the API server always runs wide), in our words:
- the columns are Name, Ready, Status, Restarts, Age, IP, Node, Nominated Node, Readiness Gates;
- Ready is `<ready>/<containers>`; Status is the phase, or the pod's reason, or a container's
  waiting or terminated reason, and `Terminating` once the pod has a deletionTimestamp;
- Restarts sums the containers' restartCount;
- IP is the first of `status.podIPs` (the server's internal Pod has only that list; a `podIP` alone
  is converted into it), `<none>` without one; Node, Nominated Node and Readiness Gates say `<none>`
  when empty;
- a Succeeded or Failed pod's row carries the condition `Completed`;
- each row's `object` is what `includeObject` asks for: `None` (null), `Metadata` (the default: a
  PartialObjectMetadata, managedFields included) or `Object` (the pod); another value is a 400
  (apiserver's endpoints/handlers/response.go, transformObject's table case).
Not printed here: init containers' progress (`Init:0/1`), which no test pod has.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

NONE = "<none>"
POD_COLUMNS = [
    {"name": "Name", "type": "string", "format": "name", "description": "Name of the object.", "priority": 0},
    {"name": "Ready", "type": "string", "format": "", "description": "Ready containers.", "priority": 0},
    {"name": "Status", "type": "string", "format": "", "description": "The pod's status.", "priority": 0},
    {"name": "Restarts", "type": "string", "format": "", "description": "Container restarts.", "priority": 0},
    {"name": "Age", "type": "string", "format": "", "description": "Since creationTimestamp.", "priority": 0},
    {"name": "IP", "type": "string", "format": "", "description": "The pod's IP.", "priority": 1},
    {"name": "Node", "type": "string", "format": "", "description": "spec.nodeName.", "priority": 1},
    {"name": "Nominated Node", "type": "string", "format": "", "description": "Nominated node.", "priority": 1},
    {"name": "Readiness Gates", "type": "string", "format": "", "description": "Readiness gates.", "priority": 1},
]
INCLUDE_OBJECT = ("None", "Metadata", "Object")
_COMPLETED = {
    "Succeeded": "The pod has completed successfully.",
    "Failed": "The pod failed.",
}


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration, as the Age column shows it."""
    if seconds < -1:
        return "<invalid>"
    whole = max(0, int(seconds))
    if whole < 120:
        return f"{whole}s"
    minutes, hours = whole // 60, whole // 3600
    if minutes < 10:
        return f"{minutes}m{whole % 60}s" if whole % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        return f"{hours // 24 // 365}y{hours // 24 % 365}d"
    return f"{hours // 24 // 365}y"


def _age(metadata: dict[str, Any], now: datetime) -> str:
    created = metadata.get("creationTimestamp")
    if not created:
        return "<unknown>"
    return human_duration((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds())


def pod_cells(pod: dict[str, Any], now: datetime | None = None) -> list[Any]:
    """One pod's row, wide, as printPod makes it."""
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or ""
    restarts = ready = 0
    for container in reversed(status.get("containerStatuses") or []):
        restarts += container.get("restartCount") or 0
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated")
        if waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated is not None and terminated.get("reason"):
            reason = terminated["reason"]
        elif terminated is not None:
            signal = terminated.get("signal")
            reason = f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}"
        elif container.get("ready") and "running" in state:
            ready += 1
    if metadata.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    ips = [entry.get("ip") for entry in status.get("podIPs") or [] if entry.get("ip")] or [
        ip for ip in (status.get("podIP"),) if ip
    ]
    gates = spec.get("readinessGates") or []
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return [
        metadata.get("name", ""),
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        str(restarts),
        _age(metadata, now or datetime.now(UTC)),
        ips[0] if ips else NONE,
        spec.get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        f"{sum(conditions.get(g.get('conditionType')) == 'True' for g in gates)}/{len(gates)}" if gates else NONE,
    ]


def row(pod: dict[str, Any], include: str) -> dict[str, Any]:
    """A pod's Table row, its object as `include` (one of INCLUDE_OBJECT) asks."""
    found: dict[str, Any] = {"cells": pod_cells(pod)}
    phase = (pod.get("status") or {}).get("phase")
    if phase in _COMPLETED:
        found["conditions"] = [{"type": "Completed", "status": "True", "reason": phase, "message": _COMPLETED[phase]}]
    if include == "None":
        found["object"] = None
    elif include == "Object":
        found["object"] = pod
    else:
        found["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": pod.get("metadata") or {},
        }
    return found


def table(metadata: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A page of pods as a Table; every page carries the column definitions (no `noHeaders`)."""
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": POD_COLUMNS,
        "rows": rows,
    }
