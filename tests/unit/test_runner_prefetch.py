"""Batched reads: a no-change play costs one round trip per host; a change falls back to live."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_runner import run, write_playbook
from test_runner_support import FakeHost, install_fake_systemctl, make_inventory

from vllm_provision.runner import prefetch
from vllm_provision.runner.prefetch import PrefetchingConnection, batch_script, split_batch
from vllm_provision.transport.base import CommandResult
from vllm_provision.transport.local import LocalConnection

PLAY = """
- hosts: all
  tasks:
    - name: State folder
      file: {path: "{{ root }}/etc", state: directory, mode: "0755"}
    - name: First config
      template: {src: a.j2, dest: "{{ root }}/etc/a.conf", mode: "0644"}
      notify: Restart
    - name: Second config
      template: {src: b.j2, dest: "{{ root }}/etc/b.conf", mode: "0640"}
    - name: Second config is a file
      file: {path: "{{ root }}/etc/b.conf", state: file}
    - name: The unit runs
      systemd: {name: app.service, state: started, enabled: true}
  handlers:
    - name: Restart
      command: "echo restarted >> {{ root }}/restarts"
"""


@pytest.fixture
def playbook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install_fake_systemctl(tmp_path, monkeypatch)
    path = write_playbook(tmp_path, PLAY)
    templates = path.parent / "templates"
    templates.mkdir()
    (templates / "a.j2").write_text("a={{ inventory_hostname }}\n")
    (templates / "b.j2").write_text("b=2")
    return path


def results(runner: object) -> list[tuple[str, str, str, str]]:
    return sorted((r.host, r.task, r.status.value, r.message + r.diff)
                  for r in runner.outcome.results)  # type: ignore[attr-defined]


def test_no_change_play_is_one_remote_command_per_host(tmp_path: Path, playbook: Path) -> None:
    inventory = make_inventory(tmp_path)
    first, _ = run(inventory, playbook)
    assert {r.status.value for r in first.outcome.results} >= {"changed"}
    fakes: dict[str, FakeHost] = {}
    second, summary = run(inventory, playbook, fakes=fakes)
    assert summary["changed"] == 0 and summary["failed"] == 0
    assert summary["ok"] == 10  # 5 tasks x 2 hosts
    assert [len(f.commands) for f in fakes.values()] == [1, 1]


def test_reads_after_a_change_are_live(tmp_path: Path, playbook: Path) -> None:
    inventory = make_inventory(tmp_path, ("h1",))
    run(inventory, playbook)
    (tmp_path / "h1" / "etc" / "b.conf").unlink()  # task 3 must write, task 4 must see it
    fakes: dict[str, FakeHost] = {}
    runner, summary = run(inventory, playbook, fakes=fakes)
    by_task = {r.task: r.status.value for r in runner.outcome.results}
    # without dropping the cache, task 4 would get the prefetched "ABSENT" and fail
    assert by_task == {"State folder": "ok", "First config": "ok", "Second config": "changed",
                       "Second config is a file": "ok", "The unit runs": "ok"}
    commands = fakes["h1"].commands
    assert len(commands) == 4  # batch, write of b.conf, live stat, live systemctl show
    assert commands[2].startswith("stat -c") and "b.conf" in commands[2]
    assert commands[3].startswith("systemctl show")


def test_an_unchanged_command_splits_the_play_into_two_batches(tmp_path: Path,
                                                               playbook: Path) -> None:
    path = write_playbook(tmp_path, """
- hosts: all
  tasks:
    - name: State folder
      file: {path: "{{ root }}/etc", state: directory}
    - name: Leave a marker
      command: "touch {{ root }}/etc/marker"
      changed_when: false
    - name: The marker is a file
      file: {path: "{{ root }}/etc/marker", state: file, mode: "0600"}
    - name: Config
      template: {src: a.j2, dest: "{{ root }}/etc/a.conf"}
""", "split.yml")
    inventory = make_inventory(tmp_path, ("h1",))
    run(inventory, path)
    (tmp_path / "h1" / "etc" / "marker").unlink()
    (tmp_path / "h1" / "etc" / "a.conf").chmod(0o644)
    fakes: dict[str, FakeHost] = {}
    runner, summary = run(inventory, path, fakes=fakes)
    # the reads after the command were batched AFTER it ran: the new marker is seen (and chmod-ed)
    by_task = {r.task: r.status.value for r in runner.outcome.results}
    assert by_task == {"State folder": "ok", "Leave a marker": "ok",
                       "The marker is a file": "changed", "Config": "ok"}
    # batch (1 read), command, batch (2 reads), chmod, then the template read live after the change
    assert len(fakes["h1"].commands) == 5
    assert fakes["h1"].commands[4].startswith("if [ -f ")
    fakes = {}
    runner, summary = run(inventory, path, fakes=fakes)
    assert summary["changed"] == 0 and summary["failed"] == 0
    assert len(fakes["h1"].commands) == 3  # batch, command, batch


def test_a_leading_command_shares_the_batch_and_runs_once(tmp_path: Path) -> None:
    """A play that starts with a command (the facts read of bench/workload): the command leads
    the batch, the reads after it run after it (they see what it did), and it runs exactly once
    per run, also when a later task changes something and the rest of the play goes live."""
    path = write_playbook(tmp_path, """
- hosts: all
  tasks:
    - name: Count the runs and leave a marker
      command: "echo run >> {{ root }}/runs; touch {{ root }}/marker"
      register: counted
      changed_when: false
    - name: The marker is private
      file: {path: "{{ root }}/marker", state: file, mode: "0600"}
    - name: Config from the command's output
      template: {src: a.j2, dest: "{{ root }}/a.conf"}
""", "lead.yml")
    (path.parent / "templates").mkdir(exist_ok=True)
    (path.parent / "templates" / "a.j2").write_text("rc={{ counted.rc }}\n")
    inventory = make_inventory(tmp_path, ("h1",))
    run(inventory, path)
    runs = tmp_path / "h1" / "runs"
    assert runs.read_text() == "run\n"
    (tmp_path / "h1" / "marker").unlink()  # the command makes it again; the file task sees it
    fakes: dict[str, FakeHost] = {}
    runner, _ = run(inventory, path, fakes=fakes)
    by_task = {r.task: r.status.value for r in runner.outcome.results}
    assert by_task == {"Count the runs and leave a marker": "ok",
                       "The marker is private": "changed",
                       "Config from the command's output": "ok"}
    assert runs.read_text() == "run\n" * 2
    assert fakes["h1"].commands[0].count("echo run") == 1  # the batch, the command at its head
    fakes = {}
    runner, summary = run(inventory, path, fakes=fakes)
    assert summary["changed"] == 0 and summary["failed"] == 0
    assert len(fakes["h1"].commands) == 1 and runs.read_text() == "run\n" * 3


def test_batched_and_live_runs_give_identical_results(tmp_path: Path, playbook: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    batched_root, live_root = tmp_path / "batched", tmp_path / "live"
    batched_root.mkdir()
    live_root.mkdir()
    outcomes: dict[str, list[list[tuple[str, str, str, str]]]] = {"batched": [], "live": []}
    for label, root in (("batched", batched_root), ("live", live_root)):
        with monkeypatch.context() as patch:
            if label == "live":
                patch.setattr(PrefetchingConnection, "prefetch", lambda self, commands, ahead=(): 0)
            inventory = make_inventory(root)
            for step in ("first", "second", "drift", "check"):
                if step == "drift":
                    (root / "h2" / "etc" / "a.conf").write_text("drifted\n")
                    (root / "h1" / "etc" / "b.conf").chmod(0o600)
                    continue
                runner, _ = run(inventory, playbook, check=step == "check", diff=True)
                outcomes[label].append([(h, t, s, m.replace(str(root), "ROOT"))
                                        for h, t, s, m in results(runner)])
    assert outcomes["batched"] == outcomes["live"]
    statuses = {s for run_results in outcomes["batched"] for _, _, s, _ in run_results}
    assert statuses >= {"ok", "changed"}
    # check mode wrote nothing in either tree
    assert (batched_root / "h2" / "etc" / "a.conf").read_text() == "drifted\n"
    assert (live_root / "h2" / "etc" / "a.conf").read_text() == "drifted\n"


def test_split_batch_keeps_each_commands_output_and_exit_code() -> None:
    commands = ["printf 'no newline'", "echo out; echo err >&2; exit 3", "true",
                "printf 'two\\nlines\\n'"]
    nonce = "abc123"
    done = LocalConnection("h").run(batch_script(commands, nonce))
    parts = split_batch(done.stdout, done.stderr, len(commands), nonce)
    assert parts is not None
    assert [(p.exit_code, p.stdout, p.stderr) for p in parts] == [
        (0, "no newline", ""), (3, "out\n", "err\n"), (0, "", ""), (0, "two\nlines\n", "")]
    assert split_batch(done.stdout[:-20], done.stderr, len(commands), nonce) is None


class Counting:
    """An inner connection that counts and answers every command with its own text."""

    def __init__(self) -> None:
        self.name = "h"
        self.sent: list[str] = []

    def run(self, command: str, **_: object) -> CommandResult:
        self.sent.append(command)
        return LocalConnection("h").run(command)


def test_cache_hit_only_for_same_command_default_sudo_no_stdin() -> None:
    inner = Counting()
    conn = PrefetchingConnection(inner)
    assert conn.prefetch(["echo a", "echo b", "echo c"]) == 3
    assert conn.run("echo a").stdout == "a\n" and len(inner.sent) == 1
    assert conn.run("echo b", sudo=True).stdout == "b\n" and len(inner.sent) == 2
    # the live command dropped the cache: "echo c" is read live too
    assert conn.run("echo c").stdout == "c\n" and len(inner.sent) == 3


def test_the_same_read_asked_twice_is_answered_twice() -> None:
    inner = Counting()
    conn = PrefetchingConnection(inner)
    conn.prefetch(["echo a", "echo b"])
    assert [conn.run(c).stdout for c in ("echo a", "echo b", "echo a")] == ["a\n", "b\n", "a\n"]
    assert len(inner.sent) == 1


def test_cache_dropped_by_a_write_and_by_age(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = Counting()
    conn = PrefetchingConnection(inner)
    conn.prefetch(["echo a", "echo b"])
    conn.run("touch /dev/null")
    conn.run("echo a")
    assert len(inner.sent) == 3
    conn.prefetch(["echo a"])
    clock = [prefetch.time.monotonic() + prefetch.MAX_AGE_S + 1]
    monkeypatch.setattr(prefetch.time, "monotonic", lambda: clock[0])
    conn.run("echo a")
    assert len(inner.sent) == 5


def test_a_read_that_fails_is_answered_with_its_exit_code(tmp_path: Path) -> None:
    inner = Counting()
    conn = PrefetchingConnection(inner)
    missing = tmp_path / "missing"
    conn.prefetch([f"cat {missing}"])
    answer = conn.run(f"cat {missing}")
    assert answer.exit_code != 0 and "No such file" in answer.stderr and len(inner.sent) == 1


HOLD_PLAY = """
- hosts: all
  tasks:
    - name: Hold (a write leads the first play's batch)
      command: "echo held >> {{ root }}/holds"
      changed_when: false
"""

THREE_PLAYS = HOLD_PLAY + """- hosts: all
  tasks:
    - name: Which folder the venv is (read only)
      command: {cmd: "echo venv-a", read_only: true}
      register: resolved
    - name: The user exists, else create it
      command: {cmd: "echo created >> {{ root }}/users", unless: "test -e {{ root }}/user"}
    - name: Config
      template: {src: a.j2, dest: "{{ root }}/a.conf"}
- hosts: all
  tasks:
    - name: Config is private
      file: {path: "{{ root }}/a.conf", state: file, mode: "0600"}
"""


def _three_plays(tmp_path: Path) -> Path:
    path = write_playbook(tmp_path, THREE_PLAYS, "three.yml")
    (path.parent / "templates").mkdir(exist_ok=True)
    (path.parent / "templates" / "a.j2").write_text("venv={{ resolved.stdout }}\n")
    return path


def test_later_plays_reads_ride_in_the_first_batch(tmp_path: Path) -> None:
    """A no-change run of three plays: one round trip per host. The hold leads the first
    play's batch and every read of the plays after it follows it in the same batch; the
    read-only command and the ``unless`` probe are among them."""
    path = _three_plays(tmp_path)
    inventory = make_inventory(tmp_path, ("h1",))
    first, _ = run(inventory, path)
    assert {r.task: r.status.value for r in first.outcome.results}[
        "The user exists, else create it"] == "changed"  # the probe failed: cmd ran
    (tmp_path / "h1" / "user").touch()
    fakes: dict[str, FakeHost] = {}
    runner, summary = run(inventory, path, fakes=fakes)
    by_task = {r.task: r.status.value for r in runner.outcome.results}
    assert by_task == {"Hold (a write leads the first play's batch)": "ok",
                       "Which folder the venv is (read only)": "ok",
                       "The user exists, else create it": "ok", "Config": "ok",
                       "Config is private": "ok"}
    assert summary["changed"] == 0
    (batch,) = fakes["h1"].commands
    assert batch.index("echo held") < batch.index("echo venv-a") < batch.index("test -e")
    assert (tmp_path / "h1" / "holds").read_text() == "held\n" * 2  # ran once per run
    assert (tmp_path / "h1" / "users").read_text() == "created\n"


def test_a_change_in_a_later_play_makes_its_reads_live_again(tmp_path: Path) -> None:
    """Reads fetched ahead are never answered stale: the template changes a.conf, so the
    next play's stat of it runs live after the write and sees the new file."""
    path = _three_plays(tmp_path)
    inventory = make_inventory(tmp_path, ("h1",))
    run(inventory, path)
    (tmp_path / "h1" / "a.conf").write_text("edited\n")
    (tmp_path / "h1" / "a.conf").chmod(0o644)
    fakes: dict[str, FakeHost] = {}
    runner, _ = run(inventory, path, fakes=fakes)
    by_task = {r.task: r.status.value for r in runner.outcome.results}
    assert by_task["Config"] == "changed" and by_task["Config is private"] == "changed"
    assert (tmp_path / "h1" / "a.conf").stat().st_mode & 0o777 == 0o600
    assert fakes["h1"].commands[-2].startswith("stat -c")  # live, after the template's write


PEER_PLAYS = HOLD_PLAY + """- hosts: h1
  tasks:
    - name: Read every node from the master
      peer_probe: {}
"""


def test_a_read_the_master_sends_a_follower_rides_in_the_follower_s_first_batch(
        tmp_path: Path) -> None:
    """A module that reads other hosts first (``peer_read_commands``, as ``vllm_wait_ready``
    reads every node) has the follower's read carried by the follower's earlier batch, though
    the follower is not in its play: one round trip per host for the whole run, and the
    answer is the follower's own."""
    from vllm_provision.core.results import Status
    from vllm_provision.modules import ModuleResult, register_module

    def reads(ctx: object, args: object) -> dict[str, str]:
        return {n.name: f"cat {n.host.vars['root']}/state"
                for n in ctx.replica.nodes}  # type: ignore[attr-defined]

    def probe(ctx: object, args: object) -> ModuleResult:
        seen = {name: ctx.connections[name].run(command).stdout.strip()  # type: ignore[attr-defined]
                for name, command in reads(ctx, args).items()}
        return ModuleResult(Status.OK, "", data={"seen": seen})

    register_module("peer_probe", probe,
                    read_command=lambda ctx, args: reads(ctx, args)[ctx.host.name],
                    peer_read_commands=reads)
    path = write_playbook(tmp_path, PEER_PLAYS, "peer.yml")
    inventory = make_inventory(tmp_path)
    for name in ("h1", "h2"):
        (tmp_path / name / "state").write_text(f"state of {name}\n")
    fakes: dict[str, FakeHost] = {}
    runner, summary = run(inventory, path, fakes=fakes)
    assert summary["failed"] == 0
    [probed] = [r for r in runner.outcome.results if r.task == "Read every node from the master"]
    assert probed.data == {"seen": {"h1": "state of h1", "h2": "state of h2"}}
    assert [len(fakes[n].commands) for n in ("h1", "h2")] == [1, 1]
    assert "/h2/state" in fakes["h2"].commands[0] and "echo held" in fakes["h2"].commands[0]
