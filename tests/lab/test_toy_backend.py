"""A third backend added from outside the package deploys on the lab: the extension point is real.

The toy backend (tests/data/backends: one class, one role) is registered the way a plug-in
distribution would: through the ``vllm_provision.backends`` entry-point group of a distribution
on the path of the ``provision`` process. ``up`` then installs and starts its stub unit on both
lab hosts, and ``down --purge`` stops it and removes its unit (from the hosts' state records);
the hosts are read over the lab's SSH. The hosts are held exclusively from the session's
``replicas`` broker, handed over purged of our replicas (the broker purges unless it knows them
purged); the module ends with ``down`` and tells the broker so.

Cost: about 22 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_support import provision

pytestmark = pytest.mark.lab

BACKENDS = Path(__file__).resolve().parents[1] / "data" / "backends"
UNIT = "toy-stub.service"
PORT = 18080


def _plugin_path(root: Path) -> Path:
    """A distribution's metadata naming the toy backend in the entry-point group."""
    info = root / "toy_backend_plugin-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend-plugin\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text("[vllm_provision.backends]\n"
                                           "toy = toy_backend:ToyBackend\n")
    return root


def _provision(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with ``env`` added (the toy's PYTHONPATH)."""
    return provision(*args, env=env)


@pytest.fixture(scope="module")
def toy(lab: Any, replicas: Any, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[dict[str, Any]]:
    """The lab's two hosts as one toy replica, and the environment that registers the toy."""
    root = tmp_path_factory.mktemp("toy")
    doc = yaml.safe_load(lab.inventory_path("mp").read_text())
    replica = doc["all"]["children"]["vllm_replicas"]["children"]["lab"]
    replica["vars"]["vllm_backend"] = "toy"
    inventory = root / "toy.yml"
    inventory.write_text(yaml.safe_dump(doc))
    env = {"PYTHONPATH": os.pathsep.join(
        [str(_plugin_path(root / "plugin")), str(BACKENDS), os.environ.get("PYTHONPATH", "")])}
    # nothing of another backend runs on the hosts
    with replicas.exclusive("mp", start="purged") as lease:
        yield {"inventory": str(inventory), "env": env}
        down = _provision(env, "down", "-i", str(inventory))
        lease.leave("down" if down.returncode == 0 else "unknown")


def test_toy_backend_deploys_its_units_and_takes_them_down(toy: dict[str, Any], lab: Any,
                                                           lab_host: Any) -> None:
    up = _provision(toy["env"], "up", "-i", toy["inventory"])
    assert up.returncode == 0, up.stdout + up.stderr
    for node in lab.hosts[:2]:
        host = lab_host(node.name)
        service = host.service(UNIT)
        assert service.is_running and service.is_enabled, f"{node.name}: {UNIT} not up"
        assert host.socket(f"tcp://{node.address}:{PORT}").is_listening
        assert not host.service("vllm.service").is_running  # no unit of another backend
    # --purge removes what the hosts' state records list, the toy's unit included: no name of
    # the toy is known to vllm_provision
    down = _provision(toy["env"], "down", "-i", toy["inventory"], "--purge")
    assert down.returncode == 0, down.stdout + down.stderr
    for node in lab.hosts[:2]:
        host = lab_host(node.name)
        assert not host.service(UNIT).is_running, f"{node.name}: {UNIT} still up"
        for unit in (UNIT, "vllm-watchdog.service"):
            assert not host.file(f"/etc/systemd/system/{unit}").exists, f"{node.name}: {unit}"
