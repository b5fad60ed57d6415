"""`provision up` from an INI inventory and from an inventory directory of the lab's two hosts.

The INI file is the lab's mp inventory (vllm_provision_lab.inventories) written as INI, h2 reached
through the legacy ``ansible_ssh_host``/``ansible_ssh_user`` names; the directory holds the same
hosts as INI with the connection in ``group_vars/all.yml`` and the engine in a
``group_vars/lab/`` folder whose file has no extension. The session's ``replicas`` broker hands
the hosts over with no replica serving (held exclusively); the first ``up`` deploys the replica;
the second, from the directory, finds the same replica (same units, same engine arguments, and
the same replica id, so it is the same owner without ``--take-over``), so it changes nothing,
and must still see it serve. One ``down --purge`` at the end, of which the
broker is told.

Cost: about 52 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_support import complete, provision
from vllm_provision_lab.inventories import (
    LAB_MODEL,
    PIPELINE_PARALLEL_SIZE,
    REPLICA_GROUP,
    TENSOR_PARALLEL_SIZE,
)

pytestmark = pytest.mark.lab

def _connection(lab: Any) -> dict[str, str]:
    return {"ansible_user": "root", "ansible_port": "22",
            "ansible_ssh_private_key_file": str(lab.key_file),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={lab.known_hosts}"}


def _engine() -> dict[str, str]:
    return {"vllm_backend": "mp", "vllm_model": LAB_MODEL,
            "vllm_tensor_parallel_size": str(TENSOR_PARALLEL_SIZE),
            "vllm_pipeline_parallel_size": str(PIPELINE_PARALLEL_SIZE),
            "vllm_cluster_interface": "eth0"}


def _address(lab: Any, name: str) -> str:
    return str(next(h.address for h in lab.hosts if h.name == name))


def write_ini(lab: Any, path: Path) -> Path:
    """The lab's mp inventory as one INI file; h2 through the legacy aliases."""
    lines = [f"[{REPLICA_GROUP}]",
             f"h1 ansible_host={_address(lab, 'h1')} vllm_node_rank=0",
             f"h2 ansible_ssh_host={_address(lab, 'h2')} ansible_ssh_user=root vllm_node_rank=1",
             f"[{REPLICA_GROUP}:vars]", *(f"{k}={v}" for k, v in _engine().items()),
             "[vllm_replicas:children]", REPLICA_GROUP,
             "[all:vars]", *(f"{k}='{v}'" for k, v in _connection(lab).items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_directory(lab: Any, folder: Path) -> Path:
    """The same replica as an inventory directory with group_vars files and folders."""
    (folder / "group_vars" / REPLICA_GROUP).mkdir(parents=True)
    (folder / "10-hosts.ini").write_text(
        f"[{REPLICA_GROUP}]\n"
        + "".join(f"{name} ansible_host={_address(lab, name)} vllm_node_rank={rank}\n"
                  for rank, name in enumerate(("h1", "h2")))
        + f"[vllm_replicas:children]\n{REPLICA_GROUP}\n")
    (folder / "README.md").write_text("[ignored]\nnot-a-host\n")  # skipped, as Ansible does
    (folder / "group_vars" / "all.yml").write_text(json.dumps(_connection(lab)) + "\n")
    (folder / "group_vars" / REPLICA_GROUP / "engine").write_text(
        "".join(f"{k}: {v}\n" for k, v in _engine().items()))
    return folder


@pytest.fixture(scope="module")
def sources(lab: Any, replicas: Any, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, Path]]:
    """Both inventories; the replica is taken down (and purged) after the module."""
    root = tmp_path_factory.mktemp("inventory-formats")
    found = {"ini": write_ini(lab, root / "hosts"),
             "dir": write_directory(lab, root / "inventory")}
    with replicas.exclusive("mp", start="stopped") as lease:
        yield found
        done = provision("down", "-i", str(found["dir"]), "--purge", timeout=300)
        if done.returncode != 0:  # the directory's up did not run: the INI file owns the hosts
            done = provision("down", "-i", str(found["ini"]), "--purge", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        lease.leave("purged")


def _api_url(source: Path) -> str:
    listed = provision("inventory", "-i", str(source), "--list", timeout=60)
    assert listed.returncode == 0, listed.stderr
    return str(json.loads(listed.stdout)["_vllm_provision"]["replicas"][REPLICA_GROUP]["api_url"])


def _assert_served(run: subprocess.CompletedProcess[str], source: Path, lab_host: Any) -> None:
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(rf"completion from {re.escape(LAB_MODEL)}: '.+'", run.stdout), run.stdout
    for name in ("h1", "h2"):
        assert lab_host(name).service("vllm.service").is_running, name
    assert complete(_api_url(source), LAB_MODEL), "the replica does not answer a completion"


def test_up_from_ini_inventory_serves(sources: dict[str, Path], lab_host: Any) -> None:
    run = provision("up", "-i", str(sources["ini"]), timeout=300)
    _assert_served(run, sources["ini"], lab_host)
    # the legacy names took effect (h2 reached at its address) and each warned once, on stderr
    assert "ansible_ssh_host is deprecated; use ansible_host instead" in run.stderr
    assert "ansible_ssh_user is deprecated; use ansible_user instead" in run.stderr


def test_up_from_inventory_directory_serves_the_same_replica(sources: dict[str, Path],
                                                             lab_host: Any) -> None:
    # the INI file deployed the hosts; the directory describes the same replica (name, hosts,
    # model: the same derived replica id), so it is the same owner: no --take-over
    run = provision("up", "-i", str(sources["dir"]), timeout=300)
    _assert_served(run, sources["dir"], lab_host)
    assert "take-over" not in run.stdout + run.stderr
    assert "deprecated" not in run.stderr
