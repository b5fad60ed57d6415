"""The stall rule of the readiness wait (output/stall.py, modules/vllm_wait_ready.py), its
variable, the remedy per phase, and the first failure's journal (output/phases.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from clock_support import FakeClock
from inventory_support import load_llama

from vllm_provision.core.errors import InventoryError, Problem, ProvisionError
from vllm_provision.modules import vllm_wait_ready
from vllm_provision.output.phases import PHASES, first_failure
from vllm_provision.output.stall import (
    BEFORE_FIRST_PHASE,
    REMEDIES,
    StallWatch,
    remedy_for,
)
from vllm_provision.transport.api import Endpoint, Observation, Stalled, UnitState, wait_ready
from vllm_provision.transport.base import CommandResult

REFUSED = Endpoint("http://127.0.0.1:9", timeout_s=1)  # nothing listens: "still loading"


def _active(host: str) -> UnitState:
    return UnitState(host=host, unit="vllm.service", active_state="active", sub_state="running",
                     main_pid=42)


# --- StallWatch: a fake clock and a sequence of observations ------------------------------------

def test_progress_on_any_node_resets_the_timer() -> None:
    watch = StallWatch(["h1", "h2"], 10, now=0)
    for second, phase in enumerate(["loading weights", "loading weights 50% (1/2 shards)",
                                    "loading weights 100% (2/2 shards)", "weights loaded"]):
        watch.observe("h1", phase, now=second * 8)
        assert watch.stalled(second * 8 + 9.9) is None
    assert watch.stalled(24 + 9.9) is None
    assert watch.stalled(24 + 10) is not None


def test_the_same_phase_text_again_is_no_progress() -> None:
    watch = StallWatch(["h1"], 10, now=0)
    watch.observe("h1", "waiting for nothing", now=1)  # a text, whatever it is, moves once
    for now in (3, 6, 9):
        watch.observe("h1", "waiting for nothing", now=now)
    assert watch.stalled(11) is not None


def test_no_progress_for_the_timeout_names_the_node_furthest_behind_and_its_phase() -> None:
    watch = StallWatch(["h1", "h2"], 10, now=0)
    watch.observe("h2", "loading weights", now=1)
    watch.observe("h1", "loading weights", now=1)
    watch.observe("h1", "weights loaded", now=3)
    watch.observe("h1", "sizing the KV cache", now=5)  # h1 went on, then waits for h2
    assert watch.stalled(14.9) is None
    stall = watch.stalled(15)
    assert stall is not None
    assert (stall.host, stall.phase, stall.silent_s, stall.in_phase_s) == \
        ("h2", "loading weights", 10, 14)


def test_a_node_without_any_phase_line_is_furthest_behind() -> None:
    watch = StallWatch(["h1", "h2"], 5, now=0)
    watch.observe("h1", "loading weights", now=1)
    stall = watch.stalled(6)
    assert stall is not None and stall.host == "h2" and stall.phase_name == BEFORE_FIRST_PHASE


def test_a_ray_placement_wait_is_left_to_the_backend_check() -> None:
    watch = StallWatch(["h1"], 5, now=0)
    watch.observe("h1", "waiting for a Ray placement group", now=1)
    assert watch.stalled(1000) is None
    watch.observe("h1", "loading weights", now=1001)
    assert watch.stalled(1006) is not None


def test_seconds_per_phase_in_order() -> None:
    watch = StallWatch(["h1"], 100, now=0)
    watch.observe("h1", "loading weights", now=2)
    watch.observe("h1", "loading weights 50% (1/2 shards)", now=5)  # same phase, progress
    watch.observe("h1", "sizing the KV cache", now=9)
    seconds = watch.phase_seconds(now=10)["h1"]
    assert list(seconds) == [BEFORE_FIRST_PHASE, "loading weights", "sizing the KV cache"]
    assert list(seconds.values()) == [2, 7, 1]


# --- wait_ready with a stall check ----------------------------------------------------------------

def test_wait_ready_ends_at_the_stall_not_at_the_timeout() -> None:
    clock = FakeClock()
    calls: list[float] = []

    def check(now: float) -> Problem | None:
        calls.append(now)
        return Problem("h2:vllm.service", "the start stalled") if now >= 10 else None

    with pytest.raises(Stalled, match="the start stalled"):
        wait_ready(observe=lambda: Observation([_active("h1"), _active("h2")]),
                   journal=lambda s: "", endpoint=REFUSED, model="m", timeout_s=1800,
                   stall_check=check, clock=clock, sleep=clock.sleep)
    assert clock.now == 10 and calls == [float(n) for n in range(11)]


def test_a_failed_unit_wins_over_a_stall() -> None:
    failed = UnitState("h2", "vllm.service", active_state="failed", result="exit-code",
                       exit_status=1)
    with pytest.raises(ProvisionError) as error:
        wait_ready(observe=lambda: Observation([_active("h1"), failed]),
                   journal=lambda s: "boom", endpoint=REFUSED, model="m", timeout_s=60,
                   stall_check=lambda now: Problem("x", "stalled"))
    assert not isinstance(error.value, Stalled) and "boom" in str(error.value)


# --- the module: the error, the stop in order, the other replica --------------------------------

class FakeHost:
    """A host's connection: answers the journal reads, records every command."""

    def __init__(self, name: str, journal: str, commands: list[tuple[str, str]]) -> None:
        self.name, self.journal, self.commands = name, journal, commands

    def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        self.commands.append((self.name, command))
        if command.startswith("journalctl"):
            return CommandResult(0, self.journal, "")
        return CommandResult(0, "", "")


def _ctx(tmp_path: Path, backend: str, journals: dict[str, str],
         commands: list[tuple[str, str]]) -> tuple[Any, Any]:
    inventory = load_llama(tmp_path, backend, vllm_api_key="sk-secret-0123456789")
    [replica] = inventory.replicas
    connections = {h: FakeHost(h, journals.get(h, ""), commands) for h in ("h1", "h2")}
    return SimpleNamespace(vars={}, connections=connections), replica


def test_a_stall_names_node_phase_time_lines_and_remedy(tmp_path: Path) -> None:
    lines = "h2 vllm[7]: INFO Starting to load model /srv/models/tiny...\n" \
            "h2 vllm[7]: key sk-secret-0123456789 \x1b[31mred\n"
    ctx, replica = _ctx(tmp_path, "mp", {"h2": lines}, [])
    watch = StallWatch(["h1", "h2"], 10, now=0)
    watch.observe("h2", "loading weights", now=1)
    watch.observe("h1", "weights loaded", now=2)
    assert vllm_wait_ready.stall_problem(ctx, replica, watch, 11.9) is None
    problem = vllm_wait_ready.stall_problem(ctx, replica, watch, 12)
    assert problem is not None
    assert problem.where == "h2:vllm.service"
    assert "no node of replica llama progressed for 10 s" in problem.message
    assert "phase 'loading weights' for 11 s" in problem.message
    assert "slow mount" in problem.fix and "Troubleshooting" in problem.fix
    assert "Starting to load model" in problem.fix
    assert "sk-secret" not in problem.fix and "\x1b" not in problem.fix and "\\x1b" in problem.fix


@pytest.mark.parametrize("backend, order", [
    ("mp", [("h1", "vllm.service"), ("h2", "vllm.service")]),
    ("ray", [("h1", "vllm.service"), ("h2", "ray-worker.service"), ("h1", "ray-head.service")]),
])
def test_a_stalled_replica_is_stopped_in_reverse_start_order(
        tmp_path: Path, backend: str, order: list[tuple[str, str]]) -> None:
    commands: list[tuple[str, str]] = []
    ctx, replica = _ctx(tmp_path, backend, {}, commands)
    stopped = vllm_wait_ready.stop_in_order(ctx, replica)
    assert stopped == [f"{h} {u}" for h, u in order]
    assert commands == [(h, f"systemctl stop -- {u}") for h, u in order]


def test_one_replica_stalling_does_not_touch_the_other(tmp_path: Path) -> None:
    """Each replica's wait is its own task (run_once per replica, fatal_scope replica:
    tests/unit/test_replicas_independent.py): a stall stops only the stalled one's hosts."""
    more = """\
        other:
          vars: {vllm_backend: mp, vllm_model: /srv/models/tiny}
          hosts:
            h3: {ansible_host: 10.0.0.13, vllm_node_rank: 0}
"""
    inventory = load_llama(tmp_path, "mp", more=more)
    llama = next(r for r in inventory.replicas if r.name == "llama")
    commands: list[tuple[str, str]] = []
    connections = {h: FakeHost(h, "", commands) for h in ("h1", "h2", "h3")}
    vllm_wait_ready.stop_in_order(SimpleNamespace(vars={}, connections=connections), llama)
    assert {host for host, _ in commands} == {"h1", "h2"}


# --- the remedy table --------------------------------------------------------------------------

def test_every_timed_phase_has_a_remedy_with_a_documentation_source() -> None:
    phases = {remedy.phase for remedy in REMEDIES}
    assert phases == {BEFORE_FIRST_PHASE, *PHASES} - {"waiting for a Ray placement group"}
    for remedy in REMEDIES:
        assert remedy.cause and remedy.fix and remedy.sources
        assert all("docs" in source for source in remedy.sources)
        assert "issue" not in " ".join(remedy.sources).lower()


@pytest.mark.parametrize("phase, words", [
    ("loading weights 50% (1/2 shards)", "slow mount"),
    ("", "NCCL_DEBUG"),
    ("", "vllm_cluster_interface"),
    ("", "ray status"),
    ("sizing the KV cache", "vllm_gpu_memory_utilization"),
    ("capturing CUDA graphs 40%", "--enforce-eager"),
    ("a phase nobody knows", "NCCL_SOCKET_IFNAME"),
])
def test_remedy_lookup(phase: str, words: str) -> None:
    assert words in remedy_for(phase).fix


# --- the variable --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-5", "0.5"])
def test_a_stall_timeout_below_the_poll_interval_is_refused_at_load(
        tmp_path: Path, value: str) -> None:
    with pytest.raises(InventoryError) as error:
        load_llama(tmp_path, "mp", vllm_stall_timeout_s=value)
    text = str(error.value)
    assert "inventory.yml" in text and "llama.vars.vllm_stall_timeout_s" in text
    assert "at least 1 (the readiness wait polls every 1 s)" in text
    assert "fix: write e.g. vllm_stall_timeout_s: 600" in text


def test_a_stall_timeout_of_seconds_loads(tmp_path: Path) -> None:
    from vllm_provision import settings

    inventory = load_llama(tmp_path, "mp", vllm_stall_timeout_s=10)
    [replica] = inventory.replicas
    assert settings.layered(replica.vars)["vllm_stall_timeout_s"] == 10
    assert settings.layered({})["vllm_stall_timeout_s"] == 300


# --- the first failure's journal -----------------------------------------------------------------

TWO_FAILURES = """\
2026-12-04T09:00:00Z h1 systemd[1]: Starting vllm.service - vLLM...
2026-12-04T09:00:00Z h1 systemd[1]: Started vllm.service - vLLM.
2026-12-04T09:00:01Z h1 vllm[100]: INFO Starting to load model /srv/models/tiny...
2026-12-04T09:00:02Z h1 vllm[100]: ValueError: the first cause: 4 GPUs asked, 2 found
2026-12-04T09:00:02Z h1 systemd[1]: vllm.service: Main process exited, code=exited, status=1/FAILURE
2026-12-04T09:00:02Z h1 systemd[1]: vllm.service: Failed with result 'exit-code'.
2026-12-04T09:00:07Z h1 systemd[1]: vllm.service: Scheduled restart job, restart counter is at 1.
2026-12-04T09:00:07Z h1 systemd[1]: Stopped vllm.service - vLLM.
2026-12-04T09:00:07Z h1 systemd[1]: Starting vllm.service - vLLM...
2026-12-04T09:00:07Z h1 systemd[1]: Started vllm.service - vLLM.
2026-12-04T09:00:08Z h1 vllm[200]: OSError: [Errno 98] Address already in use
2026-12-04T09:00:08Z h1 systemd[1]: vllm.service: Main process exited, code=exited, status=1/FAILURE
2026-12-04T09:00:08Z h1 systemd[1]: vllm.service: Failed with result 'exit-code'.
"""
EARLIER_RUN = """\
2026-12-04T08:00:00Z h1 systemd[1]: Starting vllm.service - vLLM...
2026-12-04T08:00:09Z h1 vllm[50]: RuntimeError: yesterday's failure
2026-12-04T08:00:09Z h1 systemd[1]: vllm.service: Main process exited, code=exited, status=1/FAILURE
2026-12-04T08:10:00Z h1 systemd[1]: Stopped vllm.service - vLLM.
"""


def test_the_first_failure_of_two_is_shown_not_the_last() -> None:
    lines, found = first_failure(EARLIER_RUN + TWO_FAILURES, 25)
    assert found
    assert "the first cause" in lines and "Failed with result 'exit-code'" in lines
    assert "Address already in use" not in lines and "restart counter" in lines
    assert "yesterday" not in lines  # before this start by hand


def test_the_first_failure_is_cut_to_its_last_lines() -> None:
    lines, _ = first_failure(TWO_FAILURES, 4)
    assert lines.splitlines()[0].endswith("the first cause: 4 GPUs asked, 2 found")
    assert lines.splitlines()[-1].endswith("restart counter is at 1.")


def test_without_a_failure_the_last_lines_are_shown() -> None:
    running = "\n".join(TWO_FAILURES.splitlines()[:3])
    assert first_failure(running, 2) == ("\n".join(running.splitlines()[-2:]), False)


def test_the_module_reads_the_first_failure_masked_and_printable(tmp_path: Path) -> None:
    journal = TWO_FAILURES.replace("the first cause", "sk-secret-0123456789 \x1b[2J")
    commands: list[tuple[str, str]] = []
    ctx, replica = _ctx(tmp_path, "mp", {"h1": journal}, commands)
    state = UnitState("h1", "vllm.service", active_state="failed")
    text = vllm_wait_ready.read_journal(ctx, replica, state)
    assert text.startswith("(its first failure since it was started)")
    assert "*** \\x1b[2J: 4 GPUs asked" in text and "Address already in use" not in text
    assert commands == [("h1", "journalctl -u vllm.service -b -n 2000 --no-pager -o short-iso")]


def test_the_docs_hold_the_remedy_table() -> None:
    from vllm_provision.output import stall

    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    begin, end = "<!-- stall-remedies:begin -->\n", "<!-- stall-remedies:end -->"
    held = text[text.index(begin) + len(begin):text.index(end)]
    assert held == stall.render_markdown_table(), (
        "paste vllm_provision.output.stall.render_markdown_table() between the markers of "
        "docs/deploy.md")


def test_phase_seconds_reach_the_replica_result_and_fit_the_schema(tmp_path: Path) -> None:
    import jsonschema

    from vllm_provision.cli.json_schemas import validate
    from vllm_provision.core.results import Status, TaskResult
    from vllm_provision.operations.deploy import replica_results

    inventory = load_llama(tmp_path, "mp")
    phases = {"h1": {BEFORE_FIRST_PHASE: 2.0, "loading weights": 7.5},
              "h2": {BEFORE_FIRST_PHASE: 2.5, "loading weights": 7.0}}
    results = [TaskResult("h1", "Wait until rank 0 serves the model", Status.OK,
                          data={"start_to_serving_s": 9.5, "served_model": "m",
                                "phase_s": phases, "over_budget": [
                                    {"host": "h1", "phase": "loading weights", "seconds": 7.5,
                                     "budget_s": 3.0}]}, register="vllm_ready")]
    [entry] = replica_results(inventory, results, ["h1", "h2"])
    assert entry["phase_s"] == phases and entry["over_budget"][0]["budget_s"] == 3.0
    entry["start_kind"] = "cold"  # what a verified up adds from its state record
    document = {"ok": 1, "changed": 0, "failed": 0, "skipped": 0, "unreachable": 0,
                "hosts": {}, "tasks": [], "check_mode": False, "duration_s": 1.0,
                "phase_s": phases, "start_kind": "cold", "replicas": [entry]}
    validate("up", document)
    with pytest.raises(jsonschema.ValidationError, match="lukewarm"):
        validate("up", {**document, "replicas": [{**entry, "start_kind": "lukewarm"}]})
    entry["phase_s"] = {"h1": {"loading weights": -1}}
    with pytest.raises(jsonschema.ValidationError, match="-1"):
        validate("up", {**document, "replicas": [entry]})


# --- phase budgets -------------------------------------------------------------------------------

def test_the_budgets_come_from_the_model_size_the_load_rate_and_the_overrides() -> None:
    from vllm_provision.output.stall import MIN_LOAD_BUDGET_S, phase_budgets

    fourteen_gib = 14 << 30
    budgets = phase_budgets(fourteen_gib, 200.0)
    load = budgets["loading weights"]
    assert load.seconds == round(2 * fourteen_gib / (200 * (1 << 20)), 1) == 143.4
    assert "14.0 GiB" in load.why and "vllm_load_rate_mib_s" in load.why
    assert budgets["capturing CUDA graphs"].seconds == 134.0  # 67 sizes x 2 s
    assert phase_budgets(1 << 20, 200.0)["loading weights"].seconds == MIN_LOAD_BUDGET_S
    assert phase_budgets(None, 200.0)["loading weights"].why.startswith("the minimum")
    eager = phase_budgets(None, 200.0, eager=True)
    assert eager["capturing CUDA graphs"].why == "the default"
    chosen = phase_budgets(fourteen_gib, 200.0, {"compiling": "1200"})
    assert (chosen["compiling"].seconds, chosen["compiling"].why) == (1200.0,
                                                                       "vllm_phase_budgets_s")


def test_a_node_over_its_phase_budget_is_reported_once_and_the_start_goes_on() -> None:
    from vllm_provision.output.stall import Budget

    watch = StallWatch(["h1", "h2"], 300, 0.0, {"loading weights": Budget(60.0, "test")})
    watch.observe("h1", "loading weights 10% (1/10 shards)", 1.0)
    watch.observe("h2", "loading weights 10% (1/10 shards)", 1.0)
    watch.observe("h2", "weights loaded", 30.0)
    assert watch.over_budget(50.0) == []
    watch.observe("h1", "loading weights 90% (9/10 shards)", 59.0)  # progress, same phase
    [over] = watch.over_budget(62.0)
    assert (over.host, over.phase, over.seconds) == ("h1", "loading weights", 61.0)
    assert "over its budget of 60 s (test)" in over.describe()
    assert watch.over_budget(90.0) == []  # once per node and phase
    assert watch.stalled(90.0) is None  # a phase over budget is no stall
    assert [o.host for o in watch.over] == ["h1"]


def test_the_budgeted_phases_are_phases_the_parser_knows() -> None:
    from vllm_provision.settings.variables import BUDGET_PHASES, check_phase_budgets

    assert set(BUDGET_PHASES) <= set(PHASES)
    assert check_phase_budgets({"compiling": "900", "loading weights": 60}) is None
    assert "not 'loading'" in (check_phase_budgets({"loading": 60}) or "")
    assert "seconds > 0" in (check_phase_budgets({"compiling": "-1"}) or "")
    assert "seconds > 0" in (check_phase_budgets({"compiling": "soon"}) or "")


def test_the_waits_budgets_read_the_variables_as_the_inventory_leaves_them(
        tmp_path: Path) -> None:
    from vllm_provision import settings
    from vllm_provision.facts.model import HostFacts, ModelFile

    replica = load_llama(tmp_path).replicas[0]
    master = replica.master.name
    ctx = SimpleNamespace(facts={master: HostFacts(host=master, model_files=(
        ModelFile("model.safetensors", 30 << 30),))})
    unset = vllm_wait_ready.budgets_for(ctx, replica, settings.layered({}))  # type: ignore[arg-type]
    assert unset["loading weights"].seconds == round(2 * (30 << 30) / (200 * (1 << 20)), 1)
    chosen = vllm_wait_ready.budgets_for(ctx, replica, settings.layered(  # type: ignore[arg-type]
        {"vllm_phase_budgets_s": {"compiling": "5"}, "vllm_load_rate_mib_s": 1000}))
    assert chosen["compiling"].seconds == 5.0 and chosen["loading weights"].seconds == 61.4


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_the_first_poll_is_what_the_batches_carry_and_every_later_poll_reads_now(
        tmp_path: Path, backend: str) -> None:
    """The readiness wait's first poll sends each node exactly the command its module declares
    (read_command on the master, peer_read_commands for every node), so a replica that already
    serves is seen from the batches; every later poll's command differs (its number), so a
    batch's answer is never taken for a later state of the node."""
    from vllm_provision.output.phases import JournalTail

    commands: list[tuple[str, str]] = []
    ctx, replica = _ctx(tmp_path, backend, {}, commands)
    ctx.replica, ctx.check_mode, ctx.host = replica, False, replica.master.host
    declared = vllm_wait_ready.peer_read_commands(ctx, {})
    assert set(declared) == {"h1", "h2"}
    assert vllm_wait_ready.read_command(ctx, {}) == declared["h1"]
    tail = JournalTail()
    vllm_wait_ready.observe_units(ctx, replica, tail, poll=1)
    assert dict(commands) == declared
    commands.clear()
    vllm_wait_ready.observe_units(ctx, replica, tail, poll=2)
    assert all(command.endswith("; : poll 2") for _, command in commands), commands
    assert not set(dict(commands).values()) & set(declared.values())
    ctx.check_mode = True
    assert vllm_wait_ready.peer_read_commands(ctx, {}) == {}
    assert vllm_wait_ready.read_command(ctx, {}) is None
