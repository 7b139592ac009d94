"""A loopback TCP relay to a real server that can be cut, to fail a client mid-conversation."""

from __future__ import annotations

import socket
import threading
from contextlib import suppress


class CutLink:
    """Relays 127.0.0.1:<port> to a target; after `cut_after` bytes sent back to clients, it
    drops every connection and refuses new ones, as a network partition would."""

    def __init__(self, target_port: int, cut_after: int | None = None) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
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
        with suppress(OSError):
            while not self.cut.is_set():
                data = source.recv(65536)
                if not data:
                    break
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

    def sever(self) -> None:
        self.cut.set()
        with self._lock:
            for sock in [self._listener, *self._sockets]:
                with suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self.sever()
