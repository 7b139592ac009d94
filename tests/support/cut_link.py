"""A loopback TCP relay to a real server that can be cut, to fail a client mid-conversation."""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

HTTP2_PREFACE = b"PRI * HTTP/2.0"
_HEADERS, _DATA = 1, 0


def _whole_frames(buffered: bytes, doomed: bool) -> tuple[bytes, bytes, bool]:
    """The whole HTTP/2 frames at the start of `buffered` that may be relayed, what is left, and
    whether an answer (HEADERS or DATA) came where `doomed`: it and what follows are not relayed."""
    end = 0
    while len(buffered) - end >= 9:
        size = int.from_bytes(buffered[end : end + 3], "big")
        if len(buffered) - end < 9 + size:
            break
        if doomed and buffered[end + 3] in (_HEADERS, _DATA):
            return buffered[:end], b"", True
        end += 9 + size
    return buffered[:end], buffered[end:], False


class CutLink:
    """Relays 127.0.0.1:<port> to a target; after `cut_after` bytes sent back to clients, it
    drops every connection and refuses new ones, as a network partition would.

    `lose_answer_to`: the answers to the first `losses` requests (one by default) whose bytes
    hold it are lost. Such a request reaches the server, and once the server answers, that
    connection is dropped unanswered (a timeout or a reset after the server acted); new
    connections are relayed as before. On HTTP/2 (gRPC) the answer is the first HEADERS or DATA
    frame the server sends after the request: the frames before it (PING, SETTINGS,
    WINDOW_UPDATE) are the transport's, sent before the server has acted."""

    def __init__(
        self, target_port: int, cut_after: int | None = None, lose_answer_to: bytes | None = None, losses: int = 1
    ) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.lose_answer_to = lose_answer_to
        self.losses = losses
        self.doomed = 0  # requests that held the marker, so far
        self.lost = threading.Event()  # an answer was lost
        self._doomed: set[socket.socket] = set()  # clients whose next answer is lost
        self._http2: set[socket.socket] = set()  # clients that spoke HTTP/2
        self.relayed = 0
        self.cut = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, to_client: bool) -> None:
        seen = b""  # the end of what the client sent, so that a marker split across reads is found
        frames = b""  # from an HTTP/2 server: what is not yet a whole frame
        with suppress(OSError):
            while not self.cut.is_set():
                data = source.recv(65536)
                if not data:
                    break
                marker = self.lose_answer_to
                if marker and not to_client and self.doomed < self.losses:
                    seen = (seen + data)[-len(data) - len(marker) :]
                    if data.startswith(HTTP2_PREFACE):
                        with self._lock:
                            self._http2.add(source)
                    if marker in seen and source not in self._doomed:
                        with self._lock:
                            self._doomed.add(source)
                            self.doomed += 1
                if marker and to_client and sink in self._http2:
                    frames += data
                    data, frames, answered = _whole_frames(frames, sink in self._doomed)
                    if data:
                        sink.sendall(data)
                    if answered:
                        self._lose(source, sink)
                        return
                    continue
                if to_client and sink in self._doomed:
                    self._lose(source, sink)
                    return
                if to_client:
                    with self._lock:
                        self.relayed += len(data)
                        over = self.cut_after is not None and self.relayed > self.cut_after
                    if over:
                        self.sever()
                        return
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _lose(self, server: socket.socket, client: socket.socket) -> None:
        self.lost.set()
        for sock in (server, client):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def sever(self) -> None:
        """Drop every connection at once (shut down, so that the other end sees it now, not when a
        relaying thread next wakes) and refuse new ones."""
        self.cut.set()
        with self._lock:
            for sock in [self._listener, *self._sockets]:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self.sever()
