"""Runner semantics with fake hosts whose commands run locally in a temp folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_runner_support import FakeHost, make_inventory

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, register_module
from vllm_provision.output import report
from vllm_provision.runner import Runner, RunOptions, load_playbook

DATA = Path(__file__).resolve().parents[1] / "data" / "playbooks" / "engine"


def write_playbook(tmp_path: Path, text: str, name: str = "play.yml") -> Path:
    folder = tmp_path / "playbooks"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def write_play(tmp_path: Path, hosts: str, tasks: str, name: str = "play.yml") -> Path:
    """Write a playbook of one play on ``hosts`` (a host pattern) whose ``tasks:`` list is the
    YAML ``tasks`` (a newline, then the items indented by 4 spaces); see :func:`write_playbook`."""
    return write_playbook(tmp_path, f"\n- hosts: {hosts}\n  tasks:{tasks}", name)


def run(inventory: Any, playbook: Path, *, check: bool = False, diff: bool = False,
        fakes: dict[str, FakeHost] | None = None, **factory: Any) -> tuple[Runner, dict]:
    fakes = fakes if fakes is not None else {}

    def factory_fn(host: Host) -> FakeHost:
        fakes[host.name] = FakeHost(host, **factory.get(host.name, {}))
        return fakes[host.name]

    runner = Runner(inventory, RunOptions(check_mode=check, diff_mode=diff,
                                          pending_dir=str(inventory.path.parent / "pending")),
                    connection_factory=factory_fn)
    outcome = runner.run_playbook(playbook)
    summary = report.summarize(outcome.results, outcome.hosts, check_mode=check,
                               duration_s=outcome.duration_s)
    return runner, summary


def statuses(runner: Runner, task: str) -> dict[str, str]:
    return {r.host: r.status.value for r in runner.outcome.results if r.task == task}


def test_role_template_is_changed_then_ok_and_handler_runs_once(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    playbook = DATA / "playbooks" / "demo.yml"
    runner, first = run(inventory, playbook)
    assert statuses(runner, "Install the app config") == {"h1": "changed", "h2": "changed"}
    assert statuses(runner, "Restart the app") == {"h1": "changed", "h2": "changed"}
    assert (tmp_path / "h1" / "app.conf").read_text() == (
        "# managed by vllm-provision (role demo)\ngreeting=hello from defaults\nlisten=h1:8000\n")
    assert oct((tmp_path / "h1" / "app.conf").stat().st_mode & 0o777) == "0o640"
    runner, second = run(inventory, playbook)
    assert second["changed"] == 0 and second["failed"] == 0
    assert statuses(runner, "Restart the app") == {}
    assert (tmp_path / "h1" / "restarts").read_text() == "restarted\n"


def test_no_change_costs_one_round_trip_per_host_per_play(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    playbook = DATA / "playbooks" / "demo.yml"
    run(inventory, playbook)
    fakes: dict[str, FakeHost] = {}
    run(inventory, playbook, fakes=fakes)
    # the read of pending notifications (the play has handlers) and the template read, batched
    assert len(fakes["h1"].commands) == 1


def test_precedence_defaults_inventory_play_vars_extra_vars(tmp_path: Path) -> None:
    playbook = write_playbook(tmp_path, """
- hosts: all
  vars: {from_play: play, both: play}
  tasks:
    - name: Write the variables
      command: "echo {{ greeting }} {{ both }} {{ from_play }} {{ port }} > {{ root }}/vars"
""")
    (tmp_path / "roles").mkdir()
    inventory = make_inventory(tmp_path, host_vars={"h1": {"greeting": "from-host"}},
                               extra_vars={"both": "extra"})
    plays = load_playbook(playbook)
    runner = Runner(inventory, RunOptions(), connection_factory=FakeHost)
    object.__setattr__(plays[0], "role_defaults", {"greeting": "default", "port": 1})
    runner.run_plays(plays)
    assert (tmp_path / "h1" / "vars").read_text() == "from-host extra play 1\n"
    assert (tmp_path / "h2" / "vars").read_text() == "default extra play 1\n"


def test_when_false_skips_and_list_means_all(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "llama", """
    - name: Only on the master
      command: "touch {{ root }}/master"
      when: node.rank == 0
    - name: Never
      command: "touch {{ root }}/never"
      when: ["node.rank == 0", "replica.backend == 'ray'"]
""")
    runner, summary = run(make_inventory(tmp_path), playbook)
    assert statuses(runner, "Only on the master") == {"h1": "changed", "h2": "skipped"}
    assert statuses(runner, "Never") == {"h1": "skipped", "h2": "skipped"}
    assert (tmp_path / "h1" / "master").exists() and not (tmp_path / "h2" / "master").exists()


def test_undefined_variable_fails_that_host_with_its_name(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "llama", """
    - name: Use a missing variable
      command: "echo {{ nope }}"
    - name: Not reached
      command: "true"
""")
    runner, summary = run(make_inventory(tmp_path), playbook)
    failed = [r for r in runner.outcome.results if r.status is Status.FAILED]
    assert {r.host for r in failed} == {"h1", "h2"}
    assert "nope" in failed[0].message
    assert statuses(runner, "Not reached") == {}
    assert report.exit_code(summary, check_mode=False) == 1


def test_register_and_changed_when(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "llama", """
    - name: Read a value
      command: echo 42
      register: answer
      changed_when: false
    - name: Use it
      command: "echo {{ answer.stdout | int + 1 }} > {{ root }}/answer"
      changed_when: answer.rc == 0
""")
    runner, summary = run(make_inventory(tmp_path), playbook)
    assert statuses(runner, "Read a value") == {"h1": "ok", "h2": "ok"}
    assert (tmp_path / "h2" / "answer").read_text() == "43\n"


def test_failed_host_drops_out_others_go_on(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "llama", """
    - name: Fail on h2
      command: "test {{ inventory_hostname }} = h1"
    - name: Next
      command: "touch {{ root }}/next"
""")
    runner, summary = run(make_inventory(tmp_path), playbook)
    assert statuses(runner, "Next") == {"h1": "changed"}
    assert summary["hosts"]["h2"]["failed"] == 1
    assert summary["hosts"]["h2"]["failures"][0]["task"] == "Fail on h2"


def test_any_errors_fatal_stops_every_host(tmp_path: Path) -> None:
    playbook = write_playbook(tmp_path, """
- hosts: llama
  any_errors_fatal: true
  tasks:
    - name: Fail on h2
      command: "test {{ inventory_hostname }} = h1"
    - name: Next
      command: "true"
""")
    runner, _ = run(make_inventory(tmp_path), playbook)
    assert statuses(runner, "Next") == {}
    assert runner.outcome.aborted


def test_unreachable_host_is_reported_and_others_converge(tmp_path: Path) -> None:
    runner, summary = run(make_inventory(tmp_path), DATA / "playbooks" / "demo.yml",
                          h2={"unreachable": True})
    assert summary["hosts"]["h2"]["unreachable"] == 1
    assert summary["hosts"]["h1"]["changed"] == 2
    assert report.exit_code(summary, check_mode=False) == 1


def test_check_mode_changes_nothing_and_exits_2(tmp_path: Path) -> None:
    runner, summary = run(make_inventory(tmp_path), DATA / "playbooks" / "demo.yml",
                          check=True, diff=True)
    assert not (tmp_path / "h1" / "app.conf").exists()
    assert statuses(runner, "Install the app config") == {"h1": "changed", "h2": "changed"}
    result = next(r for r in runner.outcome.results if r.task == "Install the app config")
    assert "+greeting=hello from defaults" in result.diff
    assert not (tmp_path / "pending").exists()
    assert report.exit_code(summary, check_mode=True) == 2
    run(make_inventory(tmp_path), DATA / "playbooks" / "demo.yml")
    _, again = run(make_inventory(tmp_path), DATA / "playbooks" / "demo.yml", check=True)
    assert report.exit_code(again, check_mode=True) == 0


def test_notification_survives_a_later_failure_and_runs_next_time(tmp_path: Path) -> None:
    failing = write_playbook(tmp_path, """
- hosts: llama
  tasks:
    - name: Write the config
      command: "echo v1 > {{ root }}/conf"
      notify: Restart
    - name: Break
      command: "false"
  handlers:
    - name: Restart
      command: "echo restarted >> {{ root }}/restarts"
""", "failing.yml")
    runner, _ = run(make_inventory(tmp_path), failing)
    assert not (tmp_path / "h1" / "restarts").exists()
    assert list((tmp_path / "pending").glob("*.pending"))
    healthy = write_playbook(tmp_path, """
- hosts: llama
  tasks:
    - name: Write the config
      command: "echo v1 > {{ root }}/conf"
      changed_when: false
      notify: Restart
  handlers:
    - name: Restart
      command: "echo restarted >> {{ root }}/restarts"
""", "healthy.yml")
    runner, _ = run(make_inventory(tmp_path), healthy)
    restart = [r for r in runner.outcome.results if r.task == "Restart"]
    assert {r.host for r in restart} == {"h1", "h2"}
    assert "earlier run" in restart[0].message
    assert (tmp_path / "h1" / "restarts").read_text() == "restarted\n"
    assert not list((tmp_path / "pending").glob("*.pending"))
    runner, _ = run(make_inventory(tmp_path), healthy)
    assert statuses(runner, "Restart") == {}


def test_notification_persisted_in_the_same_round_trip_as_the_change(tmp_path: Path) -> None:
    fakes: dict[str, FakeHost] = {}
    # the template write is the 2nd command (pending read + template read batched, write): cut
    # after it
    runner, summary = run(make_inventory(tmp_path, ("h1",)), DATA / "playbooks" / "demo.yml",
                          fakes=fakes, h1={"fail_after": 2})
    assert statuses(runner, "Restart the app") == {"h1": "unreachable"}
    assert (tmp_path / "h1" / "app.conf").exists()
    pending = list((tmp_path / "pending").glob("*.pending"))
    assert pending and "Restart the app" in pending[0].read_text()


def test_replica_handler_runs_followers_first_once_per_replica(tmp_path: Path) -> None:
    calls: list[str] = []

    def record(ctx: Any, args: Any) -> ModuleResult:
        calls.append(ctx.host.name)
        return ModuleResult(Status.CHANGED)

    register_module("record_call", record)
    playbook = write_playbook(tmp_path, """
- hosts: llama
  tasks:
    - name: Change h2 only
      command: "true"
      changed_when: inventory_hostname == 'h3'
      notify: Restart the replica
    - name: Change every node
      command: "true"
      notify: Restart the replica
  handlers:
    - name: Restart the replica
      record_call: {}
      scope: replica
""")
    run(make_inventory(tmp_path, ("h1", "h2", "h3")), playbook)
    assert calls == ["h2", "h3", "h1"]


def test_json_summary_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, summary = run(make_inventory(tmp_path), DATA / "playbooks" / "demo.yml")
    report.print_json(summary)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    data = json.loads(out)
    assert {k: data[k] for k in ("ok", "changed", "failed", "skipped", "unreachable")} == {
        "ok": 0, "changed": 4, "failed": 0, "skipped": 0, "unreachable": 0}
    assert data["hosts"]["h1"]["changed"] == 2 and data["hosts"]["h1"]["failures"] == []
    assert {t["status"] for t in data["tasks"]} == {"changed"}
    assert data["check_mode"] is False and data["duration_s"] >= 0


def test_secrets_are_masked_in_messages_and_diffs(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "llama", """
    - name: Write the key
      template: {src: key.j2, dest: "{{ root }}/key"}
    - name: Echo it
      command: "echo {{ vllm_api_key }}; false"
""")
    (tmp_path / "playbooks" / "templates").mkdir()
    (tmp_path / "playbooks" / "templates" / "key.j2").write_text(
        "NAME=app\nKEY={{ vllm_api_key }}\n")
    inventory = make_inventory(tmp_path, group_vars={"vllm_api_key": "sup3r-s3cret"})
    runner, summary = run(inventory, playbook, diff=True)
    text = json.dumps(summary)
    assert "sup3r-s3cret" not in text
    assert "KEY=********" in text


def test_playbook_errors_name_the_place(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "all", """
    - name: Typo
      templte: {src: a, dest: /b}
""")
    with pytest.raises(ProvisionError) as caught:
        load_playbook(playbook)
    assert "tasks[0].templte" in caught.value.render()
    assert "template" in caught.value.render()
    missing = write_play(tmp_path, "all", """
    - name: Notify nobody
      command: "true"
      notify: Restart
""", "missing.yml")
    with pytest.raises(ProvisionError, match="no handler named 'Restart'"):
        load_playbook(missing)


def test_unknown_host_pattern_is_refused_before_connecting(tmp_path: Path) -> None:
    playbook = write_playbook(tmp_path, "- hosts: nosuchgroup\n  tasks: []\n")
    opened: list[str] = []

    def factory(host: Host) -> FakeHost:
        opened.append(host.name)
        return FakeHost(host)

    runner = Runner(make_inventory(tmp_path), RunOptions(), connection_factory=factory)
    with pytest.raises(ProvisionError, match="nosuchgroup"):
        runner.run_playbook(playbook)
    assert opened == []
