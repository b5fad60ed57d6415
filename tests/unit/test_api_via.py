"""``vllm_api_via``: its kind, the choice of ``auto``, and the SSH tunnel's network backend doing a
real HTTP exchange (a socketpair stands in for the paramiko channel, a thread for sshd's
forward to a tiny local HTTP server)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_runner_support import make_inventory

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Replica
from vllm_provision.inventory.source import Origin, Problems, Setting
from vllm_provision.inventory.values import check_setting
from vllm_provision.transport import tunnel
from vllm_provision.transport.api import Endpoint

ORIGIN = Origin(Path("inventory.yml"), ("all", "vars", "vllm_api_via"))
# TEST-NET-1 (RFC 5737): never routed; a request that did not go through the tunnel fails
NOWHERE = "192.0.2.1"


@pytest.fixture(autouse=True)
def _fresh_choices() -> Iterator[None]:
    tunnel.forget()
    yield
    tunnel.forget()


@pytest.mark.parametrize("value", ["auto", "direct", "ssh"])
def test_the_three_values_are_accepted(value: str) -> None:
    problems = Problems()
    assert check_setting("vllm_api_via", Setting(value, ORIGIN), problems) is not None
    assert not problems.items


@pytest.mark.parametrize("value", ["tunnel", "SSH", "", 1])
def test_another_value_names_the_item_what_was_expected_and_the_fix(value: Any) -> None:
    problems = Problems()
    assert check_setting("vllm_api_via", Setting(value, ORIGIN), problems) is None
    text = " ".join(str(p) for p in problems.items)
    assert "vllm_api_via" in text and "auto, direct, ssh" in text


def _never(address: str, port: int, timeout_s: float) -> tuple[bool, str]:
    raise AssertionError("no probe expected")


def test_auto_with_a_refused_connection_is_direct() -> None:
    choice = tunnel.choose("0.0.0.0", "10.0.0.11", 8000, "auto",
                           probe=lambda a, p, t: (True, "connection refused"))
    assert (choice.via, choice.setting) == ("direct", "auto")
    assert "refused" in choice.reason


def test_auto_with_a_timeout_is_ssh() -> None:
    choice = tunnel.choose("0.0.0.0", "10.0.0.11", 8000, "auto",
                           probe=lambda a, p, t: (False, "no answer within 2 s"))
    assert choice.via == "ssh" and "not reachable" in choice.reason


@pytest.mark.parametrize("api_host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_auto_with_an_api_on_loopback_is_ssh_without_a_probe(api_host: str) -> None:
    choice = tunnel.choose(api_host, api_host, 8000, "auto", probe=_never)
    assert choice.via == "ssh" and "loopback" in choice.reason


def test_a_loopback_bind_on_the_controller_itself_is_probed() -> None:
    choice = tunnel.choose("127.0.0.1", "127.0.0.1", 8000, "auto", local=True,
                           probe=lambda a, p, t: (True, "/health answered HTTP 200"))
    assert choice.via == "direct"


@pytest.mark.parametrize("setting", ["direct", "ssh"])
def test_an_explicit_setting_is_taken_without_a_probe(setting: str) -> None:
    assert tunnel.choose("127.0.0.1", "127.0.0.1", 8000, setting, probe=_never).via == setting


def test_the_probe_counts_a_refused_port_as_reachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    reachable, seen = tunnel.probe_direct("127.0.0.1", port, 1.0)
    assert reachable and "refused" in seen


def test_the_probe_counts_no_answer_as_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    def silent(address: Any, timeout: float | None = None) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    reachable, seen = tunnel.probe_direct("10.0.0.11", 8000, 0.5)
    assert not reachable and "0.5 s" in seen


class _Api(BaseHTTPRequestHandler):
    """``/health``, ``/v1/models`` and a streamed ``/v1/completions``, as vLLM answers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self._send(b"")
        else:
            self._send(json.dumps({"data": [{"id": "tiny"}]}).encode())

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        events = [{"choices": [{"text": word, "finish_reason": None}]} for word in ("a", "b")]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(body.encode(), "text/event-stream")


@pytest.fixture
def api_server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (sink,):
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass


class FakeSshHost:
    """Stands in for rank 0's connection: ``open_forward`` returns one end of a socketpair whose
    other end is joined to ``127.0.0.1:<port>`` on this machine, as sshd joins a direct-tcpip
    channel to its destination. Records each (address, port) asked for."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.opened: list[tuple[str, int]] = []

    def open_forward(self, address: str, port: int, timeout_s: float | None) -> socket.socket:
        self.opened.append((address, port))
        ours, theirs = socket.socketpair()
        upstream = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        for a, b in ((theirs, upstream), (upstream, theirs)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()
        return ours


def _replica(tmp_path: Path, **group_vars: Any) -> Replica:
    inventory = make_inventory(tmp_path, group_vars=group_vars)
    replica = inventory.replicas[0]
    engine = replace(replica.engine, api_host=str(group_vars.get("vllm_api_host", "0.0.0.0")))
    nodes = tuple(replace(n, host_ip=NOWHERE) if n.rank == 0 else n for n in replica.nodes)
    return replace(replica, engine=engine, nodes=nodes)


def test_an_http_exchange_goes_through_the_tunnel(tmp_path: Path, api_server: int) -> None:
    host = FakeSshHost(api_server)
    replica = _replica(tmp_path, vllm_api_via="ssh")
    route = tunnel.route_for(replica, host)
    assert route.via == "ssh" and route.describe == "ssh via h1"
    assert route.base_url == f"http://{NOWHERE}:8000"  # never dialled: the tunnel carries it
    endpoint = Endpoint.for_replica(replica, timeout_s=5, route=route)
    assert endpoint.health() == 200
    assert endpoint.served_models() == ["tiny"]
    completion = endpoint.complete("tiny")
    assert completion.text == "ab"
    # an all-interfaces bind is reached on rank 0's own loopback
    assert host.opened and all(dest == ("127.0.0.1", 8000) for dest in host.opened)


def test_concurrent_streams_take_one_channel_each(tmp_path: Path, api_server: int) -> None:
    from vllm_provision.evidence import load

    host = FakeSshHost(api_server)
    route = tunnel.route_for(_replica(tmp_path, vllm_api_via="ssh"), host)
    results, _ = load.run_load(route.base_url + "/v1/completions", "tiny", ["x"] * 6, 2, 3,
                               [0.0] * 6, read_timeout_s=5, route=route)
    assert [r.error for r in results] == [None] * 6 and all(r.done for r in results)
    # one channel per HTTP connection; a stream left at [DONE] is not reused (httpcore closes
    # a connection whose body was not read to its end), so up to one per request
    assert 1 <= len(host.opened) <= 6


def test_a_refused_channel_is_no_answer_and_a_slow_one_a_connect_timeout(
        tmp_path: Path) -> None:
    import httpx

    class Refusing:
        def open_forward(self, address: str, port: int, timeout_s: float | None) -> Any:
            raise ConnectionRefusedError("h1: 127.0.0.1:8000: Connection refused")

    class Slow:
        def open_forward(self, address: str, port: int, timeout_s: float | None) -> Any:
            raise TimeoutError("no channel within 1 s")

    replica = _replica(tmp_path, vllm_api_via="ssh")
    assert Endpoint.for_replica(replica, 1, tunnel.route_for(replica, Refusing())).health() is None
    with pytest.raises(httpx.ConnectTimeout), \
            tunnel.route_for(replica, Slow()).client(1) as client:
        client.get("http://x/health")


def test_the_loopback_bind_is_the_channel_destination(tmp_path: Path, api_server: int) -> None:
    host = FakeSshHost(api_server)
    replica = _replica(tmp_path, vllm_api_host="127.0.0.1")
    route = tunnel.route_for(replica, host, probe=_never)
    assert route.via == "ssh" and route.choice.setting == "auto"
    assert Endpoint.for_replica(replica, 5, route).health() == 200
    assert host.opened == [("127.0.0.1", 8000)]


def test_ssh_without_a_connection_to_rank_0_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError) as caught:
        tunnel.route_for(_replica(tmp_path, vllm_api_via="ssh"), None)
    text = caught.value.render()
    assert "h1" in text and "no SSH connection to rank 0" in text and "vllm_api_via" in text


def test_auto_is_probed_once_per_replica(tmp_path: Path) -> None:
    calls: list[str] = []

    def probe(address: str, port: int, timeout_s: float) -> tuple[bool, str]:
        calls.append(address)
        return True, "connection refused"

    replica = _replica(tmp_path)
    assert tunnel.route_for(replica, probe=probe).via == "direct"
    assert tunnel.route_for(replica, probe=probe).via == "direct"
    assert calls == [NOWHERE]


@pytest.mark.parametrize(("api_host", "destination"), [
    ("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "::1"), ("127.0.0.1", "127.0.0.1"),
    ("10.0.0.11", "10.0.0.11")])
def test_tunnel_destination(api_host: str, destination: str) -> None:
    assert tunnel.tunnel_destination(api_host) == destination


def _forwarding(outcome: BaseException | None) -> Any:
    """A ``HostConnection`` whose paramiko transport answers ``open_channel`` with ``outcome``
    (raised) or a channel; records what it was asked."""
    from vllm_provision.core.models import Host
    from vllm_provision.transport.base import ConnectionOptions
    from vllm_provision.transport.connection import HostConnection

    asked: list[tuple[Any, ...]] = []

    class Transport:
        def is_active(self) -> bool:
            return True

        def open_channel(self, kind: str, dest: Any, src: Any, timeout: float) -> str:
            asked.append((kind, dest, src, timeout))
            if outcome is not None:
                raise outcome
            return "channel"

    class Fabric:
        class client:  # noqa: N801 - fabric's attribute name
            @staticmethod
            def get_transport() -> Transport:
                return Transport()

        def close(self) -> None:
            """Nothing behind the fake."""

    conn = HostConnection(Host("h1", "192.0.2.1"), ConnectionOptions())
    conn._fabric = Fabric()
    return conn, asked


def test_open_forward_asks_sshd_for_a_direct_tcpip_channel() -> None:
    conn, asked = _forwarding(None)
    assert conn.open_forward("127.0.0.1", 8000, 3) == "channel"
    assert asked == [("direct-tcpip", ("127.0.0.1", 8000), ("127.0.0.1", 0), 3.0)]


def test_open_forward_maps_sshd_answers_to_os_errors() -> None:
    import paramiko

    from vllm_provision.transport.connection import HostConnection

    refused = paramiko.ChannelException(paramiko.common.OPEN_FAILED_CONNECT_FAILED,
                                        "Connection refused")
    prohibited = paramiko.ChannelException(
        paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED, "open failed")
    cases: list[tuple[BaseException, type[BaseException], str]] = [
        (refused, ConnectionRefusedError, "Connection refused"),
        (prohibited, ConnectionError, "AllowTcpForwarding"),
        (paramiko.SSHException("Timeout opening channel."), TimeoutError, "within 2 s")]
    for raised, expected, words in cases:
        conn, _ = _forwarding(raised)
        assert isinstance(conn, HostConnection)
        with pytest.raises(expected, match=words):
            conn.open_forward("127.0.0.1", 8000, 2)



def test_choices_for_probes_a_fleet_side_by_side(tmp_path: Path) -> None:
    """Three replicas' auto probes run at once (each waits for the other two at a barrier,
    which a one-after-the-other probe never passes), and each replica gets its own answer."""
    met = threading.Barrier(3, timeout=10)

    def together(address: str, port: int, timeout_s: float) -> tuple[bool, str]:
        met.wait()
        return (port == 8000, f"probed {address}:{port}")

    base = _replica(tmp_path, vllm_api_via="auto")
    replicas = [replace(base, name=f"r{i}", engine=replace(base.engine, api_port=8000 + i))
                for i in range(3)]
    chosen = tunnel.choices_for(replicas, probe=together)
    assert [chosen[f"r{i}"].via for i in range(3)] == ["direct", "ssh", "ssh"]
    assert all(f":{8000 + i}" in chosen[f"r{i}"].reason for i in range(3))


def test_the_tunnel_verifies_tls_with_the_direct_requests_context() -> None:
    """The tunnel's connection pool carries the TLS context a direct request uses (the
    operator's CA bundle), not httpcore's default."""
    transport = tunnel.tunnel_transport(tunnel.TunnelBackend(lambda timeout: None, "test"))
    assert transport._pool._ssl_context is tunnel.ssl_context()
