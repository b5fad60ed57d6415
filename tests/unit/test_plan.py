"""The dry run's plan: handlers that would run, on which hosts in which order, the outage."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from inventory_support import load_llama
from test_runner import run, write_playbook
from test_runner_support import install_fake_systemctl, make_inventory

from vllm_provision import state
from vllm_provision.operations.plan import build_plan, plan_lines

PLAY = """
- hosts: all
  tasks:
    - name: Engine config
      template: {src: engine.j2, dest: "{{ root }}/engine.env", mode: "0600"}
      notify: [Restart the replica, Restart the watchdog]
  handlers:
    - name: Restart the replica
      systemd: {name: vllm.service, state: restarted, if_running: true}
      scope: replica
      order: followers_first
    - name: Restart the watchdog
      systemd: {name: vllm-watchdog.service, state: restarted, if_running: true}
    - name: Never for this host
      systemd: {name: other.service, state: restarted, if_running: true}
      when: false
"""

SERVING = {"h1": ["vllm.service"], "h2": ["vllm.service"]}


@pytest.fixture
def playbook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install_fake_systemctl(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_ACTIVE", "active")
    path = write_playbook(tmp_path, PLAY)
    (path.parent / "templates").mkdir()
    (path.parent / "templates" / "engine.j2").write_text("MAX_LEN={{ max_len }}\n")
    return path


def test_check_mode_plan_names_restarts_in_order_with_the_outage(tmp_path: Path,
                                                                 playbook: Path) -> None:
    inventory = make_inventory(tmp_path, extra_vars={"max_len": 1024})
    runner, summary = run(inventory, playbook, check=True)
    plan = build_plan(runner.outcome, inventory, SERVING, {"llama": 7.06})
    assert [(s["handler"], s["hosts"], s["replicas"]) for s in plan["steps"]] == [
        ("Restart the replica", ["h2", "h1"], ["llama"]),
        ("Restart the watchdog", ["h1", "h2"], [])]
    assert plan["steps"][0]["line"] == (
        "Restart the replica: would restart vllm.service on h2, then h1: the replica 'llama' "
        "stops serving during the restart (about 7.1 s, its last start to serving)")
    assert plan["steps"][1]["line"].endswith(", together: the replica keeps serving")
    assert plan["summary"] == ("2 to change, 4 restarts, replica 'llama' would be unavailable "
                               "(last start 7.1 s)")
    assert plan_lines(plan)[-1] == plan["summary"]
    assert not (tmp_path / "systemctl.log").exists()  # nothing was restarted
    # the real run does what the plan said, in that order
    real, _ = run(inventory, playbook)
    log = (tmp_path / "systemctl.log").read_text().splitlines()
    assert log[:2] == ["restart -- vllm.service", "restart -- vllm.service"]
    assert sorted(log[2:]) == ["restart -- vllm-watchdog.service"] * 2
    order = [h.result.host for h in real.outcome.handler_results
             if h.handler == "Restart the replica"]
    assert order == ["h2", "h1"]


def test_no_change_and_stopped_units_plan_no_restart(tmp_path: Path, playbook: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = make_inventory(tmp_path, extra_vars={"max_len": 1024})
    run(inventory, playbook)
    runner, _ = run(inventory, playbook, check=True)
    plan = build_plan(runner.outcome, inventory, SERVING, {"llama": 7.0})
    assert plan["steps"] == [] and plan["summary"] == (
        "0 to change, 0 restarts, replica 'llama' keeps serving")
    # a change while the units are stopped: the handlers run but restart nothing (ok)
    monkeypatch.setenv("FAKE_ACTIVE", "inactive")
    changed = make_inventory(tmp_path, extra_vars={"max_len": 2048})
    runner, _ = run(changed, playbook, check=True)
    plan = build_plan(runner.outcome, changed, SERVING, {})
    assert plan["steps"] == [] and plan["changes"] == 2


def test_a_handler_check_mode_cannot_simulate_is_listed_as_would_run(tmp_path: Path) -> None:
    playbook = write_playbook(tmp_path, """
- hosts: all
  tasks:
    - name: Config
      file: {path: "{{ root }}/flag", state: touch}
      notify: Reload the app
  handlers:
    - name: Reload the app
      command: "echo reloaded"
""")
    inventory = make_inventory(tmp_path, ("h1",))
    runner, _ = run(inventory, playbook, check=True)
    plan = build_plan(runner.outcome, inventory, {}, {})
    assert [s["line"] for s in plan["steps"]] == [
        "Reload the app: would run on h1 (check mode cannot tell what it would do)"]


def test_check_mode_lists_one_daemon_reload_like_the_real_run(tmp_path: Path,
                                                              playbook: Path) -> None:
    unit = f"/etc/systemd/system/vp-plan-test-{os.getpid()}.service"
    path = write_playbook(tmp_path, f"""
- hosts: all
  tasks:
    - name: Unit
      template: {{src: engine.j2, dest: "{unit}", mode: "0644"}}
    - name: First reload
      systemd: {{daemon_reload: true}}
    - name: Second reload (a later role)
      systemd: {{daemon_reload: true}}
""", name="reload.yml")
    inventory = make_inventory(tmp_path, ("h1",), extra_vars={"max_len": 1})
    runner, _ = run(inventory, path, check=True)
    got = {r.task: r.status.value for r in runner.outcome.results}
    assert got == {"Unit": "changed", "First reload": "changed", "Second reload (a later role)":
                   "ok"}
    assert not Path(unit).exists()


def test_systemd_if_running_needs_state_restarted(tmp_path: Path, playbook: Path) -> None:
    path = write_playbook(tmp_path, """
- hosts: all
  tasks:
    - name: Bad
      systemd: {name: vllm.service, state: started, if_running: true}
""", name="bad.yml")
    runner, _ = run(make_inventory(tmp_path, ("h1",)), path)
    [result] = runner.outcome.results
    assert result.status.value == "failed" and "only applies to state: restarted" in \
        result.message


def test_serving_record_keeps_the_last_measured_start() -> None:
    begun = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    fresh = state.serving_record(None, "llm", 7.1234, begun)
    assert fresh == {"start_to_serving_s": 7.123, "deployed_at": "2026-01-02T03:04:05Z",
                     "start_key": None, "last_start": "cold",
                     "starts": {"cold": {"start_to_serving_s": 7.123,
                                         "at": "2026-01-02T03:04:05Z", "phase_s": {}}}}
    previous = {"replicas": {"llm": fresh}}
    later = datetime(2026, 1, 3, tzinfo=UTC)
    assert state.serving_record(previous, "llm", None, later) == fresh  # already serving
    assert state.serving_record(previous, "other", None, later) == {
        "start_to_serving_s": None, "deployed_at": None, "start_key": None,
        "last_start": None, "starts": {}}
    assert state.last_start_s(previous) == {"llm": 7.123}
    assert state.last_start_s(None) == {}


def test_the_start_key_reads_the_replicas_engine_and_rank_0s_versions(tmp_path: Path) -> None:
    from vllm_provision.facts.model import HostFacts

    replica = load_llama(tmp_path).replicas[0]
    master = replica.master.name
    facts = {master: HostFacts(host=master, packages={"vllm": "0.11.0", "torch": "2.8.0"})}
    key = state.start_key(replica, facts)
    assert key["nodes"] == [n.name for n in replica.nodes] and key["backend"] == replica.backend
    assert (key["vllm"], key["torch"]) == ("0.11.0", "2.8.0")
    assert key["extra_args"] == list(replica.engine.extra_args)
    assert state.start_key(replica, {})["vllm"] is None  # facts not gathered


def test_a_start_with_the_last_starts_key_is_warm_and_both_kinds_are_kept() -> None:
    key = {"nodes": ["h1", "h2"], "model": "/m", "vllm": "0.11.0", "torch": "2.8.0",
           "tensor_parallel_size": 4, "pipeline_parallel_size": 2, "max_model_len": None,
           "extra_args": ["--dtype", "bfloat16"]}
    day = [datetime(2026, 1, d, tzinfo=UTC) for d in (1, 2, 3, 4)]
    phases = {"h1": {"loading weights": 30.0}}
    first = state.serving_record(None, "llm", 95.2, day[0], key=key, phase_s=phases)
    assert first["last_start"] == "cold" and first["starts"]["cold"]["phase_s"] == phases
    record = {"replicas": {"llm": first}}
    second = state.serving_record(record, "llm", 40.1, day[1], key=dict(key))
    assert second["last_start"] == "warm"
    assert second["starts"] == {"cold": first["starts"]["cold"],
                                "warm": {"start_to_serving_s": 40.1,
                                         "at": "2026-01-02T00:00:00Z", "phase_s": {}}}
    # an upgrade of vLLM changes the key: cold again, the last warm start is kept
    upgraded = state.serving_record({"replicas": {"llm": second}}, "llm", 99.0, day[2],
                                    key={**key, "vllm": "0.12.0"})
    assert upgraded["last_start"] == "cold"
    assert upgraded["starts"]["cold"]["start_to_serving_s"] == 99.0
    assert upgraded["starts"]["warm"] == second["starts"]["warm"]
    # another owner's entry is not this replica's history
    other = state.serving_record({"replicas": {"llm": {**second, "replica_id": "x"}}}, "llm",
                                 41.0, day[3], key=key, replica_id="y")
    assert other["last_start"] == "cold" and set(other["starts"]) == {"cold"}
    described = state.describe_starts(state.recorded_starts(
        {"replicas": {"llm": second}})["llm"])
    assert described == ("cold 95.2 s (2026-01-01T00:00:00Z), warm 40.1 s "
                         "(2026-01-02T00:00:00Z)")
    assert state.describe_starts({}) == "none recorded"
    assert state.recorded_starts({"replicas": {"llm": {"starts": "junk"}}}) == {}


def test_plan_summary_without_a_measured_start() -> None:
    from vllm_provision.operations.plan import summary_line

    assert summary_line(1, 2, [{"replica": "llm", "unavailable": True, "last_start_s": None}]) \
        == "1 to change, 2 restarts, replica 'llm' would be unavailable (last start not measured)"


DOWN = """
- hosts: all
  tasks:
    - name: Stop the watchdog
      systemd: {name: vllm-watchdog.service, state: stopped}
- hosts: vllm_master
  tasks:
    - name: Stop vLLM
      systemd: {name: vllm.service, state: stopped, enabled: false}
- hosts: vllm_followers
  tasks:
    - name: Stop vLLM
      systemd: {name: vllm.service, state: stopped, enabled: false}
"""


def test_down_plan_stops_the_master_then_the_followers_together(tmp_path: Path,
                                                                playbook: Path) -> None:
    path = write_playbook(tmp_path, DOWN, name="down.yml")
    inventory = make_inventory(tmp_path, ("h1", "h2", "h3"))
    runner, _ = run(inventory, path, check=True)
    serving = {h: ["vllm.service"] for h in ("h1", "h2", "h3")}
    plan = build_plan(runner.outcome, inventory, serving, {"llama": 7.0})
    # the watchdog is no serving unit: not a step
    assert [s["line"] for s in plan["steps"]] == [
        "Stop vLLM: would stop vllm.service on h1, then h2 and h3, together: the replica "
        "'llama' stops serving"]
    assert plan["summary"] == "6 to change, 0 restarts, replica 'llama' would stop serving"
    again = build_plan(runner.outcome, inventory, serving, {"llama": 7.0}, starts_again=True)
    assert again["summary"].endswith("replica 'llama' would be unavailable (last start 7.0 s)")


def test_summary_of_an_incomplete_plan_claims_nothing_about_the_unread_replica() -> None:
    from vllm_provision.operations.plan import summary_line

    line = summary_line(0, 0, [{"replica": "llm", "unavailable": False, "stopped": False,
                                "last_start_s": 7.0, "unknown": ["h2"]},
                               {"replica": "other", "unavailable": False, "stopped": False,
                                "last_start_s": 7.0, "unknown": []}], 0, ["h2"])
    assert line.startswith("plan incomplete: h2 not read (unreachable or failed)")
    assert "replica 'llm' unknown (h2 not read)" in line
    assert "replica 'other' keeps serving" in line and "'llm' keeps" not in line


def test_an_up_that_found_the_replica_serving_records_no_start_to_serving() -> None:
    from vllm_provision.operations.deploy import measured_starts

    replicas = [
        {"name": "started", "start_to_serving_s": 7.1, "already_serving": False},
        # found serving at the first poll: 533 s is its units' uptime, not a start
        {"name": "was-serving", "start_to_serving_s": 533.4, "already_serving": True},
        {"name": "unmeasured", "start_to_serving_s": None, "already_serving": False},
        {"name": "failed-before-readiness"},
    ]
    assert measured_starts(replicas) == {"started": 7.1, "unmeasured": None}
