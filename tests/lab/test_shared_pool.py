"""A shared GPU pool on the lab: another job holds a GPU, `up` waits for it, names it, and
starts nothing until every node's GPUs are free (mp); Ray explains its pending placement group.

The tests run in file order on one lab and share its state: the mp replica first times out with
h2's GPU 0 held, then (the same hold) waits until the hold is released and starts; then the Ray
replica is deployed, its vLLM stopped, one worker GPU taken by another Ray job, and `up` waits
on the pending placement group until the job ends. Short timeouts keep the module quick.

Cost: about 207 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lab_support
import pytest

pytestmark = pytest.mark.lab

SHARED = ("-e", "vllm_gpu_pool=shared")
HOLDER_UNIT = "vllm-lab-occupy-0.service"


@pytest.fixture(scope="module")
def state_home(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private controller state; releases every hold and takes both replicas down at the end."""
    home = tmp_path_factory.mktemp("state")
    try:
        yield home
    finally:
        lab_support.provision("lab", "occupy", "h2", "--release", state_home=home)
        for kind in ("mp", "ray"):
            lab_support.provision("down", "-i", str(lab.inventory_path(kind)), state_home=home)


@contextlib.contextmanager
def up_in_background(lab: Any, kind: str, home: Path, log: Path,
                     *extra: str) -> Iterator[subprocess.Popen[str]]:
    """`provision up` in the background, its stderr (the progress lines) into ``log``; killed
    on the way out if it still runs."""
    env = {**os.environ, "XDG_STATE_HOME": str(home)}
    with log.open("w") as stream:
        up = subprocess.Popen(
            [lab_support.PROVISION, "up", "-i", str(lab.inventory_path(kind)), *extra],
            stdout=subprocess.PIPE, stderr=stream, text=True, env=env)
    try:
        yield up
    finally:
        if up.poll() is None:
            up.kill()


def release_then_finish(up: subprocess.Popen[str], home: Path) -> str:
    """Release the hold on h2 (``lab occupy --release``), then ``up``'s stdout once it ends."""
    released = lab_support.provision("lab", "occupy", "h2", "--release", state_home=home)
    assert released.returncode == 0, released.stderr
    stdout, _ = up.communicate(timeout=300)
    return stdout


def wait_for_line(log: Path, process: subprocess.Popen[str], *words: str,
                  timeout_s: float = 240) -> str:
    """The first line of ``log`` holding every one of ``words``; fails if ``up`` ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if all(word in line for word in words):
                return line
        assert process.poll() is None, f"up ended ({process.returncode}) before {words}:\n" \
            + log.read_text() + (process.stdout.read() if process.stdout else "")
        time.sleep(0.5)
    raise AssertionError(f"no line with {words} within {timeout_s} s:\n{log.read_text()}")


def vllm_states(lab: Any) -> dict[str, str]:
    """``running`` or ``stopped`` per node (``failed`` left by an earlier stop counts as
    stopped: nothing runs)."""
    states = {host: lab.ssh(host, "systemctl is-active vllm.service").stdout.strip()
              for host in ("h1", "h2")}
    return {host: "running" if state in ("active", "activating", "reloading") else "stopped"
            for host, state in states.items()}


def test_shared_pool_mp_times_out_leaving_no_node_started(lab: Any, state_home: Path) -> None:
    held = lab_support.provision("lab", "occupy", "h2", "--gpus", "0", state_home=state_home)
    assert held.returncode == 0, held.stderr
    pid = lab.ssh("h2", f"systemctl show -p MainPID --value {HOLDER_UNIT}").stdout.strip()
    run = lab_support.provision("up", "-i", str(lab.inventory_path("mp")), *SHARED,
                                "-e", "vllm_gpu_wait_timeout_s=3", state_home=state_home)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    holder = f"h2 GPU 0: pid {pid} python3 (120000 MiB) in unit {HOLDER_UNIT}"
    assert "not free at the same time within 3 s" in output and holder in output, output
    assert "no node was started" in output
    assert vllm_states(lab) == {"h1": "stopped", "h2": "stopped"}


def test_shared_pool_mp_waits_for_the_holder_then_starts_both(
        lab: Any, state_home: Path, tmp_path: Path) -> None:
    log = tmp_path / "up.err"
    with up_in_background(lab, "mp", state_home, log, *SHARED,
                          "-e", "vllm_gpu_wait_timeout_s=180") as up:
        line = wait_for_line(log, up, "waiting for the GPUs of every node", "h2 GPU 0",
                             f"in unit {HOLDER_UNIT}")
        assert vllm_states(lab) == {"h1": "stopped", "h2": "stopped"}, line
        stdout = release_then_finish(up, state_home)
    assert up.returncode == 0, stdout + log.read_text()
    assert "started h2 vllm.service, h1 vllm.service after" in stdout
    assert vllm_states(lab) == {"h1": "running", "h2": "running"}
    down = lab_support.provision("down", "-i", str(lab.inventory_path("mp")),
                                 state_home=state_home)
    assert down.returncode == 0, down.stdout + down.stderr


def test_ray_pending_bundle_names_the_free_resources_then_serves(
        lab: Any, state_home: Path, tmp_path: Path) -> None:
    inventory = str(lab.inventory_path("ray"))
    first = lab_support.provision("up", "-i", inventory, state_home=state_home)
    assert first.returncode == 0, first.stdout + first.stderr
    lab.ssh("h1", "systemctl stop vllm.service")  # the replica's engine gone, its Ray stays
    held = lab_support.provision("lab", "occupy", "h2", "--ray", "--gpus", "0",
                                 state_home=state_home)
    assert held.returncode == 0, held.stdout + held.stderr
    worker_ip = lab.config.address("h2")
    log = tmp_path / "up.err"
    with up_in_background(lab, "ray", state_home, log) as up:
        line = wait_for_line(log, up, "waiting for Ray resources", "pending (NO_RESOURCES)")
        assert "it needs 1 x {GPU: 1, node:" in line and "+ 7 x {GPU: 1}" in line, line
        assert f"{worker_ip}: 3 of 4 GPU" in line, line
        assert f"held on {worker_ip} by actor GpuHolder" in line, line
        status = lab_support.provision("status", "-i", inventory, state_home=state_home)
        assert "pending: placement group" in status.stdout, status.stdout
        assert f"{worker_ip}: 3 of 4 GPU" in status.stdout, status.stdout
        stdout = release_then_finish(up, state_home)
    assert up.returncode == 0, stdout + log.read_text()
    assert "completion from" in stdout
