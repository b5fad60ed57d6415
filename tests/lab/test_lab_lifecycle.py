"""up/status/down of a separate lab instance leaves nothing behind, even after interruptions.

These tests use their own instance (own name, network and state dir, the shared base cache), so
they run while the session's lab is up and never touch it.

Cost: about 33 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_provision_lab import Lab, LabConfig, cgroups, network

pytestmark = pytest.mark.lab


def _free_config(state_dir: Path) -> LabConfig:
    """A lab instance whose name and /24 no one on this machine uses now."""
    in_use = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True,
                            check=True).stdout
    for octet in range(100 + os.getpid() % 100, 256):
        net = f"10.213.{octet}"
        name = f"lc{octet}"
        if f" {net}." not in in_use and not network.link_exists(f"{name}br0"):
            return LabConfig(state_dir=state_dir, name=name, net=net,
                             cache_dir=Lab.from_env().config.cache)
    raise AssertionError("no free lab network 10.213.100-255")


def _leftovers(config: LabConfig) -> dict[str, list[str]]:
    """Everything of ``config``'s instance that still exists on the main machine."""
    with open("/proc/self/mountinfo") as handle:
        mounts = [line.split()[4] for line in handle if str(config.state_dir) in line.split()[4]]
    processes = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(config.state_dir) in cmdline:
                processes.append(cmdline)
    return {
        "netns_or_veth": network.leftover_hosts(config),
        "bridge": [config.bridge] if network.link_exists(config.bridge) else [],
        "mounts": mounts,
        "cgroups": [str(root / config.cgroup_subtree) for root in cgroups.hierarchy_roots()
                    if (root / config.cgroup_subtree).exists()],
        "cgroup_processes": [str(p) for p in cgroups.pids(config.cgroup_subtree)],
        "processes": processes,
    }


NOTHING: dict[str, list[str]] = {"netns_or_veth": [], "bridge": [], "mounts": [], "cgroups": [],
                                 "cgroup_processes": [], "processes": []}


@pytest.fixture
def instance(tmp_path: Path, lab: Lab):  # after the session lab, so the base cache is built
    config = _free_config(tmp_path / "lab")
    yield Lab(config)
    Lab(config).down()


def test_up_status_down_leaves_nothing_behind(instance: Lab) -> None:
    instance.up(hosts=2)
    assert [s.state for s in instance.status()] == ["running", "running"]
    instance.delay("h1", 5)  # a delayer process must go too
    assert _leftovers(instance.config)["processes"]
    instance.down()
    assert _leftovers(instance.config) == NOTHING
    assert instance.status() == [] and not instance.is_up()


def test_interrupted_up_is_cleaned_up_by_the_next(instance: Lab) -> None:
    config = instance.config
    env = dict(os.environ, VLLM_PROVISION_LAB_DIR=str(config.state_dir),
               VLLM_PROVISION_LAB_NAME=config.name, VLLM_PROVISION_LAB_NET=config.net,
               VLLM_PROVISION_LAB_CACHE=str(config.cache))
    provision = Path(sys.executable).with_name("provision")
    up = subprocess.Popen([str(provision), "lab", "up", "--hosts", "2"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (config.run_dir / "h2" / "boot.pid").exists():  # midway: hosts are booting
        assert up.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    up.send_signal(signal.SIGKILL)
    up.wait()
    assert _leftovers(config)["netns_or_veth"], "the killed up should have left hosts behind"
    instance.up(hosts=2)
    assert [s.state for s in instance.status()] == ["running", "running"]
    instance.down()
    assert _leftovers(config) == NOTHING


def test_down_recovers_after_nspawn_was_sigkilled(instance: Lab) -> None:
    instance.up(hosts=1)
    pid = int((instance.config.run_dir / "h1" / "nspawn.pid").read_text())
    os.kill(pid, signal.SIGKILL)  # the guest's systemd keeps running without it (gotcha 2)
    time.sleep(0.5)
    assert cgroups.pids(instance.config.cgroup_subtree, "h1")
    instance.down()
    assert _leftovers(instance.config) == NOTHING
