"""HTTP to etcd's v2 keys API (Calico 2.x; v2 has no gRPC): the sessions and TLS, and every
HTTP failure turned into one DatastoreError line that names the server and the setting to check.
Failover and retries are failover.Endpoints', as for the v3 gRPC transport.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Collection
from typing import Any

import requests

from job.adapters.datastores.failover import (
    AUTH_HINT,
    ENDPOINTS_HINT,
    TLS_HINT,
    Endpoints,
    Final,
    Transient,
    check_tls_files,
)
from job.adapters.retry import RetryPolicy, network_reason, never_sent, one_line
from job.config import Config

# Answers are read 64 KiB at a time, not requests' 10 KiB: an answer is megabytes, and each
# read waits for the GIL again while another thread parses the last page.
BODY_CHUNK = 64 << 10


def _tls_reason(error: requests.exceptions.SSLError) -> str:
    text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(error))
    for marker in ("CERTIFICATE_VERIFY_FAILED", "certificate required", "unknown ca", "bad certificate", "hostname"):
        if marker.lower() in text.lower():
            start = text.lower().index(marker.lower())
            return one_line(text[start:], 120).rstrip(")'\"")
    return one_line(text, 120)


def _not_etcd(response: requests.Response, url: str, reason: str | None = None) -> Final:
    """An answer that is not etcd's: another content type, or JSON of a shape etcd never writes."""
    kind = response.headers.get("Content-Type", "no content type").split(";")[0]
    what = f"JSON etcd does not write ({reason})" if reason and kind == "application/json" else kind
    return Final(
        f"{url} answered HTTP {response.status_code} with {what}, not etcd's JSON API; {ENDPOINTS_HINT} "
        "(a proxy or another service?)",
        "bad_answer",
    )


class EtcdHttp:
    """Requests to the configured endpoints, the next one after a connection failure."""

    def __init__(self, config: Config, retry: RetryPolicy) -> None:
        self._endpoints = Endpoints(config, retry)
        self._config = config
        self._timeout = config.etcd_timeout.total_seconds()
        self._verify: str | bool = str(config.etcd_ca_cert_file) if config.etcd_ca_cert_file else True
        self._cert = (
            (str(config.etcd_cert_file), str(config.etcd_key_file))
            if config.etcd_cert_file and config.etcd_key_file
            else None
        )
        self._local = threading.local()  # requests.Session is not thread-safe: one per thread
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints.urls)

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            if any(url.startswith("https:") for url in self._endpoints.urls):
                check_tls_files(self._config)
            session = requests.Session()
            session.trust_env = False  # REQUESTS_CA_BUNDLE must not replace the etcd CA
            session.verify = self._verify
            session.cert = self._cert
            if self._config.etcd_username:  # etcd v2's own users: HTTP basic authentication
                session.auth = (self._config.etcd_username, self._config.etcd_password.value)
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
        tries: list[int] | None = None,
    ) -> tuple[int, Any]:
        """One call, retried on transient failures; returns (status, parsed JSON) (Endpoints.call's `tries`).

        A status outside `expect` raises DatastoreError with etcd's own message, except 5xx and
        "no leader" answers, which are retried first. `decode` parses an expected answer in place
        of json (typed, in one pass); it raises ValueError, with the reason, on one it cannot.
        """

        def attempt(index: int) -> tuple[int, Any]:
            url = self._endpoints.urls[index] + path
            try:
                response = self._session().request(
                    method, url, json=json_body, params=params, data=data, timeout=self._timeout, stream=True
                )
                body = b"".join(response.iter_content(BODY_CHUNK))
            except requests.exceptions.SSLError as error:
                raise Final(f"TLS to etcd at {url} failed: {_tls_reason(error)}; {TLS_HINT}", "tls") from error
            except requests.RequestException as error:
                reason = "timed out" if isinstance(error, requests.Timeout) else network_reason(error)
                raise Transient(f"etcd at {url} did not answer: {reason}", sent=not never_sent(error)) from error
            if decode is not None and response.status_code in expect:
                try:
                    return response.status_code, decode(body)
                except (ValueError, RecursionError) as error:
                    raise _not_etcd(response, url, one_line(str(error))) from None
            try:
                parsed = json.loads(body)
            except (ValueError, RecursionError):  # UnicodeDecodeError included
                raise _not_etcd(response, url) from None
            if response.status_code in expect:
                return response.status_code, parsed
            message = one_line(
                str(parsed.get("message") or parsed.get("error") or parsed) if isinstance(parsed, dict) else str(parsed)
            )
            if response.status_code >= 500 or "leader" in message.lower():
                raise Transient(f"etcd at {url}: HTTP {response.status_code} {message}")
            if response.status_code in (401, 403):
                raise Final(
                    f"etcd at {url} refused the request (HTTP {response.status_code}: {message}); {AUTH_HINT}",
                    "unauthorized",
                )
            raise Final(f"etcd {method} {path}: HTTP {response.status_code} {message}", "bad_answer")

        return self._endpoints.call(attempt, f"etcd {method} {path.split('?', 1)[0]}", tries)

    def close(self) -> None:
        with self._lock:
            for session in self._sessions:
                session.close()
