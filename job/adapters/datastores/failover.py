"""What both etcd transports (gRPC for v3, HTTP for v2) share: the endpoints of ETCD_ENDPOINTS
taken in turn, the next one after a failure worth another attempt, tenacity's retries, and
every failure turned into one DatastoreError line."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from job.adapters.datastores.base import DatastoreError
from job.adapters.retry import ANSWERED, UNANSWERED, RetryPolicy
from job.config import Config

T = TypeVar("T")
ENDPOINTS_HINT = "check ETCD_ENDPOINTS (--etcd-endpoints)"
TLS_HINT = "check ETCD_CA_CERT_FILE, ETCD_CERT_FILE and ETCD_KEY_FILE"
AUTH_HINT = "check ETCD_USERNAME and ETCD_PASSWORD, or ETCD_CERT_FILE and ETCD_KEY_FILE"


_KEY_HEADERS = (b"-----BEGIN PRIVATE KEY-----", b"-----BEGIN RSA PRIVATE KEY-----", b"-----BEGIN EC PRIVATE KEY-----")


def check_tls_files(config: Config) -> None:
    """Each TLS file is what its setting says, checked before any connection: else a key that is
    not a key reads, at the handshake, as an etcd that cannot be reached. One line, exit 2."""

    def pem(setting: str, path: Path | None, headers: tuple[bytes, ...], what: str) -> None:
        if path is None:
            return
        try:
            data = path.read_bytes()
        except OSError as error:
            raise DatastoreError(f"{setting} {path}: cannot read it ({error.strerror})", "tls") from None
        if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data:
            raise DatastoreError(f"{setting} {path} is an encrypted key: give the key without a passphrase", "tls")
        if not any(header in data for header in headers):
            raise DatastoreError(f"{setting} {path} is not {what} in PEM form; {TLS_HINT}", "tls")

    pem("ETCD_CA_CERT_FILE", config.etcd_ca_cert_file, (b"-----BEGIN CERTIFICATE-----",), "a CA certificate")
    pem("ETCD_CERT_FILE", config.etcd_cert_file, (b"-----BEGIN CERTIFICATE-----",), "a client certificate")
    pem("ETCD_KEY_FILE", config.etcd_key_file, _KEY_HEADERS, "a private key")
    if config.etcd_cert_file is None or config.etcd_key_file is None:
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(config.etcd_cert_file, config.etcd_key_file)
    except ssl.SSLError as error:
        why = "it is not the key of that certificate" if "MISMATCH" in str(error).upper() else "it cannot be read"
        raise DatastoreError(
            f"ETCD_KEY_FILE {config.etcd_key_file} does not go with ETCD_CERT_FILE {config.etcd_cert_file}: {why} "
            f"({error.reason or error}); {TLS_HINT}",
            "tls",
        ) from None


class Transient(Exception):
    """Worth another attempt, at the next endpoint: no answer, or no etcd leader yet. `sent`
    is False where the request cannot have reached etcd (no connection was made)."""

    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


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

    def call(self, attempt: Callable[[int], T], what: str, tries: list[int] | None = None) -> T:
        """`attempt(index)` at the current endpoint, retried on Transient at the next one; a
        DatastoreError when it fails for good. `what` names the call in the retry log; `tries`,
        where given, gets what became of each attempt (retry.UNANSWERED: a write so tried may
        have committed, its answer lost). The error says whether the call may have been carried
        out all the same (`in_doubt`): some try of it went unanswered."""
        attempts: list[int] = [] if tries is None else tries

        def once() -> T:
            index = self.current
            attempts.append(ANSWERED)
            try:
                return attempt(index)
            except Transient as error:
                self.current = (index + 1) % len(self.urls)
                if error.sent:
                    attempts[-1] = UNANSWERED
                raise

        once.__qualname__ = what
        try:
            return self._retry.call(once, lambda error: isinstance(error, Transient))
        except Transient as error:
            message = f"{error}; gave up after retries, {ENDPOINTS_HINT}"
            raise DatastoreError(message, in_doubt=int(UNANSWERED in attempts)) from error
        except Final as error:
            raise DatastoreError(str(error), error.kind, in_doubt=int(UNANSWERED in attempts)) from error
