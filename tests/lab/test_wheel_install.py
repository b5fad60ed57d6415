"""A user's install: the operator's wheel alone (built from the sdist; the lab is a distribution
of its own, lab/) in a fresh venv outside the checkout, no editable install, no PYTHONPATH, run
from a folder outside the repository, drives the lab (booted by this session's own install):
``--help``, ``--version``, ``check``, ``up`` (the replica serves), a second ``up`` (changed=0)
and the packaged verify suite; ``provision lab`` there says the lab is not installed."""

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

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(built_dists: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
              ) -> dict[str, Any]:
    """A fresh venv with the wheel and its ``test`` extra; ``{"bin": Path, "cwd": Path,
    "install_s": float}``. The venv gets no pip of its own: this session's pip installs into it
    (``pip --python``), from pip's cache or the index, which saves the ensurepip step."""
    work = tmp_path_factory.mktemp("wheel-user")
    venv = work / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", f"{built_dists['wheel']}[test]"],
                   check=True, capture_output=True, timeout=600, cwd=work)
    install_s = time.monotonic() - started
    print(f"build {built_dists['build_s']:.1f} s, venv + install {install_s:.1f} s")
    return {"bin": venv / "bin", "cwd": work, "install_s": install_s}


def _run(installed: dict[str, Any], *args: str, timeout: int = 600,
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{installed['bin']}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run([str(installed["bin"] / "provision"), *args], cwd=installed["cwd"],
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_the_installed_wheel_deploys_and_verifies_the_lab_replica(
        lab: object, installed: dict[str, Any]) -> None:
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

    inventory = str(lab.inventory_path("mp"))  # type: ignore[attr-defined]
    check = _run(installed, "check", "-i", inventory)
    assert check.returncode == 0, check.stdout + check.stderr

    first = _run(installed, "up", "-i", inventory, "--json")
    assert first.returncode == 0, first.stdout + first.stderr
    summary = json.loads(first.stdout)
    assert summary["completion"] and summary["failed"] == 0
    assert summary["start_to_serving_s"] is not None, summary["start_to_serving_reason"]

    again = _run(installed, "up", "-i", inventory, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["changed"] == 0

    verified = _run(installed, "verify", "-i", inventory, "--", "-q", timeout=300)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "11 passed" in verified.stdout
