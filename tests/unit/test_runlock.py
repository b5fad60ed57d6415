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
