"""The run lock and secret hygiene on the lab (mp replica), as an operator would see them.

One module-scoped sequence, four ``provision`` runs in all:

1. a real ``up`` with a new API key written with characters that JSON, Jinja's ``tojson``, the
   shell and systemd each escape (it restarts vLLM, so it runs for several seconds); while it
   holds the lock, a second ``up`` on the same hosts must exit 1 at once naming the holder;
2. a ``play`` that is killed (SIGKILL) once it holds the lock: its connection drops, its holder
   file stays; the next ``up --check --diff --json`` must take the stale lock over, warn, and
   succeed; then a no-change ``up --json``;
3. every encoding of the key is searched in every captured output, the controller's state
   record, the hosts' /etc, /var/lib/vllm-provision and /run/vllm-provision, and the whole
   journal: only the 0600 files that must hold it (the env file, the watchdog's config) may.

The session's ``replicas`` broker hands the hosts over with no replica serving (held
exclusively; the keyed inventory differs from the lab's only in its API key, so it has the same
replica id and is the same owner). At the end the replica is
taken down (``down``), as the module found the lab, and the broker is told so: later modules
start vLLM stand-ins by hand on the same ports.

Cost: about 37 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from lab_support import PROVISION, provision

from vllm_provision.settings.masking import encodings
from vllm_provision.state import controller_state_path

pytestmark = pytest.mark.lab

HOLDER_FILE = "/var/lib/vllm-provision/run.lock.holder"
# The files that must hold the key: 0600, root (roles vllm_mp and vllm_watchdog).
KEY_FILES = {"/etc/vllm-provision/vllm.env", "/etc/vllm-provision/watchdog.json"}
SLOW_PLAY = """- name: Hold the run lock for a while
  hosts: all
  tasks:
    - name: Sleep
      command: sleep 60
      changed_when: false
"""


@dataclass
class Outcome:
    """What the module's runs printed and how they ended."""

    key: str
    inventory: Path
    state_home: Path
    outputs: dict[str, str] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    elapsed: dict[str, float] = field(default_factory=dict)
    first_still_running: bool = False


def _run(name: str, outcome: Outcome, *args: str) -> None:
    started = time.monotonic()
    proc = provision(*args, state_home=outcome.state_home)
    outcome.elapsed[name] = time.monotonic() - started
    outcome.codes[name] = proc.returncode
    outcome.outputs[name] = proc.stdout + proc.stderr


def _wait_for_holder(lab: Any, proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
    """Poll h1 until a holder file names ``proc``; return its text."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        text = lab.ssh("h1", f"cat {HOLDER_FILE} 2>/dev/null").stdout
        if f'"pid": {proc.pid}' in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"no holder file for PID {proc.pid} (exit status {proc.poll()})")


@pytest.fixture(scope="module")
def outcome(lab: Any, replicas: Any, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Outcome]:
    with replicas.exclusive("mp", start="stopped") as lease:
        down = yield from _outcome(lab, tmp_path_factory.mktemp("security"))
        lease.leave("down" if down == 0 else "unknown")


def _outcome(lab: Any, folder: Path) -> Generator[Outcome, None, int]:
    """The module's runs (see the module's docstring); returns the exit code of its `down`."""
    base = lab.inventory_path("mp")
    data = yaml.safe_load(base.read_text())
    key = 'k"e\\y<$%{x}&\'' + secrets.token_hex(4)  # new each session: the first up changes
    for replica in data["all"]["children"]["vllm_replicas"]["children"].values():
        replica["vars"]["vllm_api_key"] = key
    inventory = folder / "keyed-mp.yml"
    inventory.write_text(yaml.safe_dump(data))
    (folder / "slow.yml").write_text(SLOW_PLAY)
    result = Outcome(key, inventory, folder / "state")
    env = {**os.environ, "XDG_STATE_HOME": str(result.state_home)}
    inv = ["-i", str(inventory)]
    try:
        # 1. A real up holds the lock; a second up on the same hosts exits 1 at once.
        first = subprocess.Popen([PROVISION, "up", "--diff", *inv], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env)
        _wait_for_holder(lab, first)
        _run("second", result, "up", "-i", str(base))
        result.first_still_running = first.poll() is None
        out, _ = first.communicate(timeout=600)
        result.outputs["first"], result.codes["first"] = out, first.returncode
        # 2. A run killed while it holds the lock leaves a stale lock; the next run takes it.
        killed = subprocess.Popen([PROVISION, "play", *inv, str(folder / "slow.yml")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        result.outputs["killed_holder"] = _wait_for_holder(lab, killed)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(30)
        _run("check", result, "up", "--check", "--diff", "--json", *inv)
        _run("json", result, "up", "--json", *inv)
        with mock.patch.dict(os.environ, {"XDG_STATE_HOME": str(result.state_home)}):
            record = controller_state_path(inventory)
        result.outputs["state_record"] = record.read_text() if record.exists() else ""
        yield result
    finally:
        # the keyed inventory's up ran last: take the hosts down with it (the lab's inventory,
        # the same replica id, could too)
        down = provision("down", *inv, state_home=result.state_home)
    return down.returncode


def test_a_second_run_on_the_same_hosts_exits_1_naming_the_holder(outcome: Outcome) -> None:
    second = outcome.outputs["second"]
    assert outcome.codes["second"] == 1, second
    assert outcome.first_still_running, "the first run ended before the second was refused"
    # "at once": refused while the first still runs (above), not after waiting for its lock;
    # the CLI's start, facts and lock read took 19.9 s under the full suite's load (15 s failed)
    assert outcome.elapsed["second"] < 60
    assert "another run holds this host's run lock: provision up by" in second
    for part in ("(PID ", "started ", " on "):
        assert part in second
    assert "Traceback" not in second and "PLAY" not in second  # refused before any task
    assert outcome.codes["first"] == 0, outcome.outputs["first"]
    assert "completion from" in outcome.outputs["first"]


def test_a_stale_lock_is_taken_over_with_a_warning(outcome: Outcome) -> None:
    assert '"command": "play"' in outcome.outputs["killed_holder"]
    check = outcome.outputs["check"]
    assert "warning: h1: took over a stale run lock" in check, check
    assert "provision play by" in check
    assert outcome.codes["check"] == 0, check
    assert outcome.codes["json"] == 0, outcome.outputs["json"]
    assert "stale" not in outcome.outputs["json"]  # released properly by the run before


def test_the_api_key_appears_in_no_output_no_record_no_journal(lab: Any,
                                                                 outcome: Outcome) -> None:
    forms = sorted(form for form in encodings(outcome.key) if len(form) >= 8)
    for name, text in outcome.outputs.items():
        found = [form for form in forms if form in text]
        assert not found, f"the key appears in {name} as {found}"
    patterns = base64.b64encode("\n".join(forms).encode()).decode()
    for host in ("h1", "h2"):
        script = (f"p=$(mktemp) && echo {patterns} | base64 -d > $p && "
                  "echo FILES; grep -rlF -f $p /etc /var/lib/vllm-provision /run/vllm-provision "
                  "2>/dev/null | xargs -r stat -c '%a %U %n'; "
                  "echo JOURNAL; journalctl -o cat --no-pager | grep -F -f $p | head -3; "
                  "rm -f $p")
        result = lab.ssh(host, script, timeout_s=120)
        files_part, _, journal = result.stdout.partition("JOURNAL")
        files = [line.split(" ", 2) for line in files_part.splitlines()[1:] if line.strip()]
        for mode, owner, path in files:
            assert path in KEY_FILES and mode == "600" and owner == "root", (host, path, mode)
        assert not journal.strip(), f"{host}: journal lines hold the key: {journal[:300]}"
        if host == "h1":  # rank 0 serves the API: the search finds the key where it must be
            assert {path for _, _, path in files} == KEY_FILES, files
