"""The product on each Linux release the lab boots: Debian 11 (systemd 247, OpenSSH 8.4, Python
3.9) and 13 (systemd 257, OpenSSH 10.0, Python 3.13) beside the default bookworm hosts.

The module boots four more hosts into the session's lab (h3, h4 bullseye; h5, h6 trixie; about
10 s each pair from the cached bases) and removes them at the end. Per release, one mp replica
(rank 0 on the first host, headless on the second) goes through what an operator does: ``up``
(the start-to-serving time is a number), ``status`` (every unit's start time read without
``systemctl --timestamp=unix``), ``drift``, ``restart``, a kill -9 of the headless node (the
replica heals with no operator) and ``down``. A replica mixing the releases is refused by
preflight's parity rules: Python (and, for Ray, Ray) versions differ.

Cost: about 470 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lab_support
import pytest

pytestmark = pytest.mark.lab

MODEL = "/srv/models/lab-model"
# suite -> (rank 0, headless), and what the release ships (vllm_provision_lab.base.RELEASES)
HOSTS = {"bullseye": ("h3", "h4"), "trixie": ("h5", "h6")}


@pytest.fixture(scope="module")
def release_lab(lab: Any) -> Iterator[Any]:
    """The session's lab with h3/h4 (bullseye) and h5/h6 (trixie) booted; removed after."""
    if lab.vllm != "standin":
        pytest.skip("the release tests run on the stand-in lab (`provision lab up`)")
    added = []
    try:
        for suite, names in HOSTS.items():
            missing = [n for n in names if n not in lab.suites()]
            lab.add_hosts(missing, suite)
            added += missing
            assert all(lab.suites()[n] == suite for n in names), lab.suites()
        yield lab
    finally:
        if added:
            lab.remove_hosts(added)


@dataclass
class Release:
    """One release's mp replica: its inventory and private controller state."""

    lab: Any
    suite: str
    inventory: Path
    state_home: Path

    @property
    def nodes(self) -> tuple[str, str]:
        return HOSTS[self.suite]

    def provision(self, *args: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
        return lab_support.provision(*args, "-i", str(self.inventory),
                                     state_home=self.state_home, timeout=timeout_s)

    def ssh(self, host: str, command: str) -> str:
        result = self.lab.ssh(host, command, timeout_s=30)
        assert result.returncode == 0, f"{host}: {command}: {result.stderr}"
        return str(result.stdout)

    @property
    def base_url(self) -> str:
        return f"http://{self.lab.config.address(self.nodes[0])}:8000"

    def complete(self) -> bool:
        return lab_support.complete(self.base_url, MODEL)

    def invocation(self) -> str:
        """rank 0's vLLM InvocationID while it runs, else ""."""
        out = self.lab.ssh(self.nodes[0], "systemctl show -p InvocationID,SubState vllm.service",
                           timeout_s=10).stdout
        values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        return values.get("InvocationID", "") if values.get("SubState") == "running" else ""


def _inventory(lab: Any, nodes: tuple[str, str], backend: str, path: Path) -> Path:
    from vllm_provision_lab.inventories import inventory_text

    path.write_text(inventory_text(lab.config, backend, nodes))  # type: ignore[arg-type]
    return path


@pytest.fixture(scope="class", params=list(HOSTS))
def release(request: pytest.FixtureRequest, release_lab: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """An mp replica on two hosts of one release (not deployed yet); purged at the end."""
    suite = str(request.param)
    folder = tmp_path_factory.mktemp(suite)
    replica = Release(release_lab, suite, _inventory(release_lab, HOSTS[suite], "mp",
                                                     folder / "inventory.yml"), folder / "state")
    yield replica
    replica.provision("down", "--purge")


class TestOneRelease:
    """up, status, drift, restart, kill -9 of the headless node, down (mp), then a Ray replica
    up and down: on one release."""

    def test_hosts_run_the_release(self, release: Release) -> None:
        from vllm_provision_lab.base import RELEASES

        wanted = RELEASES[release.suite]
        for host in release.nodes:
            out = release.ssh(host, "grep ^VERSION_CODENAME= /etc/os-release; "
                                    "systemctl --version | head -n1; /opt/vllm/bin/python -V")
            assert f"VERSION_CODENAME={release.suite}" in out
            assert f"systemd {wanted.systemd} " in out and f"Python {wanted.python}." in out

    def test_up_serves_and_measures_start_to_serving(self, release: Release) -> None:
        run = release.provision("up", "--json", timeout_s=600)
        assert run.returncode == 0, run.stdout + run.stderr
        summary = json.loads(run.stdout)
        assert summary["failed"] == 0 and summary["completion"].strip()
        seconds = summary["start_to_serving_s"]
        assert isinstance(seconds, float) and 0 < seconds < 120, summary
        print(f"\n{release.suite}: start to serving {seconds} s")

    def test_status_reads_every_unit_and_its_start_time(self, release: Release) -> None:
        run = release.provision("status", "--json", timeout_s=120)
        assert run.returncode == 0, run.stdout + run.stderr
        (replica,) = json.loads(run.stdout)["replicas"]
        assert replica["verdict"] == "serving" and replica["health"] == 200
        vllm = [u for u in replica["units"] if u["unit"] == "vllm.service"]
        assert {u["host"] for u in vllm} == set(release.nodes)
        assert all(u["state"] == "active (running)" and u["since"] for u in vllm), vllm

    def test_no_drift_after_up(self, release: Release) -> None:
        run = release.provision("drift", "--json", timeout_s=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout)["drift"] is False

    def test_restart_serves_again(self, release: Release) -> None:
        before = release.invocation()
        run = release.provision("restart", timeout_s=600)
        assert run.returncode == 0, run.stdout + run.stderr
        assert release.invocation() not in ("", before)
        assert release.complete()

    def test_kill_9_of_the_headless_node_heals(self, release: Release) -> None:
        assert release.complete()
        before = release.invocation()
        started = time.monotonic()
        release.ssh(release.nodes[1], "kill -9 $(systemctl show -p MainPID --value vllm.service)")
        healed = None
        while time.monotonic() - started < 90:  # TimeoutStopSec 15 + RestartSec 5 + load 5
            current = release.invocation()
            if current not in ("", before) and release.complete():
                healed = round(time.monotonic() - started, 1)
                break
            time.sleep(0.5)
        print(f"\n{release.suite}: kill -9 headless -> serving again in {healed} s")
        assert healed is not None, "the replica did not serve again within 90 s"

    def test_down_stops_every_unit(self, release: Release) -> None:
        run = release.provision("down", timeout_s=300)
        assert run.returncode == 0, run.stdout + run.stderr
        for host in release.nodes:
            state = release.lab.ssh(host, "systemctl is-active vllm.service", timeout_s=10)
            assert state.stdout.strip() in ("inactive", "failed"), (host, state.stdout)

    def test_ray_replica_serves_with_the_release_ray(self, release: Release,
                                                    tmp_path: Path) -> None:
        """The Ray units pass this release's systemd-analyze verify (up refuses any output of
        it) and the release's own Ray (2.51.2 on Python 3.9, 2.60.0 on 3.13) forms the cluster."""
        ray = Release(release.lab, release.suite,
                      _inventory(release.lab, release.nodes, "ray", tmp_path / "ray.yml"),
                      release.state_home)
        # Ray 2.51.2 (bullseye) has no token authentication and the lab has no firewall, so
        # preflight's network.ray_auth refuses the default vllm_ray_auth: token there; this
        # release states that its Ray runs without it (docs/security.md). 2.60.0 takes the token.
        auth = ("-e", "vllm_ray_auth=none") if release.suite == "bullseye" else ()
        run = ray.provision("up", "--json", *auth, timeout_s=600)
        try:
            assert run.returncode == 0, run.stdout + run.stderr
            summary = json.loads(run.stdout)
            assert summary["completion"].strip() and summary["start_to_serving_s"] > 0
        finally:
            down = ray.provision("down", "--purge", *auth, timeout_s=300)
        assert down.returncode == 0, down.stdout + down.stderr


def test_a_mixed_release_replica_is_refused_by_the_parity_rules(
        release_lab: Any, tmp_path: Path) -> None:
    """Ray backend on h3 (bullseye) + h5 (trixie): Python 3.9 vs 3.13 and Ray 2.51.2 vs 2.60.0
    differ, so preflight refuses it, naming both versions; each host's own platform checks pass."""
    inventory = _inventory(release_lab, ("h3", "h5"), "ray", tmp_path / "mixed.yml")
    run = lab_support.provision("check", "-i", str(inventory), "--json", timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    findings = json.loads(run.stdout)["findings"]
    errors = {f["check"]: f for f in findings if f["severity"] == "error"}
    assert "parity.python" in errors, errors
    assert "3.9" in errors["parity.python"]["expected"] + errors["parity.python"]["actual"]
    assert "3.13" in errors["parity.python"]["expected"] + errors["parity.python"]["actual"]
    ray = [f for check, f in errors.items() if "ray" in check]
    assert ray and "2.51.2" in ray[0]["expected"] + ray[0]["actual"], errors
    platform = {(f["check"], f["host"]): f["severity"] for f in findings
                if f["check"].startswith("platform.")}
    assert platform and set(platform.values()) == {"ok"}, platform
