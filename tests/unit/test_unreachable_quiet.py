"""A host that accepts TCP and closes before its SSH banner (sshd's MaxStartups, a port that is
not sshd): the CLI reports it as `unreachable` with the fix and no traceback. paramiko logs that
failure from its transport thread at ERROR with a traceback; it shows from -vv only."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def closing_port() -> Iterator[tuple[int, int]]:
    """Two such ports (one per host: two inventory hosts may not be one SSH target)."""
    servers = [socket.socket(), socket.socket()]
    for server in servers:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.2)
    stop = threading.Event()

    def serve(server: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()  # before any banner

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    yield servers[0].getsockname()[1], servers[1].getsockname()[1]
    stop.set()
    for thread in threads:
        thread.join()
    for server in servers:
        server.close()


def _run(tmp_path: Path, ports: tuple[int, int], *extra: str
         ) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(f"""\
all:
  children:
    vllm_replicas:
      children:
        llama:
          vars: {{vllm_model: /srv/models/m, vllm_tensor_parallel_size: 1}}
          hosts:
            h1: {{ansible_host: 127.0.0.1, ansible_port: {ports[0]}, vllm_node_rank: 0,
                 vllm_host_ip: 10.0.0.1}}
            h2: {{ansible_host: 127.0.0.1, ansible_port: {ports[1]}, vllm_node_rank: 1,
                 vllm_host_ip: 10.0.0.2}}
""")
    return subprocess.run(
        [sys.executable, "-c", "from vllm_provision.cli import main; main()", "up", "--check",
         "-i", str(inventory), "--timeout", "5", *extra],
        capture_output=True, text=True, timeout=120, check=False)


def test_a_host_closing_before_the_banner_is_unreachable_without_a_traceback(
        tmp_path: Path, closing_port: tuple[int, int]) -> None:
    result = _run(tmp_path, closing_port)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "unreachable: [h1]" in output and "Error reading SSH protocol banner" in output
    assert "Traceback" not in output and "ERROR paramiko" not in output, output


def test_an_incomplete_plan_says_so(tmp_path: Path, closing_port: tuple[int, int]) -> None:
    """A check-mode plan that could not read every node claims nothing about the replica."""
    output = _run(tmp_path, closing_port).stdout
    assert "keeps serving" not in output, output
    assert "plan incomplete" in output and "h1, h2" in output, output
