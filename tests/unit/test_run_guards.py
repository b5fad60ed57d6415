"""Guards around a run: --skip-check reaches preflight, no replica is an error, check mode
never waits for what only a real run would start."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_checks_preflight_module import make_ctx

from vllm_provision.core.results import Status
from vllm_provision.inventory import load_inventory
from vllm_provision.modules import http as http_module
from vllm_provision.modules import ray_wait_cluster, vllm_preflight, vllm_wait_ready, wait_for
from vllm_provision.operations.deploy import skip_check_vars

DATA = Path(__file__).resolve().parents[1] / "data" / "inventories"
GOOD = DATA / "good" / "mp-two-nodes" / "inventory.yml"


def test_skip_check_is_accepted_by_the_loader_and_reaches_preflight(tmp_path: Path) -> None:
    extra = skip_check_vars(("host", "parity"))
    inventory = load_inventory(GOOD, extra)  # the old name (vllm_skip_checks) was refused here
    result = vllm_preflight.run(make_ctx(tmp_path, vars=dict(inventory.extra_vars)), {})
    checks = {f["check"].split(".")[0] for f in result.data["findings"]}
    assert checks and not checks & {"host", "parity"}, checks


def test_no_skip_check_adds_no_variable() -> None:
    assert skip_check_vars(()) == {}


@pytest.mark.parametrize("command", [["check"], ["up", "--check"], ["restart"], ["down"]])
def test_an_inventory_without_a_replica_exits_1_before_connecting(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from vllm_provision.cli import main; main()", *command, "-i",
         str(DATA / "bad" / "no-replica.yml")],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the inventory defines no replica" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "Connect" not in result.stdout  # refused at load: no host was contacted


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed once the socket is


class _NoConnection:
    """A connection that fails the test when a check-mode wait runs a command."""

    def run(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("check mode ran a remote command to wait")


def _test(expression: str, names: dict) -> bool:
    return bool(eval(expression, {}, dict(names)))  # noqa: S307 - fixed test expressions


def _check_ctx(replica: object = None) -> SimpleNamespace:
    return SimpleNamespace(check_mode=True, test=_test, conn=_NoConnection(), host=SimpleNamespace(
        address="127.0.0.1", name="h1"), replica=replica, vars={"ray_cluster_timeout_s": 300,
                                                               "vllm_ready_timeout_s": 1800})


@pytest.mark.parametrize(("module", "args", "replica"), [
    (wait_for, {"port": 0, "timeout": 300}, None),
    (wait_for, {"port": 0, "timeout": 300, "from": "controller"}, None),
    (http_module, {"url": "http://127.0.0.1:PORT/state", "until": "json is not none", "retries": 60,
            "delay": 1}, None),
    (ray_wait_cluster, {}, SimpleNamespace(backend="ray")),
    (vllm_wait_ready, {}, SimpleNamespace(backend="mp")),
], ids=["wait_for-host", "wait_for-controller", "http-retries", "ray_wait_cluster",
        "vllm_wait_ready"])
def test_check_mode_never_waits(module: object, args: dict, replica: object) -> None:
    port = _closed_port()
    args = {k: (port if v == 0 else v.replace("PORT", str(port)) if isinstance(v, str) else v)
            for k, v in args.items()}
    started = time.monotonic()
    result = module.run(_check_ctx(replica), args)  # type: ignore[attr-defined]
    assert time.monotonic() - started < 5
    assert result.status is Status.SKIPPED, result.message
    assert "check mode" in result.message


def test_check_mode_http_still_answers_when_already_so() -> None:
    """One request is still made: a condition that already holds is reported ok."""
    import http.server as server_lib
    import threading

    class Handler(server_lib.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"whole": true}')

        def log_message(self, *args: object) -> None:
            pass

    server = server_lib.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/state"
        result = http_module.run(_check_ctx(), {"url": url, "until": "json['whole']",
                                                "retries": 60})
    finally:
        server.shutdown()
    assert result.status is Status.OK, result.message


def test_a_from_host_get_rides_on_the_command_line_and_a_keyed_one_on_stdin() -> None:
    """A plain GET from the host is the command the read batch carries (its first attempt is
    answered from the batch); with a header (a key) the request stays on stdin, off the host's
    process list, and is never batched."""
    import http.server as server_lib
    import threading

    from vllm_provision.transport.local import LocalConnection

    class Handler(server_lib.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200 if self.headers.get("X-Key", "k") == "k" else 403)
            self.end_headers()
            self.wfile.write(b'{"whole": true}')

        def log_message(self, *args: object) -> None:
            pass

    class Recording(LocalConnection):
        def __init__(self) -> None:
            super().__init__(become=False)
            self.sent: list[tuple[str, object]] = []

        def run(self, command: str, **options: object) -> object:
            self.sent.append((command, options.get("stdin")))
            return super().run(command, **options)  # type: ignore[arg-type]

    server = server_lib.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/state"
        plain = {"url": url, "from": "host", "until": "json['whole']", "retries": 2}
        conn = Recording()
        ctx = SimpleNamespace(conn=conn, check_mode=False, test=_test)
        read = http_module.read_command(ctx, plain)  # type: ignore[arg-type]
        result = http_module.run(ctx, plain)  # type: ignore[arg-type]
        assert result.status is Status.OK, result.message
        assert read is not None and conn.sent == [(read, None)]
        keyed = {**plain, "headers": {"X-Key": "k"}}
        assert http_module.read_command(ctx, keyed) is None  # type: ignore[arg-type]
        conn.sent.clear()
        assert http_module.run(ctx, keyed).status is Status.OK  # type: ignore[arg-type]
        ((command, stdin),) = conn.sent
        assert "X-Key" not in command and '"X-Key"' in str(stdin)
    finally:
        server.shutdown()


def test_a_retried_from_host_get_reaches_the_host_not_the_batch() -> None:
    """The first attempt may be answered from the play's read batch; every retry is sent (a
    cached "still held" answered again and again would wait out the cache's age instead)."""
    from vllm_provision.runner.prefetch import PrefetchingConnection
    from vllm_provision.transport.base import CommandResult

    answers = iter(['{"status": 200, "body": "{\\"whole\\": false}"}',
                    '{"status": 200, "body": "{\\"whole\\": true}"}'])

    class Host:
        name, become = "h1", False
        sent: list[str] = []

        def run(self, command: str, **options: object) -> CommandResult:
            self.sent.append(command)
            return CommandResult(0, next(answers), "")

    args = {"url": "http://127.0.0.1:29510/state", "from": "host", "until": "json['whole']",
            "retries": 3, "delay": 0}
    host = Host()
    conn = PrefetchingConnection(host)
    read = http_module.read_command(SimpleNamespace(check_mode=False), args)  # type: ignore[arg-type]
    assert read is not None
    conn.prefetch([read])  # the batch holds the first answer (whole: false)
    ctx = SimpleNamespace(conn=conn, check_mode=False, test=_test)
    result = http_module.run(ctx, args)  # type: ignore[arg-type]
    assert result.status is Status.OK and result.data["attempts"] == 2, result.message
    assert len(host.sent) == 2  # the batch, then the retry on the host
