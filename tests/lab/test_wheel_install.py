"""A user's install: the operator's wheel alone (built from the sdist; the lab is a distribution
of its own, lab/) in a fresh venv outside the checkout, no editable install, no PYTHONPATH, run
from a folder outside the repository, drives the lab (booted by this session's own install):
``--help``, ``--version``, ``check``, ``up`` (the replica serves), a second ``up`` (changed=0)
and the packaged verify suite; ``provision lab`` there says the lab is not installed. The lab's
hosts are held exclusively from the session's ``replicas`` broker, handed over with no replica
serving (the first ``up`` starts vLLM and measures it), and left serving the lab's mp replica,
deployed with the broker's state folder for it, which the broker is told.

Cost: about 120 s on the stand-in tier (3 lab workers on 2 cores; 271 s before the wheel was
installed with uv, 50 s alone on a quiet machine); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from lab_support import ReplicaBroker, provision

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(built_dists: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
              ) -> dict[str, Any]:
    """A fresh venv with the wheel and its ``test`` extra; ``{"bin": Path, "cwd": Path,
    "install_s": float}``. The venv gets no pip of its own: this session's uv (the ``stack``
    extra's, pinned) installs into it, about 3 s against pip's 53 s (pip resolves more slowly
    and compiles every module to bytecode; measured on a quiet 2-core machine); this session's
    pip when uv cannot (no index it can reach), from pip's cache or its configured index. The
    installer does not matter to what the module checks: the wheel alone, its pins, no lab."""
    work = tmp_path_factory.mktemp("wheel-user")
    venv = work / "venv"
    python = str(venv / "bin" / "python")
    requirement = f"{built_dists['wheel']}[test]"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    uv = Path(sys.executable).parent / "uv"
    installed_by_uv = uv.is_file() and subprocess.run(
        [str(uv), "pip", "install", "-q", "--python", python, requirement],
        capture_output=True, timeout=600, cwd=work, check=False).returncode == 0
    if not installed_by_uv:
        subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                        requirement], check=True, capture_output=True, timeout=600, cwd=work)
    install_s = time.monotonic() - started
    print(f"build {built_dists['build_s']:.1f} s, venv + install {install_s:.1f} s "
          f"({'uv' if installed_by_uv else 'pip'})")
    return {"bin": venv / "bin", "cwd": work, "install_s": install_s}


def _run(installed: dict[str, Any], *args: str, timeout: int = 600,
         state_home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed wheel's ``provision ARGS`` (not this checkout's), from outside the
    checkout, with none of this session's Python variables (``state_home`` as in
    :func:`lab_support.provision`)."""
    path = f"{installed['bin']}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = {"PYTHONPATH": None, "VIRTUAL_ENV": None, "PYTHONHOME": None, "PATH": path}
    return provision(*args, executable=str(installed["bin"] / "provision"),
                     cwd=installed["cwd"], env=env, timeout=timeout, state_home=state_home)


def test_the_installed_wheel_deploys_and_verifies_the_lab_replica(
        replicas: ReplicaBroker, installed: dict[str, Any]) -> None:
    site = installed["bin"].parent / "lib"
    assert REPO not in Path(installed["cwd"]).parents
    helped = _run(installed, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "verify" in helped.stdout and "up" in helped.stdout
    assert re.search(r"\n  lab +Not installed", helped.stdout), helped.stdout
    no_lab = _run(installed, "lab", "up")
    assert no_lab.returncode == 1 and "Traceback" not in no_lab.stderr, no_lab.stderr
    assert "is not installed" in no_lab.stderr and "vllm-provision-lab" in no_lab.stderr
    (packages,) = site.glob("python3*/site-packages")
    assert (packages / "vllm_provision" / "cli").is_dir()
    assert not list(packages.glob("vllm_provision_lab*"))
    assert not (packages / "vllm_provision" / "lab").exists()

    version = _run(installed, "--version")
    assert version.returncode == 0, version.stderr
    lines = dict(line.split(": ", 1) for line in version.stdout.splitlines()[1:])
    assert set(lines) == {"playbooks", "roles", "verify"}
    for folder in lines.values():  # from the venv's site-packages, not the checkout
        assert Path(folder).is_dir() and site in Path(folder).parents, version.stdout

    with replicas.exclusive("mp", start="stopped") as lease:
        inventory, state = lease.replica.inventory, lease.replica.state_home
        check = _run(installed, "check", "-i", inventory, state_home=state)
        assert check.returncode == 0, check.stdout + check.stderr

        first = _run(installed, "up", "-i", inventory, "--json", state_home=state)
        assert first.returncode == 0, first.stdout + first.stderr
        summary = json.loads(first.stdout)
        assert summary["completion"] and summary["failed"] == 0
        assert summary["start_to_serving_s"] is not None, summary["start_to_serving_reason"]

        again = _run(installed, "up", "-i", inventory, "--json", state_home=state)
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(again.stdout)["changed"] == 0

        verified = _run(installed, "verify", "-i", inventory, "--", "-q", timeout=300,
                        state_home=state)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "11 passed" in verified.stdout
        lease.leave("serving")
