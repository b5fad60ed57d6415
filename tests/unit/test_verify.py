"""Readiness and verification logic against a local fake vLLM HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from clock_support import FakeClock

from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.transport.api import (
    Endpoint,
    Observation,
    UnitState,
    parse_show,
    parse_timestamp,
    show_command,
    start_to_serving,
    unit_problem,
    verdict,
    wait_ready,
)

MODEL = "/srv/models/lab-model"


class FakeVllm:
    """What the fake server answers; tests change it between polls."""

    def __init__(self) -> None:
        self.health = 200
        self.models = [MODEL]
        self.version = "0.32.0"
        self.api_key: str | None = None
        self.tokens = ["Hello", ",", " world"]
        self.requests: list[dict[str, Any]] = []


def _handler(fake: FakeVllm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            """Keep the test output free of the server's request log."""

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/health":
                self.send_response(fake.health)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/version":
                self._send(200, {"version": fake.version})
            elif self.path == "/v1/models" and self._authorised():
                self._send(200, {"object": "list", "data": [{"id": m} for m in fake.models]})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fake.requests.append(body)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for token in fake.tokens:
                chunk = {"choices": [{"index": 0, "text": token, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[FakeVllm, Endpoint]]:
    fake = FakeVllm()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield fake, Endpoint(f"http://127.0.0.1:{httpd.server_address[1]}", timeout_s=5)
    httpd.shutdown()
    httpd.server_close()


def _active(unit: str = "vllm.service", host: str = "h1", restarts: int = 0) -> UnitState:
    return UnitState(host=host, unit=unit, active_state="active", sub_state="running",
                     main_pid=42, restarts=restarts, started_at=1000.0)


def _units(*states: UnitState, now: float = 1030.0) -> Observation:
    return Observation(list(states), now)


# --- systemctl show parsing and unit problems ---------------------------------------------------

SHOW = """Id=vllm.service
LoadState=loaded
ActiveState=activating
SubState=auto-restart
Result=exit-code
MainPID=0
NRestarts=3
ExecMainStartTimestamp=@1764410000
ExecMainStatus=1
ActiveEnterTimestamp=

Id=ray-head.service
LoadState=loaded
ActiveState=active
SubState=running
Result=success
MainPID=1234
NRestarts=0
ExecMainStartTimestamp=@1764409990
ExecMainStatus=0

1764410012.250000000
"""


def test_parse_show_reads_every_unit_and_the_host_clock() -> None:
    states, now = parse_show("h1", SHOW)
    assert [s.unit for s in states] == ["vllm.service", "ray-head.service"]
    assert states[0].sub_state == "auto-restart" and states[0].restarts == 3
    assert states[0].started_at == 1764410000.0 and states[0].exit_status == 1
    assert states[1].main_pid == 1234
    assert now == pytest.approx(1764410012.25)


@pytest.mark.parametrize(("state", "expected"), [
    (UnitState("h1", "u", active_state="failed", result="exit-code", exit_status=1), "failed"),
    (UnitState("h1", "u", active_state="activating", sub_state="auto-restart"), "restarted"),
    (UnitState("h1", "u", active_state="inactive", sub_state="dead"), "process ended"),
    (UnitState("h1", "u", load_state="not-found"), "not installed"),
    (_active(restarts=2), "restarted 2 time"),
])
def test_a_failed_or_restarting_unit_is_a_problem(state: UnitState, expected: str) -> None:
    problem = unit_problem(state, baseline_restarts=0)
    assert problem is not None and expected in problem.replace("to be restarted", "restarted")


def test_an_active_unit_with_its_old_restart_count_is_fine() -> None:
    assert unit_problem(_active(restarts=5), baseline_restarts=5) is None


# --- endpoint ------------------------------------------------------------------------------------

def test_completion_is_streamed_with_temperature_zero_and_a_time_to_first_token(
        server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    completion = endpoint.complete(MODEL, prompt="Hi", max_tokens=4)
    assert completion.text == "Hello, world"
    assert 0 <= completion.ttft_s <= completion.total_s
    assert fake.requests == [{"model": MODEL, "prompt": "Hi", "max_tokens": 4,
                              "temperature": 0, "stream": True}]


def test_api_key_is_sent_to_v1_routes(server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.api_key = "sk-1"
    with pytest.raises(ProvisionError, match="401"):
        endpoint.served_models()
    keyed = Endpoint(endpoint.base_url, api_key="sk-1")
    assert keyed.served_models() == [MODEL]
    assert keyed.complete(MODEL).text == "Hello, world"


def test_completion_without_text_is_an_error(server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.tokens = []
    with pytest.raises(ProvisionError, match="no text"):
        endpoint.complete(MODEL)


def test_health_is_none_when_the_port_refuses() -> None:
    assert Endpoint("http://127.0.0.1:9", timeout_s=1).health() is None


# --- wait_ready ----------------------------------------------------------------------------------

def test_ready_when_units_active_health_200_and_model_listed(
        server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    clock = FakeClock()
    ready = wait_ready(observe=lambda: _units(_active()), journal=lambda s: "",
                       endpoint=endpoint, model=MODEL, timeout_s=60, clock=clock,
                       sleep=clock.sleep)
    assert ready.already_serving and ready.start_to_serving_s == 30.0
    assert clock.sleeps == []


def test_waits_while_loading_then_reports_start_to_serving(
        server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.health = 503  # replaced below before the first poll sees it
    polls = iter(range(100))

    def observe() -> Observation:
        index = next(polls)
        # loading for 3 polls: the port "refuses" (a 404 stands in), then serving
        fake.health = 404 if index < 3 else 200
        return _units(_active(), now=1000.0 + 10 * index)

    clock = FakeClock()
    ready = wait_ready(observe=observe, journal=lambda s: "", endpoint=endpoint, model=MODEL,
                       timeout_s=60, poll_s=2, clock=clock, sleep=clock.sleep)
    assert not ready.already_serving
    assert clock.sleeps == [2, 2, 2]
    assert ready.start_to_serving_s == 30.0


@pytest.mark.parametrize(("observation", "reason"), [
    (Observation([UnitState("h1", "vllm.service", active_state="active", started_at=None)],
                 1030.0),
     "systemd reported no start time (ExecMainStartTimestamp) for h1:vllm.service"),
    (Observation([_active()], None), "the master's clock was not read"),
    (Observation([_active(unit="ray-head.service")], 1030.0), "no vLLM unit (vllm.service)"),
])
def test_start_to_serving_that_cannot_be_measured_is_none_with_the_reason(
        server: tuple[FakeVllm, Endpoint], observation: Observation, reason: str) -> None:
    fake, endpoint = server
    ready = wait_ready(observe=lambda: observation, journal=lambda s: "", endpoint=endpoint,
                       model=MODEL, timeout_s=60, clock=FakeClock(), sleep=FakeClock().sleep)
    assert ready.start_to_serving_s is None
    assert ready.start_to_serving_reason is not None
    assert ready.start_to_serving_reason.startswith(reason)


def test_a_measured_start_to_serving_has_no_reason() -> None:
    assert start_to_serving(_units(_active(), _active(host="h2")), {"vllm.service"}) == \
        (30.0, None)


def test_up_never_prints_none_as_a_time() -> None:
    from vllm_provision.cli.up import serving_line

    line = serving_line({"start_to_serving_s": None, "ttft_s": 0.12})
    assert "None" not in line
    assert line == "start to serving: not measured; time to first token: 0.12 s"
    assert serving_line({"start_to_serving_s": 533.4, "ttft_s": 0.1, "already_serving": True}) \
        == ("start to serving: not measured (already serving, its vLLM units started 533.4 s "
            "ago); time to first token: 0.1 s")


def test_a_unit_that_restarts_ends_the_wait_at_once_with_its_journal(
        server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.health = 404
    crashing = UnitState("h2", "vllm.service", active_state="activating",
                         sub_state="auto-restart", result="exit-code", exit_status=1)
    clock = FakeClock()
    states = iter([_units(_active(), _active(host="h2")), _units(_active(), crashing)])
    with pytest.raises(ProvisionError) as error:
        wait_ready(observe=lambda: next(states),
                   journal=lambda s: f"{s.host} ImportError: no module named vllm",
                   endpoint=endpoint, model=MODEL, timeout_s=1800, clock=clock,
                   sleep=clock.sleep)
    text = str(error.value)
    assert "h2:vllm.service" in text and "ImportError" in text
    assert clock.now < 5  # one poll interval, not the 1800 s timeout


def test_restart_count_growing_between_polls_is_a_crash(
        server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.health = 404
    clock = FakeClock()
    states = iter([_units(_active(restarts=1)), _units(_active(restarts=2))])
    with pytest.raises(ProvisionError, match="restarted 1 time"):
        wait_ready(observe=lambda: next(states), journal=lambda s: "", endpoint=endpoint,
                   model=MODEL, timeout_s=60, clock=clock, sleep=clock.sleep)


def test_engine_dead_503_fails_at_once(server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.health = 503
    clock = FakeClock()
    with pytest.raises(ProvisionError, match="engine is dead"):
        wait_ready(observe=lambda: _units(_active()), journal=lambda s: "EngineDeadError",
                   endpoint=endpoint, model=MODEL, timeout_s=60, clock=clock, sleep=clock.sleep)
    assert clock.now == 0


def test_timeout_names_what_was_last_seen_and_the_extra_diagnosis(
        server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.models = ["other"]
    clock = FakeClock()
    checks: list[float] = []

    def extra() -> Problem | None:
        checks.append(clock.now)
        return None

    with pytest.raises(ProvisionError) as error:
        wait_ready(observe=lambda: _units(_active()), journal=lambda s: "", endpoint=endpoint,
                   model=MODEL, timeout_s=20, poll_s=1, extra_check=extra,
                   extra_check_every_s=5, clock=clock, sleep=clock.sleep)
    assert "within 20 s" in str(error.value) and "'other'" in str(error.value)
    assert clock.now == 20
    assert 3 <= len(checks) <= 5


def test_extra_check_problem_ends_the_wait(server: tuple[FakeVllm, Endpoint]) -> None:
    fake, endpoint = server
    fake.health = 404
    clock = FakeClock()
    mismatch = Problem("h1", "placement group pending: node:10.0.0.99 is not a Ray node")
    with pytest.raises(ProvisionError, match="10.0.0.99"):
        wait_ready(observe=lambda: _units(_active()), journal=lambda s: "", endpoint=endpoint,
                   model=MODEL, timeout_s=1800, extra_check=lambda: mismatch,
                   extra_check_every_s=5, clock=clock, sleep=clock.sleep)
    assert clock.now <= 6


# --- verdict -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("states", "health", "expected"), [
    ([_active(), _active(host="h2")], 200, "serving"),
    ([_active(), UnitState("h2", "vllm.service")], 200, "degraded"),
    ([_active(), _active(host="h2")], None, "degraded"),
    ([UnitState("h1", "vllm.service"), UnitState("h2", "vllm.service")], None, "down"),
])
def test_verdict(states: list[UnitState], health: int | None, expected: str) -> None:
    assert verdict(states, health, expected_units=2) == expected


# What systemd 247 (Debian 11) prints for show_command(): no --timestamp=unix there.
SHOW_247 = """Id=vllm.service
LoadState=loaded
ActiveState=active
SubState=running
Result=success
MainPID=812
NRestarts=0
ExecMainStartTimestamp=Tue 2026-12-01 10:23:09 UTC
ExecMainStartTimestampMonotonic=813830231
ExecMainStatus=0

clock 1796120604.6741211 828.61902633
"""


def test_parse_show_moves_the_monotonic_start_onto_the_wall_clock() -> None:
    states, now = parse_show("h1", SHOW_247)
    assert now == pytest.approx(1796120604.6741211)
    # started 828.61902633 s - 813.830231 s before the clock line
    assert states[0].started_at == pytest.approx(1796120604.6741211 - (828.61902633 - 813.830231),
                                                 abs=1e-5)


def test_parse_show_falls_back_to_the_default_timestamp_format() -> None:
    text = SHOW_247.replace("clock 1796120604.6741211 828.61902633", "1796120604.674")
    states, now = parse_show("h1", text)
    assert now == pytest.approx(1796120604.674)
    assert states[0].started_at == 1796120589.0  # Tue 2026-12-01 10:23:09 UTC


@pytest.mark.parametrize(("value", "expected"), [
    ("@1796120590", 1796120590.0), ("Tue 2026-12-01 10:23:09 UTC", 1796120589.0),
    ("n/a", None), ("", None), ("Tue 2026-12-01 10:23:09 CET", None), ("@x", None),
])
def test_parse_timestamp_forms(value: str, expected: float | None) -> None:
    assert parse_timestamp(value) == expected


def test_show_command_needs_no_newer_systemctl_option() -> None:
    command = show_command(["vllm.service"])
    assert "--timestamp" not in command
    assert command.startswith("TZ=UTC systemctl show -p ")
    assert "ExecMainStartTimestampMonotonic" in command
