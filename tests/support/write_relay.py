"""A relay on loopback between the job and a real etcd that counts write transactions and can
act at the Nth one: SIGKILL the job before the write reaches etcd, or after etcd committed it
but before the answer is sent back; make the write's compare fail by rewriting one of its keys
first (what a concurrent writer does); or send SIGTERM and let the write through.

It speaks both of etcd's APIs the job uses: gRPC for v3 (`url`: grpcio's generic handlers pass
every call through as bytes, a Txn is decoded only to tell a write from a read) and HTTP for the
v2 keys API (`v2_url`). The signal is sent inside the handler, before the job can read an
answer, so where the job is hit is exact and repeatable: no timing is involved.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal, TypeVar

import grpc
import requests
from etcd3.etcdrpc import rpc_pb2, rpc_pb2_grpc

from tests.support import http_server
from tests.support.etcd_server import EtcdServer

T = TypeVar("T")
Action = Literal["kill_before", "kill_after", "conflict", "sigterm", "sigint"]


KV = "/etcdserverpb.KV/"


def is_grpc_write(method: str, request: bytes) -> bool:
    """A v3 call that changes the keyspace: a put, a delete range, a txn with puts or deletes."""
    if method in (KV + "Put", KV + "DeleteRange"):
        return True
    if method == KV + "Txn":
        txn = rpc_pb2.TxnRequest.FromString(request)
        ops = [*txn.success, *txn.failure]
        return any(op.WhichOneof("request") in ("request_put", "request_delete_range") for op in ops)
    return False


@dataclass
class Trigger:
    index: int  # 0-based index of the write to act at
    action: Action


class WriteRelay:
    def __init__(self, etcd: EtcdServer) -> None:
        self.etcd_url = etcd.url
        self.send_signal: Callable[[int], None] = lambda _: None  # to the job under test
        self.trigger: Trigger | None = None
        self.writes = 0
        self.fired = threading.Event()
        self.reads_wait_for: threading.Event | None = None  # hold every read until it is set
        self._lock = threading.Lock()
        self._session = requests.Session()
        self._session.trust_env = False
        self._server = http_server.serve(_handler(self))
        self._upstream = grpc.insecure_channel(f"127.0.0.1:{etcd.client_port}")
        self._kv = rpc_pb2_grpc.KVStub(self._upstream)
        self._grpc = grpc.server(ThreadPoolExecutor(max_workers=16), handlers=[_GrpcRelay(self)])
        self._grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()

    @property
    def url(self) -> str:
        """etcd v3, gRPC."""
        return f"http://127.0.0.1:{self._grpc_port}"

    @property
    def v2_url(self) -> str:
        """etcd v2, HTTP."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def reset(self, trigger: Trigger | None) -> None:
        with self._lock:
            self.trigger, self.writes = trigger, 0
            self.fired.clear()

    def close(self) -> None:
        self._grpc.stop(grace=None)
        self._upstream.close()
        http_server.stop(self._server)
        self._session.close()

    def _forward(self, method: str, path: str, raw: bytes, content_type: str | None) -> tuple[int, bytes]:
        headers = {"Content-Type": content_type} if content_type else {}
        response = self._session.request(method, self.etcd_url + path, data=raw or None, headers=headers, timeout=30)
        return response.status_code, response.content

    def _bump(self, path: str) -> None:
        """Rewrite the key with its own value: its modified index moves on."""
        url = self.etcd_url + path.split("?", 1)[0]
        node = self._session.get(url, timeout=30).json().get("node") or {}
        if "value" in node:
            self._session.put(url, data={"value": node["value"]}, timeout=30).raise_for_status()

    def _bump_compared(self, request: bytes) -> None:
        """Rewrite the first compared key of a txn that is there with its own value: its mod revision moves on."""
        for compare in rpc_pb2.TxnRequest.FromString(request).compare:
            for kv in self._kv.Range(rpc_pb2.RangeRequest(key=compare.key), timeout=30).kvs:
                self._kv.Put(rpc_pb2.PutRequest(key=kv.key, value=kv.value), timeout=30)
                return

    def next_write(self) -> Action | None:
        """Count one write; the action to take at it when it is the trigger's."""
        with self._lock:
            index, self.writes = self.writes, self.writes + 1
            trigger = self.trigger if self.trigger is not None and self.trigger.index == index else None
        if trigger is None:
            return None
        self.fired.set()
        return trigger.action

    def _relay(self, write: bool, bump: Callable[[], None], forward: Callable[[], T]) -> T | None:
        """`forward()`'s answer, or None to drop it (the job is dead), acting first if this write
        is the trigger's."""
        if not write and self.reads_wait_for is not None:
            self.reads_wait_for.wait(timeout=60)
        action = self.next_write() if write else None
        if action == "kill_before":
            self.send_signal(signal.SIGKILL)
            return None
        if action == "conflict":
            bump()
        if action in ("sigterm", "sigint"):
            self.send_signal(signal.SIGTERM if action == "sigterm" else signal.SIGINT)
        answer = forward()
        if action == "kill_after":
            self.send_signal(signal.SIGKILL)
            return None
        return answer

    def handle(self, method: str, path: str, raw: bytes, content_type: str | None) -> tuple[int, bytes] | None:
        """An etcd v2 request's answer, or None to drop the connection."""
        write = method in ("PUT", "DELETE")
        return self._relay(write, lambda: self._bump(path), lambda: self._forward(method, path, raw, content_type))

    def handle_grpc(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        """An etcd v3 call's answer, passed through as bytes; aborted when it is dropped."""

        def forward() -> bytes:
            try:
                answer: bytes = self._upstream.unary_unary(method)(request, timeout=30)
            except grpc.RpcError as error:
                context.abort(error.code(), error.details() or "")
            return answer

        answer = self._relay(is_grpc_write(method, request), lambda: self._bump_compared(request), forward)
        if answer is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "relay: the job was killed")
        return answer


class _GrpcRelay(grpc.GenericRpcHandler):
    """Every unary call, as bytes, through WriteRelay.handle_grpc (the job makes no streaming call)."""

    def __init__(self, relay: WriteRelay) -> None:
        self._relay = relay

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method

        def behave(request: bytes, context: grpc.ServicerContext) -> bytes:
            return self._relay.handle_grpc(method, request, context)

        return grpc.unary_unary_rpc_method_handler(behave)


def _handler(relay: WriteRelay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes: without this, Nagle's algorithm and the
            # client's delayed ACK hold every answer back ~40 ms.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _relay(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer = relay.handle(self.command, self.path, raw, self.headers.get("Content-Type"))
            if answer is None:
                self.close_connection = True
                return
            self._send(answer)

        do_GET = do_POST = do_PUT = do_DELETE = _relay

        def _send(self, answer: tuple[int, bytes]) -> None:
            status, content = answer
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
