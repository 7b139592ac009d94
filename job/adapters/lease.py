"""One run at a time: a coordination.k8s.io Lease, short and renewed by a thread for the whole
run, reads included, so that a run killed by SIGKILL locks later runs out for one Lease
duration at most. Written through `Kube`; every failure is its KubeError."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
import structlog

from job.adapters.kube import Kube, KubeError
from job.adapters.retry import describe_error
from job.core.model import parse_time

log = structlog.get_logger("calico_gc.lease")
MIN_RENEW_INTERVAL_S = 1.0


INT32_MAX = 2**31 - 1
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]  # as the API holds these


class _LeaseSpec(msgspec.Struct, frozen=True):
    """What the lock reads of a Lease; the Lease itself is written back as it was read, changed."""

    holderIdentity: str | None = None  # the API's names
    leaseDurationSeconds: Int32 | None = None
    acquireTime: str | None = None
    renewTime: str | None = None
    leaseTransitions: Int32 | None = None


class _Lease(msgspec.Struct, frozen=True):
    spec: _LeaseSpec | None = None


def _spec_of(lease: Any, path: str) -> _LeaseSpec:
    """A Lease's spec, typed; an answer that is no Lease (a proxy's) is one `bad_answer`."""
    try:
        return msgspec.convert(lease, _Lease).spec or _LeaseSpec()
    except msgspec.ValidationError as error:
        raise KubeError(f"GET {path}: the answer is not a Lease: {error}", kind="bad_answer") from None


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseLock:
    kube: Kube
    namespace: str
    name: str
    holder: str
    duration: timedelta
    _renewed: datetime | None = None
    _lost: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)
    _renewing: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    @property
    def _path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    def acquire(self) -> str | None:
        """Take the Lease if free, expired or ours; otherwise return who holds it."""
        now = self.kube.now()
        spec = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": int(self.duration.total_seconds()),
            "acquireTime": _micro_time(now),
            "renewTime": _micro_time(now),
        }
        path = f"{self._path}/{self.name}"
        try:
            current = self.kube.request("GET", path)
        except KubeError as error:
            if error.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            return self._take("POST", self._path, body, "another run")
        held = _spec_of(current, path)
        other = held.holderIdentity
        renewed = parse_time(held.renewTime) or parse_time(held.acquireTime)
        # Time left, not an expiry: renewed + duration overflows for a renewal in the year 9999.
        left = renewed - now + timedelta(seconds=held.leaseDurationSeconds or 0) if renewed else None
        if other and other != self.holder and left is not None and left > timedelta(0):
            return other
        current["spec"] = {
            **(current.get("spec") or {}),
            **spec,
            # A count at int32's end stays there: one past it is a write the server refuses.
            "leaseTransitions": min((held.leaseTransitions or 0) + (other != self.holder), INT32_MAX),
        }
        if other and other != self.holder:
            log.warning("lease_taken_over", previous_holder=other, expired_at=None if left is None else str(now + left))
        return self._take("PUT", path, current, other or "another run")

    def _written(self, method: str, path: str, body: dict[str, Any]) -> bool:
        """Write the Lease; False on a 409 (someone else wrote it first). A retried write that
        conflicts with its own first try (Kube.write) is done where the Lease is as it leaves it."""

        def done(now: dict[str, Any] | None) -> bool:
            return now is not None and now.get("spec") == body.get("spec")

        try:
            self.kube.write(method, path, body, f"{self._path}/{self.name}", done)
            return True
        except KubeError as error:
            if error.status != 409:
                raise
            return False

    def _take(self, method: str, path: str, body: dict[str, Any], other: str) -> str | None:
        if not self._written(method, path, body):
            return other  # someone else wrote the Lease first
        self._renewed = self.kube.now()
        self._thread = threading.Thread(target=self._renew_in_background, name="lease-renewal", daemon=True)
        self._thread.start()
        return None

    def _rewrite(self, change: Callable[[dict[str, Any]], None]) -> bool:
        """Apply `change` to the Lease spec if it is still ours; False when it is not."""
        path = f"{self._path}/{self.name}"
        current = self.kube.request("GET", path)
        if _spec_of(current, path).holderIdentity != self.holder:
            return False
        spec = current["spec"] = current.get("spec") or {}
        change(spec)
        return self._written("PUT", path, current)

    def _renew_in_background(self) -> None:
        interval = max(self.duration.total_seconds() / 3, MIN_RENEW_INTERVAL_S)
        while not self._done.wait(interval):
            if not self._renew():
                return

    def _renew(self) -> bool:
        """Renew now; on any failure the lock counts as lost, so that nothing more is deleted."""
        with self._renewing:
            if self._lost.is_set():
                return False
            now = self.kube.now()
            try:
                renewed = self._rewrite(lambda spec: spec.update(renewTime=_micro_time(now)))
            except Exception as error:  # gone, taken meanwhile (409), unreachable: not confirmed
                log.warning("lease_renewal_failed", error=describe_error(error))
                renewed = False
            if not renewed:
                log.warning("lock_lost", lease=f"{self.namespace}/{self.name}")
                self._lost.set()
                return False
            self._renewed = now
            return True

    def still_held(self) -> bool:
        """False once the Lease was lost; renews first when a third of its duration has passed."""
        if self._lost.is_set():
            return False
        if self._renewed is not None and self.kube.now() - self._renewed < self.duration / 3:
            return True
        return self._renew()

    def release(self) -> None:
        """Stop renewing and give the Lease up, if it is still ours."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._lost.is_set():
            return

        def give_up(spec: dict[str, Any]) -> None:
            spec.pop("holderIdentity", None)
            spec["leaseDurationSeconds"] = 1

        try:
            self._rewrite(give_up)
        except KubeError as error:
            log.warning("lease_release_failed", error=str(error))
