"""What both etcd transports (gRPC for v3, HTTP for v2) share: the endpoints of ETCD_ENDPOINTS
taken in turn, the next one after a failure worth another attempt, tenacity's retries, and
every failure turned into one DatastoreError line."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from job.adapters.datastores.base import DatastoreError
from job.adapters.retry import RetryPolicy
from job.config import Config

T = TypeVar("T")
ENDPOINTS_HINT = "check ETCD_ENDPOINTS (--etcd-endpoints)"
TLS_HINT = "check ETCD_CA_CERT_FILE, ETCD_CERT_FILE and ETCD_KEY_FILE"


class Transient(Exception):
    """Worth another attempt, at the next endpoint: no answer, or no etcd leader yet."""


class Final(Exception):
    """Not worth another attempt: TLS refused, credentials refused, or not etcd at all."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class Endpoints:
    """The configured endpoints, one of them current: the next becomes current after a
    transient failure, so that a member that is down costs one attempt, not every call."""

    def __init__(self, config: Config, retry: RetryPolicy) -> None:
        self.urls = [endpoint.url for endpoint in config.etcd_endpoints]
        self.current = 0
        self._retry = retry

    def call(self, attempt: Callable[[int], T], what: str) -> T:
        """`attempt(index)` at the current endpoint, retried on Transient at the next one; a
        DatastoreError when it fails for good. `what` names the call in the retry log."""

        def once() -> T:
            index = self.current
            try:
                return attempt(index)
            except Transient:
                self.current = (index + 1) % len(self.urls)
                raise

        once.__qualname__ = what
        try:
            return self._retry.call(once, lambda error: isinstance(error, Transient))
        except Transient as error:
            raise DatastoreError(f"{error}; gave up after retries, {ENDPOINTS_HINT}") from error
        except Final as error:
            raise DatastoreError(str(error), error.kind) from error
