"""Data-parallel replicas across two nodes, in both layouts (docs/serving.md, "Data parallel").

The broker hands the lab's hosts over with no replica serving (held exclusively). The module's
inventory has one mp replica ``dp`` on h1 (rank 0) and h2, TP=2, ``vllm_data_parallel_size: 4``
with 2 engines on each node (the stand-in's 4 GPUs each), laid out ``internal`` (one API server
on h1, h2 ``--headless``) and then ``hybrid`` (an API server on each node, both workers of a
front door on h1). For each layout, as an operator would:

- ``provision up`` serves it; each node's unit runs vLLM's data-parallel options with its own
  start rank and rank 0's address and RPC port (read with ``systemctl cat`` over the lab's
  SSH, testinfra), every API server of the layout completes a request, and ``status`` says
  it serves (with ``hybrid``, from every node's API server);
- ``provision fault --kill h2`` (kill -9 of the other node's vLLM) under a steady load: the
  replica serves again (systemd restarts h2, the peer watchdogs restart the rest);
- ``provision down`` takes it down whole: on both nodes the unit is stopped and disabled, no
  vLLM process is left (a headless node's worker outlives its main process) and nothing
  listens on the API or RPC port.

Cost: about 85 s on one lab instance alone (measured 2026-12-04: 83 s; internal: up 12 s,
fault 27 s, as the headless node's worker outlives SIGTERM for TimeoutStopSec, down 7 s;
hybrid: up with the router's venv 20 s, fault 12 s, down 3 s); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lab_support
import pytest
import yaml

from vllm_provision.cli import json_schemas

pytestmark = pytest.mark.lab

MODEL = "/srv/models/lab-model"
RPC_PORT = 29550  # vLLM's default --data-parallel-rpc-port, the variable's default


def provision(state: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with the module's controller state folder ``state``."""
    return lab_support.provision(*args, state_home=state, timeout=timeout)


@pytest.fixture(scope="module", params=["internal", "hybrid"])
def deployed(request: pytest.FixtureRequest, lab: Any, replicas: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One data-parallel replica in the layout ``request.param``, served by ``provision up``;
    taken down by the last test of the layout (``test_down_removes_it_whole``)."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    layout = request.param
    folder = tmp_path_factory.mktemp(f"dp-{layout}")
    source = yaml.safe_load(lab.inventory_path("mp").read_text())
    lab_group = source["all"]["children"]["vllm_replicas"]["children"]["lab"]
    group_vars = {k: lab_group["vars"][k]
                  for k in ("vllm_backend", "vllm_model", "vllm_cluster_interface")}
    group_vars.update(vllm_tensor_parallel_size=2, vllm_pipeline_parallel_size=1,
                      vllm_data_parallel_size=4, vllm_data_parallel_size_local=2,
                      vllm_data_parallel_layout=layout)
    hosts = {name: {"ansible_host": lab_group["hosts"][name]["ansible_host"],
                    "vllm_node_rank": rank} for rank, name in enumerate(("h1", "h2"))}
    children: dict[str, Any] = {"vllm_replicas": {"children": {"dp": {
        "vars": group_vars, "hosts": hosts}}}}
    if layout == "hybrid":
        from vllm_provision_lab import router_wheels

        children["vllm_gateways"] = {
            "vars": {"vllm_gateway_wheelhouse": str(router_wheels.wheelhouse(fetch=True))},
            "hosts": {"h1": {}}}
    path = folder / "dp.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": source["all"]["vars"],
                                            "children": children}}, sort_keys=False))
    state = folder / "state"
    with replicas.exclusive("mp", start="stopped") as lease:
        up = provision(state, "up", "-i", str(path), "--json")
        info = {"layout": layout, "inventory": str(path), "state": state, "lab": lab,
                "up": up, "down": None}
        try:
            assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
            yield info
        finally:
            if info["down"] is None:
                provision(state, "down", "-i", str(path))
            lease.leave("down")


def test_each_node_runs_its_engines_and_every_api_server_serves(deployed: dict[str, Any],
                                                                 lab_host: Any) -> None:
    lab = deployed["lab"]
    master = lab.config.address("h1")
    summary = json.loads(deployed["up"].stdout)
    assert [(r["name"], r["served"]) for r in summary["replicas"]] == [("dp", True)]
    for rank, name in enumerate(("h1", "h2")):
        unit = lab_host(name).check_output("systemctl cat vllm.service")
        words = [line for line in unit.splitlines() if line.startswith("ExecStart=")][0].split()
        flags = dict(zip(words, words[1:], strict=False))
        assert (flags["--data-parallel-size"], flags["--data-parallel-size-local"],
                flags["--data-parallel-start-rank"], flags["--data-parallel-address"],
                flags["--data-parallel-rpc-port"]) == ("4", "2", str(2 * rank), master,
                                                       str(RPC_PORT)), unit
        assert "--nnodes" not in words
        hybrid = deployed["layout"] == "hybrid"
        assert ("--data-parallel-hybrid-lb" in words) is hybrid
        assert ("--headless" in words) is (rank == 1 and not hybrid)
    servers = ["h1", "h2"] if deployed["layout"] == "hybrid" else ["h1"]
    for name in servers:
        assert lab_support.complete(f"http://{lab.config.address(name)}:8000", MODEL), name
    status = provision(deployed["state"], "status", "-i", deployed["inventory"], "--json")
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    [seen] = json.loads(status.stdout)["replicas"]
    assert seen["verdict"] == "serving", seen
    if deployed["layout"] == "hybrid":  # both API servers are workers of the front door
        assert seen["api_servers"] == {"h1": 200, "h2": 200}, seen
        with httpx.Client(timeout=10) as client:
            workers = client.get(f"http://{master}:30000/workers").json()["workers"]
        assert sorted(w["url"] for w in workers) == [
            f"http://{lab.config.address(name)}:8000" for name in ("h1", "h2")]
    else:
        assert "api_servers" not in seen


def test_a_killed_data_parallel_node_heals(deployed: dict[str, Any]) -> None:
    done = provision(deployed["state"], "fault", "-i", deployed["inventory"], "--replica", "dp",
                     "--kill", "h2", "--streams", "2", "--max-tokens", "32", "--bound", "120",
                     "--json", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    json_schemas.validate("fault", result)
    assert result["recovery"]["recovered_s"] is not None, result["recovery"]
    lab = deployed["lab"]
    servers = ["h1", "h2"] if deployed["layout"] == "hybrid" else ["h1"]
    for name in servers:  # every API server serves again (h2's own after its restart)
        url = f"http://{lab.config.address(name)}:8000"
        deadline = time.monotonic() + 60
        while not lab_support.complete(url, MODEL) and time.monotonic() < deadline:
            time.sleep(1)
        assert lab_support.complete(url, MODEL), name


def test_down_removes_it_whole(deployed: dict[str, Any], lab_host: Any) -> None:
    done = provision(deployed["state"], "down", "-i", deployed["inventory"])
    deployed["down"] = done
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for name in ("h1", "h2"):
        host = lab_host(name)
        service = host.service("vllm.service")
        assert not service.is_running and not service.is_enabled, name
        # no engine left behind (a headless node's worker outlives its main process)
        assert host.run("pgrep -f 'vllm serve'").rc == 1, name
        for port in (8000, RPC_PORT):
            assert not host.socket(f"tcp://0.0.0.0:{port}").is_listening, (name, port)
