"""An HTTP relay on loopback between the job and etcd's JSON gateway that counts write
transactions and can act at the Nth one: SIGKILL the job before the write reaches etcd, or
after etcd committed it but before the answer is sent back; make the write's compare fail by
rewriting one of its keys first (what a concurrent writer does); or send SIGTERM and let the
write through.

The signal is sent inside the request handler, before the job can read an answer, so where
the job is hit is exact and repeatable: no timing is involved.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import requests

Action = Literal["kill_before", "kill_after", "conflict", "sigterm", "sigint"]


def is_write(method: str, path: str, body: dict[str, Any]) -> bool:
    """A request that changes the keyspace: a v3 txn with puts or deletes, a put, a delete range;
    a v2 PUT or DELETE."""
    if method in ("PUT", "DELETE"):
        return True
    if path.endswith(("/kv/put", "/kv/deleterange")):
        return True
    if path.endswith("/kv/txn"):
        ops = [*body.get("success", []), *body.get("failure", [])]
        return any("request_put" in op or "request_delete_range" in op for op in ops)
    return False


@dataclass
class Trigger:
    index: int  # 0-based index of the write to act at
    action: Action


class WriteRelay:
    def __init__(self, etcd_url: str) -> None:
        self.etcd_url = etcd_url
        self.send_signal: Callable[[int], None] = lambda _: None  # to the job under test
        self.trigger: Trigger | None = None
        self.writes = 0
        self.fired = threading.Event()
        self.reads_wait_for: threading.Event | None = None  # hold every read until it is set
        self._lock = threading.Lock()
        self._session = requests.Session()
        self._session.trust_env = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def reset(self, trigger: Trigger | None) -> None:
        with self._lock:
            self.trigger, self.writes = trigger, 0
            self.fired.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._session.close()

    def _forward(self, method: str, path: str, raw: bytes, content_type: str | None) -> tuple[int, bytes]:
        headers = {"Content-Type": content_type} if content_type else {}
        response = self._session.request(method, self.etcd_url + path, data=raw or None, headers=headers, timeout=30)
        return response.status_code, response.content

    def _bump(self, path: str, body: dict[str, Any]) -> None:
        """Rewrite the first compared key with its own value: its mod revision moves on."""
        if path.startswith("/v2/keys/"):
            url = self.etcd_url + path.split("?", 1)[0]
            node = self._session.get(url, timeout=30).json().get("node") or {}
            if "value" in node:
                self._session.put(url, data={"value": node["value"]}, timeout=30).raise_for_status()
            return
        for compare in body.get("compare", []):
            key = compare["key"]
            found = self._session.post(f"{self.etcd_url}/v3/kv/range", json={"key": key}, timeout=30).json()
            for kv in found.get("kvs", []):
                put = {"key": key, "value": kv.get("value", "")}
                self._session.post(f"{self.etcd_url}/v3/kv/put", json=put, timeout=30).raise_for_status()
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

    def handle(self, method: str, path: str, raw: bytes, content_type: str | None) -> tuple[int, bytes] | None:
        """The answer to send, or None to drop the connection (the job is dead)."""
        body = json.loads(raw or b"{}") if method == "POST" else {}
        write = is_write(method, path, body)
        if not write and self.reads_wait_for is not None:
            self.reads_wait_for.wait(timeout=60)
        action = self.next_write() if write else None
        if action == "kill_before":
            self.send_signal(signal.SIGKILL)
            return None
        if action == "conflict":
            self._bump(path, body)
        if action in ("sigterm", "sigint"):
            self.send_signal(signal.SIGTERM if action == "sigterm" else signal.SIGINT)
        answer = self._forward(method, path, raw, content_type)
        if action == "kill_after":
            self.send_signal(signal.SIGKILL)
            return None
        return answer


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
