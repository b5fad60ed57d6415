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
