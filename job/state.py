"""Grace-period state: when each orphan was first seen. Losing it only restarts the wait."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Protocol

import structlog

from job.kube import Conflict, Kube

log = structlog.get_logger("calico_gc.state")
STATE_KEY = "state.json"
STATE_SCHEMA = 1
MAX_WRITE_ATTEMPTS = 5

GraceState = Mapping[str, datetime]


class StateStore(Protocol):
    def load(self) -> dict[str, datetime]: ...

    def save(self, state: GraceState) -> None: ...


def encode(state: GraceState) -> str:
    orphans = {name: since.isoformat().replace("+00:00", "Z") for name, since in sorted(state.items())}
    return json.dumps({"schema": STATE_SCHEMA, "orphans": orphans}, indent=1, sort_keys=True)


def decode(text: str, source: str) -> dict[str, datetime]:
    """Parse stored state; anything unreadable is dropped with a warning, never fatal."""
    try:
        orphans = json.loads(text).get("orphans", {})
        return {str(name): datetime.fromisoformat(str(since).replace("Z", "+00:00")) for name, since in orphans.items()}
    except (ValueError, AttributeError, TypeError) as error:
        log.warning("grace_state_unreadable", source=source, error=str(error))
        return {}


class FileStateStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, datetime]:
        try:
            return decode(self.path.read_text(), str(self.path))
        except FileNotFoundError:
            return {}

    def save(self, state: GraceState) -> None:
        """Write atomically: a crash leaves the old file or the new one, never half of one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(handle, "w") as out:
            out.write(encode(state))
        os.replace(temporary, self.path)


class ConfigMapStateStore:
    """State in a ConfigMap, written with resourceVersion checks."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self._read: dict[str, object] | None = None

    def load(self) -> dict[str, datetime]:
        self._read = self.kube.read_config_map(self.namespace, self.name)
        if self._read is None:
            return {}
        data: dict[str, str] = self._read.get("data") or {}  # type: ignore[assignment]
        return decode(data.get(STATE_KEY, "{}"), f"configmap/{self.name}")

    def save(self, state: GraceState) -> None:
        """On a 409, re-read and keep the earliest sighting of each name we still track."""
        for _ in range(MAX_WRITE_ATTEMPTS):
            metadata: dict[str, object] = {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "calico-gc"},
            }
            if self._read is not None:
                metadata["resourceVersion"] = self._read["metadata"]["resourceVersion"]  # type: ignore[index]
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {STATE_KEY: encode(state)}}
            try:
                self.kube.write_config_map(self.namespace, body)
                return
            except Conflict:
                log.warning("grace_state_conflict", configmap=self.name)
                theirs = self.load()
                state = {name: min(since, theirs.get(name, since)) for name, since in state.items()}
        raise Conflict(f"ConfigMap {self.name} kept changing; grace state not saved")
