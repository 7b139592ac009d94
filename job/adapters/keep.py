"""Kept reports: the recent reports of runs that changed the datastore, in ConfigMaps, so that
the before-values a restore needs outlive the Job's pods and their logs.

Bounded by design: a ring of `slots` (at most MAX_SLOTS), each at most MAX_PARTS ConfigMaps
of PART_BYTES of gzip. The names are fixed (`calico-gc-report-<slot>-<part>`), so the Role can
grant get and update on exactly these names, and no delete right is needed: the oldest slot is
overwritten. A slot's part 0 is written last and says how many parts it has; every part names
its run, so a reader never mixes two runs' parts.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from job.adapters.kube import Kube, KubeError
from job.adapters.report_file import json_line
from job.adapters.retry import one_line
from job.config import MAX_KEPT_REPORTS
from job.core.model import ascii_number, parse_time
from job.core.report import chunks as report_chunks

PREFIX = "calico-gc-report"
MAX_SLOTS = MAX_KEPT_REPORTS
MAX_PARTS = 4
PART_BYTES = 900 * 1024  # a ConfigMap's data must stay under 1 MiB
DATA_KEY = "report.json.gz"
ANNOTATION = "calico-gc/"
EPOCH = datetime.min.replace(tzinfo=UTC)


class KeepError(Exception):
    """A report could not be kept or fetched: the one error of this boundary. `kind` is the
    report's error kind: `config` when the asked-for report is not there."""

    def __init__(self, message: str, kind: str = "unavailable") -> None:
        super().__init__(message)
        self.kind = kind


def part_name(slot: int, part: int, prefix: str = PREFIX) -> str:
    return f"{prefix}-{slot}-{part}"


def all_names(prefix: str = PREFIX) -> list[str]:
    """Every name a kept report may use: what the Role grants get and update on."""
    return [part_name(slot, part, prefix) for slot in range(MAX_SLOTS) for part in range(MAX_PARTS)]


def worth_keeping(report: Mapping[str, Any]) -> bool:
    """A report that records a change to the datastore: a restore needs it."""
    return report.get("mode") == "apply" and any(host.get("changes") for host in report.get("hosts") or [])


def _annotations(metadata: Mapping[str, Any]) -> dict[str, str]:
    return {
        key[len(ANNOTATION) :]: value
        for key, value in (metadata.get("annotations") or {}).items()
        if key.startswith(ANNOTATION)
    }


def _packed(report: Mapping[str, Any]) -> bytes:
    """The report as gzip, compressed as it is encoded: neither the whole JSON text nor more
    than the slot can hold is ever in memory."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # a gzip stream
    packed = bytearray()
    for chunk in report_chunks(report, indent=None, one_line=json_line):
        packed += compressor.compress(chunk.encode())
        if len(packed) > MAX_PARTS * PART_BYTES:
            raise KeepError(
                f"the report is more than {MAX_PARTS * PART_BYTES / 2**20:.1f} MiB compressed, more than the "
                f"{MAX_PARTS} ConfigMaps a kept report may fill; it is only in the job's output (--report-file, "
                "logs): lower --max-deletions"
            )
    packed += compressor.flush()
    return bytes(packed)


class ReportKeeper:
    def __init__(self, kube: Kube, namespace: str, slots: int, prefix: str = PREFIX) -> None:
        self.kube, self.namespace, self.slots, self.prefix = kube, namespace, slots, prefix

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.read_config_map(self.namespace, name)
        except KubeError as error:
            raise KeepError(f"cannot read ConfigMap {self.namespace}/{name}: {error}") from error

    def _heads(self) -> dict[int, dict[str, Any] | None]:
        return {slot: self._get(part_name(slot, 0, self.prefix)) for slot in range(self.slots)}

    def keep(self, report: Mapping[str, Any]) -> str:
        """Store `report` in the slot that holds its run already (the report kept before its
        writes), or else the free or oldest one; the ConfigMap that names it."""
        packed = _packed(report)
        parts = [packed[start : start + PART_BYTES] for start in range(0, len(packed), PART_BYTES)] or [b""]
        heads = self._heads()
        run_id = str(report.get("run_id"))

        def order(s: int) -> tuple[bool, bool, datetime, int]:
            ours = _annotations((heads[s] or {}).get("metadata") or {}).get("run-id") == run_id
            return (not ours, heads[s] is not None, self._started(heads[s]), s)

        slot = min(heads, key=order)
        summary = report.get("summary") or {}
        about = {
            "run-id": run_id,
            "schema": str(report.get("schema")),
            "started-at": str(report.get("started_at")),
            "finished-at": str(report.get("finished_at")),
            "mode": str(report.get("mode")),
            "outcome": str(report.get("outcome")),
            "summary": ", ".join(f"{k}={v}" for k, v in summary.items() if v not in (None, 0, False)),
            "parts": str(len(parts)),
        }
        # Last part first, part 0 (which says how many there are) last.
        for part in range(MAX_PARTS - 1, -1, -1):
            name = part_name(slot, part, self.prefix)
            current = heads[slot] if part == 0 else self._get(name)
            if part >= len(parts):
                if current is not None and (current.get("binaryData") or {}):
                    self._write(name, current, {"part": str(part), "run-id": "", "parts": "0"}, b"")  # emptied
                continue
            self._write(name, current, {**about, "part": str(part)}, parts[part])
        return f"{self.namespace}/{part_name(slot, 0, self.prefix)}"

    def _write(self, name: str, current: Mapping[str, Any] | None, about: Mapping[str, str], data: bytes) -> None:
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/name": "calico-gc", "app.kubernetes.io/component": "report"},
            "annotations": {ANNOTATION + key: value for key, value in about.items()},
        }
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "binaryData": {DATA_KEY: base64.b64encode(data).decode()} if data else {},
        }
        try:
            self.kube.write_config_map(self.namespace, body)
        except KubeError as error:
            raise KeepError(f"cannot write ConfigMap {self.namespace}/{name}: {error}") from error

    @staticmethod
    def _started(head: Mapping[str, Any] | None) -> datetime:
        moment = parse_time(_annotations((head or {}).get("metadata") or {}).get("started-at"))
        return moment or EPOCH

    def list(self) -> list[dict[str, str]]:
        """What each slot holds, newest first."""
        kept = []
        for slot, head in self._heads().items():
            about = _annotations((head or {}).get("metadata") or {})
            if head is not None and about.get("run-id"):
                kept.append({**about, "configmap": part_name(slot, 0, self.prefix)})
        return sorted(kept, key=lambda k: parse_time(k.get("started-at")) or EPOCH, reverse=True)

    def fetch(self, run_id: str) -> dict[str, Any]:
        """The kept report of `run_id` ("latest": the newest one)."""
        heads = self._heads()
        kept = self.list()
        if run_id == "latest" and kept:
            run_id = kept[0]["run-id"]
        slot = next((s for s, h in heads.items() if h and _annotations(h["metadata"]).get("run-id") == run_id), None)
        if slot is None:
            known = ", ".join(k["run-id"] for k in kept) or "none"
            raise KeepError(f"no kept report of run {run_id!r} in {self.namespace} (kept: {known})", "config")
        head = heads[slot]
        assert head is not None
        parts = _annotations(head["metadata"]).get("parts") or "1"  # an annotation anyone may edit
        count = ascii_number(parts)
        if count is None or not 1 <= count <= MAX_PARTS:
            raise KeepError(
                f"kept report of run {run_id} says it has {one_line(repr(parts), 40)} parts, not 1 to {MAX_PARTS}"
            )
        packed = b""
        whole = _annotations(head["metadata"])
        for part in range(count):
            name = part_name(slot, part, self.prefix)
            obj = head if part == 0 else self._get(name)
            about = _annotations((obj or {}).get("metadata") or {})
            # Every part says what part 0 says: a part of another run, or of the same run's other
            # report (the one kept before its writes, being replaced), is never read with it.
            if obj is None or about != {**whole, "part": str(part)}:
                raise KeepError(
                    f"kept report of run {run_id} is incomplete: {name} holds another report "
                    "(a run died while keeping its report)"
                )
            try:
                packed += base64.b64decode((obj.get("binaryData") or {}).get(DATA_KEY, ""), validate=True)
            except (binascii.Error, ValueError) as error:
                raise KeepError(f"{name} is not base64: {error}") from error
        try:
            document = json.loads(gzip.decompress(packed))
        except (OSError, EOFError, zlib.error, ValueError, RecursionError) as error:
            raise KeepError(f"kept report of run {run_id} cannot be read: {error}") from error
        if not isinstance(document, dict):
            raise KeepError(f"kept report of run {run_id} is not a JSON object")
        return document
