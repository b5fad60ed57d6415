"""A stand-in of vllm-router 0.1.17's worker routes, for the unit tests of the front door's
client and of the upgrade's drain: ``GET /workers``, ``POST /add_worker?url=``,
``POST /remove_worker?url=``, answering as the real router was seen to answer
(vllm_provision/transport/router.py's docstring), and a connection whose ``open_forward``
opens a plain socket to it (as the gateway host's SSH channel would)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeRouter:
    """The router's worker list: ``workers`` url -> healthy; ``calls`` every change asked;
    ``unhealthy_add``: urls whose /add_worker never becomes healthy (400 Timeout)."""

    def __init__(self, workers: dict[str, bool]) -> None:
        self.workers = dict(workers)
        self.calls: list[tuple[str, str]] = []
        self.unhealthy_add: set[str] = set()
        router = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != "/workers":
                    return self._send(404 if not self.path.startswith("/add") else 405, "")
                items = [{"url": u, "model_id": "unknown", "is_healthy": h, "load": 0}
                         for u, h in router.workers.items()]
                return self._send(200, json.dumps({"workers": items, "total": len(items)}))

            def do_POST(self) -> None:  # noqa: N802
                path, _, query = self.path.partition("?")
                url = urllib.parse.parse_qs(query).get("url", [""])[0]
                router.calls.append((path, url))
                if path == "/remove_worker":
                    router.workers.pop(url, None)
                    return self._send(200, f"Successfully removed worker: {url}")
                if path == "/add_worker":
                    if url in router.workers:
                        return self._send(400, f"Worker {url} already exists")
                    if url in router.unhealthy_add:
                        return self._send(400, f"Timeout 600s waiting for worker {url}")
                    router.workers[url] = True
                    return self._send(200, f"Successfully added worker: {url}")
                return self._send(404, "")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]


@contextmanager
def serving(router: FakeRouter) -> Iterator[FakeRouter]:
    """Serve ``router`` in a thread for the block."""
    thread = threading.Thread(target=router.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield router
    finally:
        router.server.shutdown()
        router.server.server_close()


class ForwardingConnection:
    """A gateway host's connection: ``open_forward`` opens a socket to the fake router's port
    whatever address it is asked for (the router listens on the host's loopback), and records
    the destinations; ``broken``: every forward fails as a lost SSH connection would."""

    def __init__(self, port: int, broken: bool = False) -> None:
        self.port = port
        self.broken = broken
        self.forwards: list[tuple[str, int]] = []

    def open_forward(self, address: str, port: int, timeout_s: float | None = 10.0) -> Any:
        self.forwards.append((address, port))
        if self.broken:
            raise ConnectionError("connection to 10.0.0.13:22 lost")
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
