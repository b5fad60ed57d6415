"""The Ray backend healed by what Ray itself knows, on the lab's stand-in (one ``up``, one change).

One Ray replica (head h1 with vLLM, worker h2; TP 4 x PP 2, so vLLM runs on Ray's compiled
graphs) with fast GCS health checks in ``ray_env`` (a silent raylet is DEAD within 3 x (2 + 1) =
9 s instead of Ray's 65 s) and every stand-in step taking ``STAGE_S`` seconds per stage:

* the default compiled-graph timeout is rendered into vLLM's environment and a 2 s stage serves;
* a frozen worker (``systemctl kill -s STOP`` of its Ray unit: the raylet and its workers) is
  declared dead by the GCS; the worker's watchdog restarts its unit, vLLM waits in its
  ``ExecStartPre`` until every node is alive again, and the replica serves with no operator action;
* a partitioned worker host (``lab cut``) rejoins after the heal;
* the start gate's marker (Ray's books stuck) makes vLLM's unit restart the Ray head as root,
  the worker follows the new head, and the replica serves again;
* a changed ``ray_env`` restarts the Ray units, and vLLM on the head starts only after the worker
  rejoined (journal timestamps: the lab's hosts share one kernel clock); the same ``up`` sets a
  compiled-graph timeout below the stage time, and the completion fails with Ray's
  ``RayChannelTimeoutError``.

Times are printed (``pytest -s``) and recorded in docs/recovery.md.

Cost: about 425 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lab_support
import pytest
import yaml

pytestmark = pytest.mark.lab

STAGE_S = 2.0
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                      "RAY_health_check_failure_threshold": "3"}
UNITS = {"h1": ["ray-head.service", "vllm.service", "vllm-watchdog.service"],
         "h2": ["ray-worker.service", "vllm-watchdog.service"]}


@dataclass
class RayReplica:
    """The module's replica: its inventory file and the lab."""

    lab: Any
    inventory: Path
    state_home: Path

    def provision(self, *args: str) -> Any:
        return lab_support.provision(*args, state_home=self.state_home, timeout=900)

    def ssh(self, host: str, command: str, timeout_s: float = 30) -> str:
        result = self.lab.ssh(host, command, timeout_s=timeout_s)
        assert result.returncode == 0, f"{host}: {command}: {result.stderr}"
        return str(result.stdout)

    def show(self, host: str, unit: str, prop: str) -> str:
        return self.ssh(host, f"systemctl show -p {prop} --value {unit}").strip()

    @property
    def base_url(self) -> str:
        return f"http://{self.address('h1')}:8000"

    def address(self, host: str) -> str:
        return str(next(h.address for h in self.lab.hosts if h.name == host))

    def complete(self) -> bool:
        return lab_support.complete(self.base_url, "/srv/models/lab-model", timeout_s=30)

    def head_nodes(self) -> list[dict[str, Any]]:
        """The GCS node table the head's watchdog publishes ([] while unknown)."""
        result = self.lab.ssh("h1", "cat /run/vllm-provision/watchdog.json", timeout_s=10)
        try:
            return list((json.loads(result.stdout).get("ray") or {}).get("nodes") or [])
        except ValueError:
            return []

    def alive_ids(self, host: str) -> set[str]:
        return {n["id"] for n in self.head_nodes() if n["ip"] == self.address(host)
                and n["alive"]}

    def serve_again(self, started: float, bound_s: float, old_worker: str) -> float:
        """Seconds from ``started`` until a completion is served by a worker invocation other
        than ``old_worker`` (asserted within ``bound_s``)."""
        while time.monotonic() - started < bound_s:
            current = self.lab.ssh("h2", "systemctl show -p InvocationID --value "
                                   "ray-worker.service", timeout_s=10).stdout.strip()
            if current not in ("", old_worker) and self.complete():
                return round(time.monotonic() - started, 1)
            time.sleep(0.5)
        raise AssertionError(f"not serving again within {bound_s:g} s: "
                             + self.ssh("h1", "journalctl -u vllm.service -n 15 --no-pager"))

    def journal(self, host: str, unit: str, grep: str) -> list[tuple[float, str]]:
        """(epoch seconds, message) of this boot's journal lines of ``unit`` containing
        ``grep``."""
        out = self.ssh(host, f"journalctl -b -u {unit} -o json --no-pager "
                       "--output-fields=MESSAGE,__REALTIME_TIMESTAMP")
        lines = []
        for line in out.splitlines():
            entry = json.loads(line)
            message = entry.get("MESSAGE")
            if isinstance(message, str) and grep in message:
                lines.append((int(entry["__REALTIME_TIMESTAMP"]) / 1e6, message))
        return lines

    def assert_all_running(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            states = {(h, u): self.show(h, u, "SubState") for h, us in UNITS.items() for u in us}
            results = {(h, u): self.show(h, u, "Result") for h, us in UNITS.items() for u in us}
            assert "start-limit-hit" not in results.values(), results
            if set(states.values()) == {"running"}:
                return
            assert time.monotonic() < deadline, states
            time.sleep(1)


def write_inventory(lab: Any, path: Path, ray_env: dict[str, str]) -> Path:
    """The lab's Ray inventory with this module's group variables."""
    data = yaml.safe_load(lab.inventory_path("ray").read_text())
    group = data["all"]["children"]["vllm_replicas"]["children"]["lab"]
    group["vars"].update({"ray_env": ray_env, "vllm_env": {"VLLM_LAB_STAGE_S": str(STAGE_S)}})
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def replica(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayReplica]:
    if lab.vllm != "standin":
        pytest.skip("the Ray tests run on the stand-in tier (`provision lab up`)")
    folder = tmp_path_factory.mktemp("ray-heal")
    ray = RayReplica(lab, write_inventory(lab, folder / "ray.yml", FAST_HEALTH_CHECKS),
                     folder / "state")
    for other in ("mp", "ray", "real"):  # every inventory uses vllm.service: start clean
        ray.provision("down", "-i", str(lab.inventory_path(other)), "--purge")
    up = ray.provision("up", "-i", str(ray.inventory))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield ray
    finally:
        for host in ("h1", "h2"):  # a failed test must not leave anything frozen or cut
            lab.heal(host)
            lab.ssh(host, "systemctl kill -s CONT ray-worker.service || true", timeout_s=30)
        down = ray.provision("down", "-i", str(ray.inventory), "--purge")
        assert down.returncode == 0, down.stdout + down.stderr


def test_pp_over_ray_serves_with_the_default_compiled_graph_timeout(replica: RayReplica
                                                                    ) -> None:
    env = replica.ssh("h1", "cat /etc/vllm-provision/vllm.env")
    assert 'RAY_CGRAPH_get_timeout="600"' in env and 'RAY_CGRAPH_submit_timeout="600"' in env, env
    assert replica.journal("h1", "vllm.service", "RAY_CGRAPH_get_timeout is set to 600")
    started = time.monotonic()
    assert replica.complete()
    assert time.monotonic() - started >= STAGE_S  # every stage took its 2 s and was waited for


def test_frozen_worker_is_healed_with_no_operator_action(replica: RayReplica) -> None:
    """SIGSTOP of every process of h2's Ray unit: the unit stays running; the GCS declares the
    raylet dead (about 9 s here); h2's watchdog restarts its unit (systemd sends SIGCONT after
    SIGTERM); vLLM's engine died with its actors and waits in ExecStartPre for h2 to rejoin."""
    assert replica.complete()
    old = replica.show("h2", "ray-worker.service", "InvocationID")
    started = time.monotonic()
    replica.ssh("h2", "systemctl kill -s STOP ray-worker.service")
    seconds = replica.serve_again(started, 150, old)
    print(f"\nrecovery [standin] Ray: frozen worker (SIGSTOP of ray-worker.service): {seconds} s")
    restarts = replica.journal("h2", "vllm-watchdog.service", "ray: restarting ray-worker")
    assert restarts and "dead" in restarts[-1][1], restarts
    assert replica.journal("h1", "vllm.service", "are alive in Ray after")
    replica.assert_all_running()


def test_partitioned_worker_host_rejoins_after_the_heal(replica: RayReplica) -> None:
    """``lab cut h2``: the GCS declares h2 dead; h2's watchdog cannot reach the GCS for longer
    than the same bound and restarts its unit, which retries until the network heals."""
    assert replica.complete()
    old = replica.show("h2", "ray-worker.service", "InvocationID")
    old_ids = replica.alive_ids("h2")
    replica.lab.cut("h2")
    cut_at, cut_wall = time.monotonic(), time.time()
    try:
        while replica.alive_ids("h2"):  # the GCS health check gives up on h2
            assert time.monotonic() - cut_at < 60, replica.head_nodes()
            time.sleep(1)
        declared_dead_s = round(time.monotonic() - cut_at, 1)
        while time.monotonic() - cut_at < 9 + 6:  # h2's watchdog: its bound (9 s) + polls
            time.sleep(1)
    finally:
        replica.lab.heal("h2")
    healed = time.monotonic()
    seconds = replica.serve_again(healed, 150, old)
    print(f"\nrecovery [standin] Ray: worker host cut {healed - cut_at:.0f} s (dead in the GCS "
          f"after {declared_dead_s} s), serving {seconds} s after the heal")
    assert replica.alive_ids("h2") and not replica.alive_ids("h2") & old_ids
    # h2's watchdog restarted its unit during the cut: from the GCS rule ("ray: restarting
    # ray-worker") or from the peer rule on h1 ("restarting ray-worker.service ... h1 has not
    # answered"), whichever bound ran out first
    restarts = [m for at, m in replica.journal("h2", "vllm-watchdog.service",
                                               "restarting ray-worker") if at >= cut_wall - 1]
    assert restarts, "h2's watchdog did not restart ray-worker during the cut"
    replica.assert_all_running()


def test_the_gates_stuck_marker_gives_the_cluster_a_new_head_and_the_replica_serves_again(
        replica: RayReplica) -> None:
    """What vLLM's unit does when its start gate found Ray's books stuck (docs/recovery.md, "a
    new head when Ray's books are stuck"): with the gate's marker in vLLM's working directory,
    vLLM's end (here ``kill -9``) restarts the Ray head as root (``ExecStopPost=+``); h2's
    watchdog restarts its worker for the new head and the replica serves again. Ray's stuck
    books cannot be made on demand, so the marker is written as the gate writes it: by the
    service user."""
    assert replica.complete()
    head = replica.show("h1", "ray-head.service", "InvocationID")
    worker = replica.show("h2", "ray-worker.service", "InvocationID")
    user = replica.show("h1", "vllm.service", "User")
    marker = replica.show("h1", "vllm.service", "WorkingDirectory") + "/ray-scheduler-stuck"
    replica.ssh("h1", f"runuser -u {user} -- sh -c 'echo gave up > {marker}'")
    started = time.monotonic()
    replica.ssh("h1", "systemctl kill -s KILL vllm.service")
    seconds = replica.serve_again(started, 150, worker)
    print(f"\nrecovery [standin] Ray: the gate's stuck marker, then vLLM killed: a new head, "
          f"serving {seconds} s later")
    assert replica.show("h1", "ray-head.service", "InvocationID") not in ("", head)
    assert replica.ssh("h1", f"test -e {marker} && echo left || true").strip() == ""
    replica.assert_all_running()


@pytest.fixture(scope="module")
def changed(replica: RayReplica) -> dict[str, Any]:
    """``up`` with one more ``ray_env`` setting (every Ray unit restarts, then vLLM) and a
    compiled-graph get timeout of 1 s, below the 2 s stage."""
    before = float(replica.ssh("h1", "date +%s.%N"))
    write_inventory(replica.lab, replica.inventory,
                    {**FAST_HEALTH_CHECKS, "RAY_health_check_initial_delay_ms": "3000"})
    up = replica.provision("up", "-i", str(replica.inventory), "-e",
                           "ray_cgraph_get_timeout_s=1")
    return {"before": before, "up": up}


def test_changed_ray_env_starts_vllm_only_once_every_node_is_alive(
        replica: RayReplica, changed: dict[str, Any]) -> None:
    after = changed["before"]
    # systemd's own line when the worker's new invocation starts (`Started <unit> - ...`)
    restarted = [t for t, m in replica.journal("h2", "ray-worker.service", "Started ")
                 if t > after and m.startswith("Started ")]
    rejoined = [t for t, _ in replica.journal("h2", "ray-worker.service", "Ray runtime started")
                if t > after]
    assert restarted and rejoined, "the changed ray_env must restart the worker, which rejoins"
    gate = [t for t, _ in replica.journal("h1", "vllm.service", "are alive in Ray after")
            if t > after]
    vllm_started = [t for t, m in replica.journal("h1", "vllm.service", "vLLM API server version")
                    if t > after]
    assert gate and vllm_started, replica.ssh("h1", "journalctl -u vllm.service -n 30")
    # The gate passes once the GCS lists the new worker raylet as alive; `ray start` prints
    # "Ray runtime started" a moment after that registration (CI saw it 0.15 s after the gate),
    # so the order is: worker restarted <= gate (every node alive) <= vLLM started.
    assert restarted[0] <= gate[0] <= vllm_started[0], (restarted, gate, vllm_started)
    print(f"\nchanged ray_env: worker restarted {restarted[0] - after:.1f} s, rejoined "
          f"{rejoined[0] - after:.1f} s, vLLM started {vllm_started[0] - after:.1f} s after the "
          "up began")


def test_a_too_small_compiled_graph_timeout_fails_as_ray_does(
        replica: RayReplica, changed: dict[str, Any]) -> None:
    up = changed["up"]
    assert up.returncode != 0, up.stdout
    env = replica.ssh("h1", "cat /etc/vllm-provision/vllm.env")
    assert 'RAY_CGRAPH_get_timeout="1"' in env, env
    timeouts = replica.journal("h1", "vllm.service", "RayChannelTimeoutError")
    assert any("RAY_CGRAPH_get_timeout which is currently 1 seconds" in m for _, m in timeouts), \
        timeouts
