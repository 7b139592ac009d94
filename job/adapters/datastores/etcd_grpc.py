"""etcd's v3 gRPC API: the etcd3 package's generated stubs (etcd3.etcdrpc) on channels of the
job's own, one per endpoint, and every grpc failure turned into one DatastoreError line that
names the endpoint and the setting to check (docs/development.md, "etcd v3 over gRPC").

The package's client is not used: it caps answers at gRPC's 4 MiB (a page of blocks is more),
falls back to plaintext when given a client certificate without a CA, turns a refused
certificate into "etcd connection failed", and after one UNAVAILABLE refuses every call for
300 s ("Trying to use a failed node"). Here the scheme alone decides TLS, and failover and
retries are failover.Endpoints'.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# gRPC's C core logs every failed handshake to stderr on its own; each failure is said once, here.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc
from etcd3.etcdrpc import rpc_pb2, rpc_pb2_grpc

from job.adapters.datastores.base import DatastoreError
from job.adapters.datastores.failover import (
    AUTH_HINT,
    ENDPOINTS_HINT,
    TLS_HINT,
    Endpoints,
    Final,
    Transient,
    check_tls_files,
)
from job.adapters.retry import UNANSWERED, RetryPolicy, one_line
from job.config import Config

# etcd answers up to its --max-request-bytes (1.5 MiB) in a request but without limit in a range
# answer: a first page of 1,000 blocks is 5 MB. The read's own bound is its page size (etcdv3.PAGE_BYTES).
MAX_ANSWER_BYTES = 256 << 20
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
    # A member that was down is dialled again within 0.1-1 s, not after gRPC's 1-120 s backoff:
    # the retries (RetryPolicy) decide how long to wait, not the channel. (Not min_reconnect_backoff:
    # gRPC takes that as the time a dial may take, 20 s by default.)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # An http(s)_proxy in the environment must not carry etcd's traffic: ETCD_ENDPOINTS is dialled
    # as given (as trust_env=False does for the v2 HTTP client).
    ("grpc.enable_http_proxy", 0),
)
# What etcd's own "try again" answers say (rpctypes): worth another attempt, like a refused dial.
_ETCD_TRANSIENT = ("too many requests", "leader", "timed out", "timeout", "not capable", "stopped")
# The alerts a server sends for a client certificate it refuses, or one it asked for and did not get.
# TLS 1.3 sends them after the client's half of the handshake, which gRPC then reports as a record
# it cannot decrypt ("Unwrap failed (TSI_DATA_CORRUPTED)", seen with etcd 3.4).
_REFUSED_CERTIFICATE = ("bad_certificate", "certificate_required", "unknown_ca", "handshake_failure", "unwrap failed")
_SYSCALL = re.compile(r"^[a-z_]+:(.+?) \(\d+\)$")
_PEER = re.compile(r"^(?:[A-Z_]+: )?(?:(?:ipv4|ipv6|unix):\S+: )?")


def _last_error(details: str) -> str:
    """What a failed dial says after gRPC's "failed to connect to all addresses; last error: UNKNOWN: ipv4:...: "."""
    said = _PEER.sub("", details.rsplit("last error: ", 1)[-1]).removesuffix(": OK")
    said = said.removeprefix("Failed to connect to remote host: ")
    return _SYSCALL.sub(r"\1", said)  # "recvmsg:Connection reset by peer (104)"


def failure(error: grpc.RpcError, url: str, method: str, timeout_s: float) -> Transient | Final:
    """The decision for one failed call: another attempt (at the next endpoint) or a line to report.

    A TLS handshake refused either way, or an answer that is not HTTP/2 or not etcd's, is a
    setting to fix: retrying it only delays the line a person needs. A closed connection can be
    a scheme that does not match the port, but also a proxy whose etcd is down: it is retried,
    and the line says both.
    """
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = one_line((error.details() if isinstance(error, grpc.Call) else str(error)) or "", 400)
    reason = one_line(_last_error(details), 160)
    said = reason.lower()
    https = url.startswith("https:")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Transient(f"etcd at {url} did not answer: timed out after {timeout_s:g}s")
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details:
        if "certificate_verify_failed" in said:
            why = reason.split("CERTIFICATE_VERIFY_FAILED", 1)[-1].strip(": ") or "not trusted"
            return Final(f"TLS to etcd at {url} failed: its certificate is not trusted ({why}); {TLS_HINT}", "tls")
        if any(alert in said for alert in _REFUSED_CERTIFICATE):
            return Final(
                f"etcd at {url} refused the client certificate, or asked for one and got none; check "
                "ETCD_CERT_FILE and ETCD_KEY_FILE (issued by the CA etcd trusts, its --trusted-ca-file)",
                "tls",
            )
        if "wrong_version_number" in said or "record_too_large" in said:
            return Final(
                f"{url} does not speak TLS: give the endpoint as http://, or the port etcd serves TLS on; "
                f"{ENDPOINTS_HINT}",
                "tls",
            )
        if "http/2" in said or "http1" in said:
            return Final(
                f"{url} answered without HTTP/2, not etcd's gRPC API (an HTTP/1 server or proxy?); {ENDPOINTS_HINT}",
                "bad_answer",
            )
        # No connection was made: the request cannot have reached etcd.
        if any(closed in said for closed in ("socket closed", "handshake read failed", "connection reset")):
            hint = "a plaintext port? then http://" if https else "a TLS port? then https:// with ETCD_CA_CERT_FILE"
            return Transient(f"etcd at {url} did not answer: the connection was closed at once ({hint})", sent=False)
        return Transient(f"etcd at {url} did not answer: {reason}", sent=False)
    if code == grpc.StatusCode.UNAVAILABLE or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED and "too many requests" in said
    ):
        return Transient(f"etcd at {url}: {details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return Final(
            f"etcd at {url} refused {method} ({details}): the etcd user (ETCD_USERNAME, or the client "
            "certificate's common name) needs a role that may read and write the /calico/ prefix",
            "unauthorized",
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in said:
        return Final(
            f"etcd at {url} has authentication on and was given no user ({details}): set ETCD_USERNAME and "
            "ETCD_PASSWORD, or a client certificate whose common name is an etcd user",
            "unauthorized",
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Final(f"etcd at {url} refused the request ({details}); {AUTH_HINT}", "unauthorized")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return Final(f"{url} has no etcd v3 {method} ({details}): not etcd 3.x? {ENDPOINTS_HINT}", "bad_answer")
    if code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in said:
        return Final(
            f"etcd at {url}: {details}: the read's revision was compacted while it ran; the next run reads anew",
            "unavailable",
        )
    if code == grpc.StatusCode.INTERNAL and "deserializ" in said:
        return Final(f"{url} answered {method} with what etcd never sends: not etcd? {ENDPOINTS_HINT}", "bad_answer")
    if any(word in said for word in _ETCD_TRANSIENT) and code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED):
        return Transient(f"etcd at {url}: {details}")
    return Final(f"etcd {method} at {url}: {code.name} {details}", "bad_answer")


def _stale_token(error: grpc.RpcError) -> bool:
    """etcd no longer takes the token a call carried: it expired (simple tokens live 5 minutes
    unused), or users or roles changed since it was given. A new one is asked for, once."""
    said = (error.details() if isinstance(error, grpc.Call) else "") or ""
    return "invalid auth token" in said or "revision of auth store is old" in said


def _sized_range(raw: bytes) -> tuple[Any, int]:
    """A RangeResponse and its size as it came: the read sizes its pages by the bytes per key, and
    the message's own ByteSize() walks every key-value again (1 ms a page of 2,000 endpoints)."""
    return rpc_pb2.RangeResponse.FromString(raw), len(raw)


class _KvStub:
    """etcd's KV service on one channel, called as the etcd3 package's generated stub calls it,
    but with Range answering the RangeResponse and its size in bytes (_sized_range); and the
    Auth service's Authenticate, for etcd's own users (EtcdGrpc._metadata)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.Range = channel.unary_unary(
            "/etcdserverpb.KV/Range",
            request_serializer=rpc_pb2.RangeRequest.SerializeToString,
            response_deserializer=_sized_range,
        )
        self.Txn = rpc_pb2_grpc.KVStub(channel).Txn
        self.Authenticate = rpc_pb2_grpc.AuthStub(channel).Authenticate


def _credentials(config: Config) -> grpc.ChannelCredentials:
    """TLS as Calico's manifests mount it: the CA, and a client certificate with its key. Without
    ETCD_CA_CERT_FILE the system's roots are trusted; never plaintext for an https endpoint."""

    def read(path: Path | None) -> bytes | None:
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError as error:
            raise DatastoreError(f"cannot read {path}: {error.strerror}; {TLS_HINT}", "tls") from None

    check_tls_files(config)
    with_key = config.etcd_cert_file is not None and config.etcd_key_file is not None
    return grpc.ssl_channel_credentials(
        root_certificates=read(config.etcd_ca_cert_file),
        private_key=read(config.etcd_key_file) if with_key else None,
        certificate_chain=read(config.etcd_cert_file) if with_key else None,
    )


class EtcdGrpc:
    """Unary KV calls at the current endpoint, the next one after a transient failure."""

    def __init__(self, config: Config, retry: RetryPolicy) -> None:
        self._endpoints = Endpoints(config, retry)
        self._targets = [f"{e.host if ':' not in e.host else f'[{e.host}]'}:{e.port}" for e in config.etcd_endpoints]
        self._tls = [e.scheme == "https" for e in config.etcd_endpoints]
        self._config = config
        self._timeout = config.etcd_timeout.total_seconds()
        self._channels: dict[int, grpc.Channel] = {}
        self._stubs: dict[int, _KvStub] = {}
        self._tokens: dict[int, tuple[tuple[str, str], ...]] = {}  # each endpoint's call metadata
        self._lock = threading.Lock()
        self._closed = False

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints.urls)

    def _stub(self, index: int) -> _KvStub:
        with self._lock:
            if self._closed:
                raise Final("the etcd client was closed: the run is ending", "unavailable")
            stub = self._stubs.get(index)
            if stub is None:
                options = list(CHANNEL_OPTIONS)  # a list of pairs: grpc refuses a dict
                if self._tls[index]:
                    channel = grpc.secure_channel(self._targets[index], _credentials(self._config), options)
                else:
                    channel = grpc.insecure_channel(self._targets[index], options)
                self._channels[index] = channel
                stub = self._stubs[index] = _KvStub(channel)
            return stub

    def _call(self, method: str, request: Any, tries: list[int] | None = None) -> Any:
        """`KV.<method>(request)`, retried on transient failures; its answer (Endpoints.call's `tries`)."""

        def attempt(index: int) -> Any:
            stub, url = self._stub(index), self._endpoints.urls[index]
            metadata = self._metadata(index, stub, url)
            try:
                return getattr(stub, method)(request, timeout=self._timeout, metadata=metadata)
            except grpc.RpcError as error:
                if not (metadata and _stale_token(error)):
                    raise failure(error, url, method, self._timeout) from None
            metadata = self._metadata(index, stub, url, fresh=True)
            try:  # once more, with a token etcd takes
                return getattr(stub, method)(request, timeout=self._timeout, metadata=metadata)
            except grpc.RpcError as error:
                raise failure(error, url, method, self._timeout) from None

        return self._endpoints.call(attempt, f"etcd {method}", tries)

    def _metadata(self, index: int, stub: _KvStub, url: str, fresh: bool = False) -> tuple[tuple[str, str], ...]:
        """The metadata a call to endpoint `index` carries: etcd's auth token where ETCD_USERNAME
        is set (fetched on first use, and again when etcd no longer takes it), else none. A
        server whose authentication is off takes calls without a token, as etcd's own client does."""
        if not self._config.etcd_username:
            return ()
        with self._lock:
            known = self._tokens.get(index)
        if known is not None and not fresh:
            return known
        asked = rpc_pb2.AuthenticateRequest(name=self._config.etcd_username, password=self._config.etcd_password.value)
        try:
            token = stub.Authenticate(asked, timeout=self._timeout).token
        except grpc.RpcError as error:
            said = (error.details() if isinstance(error, grpc.Call) else "") or ""
            if "authentication is not enabled" in said:
                token = ""
            elif "authentication failed" in said:
                raise Final(
                    f"etcd at {url} refused user {self._config.etcd_username!r}: {one_line(said)}; check "
                    "ETCD_USERNAME and ETCD_PASSWORD",
                    "unauthorized",
                ) from None
            else:
                raise failure(error, url, "Authenticate", self._timeout) from None
        metadata = (("token", token),) if token else ()
        with self._lock:
            self._tokens[index] = metadata
        return metadata

    def range(self, key: bytes, end: bytes, limit: int, revision: int, keys_only: bool = False) -> tuple[Any, int]:
        """Keys from `key` to `end` (b"": `key` alone) at `revision` (0: now): etcd's RangeResponse,
        and its size in bytes."""
        request = rpc_pb2.RangeRequest(key=key, range_end=end, limit=limit, revision=revision, keys_only=keys_only)
        answer: tuple[Any, int] = self._call("Range", request)
        return answer

    def get(self, keys: Sequence[bytes], revision: int) -> list[Any]:
        """Exact keys at `revision` (0: now) in one transaction: the KeyValues of those present."""
        reads = [rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=k, revision=revision)) for k in keys]
        answer = self._call("Txn", rpc_pb2.TxnRequest(success=reads))
        return [kv for each in answer.responses for kv in each.response_range.kvs]

    def write_if_unchanged(self, writes: Sequence[tuple[bytes, int, bytes | None]]) -> bool:
        """(key, mod revision, value or None to delete) in one transaction, all if every key is
        still at its revision (0: absent), none otherwise; whether they were written.

        A transaction tried again after a try went unanswered (a timeout, a dropped connection) may
        have committed at that try, and then fails its compare on its own writes. So where such a
        one fails, the keys are read: each as the writes leave it means they were written.
        """
        compare = rpc_pb2.Compare
        compares = [compare(key=k, result=compare.EQUAL, target=compare.MOD, mod_revision=r) for k, r, _ in writes]
        operations = [
            rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=k))
            if v is None
            else rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=k, value=v))
            for k, _, v in writes
        ]
        tries: list[int] = []
        answer = self._call("Txn", rpc_pb2.TxnRequest(compare=compares, success=operations), tries)
        if answer.succeeded or UNANSWERED not in tries:
            return bool(answer.succeeded)
        try:
            now = {kv.key: kv.value for kv in self.get([key for key, _, _ in writes], 0)}
        except DatastoreError as error:
            error.in_doubt = 1  # the transaction's first try may have committed, and this cannot tell
            raise
        return all(now.get(key) == value for key, _, value in writes)

    def close(self) -> None:
        """Close every channel: calls still in flight (a read a stopped run left) are cancelled."""
        with self._lock:
            self._closed = True
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()
