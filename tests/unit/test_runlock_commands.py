"""Every command that changes a host holds the run lock, and a run whose lock was lost makes no
further change on that host (docs/security.md, "Run lock").

Each host is a fake connection whose commands run locally, and whose run lock holder is the real
holder script run by a local bash (as in test_runlock.py), with the host's state folder in a
temporary directory: the same flock(1), holder file and heartbeat answers as over SSH.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from inventory_support import llama_yaml, write_inventory
from test_runner_support import FakeHost, LocalChannel, make_inventory

from vllm_provision.cli import cli
from vllm_provision.core.models import Host
from vllm_provision.core.paths import STATE_DIR
from vllm_provision.core.results import Status
from vllm_provision.evidence import fault
from vllm_provision.inventory import load_inventory
from vllm_provision.operations import stack as stack_op
from vllm_provision.runner.engine import Runner, RunOptions
from vllm_provision.stack import sync as stack_sync
from vllm_provision.transport import connection, runlock
from vllm_provision.transport.base import CommandResult, ConnectionOptions
from vllm_provision.transport.runlock import Holder, RunLock, RunLockError, RunLockLost

BOB = Holder("ctl-2", "bob", 4242, "2025-01-01T12:00:00Z", "up")


class LockHost(FakeHost):
    """A fake host whose state folder (the run lock's) is ``<root>/<host>/state``."""

    is_open = True

    def __init__(self, host: Host, root: Path) -> None:
        super().__init__(host)
        self.state = root / host.name / "state"
        self.channels: list[LocalChannel] = []

    def start(self, command: str, **kwargs: Any) -> LocalChannel:
        self.channels.append(LocalChannel(command.replace(STATE_DIR, str(self.state))))
        return self.channels[-1]

    def run(self, command: str, **kwargs: Any) -> Any:
        return super().run(command.replace(STATE_DIR, str(self.state)), **kwargs)

    def holder(self) -> Holder | None:
        path = self.state / "run.lock.holder"
        return Holder.parse(path.read_text()) if path.exists() else None


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, LockHost]:
    """The fake hosts the run lock opens (by host name), in place of SSH connections."""
    hosts: dict[str, LockHost] = {}

    def fake_open(wanted: Any, options: Any, factory: Any = None) -> Any:
        def make(host: Host) -> LockHost:
            hosts[host.name] = LockHost(host, tmp_path)
            return hosts[host.name]
        return connection.open_connections(wanted, options, factory or make)

    monkeypatch.setattr(runlock, "open_connections", fake_open)
    return hosts


@pytest.fixture
def inventory_file(tmp_path: Path) -> Path:
    return write_inventory(tmp_path, llama_yaml("mp", net="10.213.0",
                                                 vllm_stack_lock="stack.lock.txt"))


def other_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> RunLock:
    """Bob's ``provision up`` takes host ``name``'s lock (another run, on another controller)."""
    host = Host(name=name, address="10.0.0.99")
    with monkeypatch.context() as patch:
        patch.setattr(runlock, "this_run", lambda command: BOB)
        return RunLock.acquire({name: LockHost(host, tmp_path)}, "up", lambda _line: None)


def no_holder_left(hosts: dict[str, LockHost]) -> bool:
    return all(h.holder() is None and all(c.status_event.is_set() for c in h.channels)
               for h in hosts.values())


# -- each command takes the lock on every node, and releases it --------------------------------

def _fake_sync(seen: list[Any], made: dict[str, LockHost]) -> Any:
    def sync(replica: Any, path: Path, wheelhouse: Any, options: Any, *, progress: Any,
             factory: Any) -> tuple[str, list[Any]]:
        seen.append({n: h.holder() for n, h in made.items()})
        factory.ensure_held("h1", "h2")
        return "abc", []
    return sync


def _fake_rollback(seen: list[Any], made: dict[str, LockHost]) -> Any:
    def rollback(replica: Any, options: Any, factory: Any) -> tuple[bool, list[str]]:
        seen.append({n: h.holder() for n, h in made.items()})
        factory.ensure_held("h1", "h2")
        return False, ["h1: a -> b"]
    return rollback


def _fake_fault(seen: list[Any], made: dict[str, LockHost]) -> Any:
    def run(replica: Any, connections: Any, vars_: Any, *, node: Any, held: Any,
            **kwargs: Any) -> dict[str, Any]:
        seen.append({n: h.holder() for n, h in made.items()})
        held(node.name)
        return {"recovery": {"recovered_s": 1.0}, "target": {}, "streams": [], "events": []}
    return run


COMMANDS = {
    "stack sync": (["stack", "sync"], (stack_op, "sync_replica", _fake_sync)),
    "stack rollback": (["stack", "rollback"], (stack_op, "rollback_replica", _fake_rollback)),
    "fault": (["fault", "--kill", "h2", "--json"], (fault, "run", _fake_fault)),
}


def _patch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str, seen: list[Any],
           made: dict[str, LockHost]) -> list[str]:
    args, (module, name, fake) = COMMANDS[command]
    monkeypatch.setattr(module, name, fake(seen, made))
    monkeypatch.setattr("vllm_provision.evidence.store.update",
                        lambda *a, **k: tmp_path / "evidence.json")
    return args


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_holds_the_lock_on_every_node_and_releases_it(
        command: str, made: dict[str, LockHost], inventory_file: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    args = _patch(monkeypatch, tmp_path, command, seen, made)
    result = CliRunner().invoke(cli, [*args, "-i", str(inventory_file)])
    assert result.exit_code == 0, (result.output, result.exception)
    [during] = seen  # while the command changed the nodes: this run's holder on each
    assert set(during) == {"h1", "h2"}
    for holder in during.values():
        assert holder is not None and holder.command == command
        assert holder.pid == os.getpid() and holder.remote_pid > 0
    assert no_holder_left(made)  # released: no holder file, no holder process


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_held_lock_refuses_each_command_as_it_refuses_up(
        command: str, made: dict[str, LockHost], inventory_file: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bob = other_run(monkeypatch, tmp_path, "h2")
    try:
        up = CliRunner().invoke(cli, ["up", "--yes", "-i", str(inventory_file)])
        seen: list[Any] = []
        args = _patch(monkeypatch, tmp_path, command, seen, made)
        refused = CliRunner().invoke(cli, [*args, "-i", str(inventory_file)])
    finally:
        bob.release()
    assert isinstance(up.exception, RunLockError), up.output
    assert isinstance(refused.exception, RunLockError), refused.output
    assert refused.exception.render() == up.exception.render()
    text = refused.exception.render()
    assert f"h2: another run holds this host's run lock: {BOB.describe()}" in text
    assert "h1" not in text.split("\n")[0]
    assert not seen  # refused before any change
    assert made["h1"].holder() is None  # the lock it had taken on h1 is released


# -- a lost lock stops the next change on that host --------------------------------------------

@pytest.fixture
def fast_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runlock, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(runlock, "_POLL_S", 0.05)


def _lock(tmp_path: Path, names: tuple[str, ...] = ("h1", "h2"), **kwargs: Any
          ) -> tuple[RunLock, dict[str, LockHost], Any]:
    inventory = make_inventory(tmp_path, names)
    hosts = {n: LockHost(inventory.hosts[n], tmp_path) for n in names}
    lock = RunLock.acquire(hosts, "up", lambda _line: None, **kwargs)
    return lock, hosts, inventory


def test_answered_heartbeats_keep_the_lock_and_unanswered_ones_lose_it_past_the_bound(
        tmp_path: Path, fast_heartbeat: None) -> None:
    offset = [0.0]
    lock, hosts, _ = _lock(tmp_path, ("h1",), clock=lambda: time.monotonic() + offset[0])
    try:
        start = lock._beats["h1"].confirmed
        offset[0] = 100.0  # far past the bound since the start, but the holder answers
        deadline = time.monotonic() + 10
        while lock._beats["h1"].confirmed < start + 100 and time.monotonic() < deadline:
            time.sleep(0.05)  # until a heartbeat sent on the moved clock was answered
        lock.ensure_held("h1")
        holder = hosts["h1"].channels[0].process
        holder.send_signal(signal.SIGSTOP)  # a hung connection: no line reaches it, no answer
        time.sleep(0.3)
        offset[0] += runlock.LOST_AFTER_S + 1
        with pytest.raises(RunLockLost) as caught:
            lock.ensure_held("h1")
        holder.send_signal(signal.SIGCONT)
    finally:
        lock.release()
    text = caught.value.render()
    assert text.startswith("h1: this run lost its run lock on this host at ")
    assert "no heartbeat was answered for" in text
    assert f"the bound is {runlock.LOST_AFTER_S:g} s" in text
    assert "nothing more is changed on h1" in text and "rerun this command" in text
    assert caught.value.exit_code == 1


def test_a_lost_lock_fails_the_next_task_on_that_host_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock, hosts, inventory = _lock(tmp_path)
    factory = runlock.LendingFactory(hosts, {}, ConnectionOptions(), lock)
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: all\n  tasks:\n    - name: Change\n"
                        "      command: touch {{ root }}/changed\n")
    try:
        hosts["h1"].channels[0].end()  # h1's holder is gone: the lock is free ...
        bob = other_run(monkeypatch, tmp_path, "h1")  # ... and another run takes it
        try:
            outcome = Runner(inventory, RunOptions(), connection_factory=factory
                             ).run_playbook(playbook)
        finally:
            bob.release()
    finally:
        lock.release()
    by_host = {r.host: r for r in outcome.results}
    assert by_host["h2"].status is Status.CHANGED and (tmp_path / "h2" / "changed").exists()
    assert by_host["h1"].status is Status.FAILED
    assert not (tmp_path / "h1" / "changed").exists()  # no change after the loss, not even
    assert not any("touch" in c for c in hosts["h1"].commands)  # as a prefetched lead command
    message = by_host["h1"].message
    assert message.startswith("h1: this run lost its run lock on this host at ")
    assert "its holder process on the host ended" in message
    assert f"the host's lock now names another run: {BOB.describe()}" in message


def test_stack_sync_switches_no_node_when_a_node_lost_its_lock(
        tmp_path: Path, made: dict[str, LockHost], inventory_file: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = load_inventory(inventory_file)
    (replica,) = inventory.replicas
    lock_file = tmp_path / "stack.lock.txt"
    monkeypatch.setattr(stack_op.stack_lock, "read_lock", lambda path: SimpleNamespace(id="abc"))
    monkeypatch.setattr(stack_sync, "probe_nodes", lambda conns, venv: {
        n: stack_sync.NodeStack(n, active=f"{venv}.stack-old") for n in conns})
    monkeypatch.setattr(stack_sync, "check_target", lambda lock, nodes: None)
    monkeypatch.setattr(stack_sync, "index_wheelhouse", lambda folder: {})
    monkeypatch.setattr(stack_sync, "wheel_plan", lambda lock, files, where: {})
    built, switched = [], []

    def build(conn: Any, node: Any, lock: Any, wheels: Any, venv: str, *, progress: Any,
              held: Any) -> Any:
        if node.host == "h2":
            made["h2"].channels[0].end()
        held()
        built.append(node.host)
        return stack_sync.NodeResult(node.host, installed=True, active=node.active)

    monkeypatch.setattr(stack_sync, "build_node", build)
    monkeypatch.setattr(stack_sync, "switch_node", lambda *a, **k: switched.append(a))
    with stack_op.locked([replica], ConnectionOptions(), "stack sync", warn=print) as factory:
        _id, results = stack_op.sync_replica(replica, lock_file, tmp_path, ConnectionOptions(),
                                             progress=lambda _line: None, factory=factory)
    assert "h2" not in built and not switched
    errors = {r.host: r.error for r in results}
    assert errors["h2"].startswith("h2: this run lost its run lock on this host at ")
    assert not errors["h1"] and "h2 failed" in next(r.held for r in results if r.host == "h1")
    assert made["h1"].holder() is None  # released; h2's holder ended without releasing


def test_a_stack_build_step_checks_the_lock_before_writing() -> None:
    class Untouched:
        name = "h2"

        def run(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a step ran after the lock was lost")

    def lost() -> None:
        raise RunLockLost.single("h2", "this run lost its run lock on this host")

    with pytest.raises(RunLockLost):
        stack_sync.build_node(Untouched(), stack_sync.NodeStack("h2"),
                              SimpleNamespace(id="abc"), {}, "/opt/vllm", held=lost)
    result = stack_sync.NodeResult("h2", active="/opt/vllm.stack-old")
    with pytest.raises(RunLockLost):
        stack_sync.switch_node(Untouched(), result, "/opt/vllm", "abc", held=lost)


def test_stack_rollback_rolls_back_no_node_when_a_node_lost_its_lock(
        tmp_path: Path, made: dict[str, LockHost], inventory_file: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (replica,) = load_inventory(inventory_file).replicas
    monkeypatch.setattr(stack_sync, "probe_nodes", lambda conns, venv: {
        n: stack_sync.NodeStack(n, previous=f"{venv}.stack-old") for n in conns})
    ran: list[str] = []
    monkeypatch.setattr(stack_sync, "run_node", lambda conn, config, **k: ran.append(conn.name))
    with stack_op.locked([replica], ConnectionOptions(), "stack rollback",
                         warn=print) as factory:
        made["h2"].channels[0].end()
        failed, lines = stack_op.rollback_replica(replica, ConnectionOptions(), factory)
    assert failed and not ran
    assert lines[-1].startswith("replica llama: FAILED, nothing rolled back: h2: this run lost "
                                "its run lock on this host at ")


class Recorder:
    """A node's connection for the fault itself: records the command, runs nothing."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        self.commands.append(command)
        return CommandResult(0, "", "")


def test_fault_applies_nothing_when_the_nodes_lock_was_lost(tmp_path: Path) -> None:
    lock, hosts, inventory = _lock(tmp_path)
    factory = runlock.LendingFactory(hosts, {}, ConnectionOptions(), lock)
    h1, h2 = inventory.replicas[0].nodes
    on = {"h1": Recorder(), "h2": Recorder()}
    try:
        hosts["h2"].channels[0].end()
        with pytest.raises(RunLockLost) as caught:
            fault.apply(on["h2"], h2, "vllm.service", "KILL", held=factory.ensure_held)
        fault.apply(on["h1"], h1, "vllm.service", "KILL",
                    held=factory.ensure_held)  # h1's lock is held: the fault is applied
    finally:
        lock.release()
    assert caught.value.render().startswith("h2: this run lost its run lock on this host")
    assert not on["h2"].commands
    assert on["h1"].commands == [fault.kill_command("vllm.service", "KILL")]


def test_the_holder_answers_each_heartbeat_line(tmp_path: Path) -> None:
    lock, hosts, _ = _lock(tmp_path, ("h1",))
    channel = hosts["h1"].channels[0]
    try:
        lock._stop.set()  # this test reads the answers itself
        channel.sendall(b"\n\n")
        answer = b""
        deadline = time.monotonic() + 10
        while answer.count(b"beat\n") < 2 and time.monotonic() < deadline:
            if channel.recv_ready():
                answer += channel.recv(64)
    finally:
        lock.release()
    assert answer == b"beat\nbeat\n"


def test_a_holder_ended_by_our_own_closed_connection_says_why_the_connection_was_closed(
        tmp_path: Path) -> None:
    """When this run gave a connection up (a command past its time limit closes it, and the
    lock's holder ends with it), the lost lock names that reason, not only the holder's rules:
    the operator reads the timeout, not a riddle about heartbeats."""
    lock, hosts, _ = _lock(tmp_path, ("h1",))
    try:
        hosts["h1"].broken = ("an operation on 10.0.0.11:22 timed out after 30 s; the "
                              "connection is considered lost")
        hosts["h1"].channels[0].end()
        with pytest.raises(RunLockLost) as lost:
            lock.ensure_held("h1")
    finally:
        lock.release()
    message = lost.value.problems[0].message
    assert ("this run closed its connection to the host (an operation on 10.0.0.11:22 timed "
            "out after 30 s") in message and "holder process there" in message
