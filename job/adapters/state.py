"""Grace-period state: when each orphan was first seen. Losing it only restarts the wait."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from job.adapters.kube import Conflict, Kube, KubeError
from job.core.model import parse_time

log = structlog.get_logger("calico_gc.state")
STATE_KEY = "state.json"
STATE_SCHEMA = 1
MAX_WRITE_ATTEMPTS = 5

GraceState = Mapping[str, datetime]


class StateError(Exception):
    """The grace state could not be read or written: the one error of this boundary."""


@dataclass(frozen=True)
class Loaded:
    """What was remembered, and what of it could not be used (each entry on its own)."""

    sightings: dict[str, datetime]
    problems: tuple[str, ...] = ()


class StateStore(Protocol):
    def load(self) -> Loaded: ...

    def save(self, state: GraceState) -> None: ...


def encode(state: GraceState) -> str:
    orphans = {name: since.isoformat().replace("+00:00", "Z") for name, since in sorted(state.items())}
    return json.dumps({"schema": STATE_SCHEMA, "orphans": orphans}, indent=1, sort_keys=True)


def decode(text: str, source: str) -> Loaded:
    """Parse stored state. An unreadable entry loses only its own sighting (its wait restarts);
    a document that is not state at all loses every one. Both are reported, never fatal."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        return Loaded({}, (f"{source} is not JSON ({error}); every wait restarts",))
    orphans = document.get("orphans") if isinstance(document, dict) else None
    if not isinstance(orphans, dict):
        return Loaded({}, (f"{source} holds no orphans map; every wait restarts",))
    sightings: dict[str, datetime] = {}
    problems = []
    for name, since in orphans.items():
        moment = parse_time(since)
        if moment is None:
            problems.append(f"{source}: first sighting of {name} is {since!r}, not a time; its wait restarts")
        else:
            sightings[str(name)] = moment
    return Loaded(sightings, tuple(problems))


class FileStateStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Loaded:
        try:
            return decode(self.path.read_text(), str(self.path))
        except FileNotFoundError:
            return Loaded({})
        except (OSError, UnicodeDecodeError) as error:
            raise StateError(f"cannot read the state file {self.path}: {error}; check --state-file") from error

    def save(self, state: GraceState) -> None:
        """Write atomically: a crash leaves the old file or the new one, never half of one."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            with os.fdopen(handle, "w") as out:
                out.write(encode(state))
            os.replace(temporary, self.path)
        except OSError as error:
            raise StateError(f"cannot write the state file {self.path}: {error}; check --state-file") from error


class ConfigMapStateStore:
    """State in a ConfigMap, written with resourceVersion checks."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self._read: dict[str, Any] | None = None

    def load(self) -> Loaded:
        try:
            self._read = self.kube.read_config_map(self.namespace, self.name)
        except KubeError as error:
            raise StateError(f"cannot read ConfigMap {self.namespace}/{self.name}: {error}") from error
        if self._read is None:
            return Loaded({})
        data = self._read.get("data") or {}
        return decode(data.get(STATE_KEY, "{}"), f"ConfigMap {self.namespace}/{self.name}")

    def save(self, state: GraceState) -> None:
        """On a 409, re-read and keep the earliest sighting of each name we still track. The
        written object's resourceVersion is kept: the run's next write builds on its own."""
        for _ in range(MAX_WRITE_ATTEMPTS):
            metadata: dict[str, object] = {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "calico-gc"},
            }
            if self._read is not None:
                metadata["resourceVersion"] = self._read["metadata"]["resourceVersion"]
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {STATE_KEY: encode(state)}}
            try:
                self._read = self.kube.write_config_map(self.namespace, body)
                return
            except Conflict:
                log.warning("grace_state_conflict", configmap=self.name)
                theirs = self.load().sightings
                state = {name: min(since, theirs.get(name, since)) for name, since in state.items()}
            except KubeError as error:
                raise StateError(f"cannot write ConfigMap {self.namespace}/{self.name}: {error}") from error
        raise StateError(f"ConfigMap {self.namespace}/{self.name} kept changing; grace state not saved")
