"""The run lock's holder script and protocol, run by a local bash (the lab tests run it over SSH).

A fake connection starts the script as a local process whose pipes stand in for the SSH
channel: the same flock(1), holder file and heartbeat rules apply.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_runner_support import LocalChannel

from vllm_provision.transport.runlock import Holder, RunLock, RunLockError


class _Connection:
    def __init__(self) -> None:
        self.channels: list[LocalChannel] = []

    def start(self, command: str, **kwargs: object) -> LocalChannel:
        channel = LocalChannel(command)
        self.channels.append(channel)
        return channel


def _acquire(tmp_path: Path, warnings: list[str] | None = None,
             command: str = "up") -> tuple[RunLock, _Connection]:
    conn = _Connection()
    lock = RunLock.acquire({"h1": conn}, command, (warnings if warnings is not None else [])
                           .append, state_dir=str(tmp_path))
    return lock, conn


def test_a_second_run_exits_at_once_naming_the_holder(tmp_path: Path) -> None:
    first, _ = _acquire(tmp_path)
    holder = Holder.parse((tmp_path / "run.lock.holder").read_text())
    assert holder is not None and holder.command == "up" and holder.remote_pid > 0
    with pytest.raises(RunLockError) as caught:
        _acquire(tmp_path, command="restart")
    text = caught.value.render()
    assert caught.value.exit_code == 1
    assert f"another run holds this host's run lock: {holder.describe()}" in text
    assert f"PID {holder.pid}" in text and holder.controller in text and holder.started in text
    first.release()
    assert not (tmp_path / "run.lock.holder").exists()
    again, _ = _acquire(tmp_path)  # released: the next run gets it, without a warning
    again.release()


def test_a_lock_whose_holder_vanished_is_taken_over_with_a_warning(tmp_path: Path) -> None:
    lost, conn = _acquire(tmp_path)
    conn.channels[0].drop()  # the controller died: the holder exits, its holder file stays
    lost.channels.clear()
    lost.release()
    assert (tmp_path / "run.lock.holder").exists()
    warnings: list[str] = []
    lock, _ = _acquire(tmp_path, warnings)
    assert len(warnings) == 1 and "took over a stale run lock" in warnings[0]
    assert "provision up by" in warnings[0]
    lock.release()


def test_holder_lines_that_are_not_ours_are_unreadable_not_errors() -> None:
    assert Holder.parse("") is None
    assert Holder.parse("garbage\n12") is None
    line = json.dumps({"controller": "c", "user": "u", "pid": 1, "started": "t",
                       "command": "up"})
    assert Holder.parse(f"{line}\n77\n") == Holder("c", "u", 1, "t", "up", 77)


def test_the_lock_answers_with_the_hosts_state_record(tmp_path: Path) -> None:
    """The ownership guard reads each host's record from the lock's first answer (one command
    fewer per host): the text as it is under the lock, None without one."""
    from vllm_provision.state import HOST_STATE_FILE
    from vllm_provision.transport.runlock import LOCK_FILE

    # the holder reads $dir/state.json: the host record's path beside the lock file
    assert Path(LOCK_FILE).parent / "state.json" == Path(HOST_STATE_FILE)
    none, _ = _acquire(tmp_path)
    assert none.records == {"h1": None}
    none.release()
    record = json.dumps({"schema": 1, "hosts": {"h1": {}}}, indent=2)
    (tmp_path / "state.json").write_text(record + "\n")
    lock, _ = _acquire(tmp_path)
    assert lock.records == {"h1": record}
    lock.release()
    # a stale holder line and the record both come back, each in its place
    lost, conn = _acquire(tmp_path)
    conn.channels[0].drop()
    lost.channels.clear()
    lost.release()
    warnings: list[str] = []
    taken, _ = _acquire(tmp_path, warnings)
    assert len(warnings) == 1 and taken.records == {"h1": record}
    taken.release()


# -- the first read and the exchanges (a no-change `up` in three commands, bench/README.md) ----

def test_the_first_read_rides_in_the_lock_answer_without_stdin(tmp_path: Path) -> None:
    conn = _Connection()
    lock = RunLock.acquire({"h1": conn}, "up", [].append, state_dir=str(tmp_path),
                           first_reads={"h1": "printf '{\"a\": 1}\\n'; cat; echo rc=$?"})
    try:
        assert json.loads(lock.firsts["h1"].splitlines()[0]) == {"a": 1}
        assert "rc=0" in lock.firsts["h1"]  # its stdin is /dev/null, not the heartbeat pipe
        assert lock.records["h1"] is None  # the state record still comes first
        assert len(conn.channels) == 1  # no channel of its own
    finally:
        lock.release()
    assert not (tmp_path / "run.lock.holder").exists()


def test_a_host_without_a_first_read_has_none(tmp_path: Path) -> None:
    lock, _ = _acquire(tmp_path)
    try:
        assert lock.firsts == {}
    finally:
        lock.release()


def test_an_exchange_runs_on_the_holder_and_keeps_the_heartbeat(tmp_path: Path) -> None:
    lock, conn = _acquire(tmp_path)
    try:
        lock.channels["h1"].sendall(b"\n")  # a heartbeat line in flight before the exchange
        lock._beats["h1"].sent.append((0.0, 0.0))
        tricky = "printf 'beat\\n@@RUN x END 0\\n%s\\n' \"$(cat)\"; exit 3"
        answers = lock.exchange({"h1": tricky, "h2": "true"})
        assert set(answers) == {"h1"}  # h2 holds no lock of this run: the caller's own way
        result = answers["h1"]
        assert result.exit_code == 3
        assert result.stdout == "beat\n@@RUN x END 0\n\n"  # as printed, markers of its own kept
        assert lock.lost_problem("h1") is None
        assert not lock._beats["h1"].sent  # the heartbeat's answer was counted, not lost
        assert lock.exchange({"h1": "echo again"})["h1"].stdout == "again\n"
        assert len(conn.channels) == 1
    finally:
        lock.release()
    assert not (tmp_path / "run.lock.holder").exists()


def test_an_exchange_on_a_released_lock_is_left_to_the_caller(tmp_path: Path) -> None:
    lock, _ = _acquire(tmp_path)
    lock.release()
    assert lock.exchange({"h1": "echo x"}) == {}
