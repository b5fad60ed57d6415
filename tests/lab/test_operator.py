"""What an operator sees: the progress of a long wait on a terminal and in a pipe, the merged
journals (`provision logs`, `-f`), and ad-hoc commands (`provision exec`).

One `up` (under a pseudo-terminal, as an operator runs it) and one `restart` (to pipes) are
shared by the module. The module holds the session's mp replica exclusively (the ``replicas``
broker's), handed over not serving so that its `up` starts vLLM; the tests run in file order
and leave it serving, which the broker is told.

Cost: about 61 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lab_support
import pytest

pytestmark = pytest.mark.lab

TITLE = "replica lab: waiting until rank 0 serves"
LINE = re.compile(r"^(?P<time>\S+Z) (?P<host>h\d) +(?P<unit>\S+) *: (?P<message>.*)$")


@dataclass
class Deployed:
    """The replica after the module's `up` (on a terminal) and `restart` (to pipes)."""

    inventory: str
    state_home: Path
    up_rc: int
    screen: bytes
    restart: subprocess.CompletedProcess[str]
    before_up: datetime.datetime
    restart_began: datetime.datetime
    api: str

    def provision(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return lab_support.provision(*args, state_home=self.state_home, timeout=timeout)


@pytest.fixture(scope="module")
def deployed(replicas: lab_support.ReplicaBroker) -> Iterator[Deployed]:
    with replicas.exclusive("mp", start="stopped") as lease:
        state_home, inventory = lease.replica.state_home, lease.replica.inventory
        env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
        before_up = datetime.datetime.now(datetime.UTC)
        up_rc, screen = lab_support.run_in_pty([lab_support.PROVISION, "up", "-i", inventory],
                                               env=env)
        restart_began = datetime.datetime.now(datetime.UTC)
        restart = lab_support.provision("restart", "-i", inventory, state_home=state_home)
        yield Deployed(inventory, state_home, up_rc, screen, restart, before_up, restart_began,
                       lease.replica.base_url)
        # the tests after the restart only read, run `exec` and send completions
        lease.leave("serving" if (up_rc, restart.returncode) == (0, 0) else "unknown")


def test_up_on_a_terminal_shows_vllm_phases_live(deployed: Deployed) -> None:
    text = lab_support.screen_text(deployed.screen)
    assert deployed.up_rc == 0, text[-3000:]
    assert "\x1b[" in deployed.screen.decode("utf-8", "replace")  # drawn live, in place
    assert TITLE in text
    phases = lab_support.shown_phases(text)
    assert len(phases) >= 2, (phases, text[-3000:])
    assert "completion from" in text  # and then it served


def test_restart_to_a_pipe_prints_plain_progress_without_escape_codes(
        deployed: Deployed) -> None:
    run = deployed.restart
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "\x1b" not in run.stdout + run.stderr
    rows = [line for line in run.stderr.splitlines() if line.startswith(f"[{TITLE}] ")]
    assert {line[len(TITLE) + 3:].split()[0] for line in rows} >= {"h1", "h2"}, rows
    assert len(lab_support.shown_phases("\n".join(rows))) >= 2, rows
    assert any(line.endswith("(serving)") for line in rows), rows


def test_logs_merge_both_nodes_in_time_order_across_the_restart(deployed: Deployed) -> None:
    since = deployed.before_up.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    run = deployed.provision("logs", "-i", deployed.inventory, "--unit", "vllm",
                             "--since", since)
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stdout
    lines = [LINE.match(line) for line in run.stdout.splitlines()]
    assert lines and all(lines), run.stdout[:2000]
    times = [m["time"] for m in lines if m]
    assert times == sorted(times)
    assert {m["unit"] for m in lines if m} == {"vllm.service"}
    began = deployed.restart_began.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for host in ("h1", "h2"):
        loads = [m["time"] for m in lines
                 if m and m["host"] == host and "Starting to load model" in m["message"]]
        # one start before the restart, one after it, both nodes in the same stream
        assert len(loads) == 2 and loads[0] < began < loads[1], (host, loads, began)
    served = [m["time"] for m in lines if m and "Application startup complete" in m["message"]]
    assert len(served) == 2 and all(m["host"] == "h1" for m in lines
                                    if m and "Application startup complete" in m["message"])


def test_logs_follow_prints_new_lines_and_exits_0_on_sigint(deployed: Deployed,
                                                            lab_host: Any) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(deployed.state_home)}
    # SIGINT as on an operator's terminal: a suite started in the background by a shell without
    # job control (CI's script) inherits SIGINT ignored, and Python then installs no handler
    proc = subprocess.Popen([lab_support.PROVISION, "logs", "-i", deployed.inventory, "-l", "h1",
                             "--unit", "vllm", "-n", "0", "-f"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    try:
        while not any("POST /v1/completions" in line for line in out):
            assert time.monotonic() < deadline, out
            # each completion adds a line to h1's journal
            lab_support.complete(deployed.api, "/srv/models/lab-model")
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # it ignored SIGINT: fail, and leave no follower
            proc.kill()
            proc.wait()
            raise
    reader.join(5)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert all(LINE.match(line.rstrip("\n")) for line in out), out
    # the follower on the node ended with the channel
    assert lab_host("h1").run("pgrep -x journalctl").stdout == ""


def test_exec_runs_on_a_pattern_and_the_recap_reports_the_failing_host(
        deployed: Deployed) -> None:
    run = deployed.provision("exec", "-i", deployed.inventory, "-l", "vllm_replicas", "--",
                             'hostname; test "$(hostname)" != h2')
    assert run.returncode == 1, run.stdout + run.stderr
    blocks = run.stdout.split("EXEC RECAP")[0]
    assert "h1 | CHANGED | rc=0 >>\nh1\n" in blocks and "h2 | FAILED | rc=1 >>\nh2\n" in blocks
    recap = run.stdout.split("EXEC RECAP")[1]
    assert re.search(r"h1\s+changed\s+0", recap) and re.search(r"h2\s+failed\s+1", recap)
    only = deployed.provision("exec", "-i", deployed.inventory, "-l", "vllm_followers",
                              "--json", "--", "systemctl", "is-active", "vllm.service")
    assert only.returncode == 0, only.stderr
    summary = json.loads(only.stdout)
    assert summary["rc"] == {"h2": 0}
    assert summary["tasks"][0]["data"]["stdout"] == "active\n"
