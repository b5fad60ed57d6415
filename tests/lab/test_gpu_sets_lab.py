"""A replica on a GPU set (``vllm_gpus``, docs/inventory.md "GPU sets") on the stand-in lab.

The broker hands the lab's hosts over with no replica serving (held exclusively). The module's
inventory is the lab's mp replica as a replica ``gpus`` of TP=2 x PP=2 (two GPU workers per
node), each node setting ``vllm_gpus: [2, 3]`` in its host vars (the stand-in hosts have GPUs
0-3). As an operator would:

- ``provision check`` with an index the hosts lack (``-e vllm_gpus=[2,7]``) exits 1 with
  ``host.gpus`` naming the host, the index and the GPUs it has, from the hosts' nvidia-smi;
- ``provision up`` serves the replica; on each node, read over the lab's SSH with
  pytest-testinfra, ``nvidia-smi`` lists the stand-in's processes on GPUs 2 and 3 and on no
  other GPU, and the env file says ``CUDA_VISIBLE_DEVICES="2,3"``;
- ``provision down`` stops it: nvidia-smi lists no process.

Cost: about 25 s on one lab instance alone (measured 2026-12-05: 22 s; check 1 s, up 12 s,
down 6 s, plus the broker's naming of what the hosts hold; add its down of a serving replica
when one is); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lab_support
import pytest
import yaml

pytestmark = pytest.mark.lab

HOSTS = ("h1", "h2")
CHOSEN = [2, 3]


def provision(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with the module's controller state folder ``state``."""
    return lab_support.provision(*args, state_home=state, timeout=300)


@pytest.fixture(scope="module")
def inventory(lab: Any, replicas: Any,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The module's inventory (the lab's hosts, each with ``vllm_gpus: [2, 3]``) and its state
    folder, with the lab's hosts held and no replica serving; taken down at the end."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    folder = tmp_path_factory.mktemp("gpus")
    source = yaml.safe_load(lab.inventory_path("mp").read_text())
    lab_group = source["all"]["children"]["vllm_replicas"]["children"]["lab"]
    group_vars = {k: lab_group["vars"][k]
                  for k in ("vllm_backend", "vllm_model", "vllm_cluster_interface")}
    group_vars.update(vllm_tensor_parallel_size=2, vllm_pipeline_parallel_size=2)
    hosts = {name: {"ansible_host": lab_group["hosts"][name]["ansible_host"],
                    "vllm_node_rank": rank, "vllm_gpus": CHOSEN}
             for rank, name in enumerate(HOSTS)}
    path = folder / "gpus.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": source["all"]["vars"], "children": {
        "vllm_replicas": {"children": {"gpus": {"vars": group_vars, "hosts": hosts}}}}}},
        sort_keys=False))
    with lab_support.own_inventory(replicas, path, folder / "state") as info:
        yield info


def processes_by_gpu(host: Any) -> dict[int, list[str]]:
    """GPU index -> the process names nvidia-smi lists on it, read on ``host`` (testinfra)."""
    indexes = dict(reversed(line.split(", ")) for line in host.check_output(
        "nvidia-smi --query-gpu=index,uuid --format=csv,noheader").splitlines())
    found: dict[int, list[str]] = {}
    for line in host.check_output("nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid "
                                  "--format=csv,noheader").splitlines():
        _pid, name, uuid = (part.strip() for part in line.split(","))
        found.setdefault(int(indexes[uuid]), []).append(name)
    return found


def test_an_index_the_hosts_lack_stops_preflight_naming_it(inventory: dict[str, Any]) -> None:
    run = provision(inventory["state"], "check", "-i", inventory["path"], "--json",
                    "-e", "vllm_gpus=[2,7]")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    errors = {(f["check"], f["host"]): f for f in json.loads(run.stdout)["findings"]
              if f["severity"] == "error"}
    for name in HOSTS:
        finding = errors[("host.gpus", name)]
        assert finding["actual"] == f"{name} has no GPU 7; it has GPU 0, 1, 2, 3", finding


def test_the_replica_runs_on_its_gpu_set_only(inventory: dict[str, Any], lab_host: Any) -> None:
    up = provision(inventory["state"], "up", "-i", inventory["path"])
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    for name in HOSTS:
        host = lab_host(name)
        on = processes_by_gpu(host)
        assert sorted(on) == CHOSEN, f"{name}: processes on GPUs {on}"
        assert all(names == ["VLLM::Worker"] for names in on.values()), on
        env = host.file("/etc/vllm-provision/vllm.env").content_string
        assert 'CUDA_VISIBLE_DEVICES="2,3"' in env.splitlines(), env


def test_down_leaves_no_process_on_any_gpu(inventory: dict[str, Any], lab_host: Any) -> None:
    down = provision(inventory["state"], "down", "-i", inventory["path"])
    inventory["down"] = down.returncode == 0
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    for name in HOSTS:
        assert processes_by_gpu(lab_host(name)) == {}, name
