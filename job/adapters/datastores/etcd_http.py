"""HTTP to etcd, for both its v3 JSON gateway and the v2 keys API: one home for the sessions,
TLS, endpoint failover, retries, and for turning every failure into one DatastoreError line
that names the server and the setting to check.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Collection
from typing import Any

import requests

from job.adapters.datastores.base import DatastoreError
from job.adapters.retry import RetryPolicy, network_reason, one_line
from job.config import Config

ENDPOINTS_HINT = "check ETCD_ENDPOINTS (--etcd-endpoints)"
# Answers are read 64 KiB at a time, not requests' 10 KiB: a range answer is megabytes, and each
# read waits for the GIL again while another thread parses the last page. 5,000 hosts: -0.13 s.
BODY_CHUNK = 64 << 10
TLS_HINT = "check ETCD_CA_CERT_FILE, ETCD_CERT_FILE and ETCD_KEY_FILE"


class _Transient(Exception):
    """Worth another attempt, at the next endpoint: no answer, 5xx, or no etcd leader yet."""


class _Final(Exception):
    """Not worth another attempt: TLS refused, credentials refused, or not etcd at all."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _tls_reason(error: requests.exceptions.SSLError) -> str:
    text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(error))
    for marker in ("CERTIFICATE_VERIFY_FAILED", "certificate required", "unknown ca", "bad certificate", "hostname"):
        if marker.lower() in text.lower():
            start = text.lower().index(marker.lower())
            return one_line(text[start:], 120).rstrip(")'\"")
    return one_line(text, 120)


def _not_etcd(response: requests.Response, url: str, reason: str | None = None) -> _Final:
    """An answer that is not etcd's: another content type, or JSON of a shape etcd never writes."""
    kind = response.headers.get("Content-Type", "no content type").split(";")[0]
    what = f"JSON etcd does not write ({reason})" if reason and kind == "application/json" else kind
    return _Final(
        f"{url} answered HTTP {response.status_code} with {what}, not etcd's JSON API; {ENDPOINTS_HINT} "
        "(a proxy or another service?)",
        "bad_answer",
    )


class EtcdHttp:
    """Requests to the configured endpoints, the next one after a connection failure."""

    def __init__(self, config: Config, retry: RetryPolicy) -> None:
        self._endpoints = [endpoint.url for endpoint in config.etcd_endpoints]
        self._timeout = config.etcd_timeout.total_seconds()
        self._verify: str | bool = str(config.etcd_ca_cert_file) if config.etcd_ca_cert_file else True
        self._cert = (
            (str(config.etcd_cert_file), str(config.etcd_key_file))
            if config.etcd_cert_file and config.etcd_key_file
            else None
        )
        self._retry = retry
        self._current = 0
        self._local = threading.local()  # requests.Session is not thread-safe: one per thread
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # REQUESTS_CA_BUNDLE must not replace the etcd CA
            session.verify = self._verify
            session.cert = self._cert
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        data: dict[str, str] | None = None,
        expect: Collection[int] = (200,),
        decode: Callable[[bytes], Any] | None = None,
    ) -> tuple[int, Any]:
        """One call, retried on transient failures; returns (status, parsed JSON).

        A status outside `expect` raises DatastoreError with etcd's own message, except 5xx and
        "no leader" answers, which are retried first. `decode` parses an expected answer in place
        of json (typed, in one pass); it raises ValueError, with the reason, on one it cannot.
        """

        def attempt() -> tuple[int, Any]:
            url = self._endpoints[self._current] + path
            try:
                response = self._session().request(
                    method, url, json=json_body, params=params, data=data, timeout=self._timeout, stream=True
                )
                body = b"".join(response.iter_content(BODY_CHUNK))
            except requests.exceptions.SSLError as error:
                raise _Final(f"TLS to etcd at {url} failed: {_tls_reason(error)}; {TLS_HINT}", "tls") from error
            except requests.RequestException as error:
                self._current = (self._current + 1) % len(self._endpoints)  # try the next endpoint
                reason = "timed out" if isinstance(error, requests.Timeout) else network_reason(error)
                raise _Transient(f"etcd at {url} did not answer: {reason}") from error
            if decode is not None and response.status_code in expect:
                try:
                    return response.status_code, decode(body)
                except ValueError as error:
                    raise _not_etcd(response, url, one_line(str(error))) from None
            try:
                parsed = json.loads(body)
            except ValueError:  # UnicodeDecodeError included
                raise _not_etcd(response, url) from None
            if response.status_code in expect:
                return response.status_code, parsed
            message = one_line(
                str(parsed.get("message") or parsed.get("error") or parsed) if isinstance(parsed, dict) else str(parsed)
            )
            if response.status_code >= 500 or "leader" in message.lower():
                raise _Transient(f"etcd at {url}: HTTP {response.status_code} {message}")
            if response.status_code in (401, 403):
                raise _Final(
                    f"etcd at {url} refused the request (HTTP {response.status_code}: {message}); {TLS_HINT}",
                    "unauthorized",
                )
            raise _Final(f"etcd {method} {path}: HTTP {response.status_code} {message}", "bad_answer")

        try:
            return self._retry.call(attempt, lambda error: isinstance(error, _Transient))
        except _Transient as error:
            raise DatastoreError(f"{error}; gave up after retries, {ENDPOINTS_HINT}") from error
        except _Final as error:
            raise DatastoreError(str(error), error.kind) from error

    def close(self) -> None:
        with self._lock:
            for session in self._sessions:
                session.close()
