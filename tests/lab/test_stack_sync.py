"""`provision stack`: a lock of small real packages (six, idna) synced air-gapped onto two lab
hosts (the guests have no internet; the controller downloads the wheels), upgraded with an
atomic switch, a controller killed mid-sync, a rollback, the comparison with the lock, and a
host whose cable is pulled mid-build (no node switches; the rerun converges).

One module-scoped set-up: a plain venv at a path of its own on both hosts (so the lab's /opt/vllm
stays as other modules expect it), locked and synced once; the tests go on from there in order.

Cost: about 139 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_support import PROVISION, provision

from vllm_provision.transport.runlock import GIVE_UP_S

pytestmark = pytest.mark.lab

VENV = "/opt/vp-stack-lab"
HOSTS = ("h1", "h2")
IMPORTS = "import six, idna; print(six.__version__, idna.__version__)"
OLD = ("1.16.0", "3.7")
NEW = ("1.17.0", "3.10")


@pytest.fixture(scope="module")
def setup(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if shutil.which("uv", path=str(Path(PROVISION).parent)) is None:
        pytest.skip("uv is not installed beside provision (pip install -e '.[test]')")
    work = tmp_path_factory.mktemp("stack")
    data = yaml.safe_load(Path(lab.inventory_path("mp")).read_text())
    group = data["all"]["children"]["vllm_replicas"]["children"]["lab"]
    group["vars"].update({"vllm_venv": VENV, "vllm_stack_lock": "stack.lock.txt"})
    group["hosts"] = {k: v for k, v in group["hosts"].items() if k in HOSTS}
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    ssh = ["ssh", "-F", str(lab.ssh_config)]

    def on(host: str, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ssh, host, command], capture_output=True, text=True,
                              timeout=60, check=False)

    for host in HOSTS:  # a hand-made venv, as operators have today
        assert on(host, f"rm -rf {VENV} {VENV}.* /opt/.vp-stack-lab.* && "
                        f"python3 -m venv --without-pip {VENV}").returncode == 0
    state = {"work": work, "inventory": str(inventory), "state": work / "state"}
    (work / "requirements.in").write_text(f"six=={OLD[0]}\nidna=={OLD[1]}\n")
    locked = _provision(state, "stack", "lock", "-i", str(inventory))
    assert locked.returncode == 0, locked.stdout + locked.stderr
    state["lock_old"] = (work / "stack.lock.txt").read_text()
    first = _provision(state, "stack", "sync", "-i", str(inventory))
    state["first"] = first
    try:
        yield state
    finally:
        for host in HOSTS:
            on(host, f"rm -rf {VENV} {VENV}.* /opt/.vp-stack-lab.*")


@pytest.fixture
def on(lab_host: Any) -> Any:
    """``on(host, command) -> testinfra CommandResult`` over the lab's SSH (testinfra)."""
    hosts = {name: lab_host(name) for name in HOSTS}
    return lambda host, command: hosts[host].run(command)


def _provision(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """``provision ARGS`` with this module's wheelhouse (``XDG_CACHE_HOME``) and state."""
    return provision(*args, state_home=state["state"], timeout=300,
                     cache_home=state["work"] / "cache")


def _versions(on: Any, host: str) -> tuple[str, ...]:
    out = on(host, f"{VENV}/bin/python -c {IMPORTS!r}")
    return tuple(out.stdout.split()) if out.rc == 0 else ("error", out.stderr[-200:])


def _active(on: Any, host: str) -> str:
    return str(on(host, f"readlink -- {VENV}").stdout.strip())


def test_sync_installs_the_lock_on_both_hosts_from_the_controller(setup: dict[str, Any],
                                                                  on: Any) -> None:
    first = setup["first"]
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 changed" in first.stdout
    stack_id = re.search(r"stack ([0-9a-f]{12})", first.stdout).group(1)  # type: ignore[union-attr]
    for host in HOSTS:
        assert _versions(on, host) == OLD
        assert _active(on, host) == f"vp-stack-lab.stack-{stack_id}"
        # a Python started through the link is pinned to the folder it named (docs/stack.md)
        prefix = on(host, f"{VENV}/bin/python -c 'import sys; print(sys.prefix)'").stdout.strip()
        assert prefix == f"{VENV}.stack-{stack_id}"
        # the hand-made venv is kept as the previous one
        assert on(host, f"readlink -- {VENV}.previous").stdout.strip() == \
            "vp-stack-lab.stack-original"
        # only the locked packages were installed from the pushed wheels (no index)
        assert on(host, f"ls {VENV}.wheels/sha256 | wc -l").stdout.strip() == "2"
    status = _provision(setup, "stack", "status", "-i", setup["inventory"])
    assert status.returncode == 0 and status.stdout.count("matches the lock") == 2


def test_a_second_sync_changes_nothing(setup: dict[str, Any], on: Any) -> None:
    before = {h: on(h, f"stat -c %Y {VENV}.wheels/sha256/* {VENV}").stdout
              for h in HOSTS}
    again = _provision(setup, "stack", "sync", "-i", setup["inventory"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 changed, 2 unchanged" in again.stdout and "pushing" not in again.stdout
    assert {h: on(h, f"stat -c %Y {VENV}.wheels/sha256/* {VENV}").stdout
            for h in HOSTS} == before


def _lock(setup: dict[str, Any], requirements: str) -> str:
    (setup["work"] / "requirements.in").write_text(requirements)
    locked = _provision(setup, "stack", "lock", "-i", setup["inventory"])
    assert locked.returncode == 0, locked.stdout + locked.stderr
    return locked.stdout


def test_a_changed_pin_upgrades_each_node_with_an_atomic_switch(setup: dict[str, Any],
                                                                on: Any) -> None:
    out = _lock(setup, f"six=={NEW[0]}\nidna=={NEW[1]}\n")
    assert f"six: {OLD[0]} -> {NEW[0]}" in out and f"idna: {OLD[1]} -> {NEW[1]}" in out
    setup["lock_new"] = (setup["work"] / "stack.lock.txt").read_text()
    sync = subprocess.Popen([PROVISION, "stack", "sync", "-i", setup["inventory"]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(setup))
    seen: dict[str, set[tuple[str, ...]]] = {h: set() for h in HOSTS}
    while sync.poll() is None:  # imports during the whole sync: the old set or the new one
        for host in HOSTS:
            seen[host].add(_versions(on, host))
    output = sync.communicate()[0]
    assert sync.returncode == 0, output
    for host in HOSTS:
        seen[host].add(_versions(on, host))
        assert seen[host] <= {OLD, NEW}, f"{host} imported a mixed or broken venv: {seen[host]}"
        assert OLD in seen[host]  # the polls began before the switch
        assert _versions(on, host) == NEW
    assert output.count("switched") == 2


def _env(setup: dict[str, Any]) -> dict[str, str]:
    import os

    return {**os.environ, "XDG_STATE_HOME": str(setup["state"]),
            "XDG_CACHE_HOME": str(setup["work"] / "cache")}


def test_a_controller_killed_mid_sync_leaves_the_old_venv_and_the_rerun_converges(
        setup: dict[str, Any], on: Any) -> None:
    _lock(setup, f"six=={NEW[0]}\nidna=={NEW[1]}\npackaging==24.2\n")
    before = {h: _active(on, h) for h in HOSTS}
    sync = subprocess.Popen([PROVISION, "stack", "sync", "-i", setup["inventory"]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(setup))
    deadline = time.monotonic() + 120
    caught = ""
    while time.monotonic() < deadline and sync.poll() is None and not caught:
        # mid-push (a wheel on its way) or mid-build (a new stack folder without its marker)
        out = on("h1", f"ls -d {VENV}.wheels/sha256/.tmp-* {VENV}.stack-* 2>/dev/null;"
                                f" ls {VENV}.stack-*/.vllm-provision-stack.json 2>/dev/null")
        stacks = [line for line in out.stdout.split() if ".stack-" in line
                  and not line.endswith(".json")]
        done = {line.rsplit("/", 1)[0] for line in out.stdout.split() if line.endswith(".json")}
        if ".tmp-" in out.stdout or [s for s in stacks if s not in done]:
            caught = out.stdout
    sync.kill()
    sync.wait()
    assert caught, "the sync ended before it was caught mid-push or mid-build"
    for host in HOSTS:
        assert _active(on, host) == before[host]
        assert _versions(on, host) == NEW
    rerun = _provision(setup, "stack", "sync", "-i", setup["inventory"])
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    for host in HOSTS:
        assert on(host, f"{VENV}/bin/python -c 'import packaging; "
                                 "print(packaging.__version__)'").stdout.strip() == "24.2"
        # nothing partial is left: the active stack, the previous one, the wheels
        left = on(host, "ls -a /opt | grep vp-stack-lab").stdout.split()
        assert sorted(left) == sorted([".vp-stack-lab.stack-lock", "vp-stack-lab",
                                       "vp-stack-lab.previous", "vp-stack-lab.wheels",
                                       _active(on, host), before[host]])
        assert "links-" not in on(host, f"ls -a {VENV}.wheels").stdout


def test_rollback_returns_to_the_previous_venv_and_the_lock_comparison_follows(
        setup: dict[str, Any], on: Any) -> None:
    status = _provision(setup, "stack", "status", "-i", setup["inventory"])
    assert status.returncode == 0, status.stdout
    # a node that keeps no previous stack: the replica's rollback is refused before any change
    active = {h: _active(on, h) for h in HOSTS}
    assert on("h2", f"mv {VENV}.previous {VENV}.previous.held").rc == 0
    try:
        refused = _provision(setup, "stack", "rollback", "-i", setup["inventory"])
    finally:
        assert on("h2", f"mv {VENV}.previous.held {VENV}.previous").rc == 0
    assert refused.returncode == 1 and "nothing rolled back: no previous stack" in refused.stdout
    assert f"beside {VENV} on h2 " in refused.stdout, \
        refused.stdout
    assert {h: _active(on, h) for h in HOSTS} == active
    back = _provision(setup, "stack", "rollback", "-i", setup["inventory"])
    assert back.returncode == 0, back.stdout + back.stderr
    for host in HOSTS:
        assert on(host, f"{VENV}/bin/python -c 'import packaging'").rc != 0
        assert _versions(on, host) == NEW
    # the node no longer runs the lock: named with the package and both versions
    status = _provision(setup, "stack", "status", "-i", setup["inventory"])
    assert status.returncode == 2
    assert "packaging  h1  expected 24.2  actual not installed" in status.stdout
    # the operator reverts the lock too: clean again
    (setup["work"] / "stack.lock.txt").write_text(setup["lock_new"])
    status = _provision(setup, "stack", "status", "-i", setup["inventory"])
    assert status.returncode == 0 and status.stdout.count("matches the lock") == 2


def test_a_host_cut_mid_build_leaves_both_nodes_on_the_old_venv_and_the_rerun_converges(
        setup: dict[str, Any], on: Any, lab: Any) -> None:
    _lock(setup, f"six=={NEW[0]}\nidna=={NEW[1]}\npackaging==24.1\n")
    before = {h: _active(on, h) for h in HOSTS}
    sync = subprocess.Popen([PROVISION, "stack", "sync", "-i", setup["inventory"], "--timeout",
                             "9"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(setup))
    # h2's cable is pulled while its new stack is being built (its folder has no marker yet)
    partial = (f"for d in {VENV}.stack-*; do [ -e $d/.vllm-provision-stack.json ] || echo $d;"
               " done")
    deadline = time.monotonic() + 120
    caught = False
    try:
        while time.monotonic() < deadline and sync.poll() is None and not caught:
            if on("h2", partial).stdout.strip():
                lab.cut("h2")
                caught = True
        output = sync.communicate(timeout=180)[0]
    finally:
        lab.heal("h2")
    assert caught, "the sync ended before h2 was caught mid-build"
    assert sync.returncode == 1, output
    assert "h2: FAILED" in output and "answered nothing" in output, output
    # h1 built its stack too, but no node switches before every node has built
    assert "h1: " in output and "not switched (h2 failed" in output, output
    assert "no node switched, run sync again" in output
    for host in HOSTS:
        assert _active(on, host) == before[host]
        assert _versions(on, host) == NEW
    # the failed run could not release h2's run lock through the cut: h2's holder keeps it
    # until GIVE_UP_S without a heartbeat (transport/runlock.py), and the refusal says so; the
    # operator reruns as it says, and within that bound the rerun takes the lock
    deadline = time.monotonic() + GIVE_UP_S + 30
    while True:
        rerun = _provision(setup, "stack", "sync", "-i", setup["inventory"])
        held = "another run holds this host's run lock" in rerun.stdout + rerun.stderr
        if rerun.returncode == 0 or not held or time.monotonic() > deadline:
            break
        assert "frees the lock within" in rerun.stdout + rerun.stderr
        time.sleep(5)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert rerun.stdout.count("switched") == 2, rerun.stdout
    for host in HOSTS:
        assert on(host, f"{VENV}/bin/python -c 'import packaging; "
                        "print(packaging.__version__)'").stdout.strip() == "24.1"
