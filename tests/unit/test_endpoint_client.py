"""The direct ``Endpoint``'s shared keep-alive client: the readiness wait, verify and status reuse
one TCP connection to rank 0 (each new one costs a round trip), and a GET whose kept-alive
connection the server closed in between is sent once more (RFC 9110 section 9.2.2: GET is
idempotent). A tiny HTTP/1.1 server on the loopback counts the connections it accepts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.transport import api
from vllm_provision.transport.api import Endpoint


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    accepted = 0

    def get_request(self) -> Any:
        request = super().get_request()
        self.accepted += 1
        return request


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless a side says close

    def do_GET(self) -> None:
        body = json.dumps({"version": "0.26.0", "data": [{"id": "m"}]}).encode()
        self.send_response(200 if self.path != "/missing" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_health_version_and_models_share_one_kept_alive_connection(server: _Server) -> None:
    endpoint = Endpoint(f"http://127.0.0.1:{server.server_port}", timeout_s=5.0)
    assert endpoint.health() == 200
    assert endpoint.version() == "0.26.0"
    assert endpoint.served_models() == ["m"]
    # a second Endpoint object of the same process reuses the same client too
    assert Endpoint(endpoint.base_url, timeout_s=2.0).health() == 200
    assert server.accepted == 1


def test_an_error_status_is_an_error_and_the_connection_stays_usable(server: _Server) -> None:
    endpoint = Endpoint(f"http://127.0.0.1:{server.server_port}", timeout_s=5.0)
    with pytest.raises(ProvisionError, match="404"):
        endpoint.get_json("/missing")
    assert endpoint.health() == 200
    assert server.accepted == 1


class _ClosedOnce:
    """A client whose first GET finds its kept-alive connection closed by the server."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def get(self, url: str, **kwargs: Any) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return f"answer to {url}"


def test_a_get_on_a_connection_the_server_closed_is_sent_once_more() -> None:
    client = _ClosedOnce(failures=1)
    assert api._get(client, "http://h/health") == "answer to http://h/health"
    assert client.calls == 2


def test_a_get_is_sent_at_most_twice() -> None:
    client = _ClosedOnce(failures=2)
    with pytest.raises(httpx.RemoteProtocolError):
        api._get(client, "http://h/health")
    assert client.calls == 2


def test_a_refused_port_reads_as_no_answer() -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as closed:
        port = closed.server_port
    assert Endpoint(f"http://127.0.0.1:{port}", timeout_s=1.0).health() is None
