"""A loopback server that accepts every connection, reads what is sent, and never answers: what
a hung etcd or API server looks like to a client (the connection is up, the call never returns)."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc


class HoldingServer:
    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.called = threading.Event()  # set once a request has come in
        self._held: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(connection)
            threading.Thread(target=self._hold, args=(connection,), daemon=True).start()

    def _hold(self, connection: socket.socket) -> None:
        try:
            while connection.recv(65536):
                self.called.set()
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for connection in self._held:
            connection.close()


class HoldingGrpcServer:
    """A gRPC server that takes every call and never answers it: a hung etcd v3 whose HTTP/2
    connection is up and whose calls are in flight (HoldingServer's never gets that far)."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self._release = threading.Event()
        outer = self

        class Hold(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
                def hold(request: bytes, context: grpc.ServicerContext) -> bytes:
                    outer.called.set()
                    outer._release.wait(120)
                    context.abort(grpc.StatusCode.UNAVAILABLE, "held")

                return grpc.unary_unary_rpc_method_handler(hold)

        self._server = grpc.server(ThreadPoolExecutor(max_workers=8), handlers=[Hold()])
        self._port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def close(self) -> None:
        self._release.set()
        self._server.stop(grace=None)
