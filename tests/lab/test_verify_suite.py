"""The verify suite (tests/verify) passes on a replica that `provision up` deployed on the lab,
and fails once `provision down` stopped it: the operator's checks can tell the two apart. The
replica is the session's mp replica, held exclusively (the ``replicas`` broker's: reused when it
knows it serving, else deployed); the broker is told it is left down.

Cost: about 57 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from lab_support import ReplicaBroker

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def _verify(inventory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/verify", "--inventory", str(inventory)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_verify_suite_passes_on_a_deployed_replica_and_fails_after_down(
        replicas: ReplicaBroker) -> None:
    with replicas.exclusive("mp") as lease:
        inventory = Path(lease.replica.inventory)
        try:
            served = _verify(inventory)
            assert served.returncode == 0, served.stdout
            assert "11 passed" in served.stdout
        finally:
            down = lease.replica.provision("down", "-i", str(inventory), cwd=REPO)
        assert down.returncode == 0, down.stdout + down.stderr
        stopped = _verify(inventory)
        assert stopped.returncode == 1
        assert "test_units_are_enabled_and_running" in stopped.stdout
        assert "test_master_is_healthy_and_serves_the_model" in stopped.stdout
        assert "test_master_serves_a_completion" in stopped.stdout
        assert "test_peer_watchdog_guards_the_node" in stopped.stdout
        lease.leave("down")
