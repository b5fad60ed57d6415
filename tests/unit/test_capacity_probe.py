"""``operations.fleet.CapacityProbe``: what counts as serving in a tick of the rolling
upgrade's capacity probe (``GET /health`` of every replica at once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_provision.operations.fleet import CapacityProbe


class Health(BaseHTTPRequestHandler):
    """/<code>/<delay ms>/health: answers ``code`` after ``delay`` milliseconds."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _, code, delay, _ = self.path.split("/")
        time.sleep(int(delay) / 1000)
        self.send_response(int(code))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def test_a_slow_but_healthy_replica_counts_as_serving(server: str) -> None:
    """An answer of 200 after 1.2 s (a loaded controller or host) is a serving replica, also
    with a one-second interval; a 500, a refusal and no answer within the timeout are not."""
    import socket

    with socket.socket() as s:  # a port nobody listens on: refused
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    probe = CapacityProbe({"fast": f"{server}/200/0", "slow": f"{server}/200/1200",
                           "failing": f"{server}/500/0", "refused": closed,
                           "hung": f"{server}/200/2500"},
                          interval_s=1.0, health_timeout_s=2.0)
    with ThreadPoolExecutor(5) as pool:
        probe._started = time.monotonic()
        sample = probe.tick(pool)
    assert sample["serving"] == 2
    assert sorted(sample["down"]) == ["failing", "hung", "refused"]


def test_the_summary_keeps_the_lowest_count(server: str) -> None:
    probe = CapacityProbe({"a": f"{server}/200/0", "b": f"{server}/500/0"}, interval_s=0.2)
    probe.start()
    time.sleep(0.7)
    summary = probe.stop()
    assert summary["replicas"] == 2
    assert summary["min_serving"] == 1
    assert len(summary["samples"]) >= 2
