"""A fleet of two replicas behind one front door, measured through it (docs/front-door.md,
docs/evidence.md "Through a front door").

The broker hands the lab's hosts over with no replica serving (held exclusively). The module's
inventory has two single-node mp replicas, ``a`` on h1 and ``b`` on h2 (TP=4, the stand-in's 4
GPUs each), and the front door on h3, a third lab host of no replica (``vllm_gateways``, the
lab's download of vllm-router 0.1.17 as its wheelhouse; h3 is booted here and removed at the
end). Then, as an operator would:

- ``provision up`` serves both replicas and the front door, whose router lists both healthy;
- ``provision bench --front-door h3`` sends the same seeded requests direct and through the
  front door: every request completes both ways, and the latency the front door adds is
  reported (its bound, 2 ms on TTFT p50, is a goal of bench/README.md, not asserted here);
- ``provision fault --replica a --kill h1 --front-door h3``: while ``a``'s rank 0 is killed and
  restarted by systemd, a steady load goes through the front door; the router stops choosing
  ``a``, calls it healthy again and really sends it requests again once it serves (the times
  are reported; their goals, 5 s each, are bench/README.md's), and a client of the front door
  loses only streams that were in flight on ``a`` (``incomplete``), never a request the router
  could have sent elsewhere (no 500 after retries on a dead replica);
- ``provision upgrade --serial 1`` with an engine argument changed on both replicas, under a
  steady load through the front door: each replica is removed from the router before it
  restarts and added back once it serves, and no request through the front door fails;
- ``provision down`` takes the fleet and the front door down, and the broker is told.

Cost: about 65 s on one lab instance alone (measured 2026-12-04: 65 s; h3's boot, up of both
replicas and the router's venv 21 s, bench 2 x 20 requests 8 s, fault 13 s, the upgrade 19 s,
down and h3's removal 3 s); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lab_support
import pytest
import yaml

from vllm_provision.cli import json_schemas

pytestmark = pytest.mark.lab

GPUS_PER_NODE = 4  # the stand-in's default (lab/vllm_provision_lab/gpu/spec.py)


def provision(state: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with the module's controller state folder ``state``."""
    return lab_support.provision(*args, state_home=state, timeout=timeout)


@pytest.fixture(scope="module")
def fleet(lab: Any, replicas: Any, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict[str, Any]]:
    """The fleet's inventory, served by one ``provision up``; taken down after the module."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    from vllm_provision_lab import router_wheels

    wheels = router_wheels.wheelhouse(fetch=True)
    folder = tmp_path_factory.mktemp("fleet")
    source = yaml.safe_load(lab.inventory_path("mp").read_text())
    lab_group = source["all"]["children"]["vllm_replicas"]["children"]["lab"]

    def single(host: str) -> dict[str, Any]:
        group_vars = {k: lab_group["vars"][k]
                      for k in ("vllm_backend", "vllm_model", "vllm_cluster_interface")}
        group_vars.update(vllm_tensor_parallel_size=GPUS_PER_NODE,
                          vllm_pipeline_parallel_size=1)
        return {"vars": group_vars,
                "hosts": {host: {"ansible_host": lab_group["hosts"][host]["ansible_host"]}}}

    inventory = {"all": {"vars": source["all"]["vars"], "children": {
        "vllm_replicas": {"children": {"a": single("h1"), "b": single("h2")}},
        "vllm_gateways": {"vars": {"vllm_gateway_wheelhouse": str(wheels)},
                          "hosts": {"h3": {"ansible_host": lab.config.address("h3")}}}}}}
    path = folder / "fleet.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    state = folder / "state"
    added = [] if "h3" in {h.name for h in lab.hosts} else ["h3"]
    lab.add_hosts(added)
    with replicas.exclusive("mp", start="stopped") as lease:
        up = provision(state, "up", "-i", str(path), "--json")
        try:
            assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
            yield {"inventory": str(path), "state": state, "lab": lab,
                   "up": json.loads(up.stdout)}
        finally:
            down = provision(state, "down", "-i", str(path))
            lease.leave("down")
            lab.remove_hosts(added)
            assert down.returncode == 0, down.stdout + down.stderr


def test_both_replicas_serve_behind_the_front_door(fleet: dict[str, Any]) -> None:
    served = {r["name"]: r["served"] for r in fleet["up"]["replicas"]}
    assert served == {"a": True, "b": True}
    address = fleet["lab"].config.address("h1")
    door = fleet["lab"].config.address("h3")
    with httpx.Client(timeout=10) as client:
        workers = client.get(f"http://{door}:30000/workers").json()["workers"]
    assert sorted((w["url"], w["is_healthy"]) for w in workers) == [
        (f"http://{address}:8000", True),
        (f"http://{fleet['lab'].config.address('h2')}:8000", True)]


def test_bench_through_the_front_door_completes_every_request_and_says_what_it_adds(
        fleet: dict[str, Any]) -> None:
    done = provision(fleet["state"], "bench", "-i", fleet["inventory"], "--replica", "a",
                     "--requests", "20", "--concurrency", "1", "--max-tokens", "8",
                     "--front-door", "h3", "--json", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    json_schemas.validate("bench", result)
    door = result["front_door"]
    assert (door["host"], door["failed"], door["client"]["completed"]) == ("h3", 0, 20)
    assert door["url"] == f"http://{fleet['lab'].config.address('h3')}:30000"
    assert all(isinstance(v, float) for v in door["added"].values()), door["added"]


def test_a_killed_replica_is_routed_around_and_taken_back(fleet: dict[str, Any]) -> None:
    done = provision(fleet["state"], "fault", "-i", fleet["inventory"], "--replica", "a",
                     "--kill", "h1", "--front-door", "h3", "--streams", "2",
                     "--max-tokens", "64", "--bound", "120", "--json", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    json_schemas.validate("fault", result)
    assert result["recovery"]["recovered_s"] is not None
    seen = result["front_door"]
    assert seen["requests"] >= 20, seen
    # a stream in flight on `a` when it died is lost; nothing the router could resend is
    assert set(seen["failures"]) <= {"incomplete", "peer_closed", "read_error"}, seen
    assert seen["failed"] <= 2, seen  # the load's 2 lanes: at most one stream each on `a`
    assert seen["marked_down_s"] is not None and seen["marked_down_s"] > 0, seen
    assert seen["marked_up_s"] is not None and seen["sent_again_s"] is not None, seen


def test_a_rolling_upgrade_behind_the_front_door_loses_no_request(fleet: dict[str, Any]) -> None:
    """``upgrade --serial 1`` under a steady load through the front door: each replica is
    removed from the router before it restarts and added back once it serves, so every
    request through the front door completes (docs/upgrade.md, "The front door")."""
    from vllm_provision.evidence.front_door import FrontDoorWatch

    lab = fleet["lab"]
    address = lab.config.address("h1")
    watch = FrontDoorWatch("h3", f"http://{lab.config.address('h3')}:30000",
                           f"http://{address}:8000",
                           "/srv/models/lab-model", read_timeout_s=30)
    # an engine argument changed on both replicas: each one restarts in its turn
    path = Path(fleet["inventory"])
    data = yaml.safe_load(path.read_text())
    for replica in data["all"]["children"]["vllm_replicas"]["children"].values():
        replica["vars"]["vllm_extra_args"] = ["--max-num-seqs", "64"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    watch.start()
    try:
        done = provision(fleet["state"], "upgrade", "-i", fleet["inventory"], "--serial", "1",
                         "--yes", "--json", "--drain-timeout", "10", timeout=600)
    finally:
        watch.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout)
    json_schemas.validate("upgrade", summary)
    steps = {entry["name"]: [(s["gateway"], s["phase"], s["action"]) for s in
                             entry["front_door"]] for entry in summary["replicas"]}
    assert steps == {name: [("h3", "drain", "removed"), ("h3", "undrain", "added")]
                     for name in ("a", "b")}, steps
    assert all(entry["outcome"] == "upgraded" and entry["restarted"] for entry in
               summary["replicas"]), summary["replicas"]
    seen = watch.result(0.0, None)
    assert seen["requests"] >= 20 and seen["failed"] == 0, seen
    for name, master in (("a", "h1"), ("b", "h2")):  # both run the new argument now
        unit = lab.ssh(master, "systemctl cat vllm.service").stdout
        assert "--max-num-seqs" in unit, (name, unit[-500:])
