"""The peer watchdog (role vllm_watchdog): its decisions, its parsers, its rendered config/unit.

The decisions are checked as the sequences of polls the lab measured (docs/recovery.md): a
follower killed, rank 0 killed, a peer unreachable, a Ray head restarted; and that two nodes
applying the rules to each other converge instead of restarting each other in turn. The
completion probe of rank 0 is driven poll by poll with a fake clock, fake HTTP answers and a
fake ``systemctl``.
"""

from __future__ import annotations

import dataclasses
import http.server
import importlib.util
import json
import socket
import sys
import threading
import time
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest
import yaml

from vllm_provision.core.models import EngineArgs, Host, Node, Replica

ROLE = Path(__file__).resolve().parents[2] / "roles" / "vllm_watchdog"
SCRIPT = ROLE / "files" / "vllm_watchdog.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_watchdog_script", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


wd = _load_script()
SETTINGS = wd.Settings(poll_s=1.0, grace_s=5.0, slack_s=2.0)
MUTUAL = wd.Rule("vllm.service", "h2", "vllm.service", True)
ONE_WAY = wd.Rule("ray-worker.service", "h1", "ray-head.service", False)


def view(invocation: str, age_s: float, active: str = "active", sub: str = "running",
         unit: str = "vllm.service") -> Any:
    return wd.UnitView(unit=unit, invocation=invocation, active=active, sub=sub, age_s=age_s)


def decide(rule: Any = MUTUAL, local: Any = None, peer: Any = None, bound_me: bool = False,
           bound: Any = None, missing_s: float = 0.0) -> Any:
    return wd.decide(rule, local, peer, bound_me, bound, missing_s, SETTINGS)


# --- decisions ----------------------------------------------------------------------------------

def test_a_unit_that_does_not_run_is_never_restarted_nor_bound() -> None:
    for local in (None, view("a", 10, "inactive", "dead"), view("a", 10, "activating",
                                                                   "auto-restart")):
        decision = decide(local=local, peer=view("x", 1))
        assert decision.action == "wait" and decision.binding is None


def test_mutual_binds_a_younger_peer_and_waits_for_an_older_one() -> None:
    younger = decide(local=view("a", 30), peer=view("x", 10))
    assert younger.action == "bind" and younger.binding.peer_invocation == "x"
    older = decide(local=view("a", 10), peer=view("x", 30))
    assert older.action == "wait" and older.binding is None


def test_mutual_binds_an_older_peer_that_already_bound_this_invocation() -> None:
    decision = decide(local=view("a", 10), peer=view("x", 30), bound_me=True)
    assert decision.action == "bind" and decision.binding.invocation == "a"


def test_ages_within_the_slack_count_as_started_together() -> None:
    assert decide(local=view("a", 10), peer=view("x", 11.5)).action == "bind"
    assert decide(local=view("a", 10), peer=view("x", 12.5)).action == "wait"


def test_a_bound_peer_that_restarted_or_stopped_restarts_this_unit() -> None:
    bound = wd.Binding("vllm.service", "a", "h2", "vllm.service", "x")
    assert decide(local=view("a", 50), peer=view("x", 40), bound=bound).action == "keep"
    restarted = decide(local=view("a", 50), peer=view("y", 1), bound=bound)
    assert restarted.action == "restart" and "restarted" in restarted.reason
    # kill -9 of the headless main process: the unit waits for its SIGTERM-deaf worker.
    dying = decide(local=view("a", 50), peer=view("x", 40, "deactivating", "stop-sigterm"),
                   bound=bound)
    assert dying.action == "restart" and "deactivating" in dying.reason


def test_an_unreachable_peer_is_tolerated_for_the_grace_period_only() -> None:
    bound = wd.Binding("vllm.service", "a", "h2", "vllm.service", "x")
    assert decide(local=view("a", 50), bound=bound, missing_s=4.0).action == "keep"
    late = decide(local=view("a", 50), bound=bound, missing_s=5.0)
    assert late.action == "restart" and "not answered" in late.reason


def test_a_binding_of_an_earlier_local_invocation_is_forgotten() -> None:
    stale = wd.Binding("vllm.service", "old", "h2", "vllm.service", "x")
    decision = decide(local=view("new", 5), peer=view("y", 1), bound=stale)
    assert decision.action == "bind" and decision.binding.invocation == "new"


def test_one_way_binds_an_older_dependency_and_restarts_after_a_newer_one() -> None:
    older = decide(ONE_WAY, local=view("w", 10, unit="ray-worker.service"),
                   peer=view("h", 40, unit="ray-head.service"))
    assert older.action == "bind"
    newer = decide(ONE_WAY, local=view("w", 40, unit="ray-worker.service"),
                   peer=view("h", 3, unit="ray-head.service"))
    assert newer.action == "restart" and "started after" in newer.reason


HEADLESS = wd.Rule("vllm.service", "h1", "vllm.service", True, "10.213.6.11", 29501)


def test_a_headless_node_binds_rank0_only_after_joining_its_rendezvous() -> None:
    """A headless unit restarted while rank 0's group had already formed with the node's
    previous, still-stopping worker is not in that group: it waits (no binding), so that
    group's failure does not restart it, and binds once its worker connected."""
    waiting = wd.decide(HEADLESS, view("b2", 2), view("a2", 6), True, None, 0.0, SETTINGS,
                        joined=False)
    assert waiting.action == "wait" and waiting.binding is None
    assert "10.213.6.11:29501" in waiting.reason
    dying = wd.decide(HEADLESS, view("b2", 3), view("a2", 7, "activating", "auto-restart"),
                      False, None, 0.0, SETTINGS, joined=False)
    assert dying.action == "wait"
    joined = wd.decide(HEADLESS, view("b2", 9), view("a3", 3), False, None, 0.0, SETTINGS,
                       joined=True)
    assert joined.action == "bind" and joined.binding.peer_invocation == "a3"


def _fake_proc(root: Path, members: dict[int, tuple[str, list[str]]], tcp: list[str],
               tcp6: list[str]) -> Path:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt" \
             "   uid  timeout inode"
    for pid, (cgroup, inodes) in members.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(cgroup)
        for fd, inode in enumerate(inodes):
            (root / str(pid) / "fd" / str(fd)).symlink_to(f"socket:[{inode}]")
    (root / "net").mkdir()
    (root / "net" / "tcp").write_text("\n".join([header, *tcp]) + "\n")
    (root / "net" / "tcp6").write_text("\n".join([header, *tcp6]) + "\n")
    return root


def _line(local: str, remote: str, state: str, inode: str) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0  0 {inode}"


def test_connected_to_reads_the_cgroups_established_sockets(tmp_path: Path) -> None:
    unit = "/system.slice/vllm.service"
    # 10.213.6.11:29501 is 0B06D50A:733D in /proc/net/tcp (little-endian words, hex port)
    proc = _fake_proc(tmp_path, {
        100: (f"0::{unit}\n", ["11"]),                          # cgroup v2 member
        101: (f"12:cpu:/x\n1:name=systemd:{unit}\n", ["12"]),  # cgroup v1 member
        200: ("0::/system.slice/other.service\n", ["13"]),
    }, tcp=[_line("0C06D50A:9C40", "0B06D50A:733D", "06", "11"),   # TIME_WAIT: not joined
            _line("0C06D50A:9C41", "0B06D50A:733D", "01", "13")],  # other unit's socket
        tcp6=[])
    assert not wd.connected_to(unit, "10.213.6.11", 29501, str(proc))
    with (proc / "net" / "tcp6").open("a") as handle:  # IPv4-mapped, established, pid 101
        handle.write(_line("0000000000000000FFFF00000C06D50A:9C42",
                           "0000000000000000FFFF00000B06D50A:733D", "01", "12") + "\n")
    assert wd.connected_to(unit, "10.213.6.11", 29501, str(proc))
    assert not wd.connected_to(unit, "10.213.6.11", 29502, str(proc))
    assert not wd.connected_to("/system.slice/none.service", "10.213.6.11", 29501, str(proc))
    assert wd.connected_to(unit, "rank0.example", 29501, str(proc))  # a name: not judged


class Pair:
    """Two nodes applying the mutual rule to each other, poll by poll (same clock)."""

    def __init__(self) -> None:
        self.units = {"h1": ["a1", 100.0], "h2": ["b1", 100.0]}
        self.bindings: dict[str, Any] = {}
        self.restarts: list[str] = []

    def restart(self, node: str, new_invocation: str) -> None:
        self.units[node] = [new_invocation, 0.0]

    def poll(self) -> None:
        decisions = {}
        for me, other in (("h1", "h2"), ("h2", "h1")):
            rule = wd.Rule("vllm.service", other, "vllm.service", True)
            mine, theirs = self.units[me], self.units[other]
            their_binding = self.bindings.get(other)
            bound_me = bool(their_binding and their_binding.peer_invocation == mine[0]
                            and their_binding.invocation == theirs[0])
            decisions[me] = wd.decide(rule, view(mine[0], mine[1]), view(theirs[0], theirs[1]),
                                      bound_me, self.bindings.get(me), 0.0, SETTINGS)
        for me, decision in decisions.items():
            self.bindings[me] = decision.binding
            if decision.action == "restart":
                self.restarts.append(me)
                self.restart(me, self.units[me][0] + "'")
        for unit in self.units.values():
            unit[1] += 1.0


def test_two_nodes_converge_after_one_restart_without_ping_pong() -> None:
    pair = Pair()
    for _ in range(3):
        pair.poll()
    assert pair.bindings["h1"] and pair.bindings["h2"] and not pair.restarts
    pair.restart("h2", "b2")  # systemd restarted the follower (crash + Restart=always)
    for _ in range(20):
        pair.poll()
    assert pair.restarts == ["h1"], "exactly one restart of the other node"
    assert pair.bindings["h1"].peer_invocation == "b2"
    assert pair.bindings["h2"].peer_invocation == pair.units["h1"][0]


# --- completion probe ---------------------------------------------------------------------------

PROBE_SETTINGS = wd.Settings(poll_s=1.0, probe_interval_s=30.0, probe_timeout_s=60.0,
                             probe_failures=3)
OK = wd.classify(200)
TIMEOUT = wd.classify(None, "no answer within 60 s")


class FakeApi:
    """The local API server as the probe sees it: scripted /health statuses and completions."""

    def __init__(self, health: int | None = 200) -> None:
        self.health_status = health
        self.answers: list[Any] = []
        self.completions = 0
        self.health_calls = 0

    def health(self) -> int | None:
        self.health_calls += 1
        return self.health_status

    def complete(self) -> Any:
        self.completions += 1
        return self.answers.pop(0) if self.answers else OK


def prober(api: FakeApi, settings: Any = PROBE_SETTINGS) -> Any:
    """A probe whose requests run inline (no thread) and answer at once."""
    return wd.Prober("vllm.service", settings, complete=api.complete, health=api.health,
                     start=lambda work: work())


def units(invocation: str = "a", sub: str = "running") -> dict[str, Any]:
    return {"vllm.service": view(invocation, 100, sub=sub)}


def run(probe: Any, clock: list[float], polls: int, local: Any = None, held: bool = False
        ) -> list[str]:
    """``polls`` watchdog polls one second apart; the restart reasons the probe returned."""
    reasons = []
    for _ in range(polls):
        reason = probe.tick(clock[0], local or units(), held)
        if reason:
            reasons.append(reason)
        clock[0] += 1.0
    return reasons


def test_probe_judges_nothing_until_the_invocation_answered_health_200() -> None:
    api, clock = FakeApi(health=None), [0.0]  # loading: the HTTP port is not open yet
    api.answers = [TIMEOUT] * 10
    probe = prober(api)
    assert run(probe, clock, 200) == [] and api.completions == 0
    assert not probe.armed and probe.failures == 0
    api.health_status = 200
    run(probe, clock, 31)
    assert probe.armed == "a" and api.completions == 1  # the first completion right away


def test_probe_restarts_once_after_n_consecutive_failures() -> None:
    api, clock = FakeApi(), [0.0]
    probe = prober(api)
    run(probe, clock, 1)
    assert probe.armed and probe.last.outcome == "ok"
    api.answers = [TIMEOUT, wd.classify(None, "connection failed: [Errno 111] Connection "
                                        "refused"), wd.classify(500, "EngineCore")]
    reasons = run(probe, clock, 3 * 30)
    assert len(reasons) == 1 and "3 consecutive" in reasons[0] and "HTTP 500" in reasons[0]
    assert probe.restarts == 1 and probe.failures == 0 and not probe.armed
    # while the watchdog awaits the restart, nothing is judged
    for _ in range(100):
        assert probe.tick(clock[0], units(), held=False, restarting=True) is None
        clock[0] += 1.0
    assert api.completions == 4 and probe.waiting == "a restart is under way"


def test_a_served_probe_resets_the_failure_count() -> None:
    api, clock = FakeApi(), [0.0]
    probe = prober(api)
    api.answers = [OK, TIMEOUT, TIMEOUT, OK, TIMEOUT, TIMEOUT, OK]
    assert run(probe, clock, 7 * 30) == []
    assert api.completions == 7 and probe.failures == 0 and probe.last.outcome == "ok"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_a_4xx_is_misconfiguration_and_never_restarts(status: int) -> None:
    api, clock = FakeApi(), [0.0]
    probe = prober(api)
    api.answers = [OK] + [wd.classify(status, "Unauthorized")] * 10
    assert run(probe, clock, 11 * 30) == []
    assert probe.last.outcome == "ignored" and probe.failures == 0 and probe.restarts == 0


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "ok"), (408, "failure"), (429, "failure"), (500, "failure"), (503, "failure"),
    (401, "ignored"), (404, "ignored"), (None, "failure")])
def test_classify_counts_what_says_not_served(status: int | None, outcome: str) -> None:
    assert wd.classify(status).outcome == outcome


def test_a_held_watchdog_does_not_probe_and_forgets_its_failures() -> None:
    api, clock = FakeApi(), [0.0]
    probe = prober(api)
    api.answers = [OK, TIMEOUT, TIMEOUT]
    run(probe, clock, 61)
    assert probe.failures == 2
    calls = (api.completions, api.health_calls)
    assert run(probe, clock, 300, held=True) == []
    assert (api.completions, api.health_calls) == calls
    assert probe.failures == 0 and not probe.armed and probe.waiting == "the watchdog is held"


def test_probe_does_not_run_while_a_local_unit_is_not_running() -> None:
    api, clock = FakeApi(), [0.0]
    api.answers = [TIMEOUT] * 10
    probe = prober(api)
    ray_head_down = {"ray-head.service": view("h", 100, "activating", "auto-restart",
                                              unit="ray-head.service"),
                     "vllm.service": view("a", 100)}
    for local in (units(sub="stop-sigterm"), ray_head_down):
        assert run(probe, clock, 300, local=local) == []
    assert api.completions == 0 and api.health_calls == 0


def test_a_restarted_unit_must_answer_again_before_it_is_judged() -> None:
    api, clock = FakeApi(), [0.0]
    probe = prober(api)
    api.answers = [OK, TIMEOUT, TIMEOUT]
    run(probe, clock, 61)
    api.health_status = None  # the new invocation loads
    assert run(probe, clock, 300, local=units("b")) == []
    assert probe.failures == 0 and not probe.armed and api.completions == 3


def test_probe_failures_0_disables_the_probe() -> None:
    api, clock = FakeApi(), [0.0]
    probe = prober(api, wd.Settings(probe_failures=0))
    assert run(probe, clock, 300) == []
    assert api.completions == 0 and api.health_calls == 0
    assert probe.state(clock[0]) == {"enabled": False, "unit": "vllm.service"}


def test_a_request_that_never_returns_counts_as_a_failure_after_the_timeout() -> None:
    api, clock = FakeApi(), [0.0]
    settings = wd.Settings(probe_interval_s=3.0, probe_timeout_s=5.0, probe_failures=2)
    started: list[Any] = []
    probe = wd.Prober("vllm.service", settings, complete=api.complete, health=api.health,
                      start=started.append)  # never runs: a thread stuck in a frozen socket
    probe.armed = "a"
    reasons = run(probe, clock, 20)
    assert len(reasons) == 1 and "no answer within 5 s" in reasons[0]
    assert len(started) == 3 and probe.job.kind == "health"  # 2 completions, then re-arming


def test_probe_state_publishes_result_age_failures_and_restarts() -> None:
    api, clock = FakeApi(), [0.0]
    probe = prober(api)
    api.answers = [OK, TIMEOUT]
    run(probe, clock, 31)
    state = probe.state(clock[0] + 4)
    assert state["last_result"] == "failure" and "no answer" in state["last_detail"]
    assert state["age_s"] == pytest.approx(5.0) and state["consecutive_failures"] == 1
    assert state["failures_to_restart"] == 3 and state["restarts"] == 0 and state["armed"]
    json.dumps(state)


class FakeSystemctl:
    """``systemctl show`` of one running vllm.service, and every other call recorded."""

    def __init__(self, invocation: str = "a") -> None:
        self.invocation = invocation
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> Any:
        if argv[:2] == ["systemctl", "show"]:
            out = (f"Id=vllm.service\nInvocationID={self.invocation}\nActiveState=active\n"
                   "SubState=running\nMainPID=42\nExecMainStartTimestampMonotonic=1000000\n")
            return types.SimpleNamespace(returncode=0, stdout=out, stderr="")
        self.calls.append(argv)
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")


def test_watchdog_try_restarts_the_unit_the_probe_gave_up_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    systemctl, clock = FakeSystemctl(), [100.0]
    monkeypatch.setattr(wd.subprocess, "run", systemctl)
    monkeypatch.setattr(wd.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(wd.time, "time", lambda: 1.7e9 + clock[0])
    api = FakeApi()
    api.answers = [OK] + [TIMEOUT] * 3
    settings = wd.Settings(probe_interval_s=30.0, probe_timeout_s=60.0, probe_failures=3)
    config = {"node": "h1", "units": ["vllm.service"], "rules": [], "peers": {},
              "hold_file": str(tmp_path / "hold"), "state_file": str(tmp_path / "state.json")}
    watchdog = wd.Watchdog(config, settings, prober=prober(api, settings))
    for _ in range(200):
        watchdog.poll()
        clock[0] += 1.0
    assert systemctl.calls == [["systemctl", "--no-block", "--job-mode=fail", "try-restart",
                                "vllm.service"]]
    published = json.loads((tmp_path / "state.json").read_text())["probe"]
    assert published["restarts"] == 1 and published["last_result"] == "failure"
    systemctl.invocation = "b"  # systemd restarted it; the new invocation is judged afresh
    api.answers = [OK]
    watchdog.poll()
    assert watchdog.prober.armed == "b" and watchdog.prober.last.outcome == "ok"


class ScriptedApi(http.server.BaseHTTPRequestHandler):
    """A local HTTP server answering POST /v1/completions by the path's scripted behaviour."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        behaviour = self.server.behaviour  # type: ignore[attr-defined]
        if behaviour == "hang":
            time.sleep(1.0)
            return
        if behaviour == "reset":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if behaviour == "500-dies":  # the 500's body is cut short: the engine process died
            self.send_response(500)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"error": "EngineCore')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status, body = {"ok": (200, {"choices": [{"text": " the"}]}),
                        "500": (500, {"error": "EngineCore encountered an issue"}),
                        "401": (401, {"error": "Unauthorized"})}[behaviour]
        if behaviour == "ok" and self.headers.get("Authorization") != "Bearer sk-lab":
            status, body = 401, {"error": "Unauthorized"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return


@pytest.mark.parametrize(("behaviour", "outcome", "detail"), [
    ("ok", "ok", "HTTP 200"), ("500", "failure", "HTTP 500"), ("401", "ignored", "HTTP 401"),
    ("500-dies", "failure", "HTTP 500"),
    ("hang", "failure", "no answer within 0.3 s"), ("reset", "failure", "connection failed"),
    ("refused", "failure", "connection failed")])
def test_probe_completion_over_real_sockets(behaviour: str, outcome: str, detail: str) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedApi)
    server.behaviour = behaviour  # type: ignore[attr-defined]
    server.daemon_threads = True
    port = server.server_address[1]
    if behaviour == "refused":
        server.server_close()
    else:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = wd.probe_completion(f"http://127.0.0.1:{port}", "tiny", "sk-lab", 0.3)
    finally:
        if behaviour != "refused":
            server.shutdown()
            server.server_close()
    assert result.outcome == outcome and detail in result.detail, result


# --- parsers and hold ---------------------------------------------------------------------------

def test_parse_show_computes_ages_from_the_monotonic_start() -> None:
    text = ("Id=vllm.service\nInvocationID=abc\nActiveState=active\nSubState=running\n"
            "MainPID=42\nExecMainStartTimestampMonotonic=90000000\n\n"
            "Id=ray-head.service\nInvocationID=\nActiveState=inactive\nSubState=dead\n"
            "MainPID=0\nExecMainStartTimestampMonotonic=0\n")
    views = wd.parse_show(text, now_monotonic_s=100.0)
    assert views["vllm.service"].age_s == pytest.approx(10.0)
    assert views["vllm.service"].running and views["vllm.service"].main_pid == 42
    assert views["ray-head.service"].age_s == -1.0 and not views["ray-head.service"].running


def test_hold_file_counts_only_until_its_deadline(tmp_path: Path) -> None:
    hold = tmp_path / "watchdog.hold"
    assert wd.held_until(str(hold), 1000.0) is None
    hold.write_text("1500\n")
    assert wd.held_until(str(hold), 1000.0) == 1500.0
    assert wd.held_until(str(hold), 2000.0) is None
    hold.write_text("garbage")
    assert wd.held_until(str(hold), 1000.0) is None


# --- rendered files -----------------------------------------------------------------------------

def _replica(backend: str, nodes: int = 3) -> Replica:
    hosts = [Host(name=f"h{i}", address=f"10.213.6.{10 + i}") for i in range(1, nodes + 1)]
    return Replica(name="llama", backend=backend,  # type: ignore[arg-type]
                   nodes=tuple(Node(host=h, rank=i, host_ip=h.address)
                               for i, h in enumerate(hosts)),
                   engine=EngineArgs(model="/srv/models/m", tensor_parallel_size=2,
                                     pipeline_parallel_size=nodes))


def render(name: str, replica: Replica, rank: int) -> str:
    roles = ["vllm_common", *(["vllm_mp"] if replica.backend == "mp" else ["ray", "vllm_ray"]),
             "vllm_watchdog"]
    values: dict[str, Any] = {}
    for role in roles:
        values.update(yaml.safe_load((ROLE.parent / role / "defaults" / "main.yml").read_text()))
    values |= {"vllm_venv": "/opt/vllm", "replica": replica, "node": replica.nodes[rank]}
    for _ in range(3):  # defaults refer to other variables
        values = {k: jinja2.Template(v).render(values) if isinstance(v, str) and "{{" in v else v
                  for k, v in values.items()}
    from vllm_provision.runner.templating import make_environment

    env = make_environment()
    return env.from_string((ROLE / "templates" / name).read_text()).render(values)


def test_mp_config_makes_every_node_depend_on_every_other_node_both_ways() -> None:
    replica = _replica("mp")
    configs = [json.loads(render("watchdog.json.j2", replica, r)) for r in range(3)]
    for rank, config in enumerate(configs):
        assert config["units"] == ["vllm.service"]
        assert {r["peer"] for r in config["rules"]} == {f"h{i}" for i in (1, 2, 3)} - {
            f"h{rank + 1}"}
        assert all(r["mutual"] for r in config["rules"])
        assert config["listen_host"] == replica.nodes[rank].host_ip
        assert set(config["peers"]) == {r["peer"] for r in config["rules"]}
    assert configs[0]["peers"]["h2"] == "10.213.6.12:29510"
    # only a headless node's rule for rank 0 names the rendezvous it must have joined
    for rank, config in enumerate(configs):
        for rule in config["rules"]:
            wanted = (replica.master_addr, replica.engine.master_port) if rule["peer"] == "h1" \
                else (None, None)
            assert (rule.get("master_addr"), rule.get("master_port")) == wanted, (rank, rule)


def test_ray_config_makes_vllm_and_workers_depend_on_the_head_one_way() -> None:
    replica = _replica("ray", nodes=2)
    head = json.loads(render("watchdog.json.j2", replica, 0))
    worker = json.loads(render("watchdog.json.j2", replica, 1))
    assert head["rules"] == [{"unit": "vllm.service", "peer": "h1",
                              "peer_unit": "ray-head.service", "mutual": False}]
    # A worker tolerates a silent head as long as Ray does: the GCS health-check bound with
    # Ray's defaults, 5 x (10 s + 3 s) (src/ray/common/ray_config_def.h).
    assert worker["rules"] == [{"unit": "ray-worker.service", "peer": "h1",
                                "peer_unit": "ray-head.service", "mutual": False,
                                "grace_s": 65.0}]
    assert head["units"] == ["ray-head.service", "vllm.service"]
    gcs = f"{replica.master.host_ip}:6379"
    assert head["ray"] == {"gcs": gcs, "observe": True, "poll_s": 2.0}
    assert worker["ray"] == {"gcs": gcs, "observe": False, "head": "h1",
                             "unit": "ray-worker.service", "unreachable_s": 65.0}


def test_watchdog_unit_is_enabled_ordered_after_its_units_and_never_gives_up() -> None:
    unit = render("vllm-watchdog.service.j2", _replica("ray", nodes=2), 0)
    assert "Before=ray-head.service vllm.service" in unit  # stop after them: peers see it at once
    assert "StartLimitIntervalSec=0" in unit and "Restart=always" in unit
    assert "WantedBy=multi-user.target" in unit
    assert "ExecStart=/opt/vllm/bin/python3 /usr/local/lib/vllm-provision/vllm_watchdog.py " \
           "/etc/vllm-provision/watchdog.json" in unit


def test_the_installed_script_is_the_file_itself() -> None:
    # The role copies files/vllm_watchdog.py as it is (the copy module never renders it): a
    # plain Python program, no Jinja markers, and what a node needs comes from its JSON config.
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    install = next(t for t in tasks if t["name"] == "Install the watchdog script")
    assert install["copy"]["src"] == "vllm_watchdog.py" and "template" not in install
    source = SCRIPT.read_text()
    assert source.splitlines()[0] == "#!/usr/bin/python3"
    assert "def decide(" in source
    assert not any(marker in source for marker in ("{%", "{{", "{#"))
    compile(source, "vllm_watchdog.py", "exec")


def test_rank0_config_carries_the_probe_and_its_settings() -> None:
    replica = _replica("mp", nodes=2)
    rank0 = json.loads(render("watchdog.json.j2", replica, 0))
    assert rank0["probe"] == {"unit": "vllm.service", "url": "http://10.213.6.11:8000",
                              "model": "/srv/models/m", "api_key": None}
    assert rank0["settings"]["probe_interval_s"] == 30.0
    assert rank0["settings"]["probe_timeout_s"] == 60.0
    assert rank0["settings"]["probe_failures"] == 3
    assert json.loads(render("watchdog.json.j2", replica, 1))["probe"] is None  # headless
    ray_head = json.loads(render("watchdog.json.j2", _replica("ray", nodes=2), 0))
    assert ray_head["probe"]["unit"] == "vllm.service"


def test_probe_uses_the_served_name_the_key_and_a_specific_api_address() -> None:
    replica = _replica("mp", nodes=2)
    engine = dataclasses.replace(replica.engine, served_model_name="llama", api_key="sk-lab-key",
                                 api_host="fd00::11", api_port=8080)
    probe = json.loads(render("watchdog.json.j2", dataclasses.replace(replica, engine=engine),
                              0))["probe"]
    assert probe == {"unit": "vllm.service", "url": "http://[fd00::11]:8080", "model": "llama",
                     "api_key": "sk-lab-key"}


def test_the_config_that_may_hold_the_api_key_is_root_only() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    (task,) = [t for t in tasks if t.get("template", {}).get("src") == "watchdog.json.j2"]
    assert task["template"]["mode"] == "0600" and task["template"]["owner"] == "root"
    assert task["notify"] == "Restart the watchdog"  # new probe values restart no vLLM unit
