"""A loopback HTTP server on threads of its own: the Kubernetes API test server, the write relay's
etcd v2 side and the tests' odd servers."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# How often a server's loop looks for a shutdown (seconds). At socketserver's default, 0.5 s,
# stopping a server waited a quarter of a second on average, at the end of nearly every test.
POLL_INTERVAL = 0.02


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A server on a free loopback port, answering each request on a thread, until `stop`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(POLL_INTERVAL,), daemon=True).start()
    return server


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()
