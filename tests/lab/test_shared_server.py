"""Two replicas on the same two servers (``vllm_instance``, docs/inventory.md "Shared servers").

The broker hands the lab's hosts over with no replica serving (held exclusively). The module's
inventory declares two mp replicas of TP=2 x PP=2 on the stand-in's 4-GPU hosts h1 and h2, each
host entered twice (``a1``/``a2`` and ``b1``/``b2``, one ``ansible_host`` per server): replica
``a`` with ``vllm_instance: a`` on GPUs 0 and 1, replica ``b`` with ``vllm_instance: b`` on GPUs
2 and 3, each with its own API, master and watchdog ports. As an operator would:

- ``provision up`` serves both, ``status`` finds both serving with whole watchdogs and
  ``drift`` finds nothing; on each server, read over the lab's SSH with pytest-testinfra:
  ``vllm-a.service`` and ``vllm-b.service`` run, each env file names its own GPUs, nvidia-smi
  lists each replica's processes on its own GPUs only, and each replica has its own state
  record under ``/var/lib/vllm-provision/instances/``; a second ``up`` changes nothing;
- ``kill -9`` of replica ``a``'s vLLM on h2 heals ``a`` (its watchdogs restart its group) while
  ``b`` keeps serving: a completion from ``b`` every half second meanwhile, and ``b``'s units
  keep the InvocationIDs they had;
- ``provision down --purge --limit a`` removes replica ``a``'s units and files while ``b``
  serves on; a second purge removes ``b``'s; the lab's own replica keeps its state record.

Cost: about 66 s on one lab instance alone (measured 2026-12-05: 66 s; both replicas' up with
status, drift and the second up 19 s, the heal 28 s, the two purges 16 s, plus the broker's
naming of what the hosts hold); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lab_support
import pytest
import yaml

pytestmark = pytest.mark.lab

SERVERS = ("h1", "h2")
REPLICAS = {  # name -> (GPUs, API port, master port, watchdog port)
    "a": ([0, 1], 8000, 29501, 29510),
    "b": ([2, 3], 8001, 29601, 29611),
}
HEAL_BOUND_S = 120
MODEL = "shared-lab"


def provision(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with the module's controller state folder ``state``."""
    return lab_support.provision(*args, state_home=state, timeout=300)


@pytest.fixture(scope="module")
def shared(lab: Any, replicas: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The module's inventory and state folder, with the lab's hosts held and no replica
    serving; both replicas taken down at the end."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    folder = tmp_path_factory.mktemp("shared")
    source = yaml.safe_load(lab.inventory_path("mp").read_text())
    lab_group = source["all"]["children"]["vllm_replicas"]["children"]["lab"]
    children = {}
    for name, (gpus, api, master, watchdog) in REPLICAS.items():
        group_vars = {k: lab_group["vars"][k]
                      for k in ("vllm_backend", "vllm_model", "vllm_cluster_interface")}
        group_vars.update(vllm_tensor_parallel_size=2, vllm_pipeline_parallel_size=2,
                          vllm_instance=name, vllm_gpus=gpus, vllm_api_port=api,
                          vllm_master_port=master, vllm_watchdog_port=watchdog,
                          vllm_served_model_name=f"{MODEL}-{name}")
        children[name] = {"vars": group_vars, "hosts": {
            f"{name}{rank + 1}": {"ansible_host": lab_group["hosts"][server]["ansible_host"],
                                  "vllm_node_rank": rank}
            for rank, server in enumerate(SERVERS)}}
    path = folder / "shared.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": source["all"]["vars"], "children": {
        "vllm_replicas": {"children": children}}}}, sort_keys=False))
    with lab_support.own_inventory(replicas, path, folder / "state", lab=lab) as info:
        yield info


def api(lab: Any, name: str) -> str:
    """Replica ``name``'s API on rank 0's server (h1)."""
    return f"http://{lab.config.address('h1')}:{REPLICAS[name][1]}"


def serves(lab: Any, name: str) -> bool:
    """One completion from replica ``name``."""
    return lab_support.complete(api(lab, name), f"{MODEL}-{name}", timeout_s=5)


def unit_view(lab: Any, server: str, unit: str) -> tuple[str, str]:
    """``(SubState, InvocationID)`` of ``unit`` on ``server``."""
    done = lab.ssh(server, f"systemctl show -p SubState,InvocationID {unit}", timeout_s=30)
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return values.get("SubState", ""), values.get("InvocationID", "")


def processes_by_gpu(host: Any) -> dict[int, int]:
    """GPU index -> how many processes nvidia-smi lists on it, read on ``host`` (testinfra)."""
    indexes = dict(reversed(line.split(", ")) for line in host.check_output(
        "nvidia-smi --query-gpu=index,uuid --format=csv,noheader").splitlines())
    found: dict[int, int] = {}
    for line in host.check_output("nvidia-smi --query-compute-apps=pid,gpu_uuid "
                                  "--format=csv,noheader").splitlines():
        uuid = line.split(",")[1].strip()
        found[int(indexes[uuid])] = found.get(int(indexes[uuid]), 0) + 1
    return found


def test_two_replicas_serve_from_the_same_two_servers(shared: dict[str, Any],
                                                      lab_host: Any) -> None:
    up = provision(shared["state"], "up", "-i", shared["path"])
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    assert serves(shared["lab"], "a") and serves(shared["lab"], "b")
    for server in SERVERS:
        host = lab_host(server)
        assert sorted(processes_by_gpu(host)) == [0, 1, 2, 3], server
        for name, (gpus, *_ports) in REPLICAS.items():
            assert host.service(f"vllm-{name}.service").is_running, (server, name)
            assert host.service(f"vllm-watchdog-{name}.service").is_running, (server, name)
            env = host.file(f"/etc/vllm-provision/{name}/vllm.env").content_string
            visible = ",".join(map(str, gpus))
            assert f'CUDA_VISIBLE_DEVICES="{visible}"' in env.splitlines(), env
            record = host.file(f"/var/lib/vllm-provision/instances/{name}/state.json")
            assert record.exists and record.mode == 0o600, (server, name)
        # the default record belongs to whichever replica without an instance last ran here
        # (the lab's own, another module's): never to a or b
        default = host.file("/var/lib/vllm-provision/state.json")
        owners = ({entry.get("replica") for entry in
                   json.loads(default.content_string).get("hosts", {}).values()}
                  if default.exists else set())
        assert not owners & set(REPLICAS), (server, owners)
        assert not host.service("vllm.service").is_running, server
    status = provision(shared["state"], "status", "-i", shared["path"], "--json")
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    seen = {r["replica"]: r for r in json.loads(status.stdout)["replicas"]}
    assert {name: r["verdict"] for name, r in seen.items()} == {"a": "serving", "b": "serving"}
    assert all(r["whole"] for r in seen.values()), {n: r["watchdogs"] for n, r in seen.items()}
    drift = provision(shared["state"], "drift", "-i", shared["path"])
    assert drift.returncode == 0, drift.stdout[-2000:] + drift.stderr[-2000:]
    before = {(server, name): unit_view(shared["lab"], server, f"vllm-{name}.service")
              for server in SERVERS for name in REPLICAS}
    again = provision(shared["state"], "up", "-i", shared["path"], "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["changed"] == 0 and summary["failed"] == 0, summary["changed"]
    assert {(server, name): unit_view(shared["lab"], server, f"vllm-{name}.service")
            for server in SERVERS for name in REPLICAS} == before


def test_kill_9_heals_one_replica_while_the_other_keeps_serving(shared: dict[str, Any]) -> None:
    lab = shared["lab"]
    assert serves(lab, "a") and serves(lab, "b"), "both must serve before the fault"
    b_before = {server: unit_view(lab, server, "vllm-b.service")[1] for server in SERVERS}
    a_before = unit_view(lab, "h1", "vllm-a.service")[1]
    misses: list[float] = []
    stop = threading.Event()

    def ask_b() -> None:
        while not stop.is_set():
            if not serves(lab, "b"):
                misses.append(time.monotonic())
            time.sleep(0.5)

    asker = threading.Thread(target=ask_b, daemon=True)
    asker.start()
    try:
        killed = lab.ssh("h2", "kill -9 $(systemctl show -p MainPID --value vllm-a.service)",
                         timeout_s=30)
        assert killed.returncode == 0, killed.stderr
        started, healed = time.monotonic(), None
        while time.monotonic() - started < HEAL_BOUND_S:
            state, invocation = unit_view(lab, "h1", "vllm-a.service")
            if state == "running" and invocation not in ("", a_before) and serves(lab, "a"):
                healed = round(time.monotonic() - started, 1)
                break
            time.sleep(1)
    finally:
        stop.set()
        asker.join(timeout=30)
    print(f"\nshared servers: kill -9 of a's vLLM on h2 healed a in {healed} s; "
          f"b missed {len(misses)} completions meanwhile")
    assert healed is not None, f"replica a did not serve again within {HEAL_BOUND_S} s"
    assert misses == [], f"replica b missed {len(misses)} completions during a's heal"
    assert {server: unit_view(lab, server, "vllm-b.service")[1]
            for server in SERVERS} == b_before


def test_purging_one_replica_leaves_the_other_serving(shared: dict[str, Any],
                                                      lab_host: Any) -> None:
    lab = shared["lab"]
    lab_record = {server: lab_host(server).file("/var/lib/vllm-provision/state.json").exists
                  for server in SERVERS}
    purge_a = provision(shared["state"], "down", "--purge", "-i", shared["path"], "--limit", "a")
    assert purge_a.returncode == 0, purge_a.stdout[-2000:] + purge_a.stderr[-2000:]
    assert serves(lab, "b"), "purging replica a stopped replica b"
    for server in SERVERS:
        host = lab_host(server)
        assert sorted(processes_by_gpu(host)) == [2, 3], server
        assert not host.file("/etc/systemd/system/vllm-a.service").exists, server
        assert not host.file("/etc/vllm-provision/a/vllm.env").exists, server
        assert host.file("/etc/vllm-provision/b/vllm.env").exists, server
        assert host.service("vllm-b.service").is_running, server
    purge_b = provision(shared["state"], "down", "--purge", "-i", shared["path"])
    shared["down"] = purge_b.returncode == 0
    assert purge_b.returncode == 0, purge_b.stdout[-2000:] + purge_b.stderr[-2000:]
    for server in SERVERS:
        host = lab_host(server)
        assert processes_by_gpu(host) == {}, server
        for name in REPLICAS:
            assert not host.file(f"/etc/systemd/system/vllm-{name}.service").exists
            assert not host.file(f"/etc/systemd/system/vllm-watchdog-{name}.service").exists
        # the lab's own replica, stopped by the broker, keeps its record
        assert host.file("/var/lib/vllm-provision/state.json").exists == lab_record[server]
