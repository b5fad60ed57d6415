"""Replicas are independent, on the lab's two hosts.

One inventory holds two single-node mp replicas: ``good`` on h1 (TP=4, the stand-in's 4 GPUs)
and ``bad`` on h2 (TP=8, more GPUs than the node has). One ``provision up --json``: the good one
serves, the bad one is reported failed with its own preflight finding and nothing started on h2,
the JSON has both results, and the exit code is 1. Then, check only (no more ``up``): the lab's
two-node replica without ``vllm_backend`` gets mp, and ``check`` says it chose mp and why.
The session's ``replicas`` broker hands the hosts over with no replica serving (held
exclusively, for the check as for the ``up``); the module takes its replicas down at the end
and tells the broker so.

Cost: about 28 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lab_support
import pytest
import yaml

pytestmark = pytest.mark.lab

GPUS_PER_NODE = 4  # the stand-in's default (lab/vllm_provision_lab/gpu/spec.py)


def provision(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with the module's controller state folder ``state``."""
    return lab_support.provision(*args, state_home=state, timeout=400)


@pytest.fixture(scope="module")
def workdir(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two inventories, made from the lab's mp inventory (its hosts, key, known_hosts)."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    folder = tmp_path_factory.mktemp("replicas")
    source = yaml.safe_load(lab.inventory_path("mp").read_text())
    lab_group = source["all"]["children"]["vllm_replicas"]["children"]["lab"]

    def single(host: str, tp: int) -> dict[str, Any]:
        group_vars = {k: lab_group["vars"][k]
                      for k in ("vllm_backend", "vllm_model", "vllm_cluster_interface")}
        group_vars.update(vllm_tensor_parallel_size=tp, vllm_pipeline_parallel_size=1)
        return {"vars": group_vars,
                "hosts": {host: {"ansible_host": lab_group["hosts"][host]["ansible_host"]}}}

    two = {"all": {"vars": source["all"]["vars"], "children": {"vllm_replicas": {"children": {
        "good": single("h1", GPUS_PER_NODE), "bad": single("h2", 2 * GPUS_PER_NODE)}}}}}
    no_backend = copy.deepcopy(source)
    del no_backend["all"]["children"]["vllm_replicas"]["children"]["lab"]["vars"]["vllm_backend"]
    paths = {"two": folder / "two-replicas.yml", "no_backend": folder / "no-backend.yml",
             "state": folder / "state"}
    paths["two"].write_text(yaml.safe_dump(two, sort_keys=False))
    paths["no_backend"].write_text(yaml.safe_dump(no_backend, sort_keys=False))
    return paths


def test_check_chooses_mp_for_a_two_node_replica_without_vllm_backend(workdir, replicas):
    # Held with no replica serving (the ports are free); the hosts may still be owned by the
    # lab's own inventory (a replica the broker took down), which is not this inventory, so the
    # ownership check is skipped: the backend choice is what is checked here.
    with replicas.exclusive("mp", start="stopped") as lease:
        human = provision(workdir["state"], "check", "-i", str(workdir["no_backend"]),
                          "--quiet-ok", "--timeout", "10", "--skip-check", "ownership")
        result = provision(workdir["state"], "check", "-i", str(workdir["no_backend"]), "--json",
                           "--skip-check", "ownership")
        lease.leave(lease.handed)  # check changes nothing on the hosts
    assert human.returncode == 0, human.stdout + human.stderr
    assert ("replica lab: backend mp (chosen: vllm_backend is not set, so vLLM's own default "
            "applies (ParallelConfig.__post_init__, vllm/config/parallel.py): mp when nnodes > 1 "
            "on CUDA; this replica has 2 nodes)") in " ".join(human.stdout.split())
    [replica] = json.loads(result.stdout)["replicas"]
    assert (replica["name"], replica["backend"], replica["backend_source"]) == (
        "lab", "mp", "default")
    assert "nnodes > 1" in replica["backend_reason"]


@pytest.fixture(scope="module")
def up_two(workdir, replicas) -> Iterator[tuple[int, dict[str, Any]]]:
    """One `provision up --json` of both replicas; both taken down after the module."""
    with replicas.exclusive("mp", start="stopped") as lease:
        result = provision(workdir["state"], "up", "-i", str(workdir["two"]), "--json")
        try:
            assert result.stdout.strip(), result.stderr
            yield result.returncode, json.loads(result.stdout)
        finally:
            down = provision(workdir["state"], "down", "-i", str(workdir["two"]))
            assert down.returncode == 0, down.stdout + down.stderr
            lease.leave("down")


def test_the_invalid_replica_fails_alone_and_the_exit_code_is_1(up_two):
    code, summary = up_two
    assert code == 1
    results = {r["name"]: r for r in summary["replicas"]}
    assert set(results) == {"good", "bad"}
    bad = results["bad"]
    assert (bad["served"], bad["failed"], bad["hosts"]) == (False, True, ["h2"])
    [finding] = bad["failed_findings"]
    assert (finding["check"], finding["host"], finding["replica"]) == (
        "topology.gpus", "h2", "bad")
    assert finding["actual"] == str(GPUS_PER_NODE)
    assert {f["host"] for f in bad["failures"]} == {"h2"}
    assert summary["failed"] == 1  # the top-level count the other lab tests read


def test_the_valid_replica_serves(up_two, lab, lab_host):
    _, summary = up_two
    good = next(r for r in summary["replicas"] if r["name"] == "good")
    assert (good["served"], good["failed"], good["failed_findings"]) == (True, False, [])
    assert good["completion"] and isinstance(good["start_to_serving_s"], float)
    assert summary["completion"] == good["completion"]  # top-level keys kept
    assert summary["start_to_serving_s"] == good["start_to_serving_s"]
    assert lab_support.complete(f"http://{lab.config.address('h1')}:8000", good["served_model"])
    assert lab_host("h1").service("vllm.service").is_running
    assert not lab_host("h2").service("vllm.service").is_running  # preflight changed nothing
