"""Replicas of three nodes: TP=4 inside each node, PP=3 across h1, h2 and h3 (stand-in GPUs).

First, without deploying: the lab's hosts pretend to have 8, 8 and 7 GPUs (``provision lab
set``), and ``provision check`` of a TP=8, PP=3 replica (24 ranks on 23 GPUs) is refused at once
for both backends, the shortfall named. Then, per backend (mp, then Ray): ``up`` of the
three-node replica serves (it takes h1 and h2 over from the lab's own replica with
``--take-over``); ``kill -9`` of the middle rank's unit (h2: the headless vLLM, or the Ray worker)
heals with no operator action: rank 0 restarts as a new group and serves again, every unit on the
three hosts running; ``down --purge`` leaves the hosts free. The module adds h3 to the running
lab when it lacks it and removes it at the end.

Cost: about 322 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lab_support
import pytest
import yaml

pytestmark = pytest.mark.lab

NODES = ("h1", "h2", "h3")
MODEL = "/srv/models/lab-model"
HEAL_BOUND_S = 180  # a generous bound (stand-in load 5 s), not a timing goal
UNITS = {"mp": {"h1": ["vllm.service", "vllm-watchdog.service"],
                "h2": ["vllm.service", "vllm-watchdog.service"],
                "h3": ["vllm.service", "vllm-watchdog.service"]},
         "ray": {"h1": ["ray-head.service", "vllm.service", "vllm-watchdog.service"],
                 "h2": ["ray-worker.service", "vllm-watchdog.service"],
                 "h3": ["ray-worker.service", "vllm-watchdog.service"]}}
MIDDLE_UNIT = {"mp": "vllm.service", "ray": "ray-worker.service"}


@pytest.fixture(scope="module")
def third_host(lab: Any) -> Iterator[None]:
    """h3 in the lab (booted here when the lab has two hosts, removed at the end)."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    added = [] if "h3" in {h.name for h in lab.hosts} else ["h3"]
    lab.add_hosts(added)
    try:
        yield
    finally:
        lab.remove_hosts(added)


def three_node_inventory(lab: Any, kind: str, folder: Path, tp: int = 4) -> Path:
    """The lab's ``kind`` inventory with h3 added as rank 2, PP=3 and TP=``tp``."""
    data = yaml.safe_load(lab.inventory_path(kind).read_text())
    group = data["all"]["children"]["vllm_replicas"]["children"]["lab"]
    group["hosts"]["h3"] = {"ansible_host": lab.config.address("h3"), "vllm_node_rank": 2}
    group["vars"] |= {"vllm_pipeline_parallel_size": 3, "vllm_tensor_parallel_size": tp}
    path = folder / f"three-{kind}-tp{tp}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("kind", ["ray", "mp"])
def test_check_refuses_24_ranks_on_8_8_7_gpus_naming_the_shortfall(
        lab: Any, third_host: None, kind: str, tmp_path: Path) -> None:
    """One GPU off the bus on h3: the sum says no (23 GPUs for 24 ranks), and says it at once
    (the pytest time limit of the call, 120 s, would end a search that backtracks)."""
    inventory = three_node_inventory(lab, kind, tmp_path, tp=8)
    sets = []
    try:
        for host, gpus in (("h1", 8), ("h2", 8), ("h3", 7)):
            done = lab_support.provision("lab", "set", host, f"gpus={gpus}")
            assert done.returncode == 0, done.stderr
            sets.append(host)
        result = lab_support.provision("check", "-i", str(inventory), "--json", timeout=120)
    finally:
        for host in sets:
            lab_support.provision("lab", "set", host, "gpus=default")
    assert result.returncode != 0, result.stdout[-2000:]
    refused = [f for f in json.loads(result.stdout)["findings"] if f["severity"] == "error"]
    assert refused, result.stdout[-2000:]
    if kind == "mp":
        # each mp node runs TP x PP / nodes ranks: h3 lacks one
        assert any(f["check"] == "topology.gpus" and f["host"] == "h3"
                   and f["actual"].startswith("7") for f in refused), refused
    else:
        # Ray places 24 one-GPU bundles anywhere: the sum is short, and the finding says so
        placement = [f for f in refused if f["check"].startswith("placement")]
        text = " ".join(f"{f['expected']} {f['actual']} {f['fix']}" for f in placement)
        assert "23" in text and "24" in text, refused


class Deployed:
    """A three-node replica deployed by this module: its inventory and the calls on it."""

    def __init__(self, lab: Any, kind: str, inventory: Path, state: Path) -> None:
        self.lab, self.kind, self.inventory, self.state = lab, kind, inventory, state
        self.base_url = f"http://{lab.config.address('h1')}:8000"

    def provision(self, *args: str, timeout: float = 900) -> Any:
        return lab_support.provision(*args, "-i", str(self.inventory), state_home=self.state,
                                     timeout=timeout)

    def invocation(self) -> str:
        """rank 0's vLLM InvocationID ("" while it is not running)."""
        done = self.lab.ssh("h1", "systemctl show -p InvocationID,SubState vllm.service",
                            timeout_s=10)
        values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        return values.get("InvocationID", "") if values.get("SubState") == "running" else ""

    def serves(self) -> bool:
        return lab_support.complete(self.base_url, MODEL)

    def diagnosis(self) -> str:
        """What an operator reads when it did not heal: ``provision status``, each host's unit
        states, and the last lines of rank 0's vLLM and of each watchdog's journal."""
        status = self.provision("status", timeout=120)
        parts = [f"provision status (exit {status.returncode}):\n{status.stdout[-3000:]}",
                 f"units: {self.unit_states()}"]
        for host in NODES:
            units = ["vllm-watchdog.service"] + (["vllm.service"] if host == "h1" else [])
            journal = self.lab.ssh(host, "journalctl --no-pager -n 25 -o short-monotonic "
                                   + " ".join(f"-u {unit}" for unit in units), timeout_s=30)
            parts.append(f"{host} journal ({', '.join(units)}):\n{journal.stdout[-4000:]}")
        return "\n".join(parts)

    def unit_states(self) -> dict[tuple[str, str], str]:
        states = {}
        for host, units in UNITS[self.kind].items():
            done = self.lab.ssh(host, "systemctl show -p SubState --value " + " ".join(units),
                                timeout_s=30)
            for unit, state in zip(units, done.stdout.split(), strict=False):
                states[(host, unit)] = state
        return states


@pytest.fixture(scope="module", params=["mp", "ray"])
def deployed(request: pytest.FixtureRequest, lab: Any, third_host: None,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """The ``kind`` replica on h1-h3, serving; purged at the end (the hosts are free again)."""
    kind = str(request.param)
    folder = tmp_path_factory.mktemp(f"three-{kind}")
    replica = Deployed(lab, kind, three_node_inventory(lab, kind, folder), folder / "state")
    up = replica.provision("up", "--take-over")
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield replica
    finally:
        down = replica.provision("down", "--purge", "--yes")
        assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]


def test_three_node_replica_serves_on_every_node(deployed: Deployed) -> None:
    assert deployed.serves()
    status = deployed.provision("status", "--json")
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    assert all(state == "running" for state in deployed.unit_states().values()), \
        deployed.unit_states()
    # rank 0's vLLM runs the three stages; with mp, each node's unit carries its own rank
    rank0 = deployed.lab.ssh("h1", "systemctl cat vllm.service", timeout_s=30).stdout
    assert "--pipeline-parallel-size 3" in rank0, rank0
    if deployed.kind == "mp":
        for rank, host in enumerate(NODES):
            unit = deployed.lab.ssh(host, "systemctl cat vllm.service", timeout_s=30).stdout
            assert "--nnodes 3" in unit and f"--node-rank {rank}" in unit, unit


def test_kill_9_of_the_middle_rank_heals_with_no_operator(deployed: Deployed) -> None:
    assert deployed.serves(), "the replica must serve before the fault"
    before = deployed.invocation()
    unit = MIDDLE_UNIT[deployed.kind]
    killed = deployed.lab.ssh("h2", f"kill -9 $(systemctl show -p MainPID --value {unit})",
                              timeout_s=30)
    assert killed.returncode == 0, killed.stderr
    started = time.monotonic()
    healed = None
    while time.monotonic() - started < HEAL_BOUND_S:
        current = deployed.invocation()  # read first: the old group's last answer does not count
        if current not in ("", before) and deployed.serves():
            healed = round(time.monotonic() - started, 1)
            break
        time.sleep(1)
    print(f"\nthree nodes [{deployed.kind}] kill -9 of h2's {unit}: healed in {healed} s")
    assert healed is not None, \
        f"not serving from a new group within {HEAL_BOUND_S} s\n{deployed.diagnosis()}"
    deadline = time.monotonic() + 60
    while not all(s == "running" for s in deployed.unit_states().values()):
        assert time.monotonic() < deadline, deployed.unit_states()
        time.sleep(1)
