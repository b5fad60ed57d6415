"""The peer watchdog's rules (roles/vllm_watchdog/files/vllm_watchdog_rules.py), on their own.

The rules module is loaded without the program (``vllm_watchdog.py``, tests/unit/test_watchdog.py):
it must stay pure (no process, socket, HTTP or file access) and importable by itself. The
decisions are checked as the sequences of polls the lab measured (docs/recovery.md): a follower
killed, rank 0 killed, a peer unreachable, a Ray head restarted; and that two nodes applying the
rules to each other converge instead of restarting each other in turn. The completion probe of
rank 0 is driven poll by poll with a fake clock and fake HTTP answers.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

RULES = Path(__file__).resolve().parents[2] / "roles" / "vllm_watchdog" / "files" / \
    "vllm_watchdog_rules.py"


def load_file(name: str, path: Path) -> ModuleType:
    """Load the Python file ``path`` as the module ``name``, registered in ``sys.modules`` (as
    the program imports its rules; dataclasses resolve annotations through ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Under the name the program imports it by: a program loaded later in this process
# (test_watchdog.py) then uses this very module, its classes included.
rules = load_file("vllm_watchdog_rules", RULES)

SETTINGS = rules.Settings(poll_s=1.0, grace_s=5.0, slack_s=2.0)
MUTUAL = rules.Rule("vllm.service", "h2", "vllm.service", True)
ONE_WAY = rules.Rule("ray-worker.service", "h1", "ray-head.service", False)


def view(invocation: str, age_s: float, active: str = "active", sub: str = "running",
         unit: str = "vllm.service") -> Any:
    return rules.UnitView(unit=unit, invocation=invocation, active=active, sub=sub, age_s=age_s)


def decide(rule: Any = MUTUAL, local: Any = None, peer: Any = None, bound_me: bool = False,
           bound: Any = None, missing_s: float = 0.0) -> Any:
    return rules.decide(rule, local, peer, bound_me, bound, missing_s, SETTINGS)


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
    bound = rules.Binding("vllm.service", "a", "h2", "vllm.service", "x")
    assert decide(local=view("a", 50), peer=view("x", 40), bound=bound).action == "keep"
    restarted = decide(local=view("a", 50), peer=view("y", 1), bound=bound)
    assert restarted.action == "restart" and "restarted" in restarted.reason
    # kill -9 of the headless main process: the unit waits for its SIGTERM-deaf worker.
    dying = decide(local=view("a", 50), peer=view("x", 40, "deactivating", "stop-sigterm"),
                   bound=bound)
    assert dying.action == "restart" and "deactivating" in dying.reason


def test_an_unreachable_peer_is_tolerated_for_the_grace_period_only() -> None:
    bound = rules.Binding("vllm.service", "a", "h2", "vllm.service", "x")
    assert decide(local=view("a", 50), bound=bound, missing_s=4.0).action == "keep"
    late = decide(local=view("a", 50), bound=bound, missing_s=5.0)
    assert late.action == "restart" and "not answered" in late.reason


def test_a_binding_of_an_earlier_local_invocation_is_forgotten() -> None:
    stale = rules.Binding("vllm.service", "old", "h2", "vllm.service", "x")
    decision = decide(local=view("new", 5), peer=view("y", 1), bound=stale)
    assert decision.action == "bind" and decision.binding.invocation == "new"


def test_one_way_binds_an_older_dependency_and_restarts_after_a_newer_one() -> None:
    older = decide(ONE_WAY, local=view("w", 10, unit="ray-worker.service"),
                   peer=view("h", 40, unit="ray-head.service"))
    assert older.action == "bind"
    newer = decide(ONE_WAY, local=view("w", 40, unit="ray-worker.service"),
                   peer=view("h", 3, unit="ray-head.service"))
    assert newer.action == "restart" and "started after" in newer.reason


HEADLESS = rules.Rule("vllm.service", "h1", "vllm.service", True, "10.213.6.11", 29501)


def test_a_headless_node_binds_rank0_only_after_joining_its_rendezvous() -> None:
    """A headless unit restarted while rank 0's group had already formed with the node's
    previous, still-stopping worker is not in that group: it waits (no binding), so that
    group's failure does not restart it, and binds once its worker connected."""
    waiting = rules.decide(HEADLESS, view("b2", 2), view("a2", 6), True, None, 0.0, SETTINGS,
                        joined=False)
    assert waiting.action == "wait" and waiting.binding is None
    assert "10.213.6.11:29501" in waiting.reason
    dying = rules.decide(HEADLESS, view("b2", 3), view("a2", 7, "activating", "auto-restart"),
                      False, None, 0.0, SETTINGS, joined=False)
    assert dying.action == "wait"
    joined = rules.decide(HEADLESS, view("b2", 9), view("a3", 3), False, None, 0.0, SETTINGS,
                       joined=True)
    assert joined.action == "bind" and joined.binding.peer_invocation == "a3"

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
            rule = rules.Rule("vllm.service", other, "vllm.service", True)
            mine, theirs = self.units[me], self.units[other]
            their_binding = self.bindings.get(other)
            bound_me = bool(their_binding and their_binding.peer_invocation == mine[0]
                            and their_binding.invocation == theirs[0])
            decisions[me] = rules.decide(rule, view(mine[0], mine[1]), view(theirs[0], theirs[1]),
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

PROBE_SETTINGS = rules.Settings(poll_s=1.0, probe_interval_s=30.0, probe_timeout_s=60.0,
                             probe_failures=3)
OK = rules.classify(200)
TIMEOUT = rules.classify(None, "no answer within 60 s")


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
    return rules.Prober("vllm.service", settings, complete=api.complete, health=api.health,
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
    api.answers = [TIMEOUT, rules.classify(None, "connection failed: [Errno 111] Connection "
                                        "refused"), rules.classify(500, "EngineCore")]
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
    api.answers = [OK] + [rules.classify(status, "Unauthorized")] * 10
    assert run(probe, clock, 11 * 30) == []
    assert probe.last.outcome == "ignored" and probe.failures == 0 and probe.restarts == 0


@pytest.mark.parametrize(("status", "outcome"), [
    (200, "ok"), (408, "failure"), (429, "failure"), (500, "failure"), (503, "failure"),
    (401, "ignored"), (404, "ignored"), (None, "failure")])
def test_classify_counts_what_says_not_served(status: int | None, outcome: str) -> None:
    assert rules.classify(status).outcome == outcome


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
    probe = prober(api, rules.Settings(probe_failures=0))
    assert run(probe, clock, 300) == []
    assert api.completions == 0 and api.health_calls == 0
    assert probe.state(clock[0]) == {"enabled": False, "unit": "vllm.service"}


def test_a_request_that_never_returns_counts_as_a_failure_after_the_timeout() -> None:
    api, clock = FakeApi(), [0.0]
    settings = rules.Settings(probe_interval_s=3.0, probe_timeout_s=5.0, probe_failures=2)
    started: list[Any] = []
    probe = rules.Prober("vllm.service", settings, complete=api.complete, health=api.health,
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


# --- parsers --------------------------------------------------------------------------------------

def test_parse_show_computes_ages_from_the_monotonic_start() -> None:
    text = ("Id=vllm.service\nInvocationID=abc\nActiveState=active\nSubState=running\n"
            "MainPID=42\nExecMainStartTimestampMonotonic=90000000\n\n"
            "Id=ray-head.service\nInvocationID=\nActiveState=inactive\nSubState=dead\n"
            "MainPID=0\nExecMainStartTimestampMonotonic=0\n")
    views = rules.parse_show(text, now_monotonic_s=100.0)
    assert views["vllm.service"].age_s == pytest.approx(10.0)
    assert views["vllm.service"].running and views["vllm.service"].main_pid == 42
    assert views["ray-head.service"].age_s == -1.0 and not views["ray-head.service"].running


# --- the module itself --------------------------------------------------------------------------

# The standard library modules the rules may import: no processes, sockets, HTTP or files.
PURE_IMPORTS = {"__future__", "collections.abc", "dataclasses", "os", "threading", "typing"}


def test_the_rules_import_only_pure_standard_modules_and_not_the_program() -> None:
    tree = ast.parse(RULES.read_text(), feature_version=(3, 9))  # the hosts' oldest Python
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert imported <= PURE_IMPORTS, imported - PURE_IMPORTS
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert not calls & {"listdir", "readlink", "system", "popen", "remove", "replace"}
    assert not any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                   and node.func.id == "open" for node in ast.walk(tree))


def test_the_rules_file_is_a_plain_python_file_under_the_size_limit() -> None:
    source = RULES.read_text()
    assert not any(marker in source for marker in ("{%", "{{", "{#"))  # copied, never rendered
    assert len(source.splitlines()) <= 800
    compile(source, RULES.name, "exec")


# -- a hold set aside and released (a run that changed nothing leaves the watchdog whole) -------

def _published(*views: Any) -> dict[str, Any]:
    return {"units": {v.unit: {"unit": v.unit, "invocation": v.invocation, "active": v.active,
                               "sub": v.sub, "age_s": v.age_s, "main_pid": 0} for v in views}}


def test_a_binding_of_the_same_two_processes_holds_again_after_the_hold() -> None:
    bound = rules.Binding("vllm.service", "inv-1", "h1", "vllm.service", "inv-0")
    local = {"vllm.service": view("inv-1", 10)}
    peer = _published(view("inv-0", 10))
    kept = rules.restore_bindings({"r": bound}, local, {"h1": peer}, "h2")
    assert kept == {"r": bound}


@pytest.mark.parametrize("local_inv, peer_inv, peer_answers, peer_active", [
    ("inv-9", "inv-0", True, "active"),      # this node's unit restarted during the hold
    ("inv-1", "inv-8", True, "active"),      # the peer's unit restarted during the hold
    ("inv-1", "inv-0", False, "active"),     # the peer's watchdog does not answer
    ("inv-1", "inv-0", True, "inactive"),    # the peer's unit is stopped
])
def test_a_binding_is_dropped_when_either_side_is_not_the_same_running_process(
        local_inv: str, peer_inv: str, peer_answers: bool, peer_active: str) -> None:
    bound = rules.Binding("vllm.service", "inv-1", "h1", "vllm.service", "inv-0")
    local = {"vllm.service": view(local_inv, 10)}
    states = {"h1": _published(view(peer_inv, 10, active=peer_active))
              if peer_answers else None}
    assert rules.restore_bindings({"r": bound}, local, states, "h2") == {}


def test_a_rule_on_two_local_units_is_restored_from_the_local_view() -> None:
    bound = rules.Binding("vllm.service", "inv-1", "h2", "ray-worker.service", "inv-2")
    local = {"vllm.service": view("inv-1", 10),
             "ray-worker.service": view("inv-2", 10, unit="ray-worker.service")}
    assert rules.restore_bindings({"r": bound}, local, {}, "h2") == {"r": bound}
