"""A shared GPU pool: who holds a GPU, the gang start's waits and order, Ray's pending group.

The compute-app rows are the real capture in tests/data/nvidia-smi-real/
query-compute-apps-uuid.csv (pids, MiB, uuids), in the fields and format the gang start asks for
(``pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from clock_support import FakeClock

from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.core.results import Status
from vllm_provision.facts import gpu_pool
from vllm_provision.modules import vllm_gang_start
from vllm_provision.modules.ray_wait_cluster import (
    RaySnapshot,
    format_resources,
    parse_snapshot,
    pending_placement_problem,
    pending_resources,
)

DATA = Path(__file__).parents[1] / "data" / "nvidia-smi-real"
UUID_A = "GPU-e13d18b6-ccfb-6676-668a-cd489ad01b55"
UUID_B = "GPU-9eb34eec-449b-7839-d362-d1e995e95239"


def real_rows() -> list[list[str]]:
    """The capture's rows: pid, ``5746 MiB``, uuid."""
    text = (DATA / "query-compute-apps-uuid.csv").read_text()
    return [[part.strip() for part in line.split(",")] for line in text.splitlines() if line]


def holders_output(cgroups: dict[str, str]) -> str:
    rows = [f"{pid}, python3, {mib.removesuffix(' MiB')}, {uuid}" for pid, mib, uuid in real_rows()]
    text = f"== gpus\n0, {UUID_A}\n1, {UUID_B}\n== apps\n" + "\n".join(rows) + "\n"
    return text + "".join(f"== cgroup {pid}\n{body}\n" for pid, body in cgroups.items())


def test_holders_are_read_with_their_gpu_index_memory_and_unit() -> None:
    text = holders_output({
        "1726992": "0::/system.slice/train-job.service",
        "1726993": "1:name=systemd:/user.slice/user-0.slice/session-3.scope\n0::/"})
    assert gpu_pool.parse_holders("h2", text) == [
        gpu_pool.Holder("h2", 0, 1726992, "python3", 5746, "train-job.service"),
        gpu_pool.Holder("h2", 1, 1726993, "python3", 5920, "session-3.scope")]
    # a pid that exited before its cgroup was read: no unit, still a holder
    [first, _] = gpu_pool.parse_holders("h2", holders_output({}))
    assert first.unit == "" and first.describe() == (
        "h2 GPU 0: pid 1726992 python3 (5746 MiB) (no systemd unit)")


def test_no_process_means_no_holder() -> None:
    assert gpu_pool.parse_holders("h1", f"== gpus\n0, {UUID_A}\n== apps\n\n") == []


def test_only_foreign_processes_on_used_gpus_hold_the_replica() -> None:
    ours = gpu_pool.Holder("h1", 0, 10, "python", 70000, "vllm.service")
    other = gpu_pool.Holder("h1", 1, 11, "python3", 120000, "vllm-lab-occupy-1.service")
    unused_gpu = gpu_pool.Holder("h1", 5, 12, "python3", 100, "batch.service")
    unknown_gpu = gpu_pool.Holder("h1", -1, 13, "python3", None, "")
    found = gpu_pool.foreign_holders([ours, other, unused_gpu, unknown_gpu], range(4),
                                     ("vllm.service", "ray-head.service"))
    assert found == [other, unknown_gpu]
    assert gpu_pool.describe(found) == (
        "h1 GPU 1: pid 11 python3 (120000 MiB) in unit vllm-lab-occupy-1.service; "
        "h1 a GPU: pid 13 python3 (no systemd unit)")


HELD = gpu_pool.Holder("h2", 0, 75, "python3", 120000, "vllm-lab-occupy-0.service")


def test_waits_until_one_observation_finds_every_node_free() -> None:
    time = FakeClock()
    observations = iter([[HELD], [HELD], []])
    seen: list[float] = []
    waited = gpu_pool.wait_until_free(lambda: next(observations), timeout_s=30, where="r",
                                      poll_s=2, progress=lambda held, s: seen.append(s),
                                      clock=time, sleep=time.sleep)
    assert waited == 4.0 and seen == [0.0, 2.0]


def test_a_hold_past_the_bound_fails_naming_the_holder() -> None:
    time = FakeClock()
    with pytest.raises(gpu_pool.GpusHeld) as caught:
        gpu_pool.wait_until_free(lambda: [HELD], timeout_s=5, where="r", poll_s=2,
                                 clock=time, sleep=time.sleep)
    assert time.now == 5.0  # the last sleep is cut to the bound, then one more reading
    assert "within 5 s" in caught.value.problems[0].message
    assert caught.value.problems[0].actual == HELD.describe()


# -- the gang start module, on fake connections ------------------------------------------------


@dataclass
class Result:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0


class Node_:
    """One node: its vllm.service state and whether a foreign job holds GPU 0 (a script)."""

    def __init__(self, name: str, holds: list[bool], log: list[str]) -> None:
        self.name, self.holds, self.log, self.active = name, holds, log, False

    def run(self, command: str, timeout_s: float = 0, **_: Any) -> Result:
        if command == gpu_pool.HOLDERS_COMMAND:
            held = self.holds.pop(0) if len(self.holds) > 1 else self.holds[0]
            self.log.append(f"read {self.name}")
            apps = f"75, python3, 120000, {UUID_A}\n" if held else ""
            return Result(f"== gpus\n0, {UUID_A}\n== apps\n{apps}== cgroup 75\n"
                          "0::/system.slice/vllm-lab-occupy-0.service\n")
        if command.startswith("systemctl is-active"):
            return Result("active\n" if self.active else "inactive\n", exit_code=3)
        verb = command.split()[1]
        self.log.append(f"{verb} {self.name}")
        self.active = verb == "start"
        return Result()


@dataclass
class Ctx:
    replica: Replica
    connections: dict[str, Node_]
    vars: dict[str, Any]
    check_mode: bool = False

    @property
    def node(self) -> Node:
        return self.replica.master


def ctx_for(h1_holds: list[bool], h2_holds: list[bool]) -> tuple[Ctx, list[str]]:
    hosts = [Host(name=f"h{i}", address=f"10.0.0.{10 + i}") for i in (1, 2)]
    replica = Replica(name="r", backend="mp", nodes=tuple(
        Node(host=h, rank=i, host_ip=h.address) for i, h in enumerate(hosts)),
        engine=EngineArgs(model="/srv/m", tensor_parallel_size=4, pipeline_parallel_size=2))
    log: list[str] = []
    conns = {"h1": Node_("h1", h1_holds, log), "h2": Node_("h2", h2_holds, log)}
    return Ctx(replica, conns, {"vllm_unit_name": "vllm.service"}), log


def test_gang_start_rereads_every_node_before_each_start_in_mp_order() -> None:
    ctx, log = ctx_for([False], [True, False])
    result = vllm_gang_start.run(ctx, {"timeout_s": 10, "poll_s": 0.05})  # type: ignore[arg-type]
    assert result.status is Status.CHANGED
    starts = [entry for entry in log if entry.startswith("start")]
    assert starts == ["start h2", "start h1"]  # the headless follower first, then rank 0
    # both nodes read again after h2 started and before h1 starts
    after = log[log.index("start h2") + 1:log.index("start h1")]
    assert sorted(after) == ["read h1", "read h2"]


def test_gang_start_stops_what_it_started_when_a_gpu_is_taken_meanwhile() -> None:
    # free at the first reading, then h1's GPU is taken by another job and stays taken
    ctx, log = ctx_for([False, True], [False])
    with pytest.raises(gpu_pool.ProvisionError) as caught:
        vllm_gang_start.run(ctx, {"timeout_s": 0.2, "poll_s": 0.05})  # type: ignore[arg-type]
    message = caught.value.problems[0].message
    assert "stopped what this run had started: h2 vllm.service" in message
    assert [e for e in log if not e.startswith("read")] == ["start h2", "stop h2"]


def test_gang_start_in_check_mode_names_the_holder_and_starts_nothing() -> None:
    ctx, log = ctx_for([False], [True])
    ctx.check_mode = True
    result = vllm_gang_start.run(ctx, {})  # type: ignore[arg-type]
    assert result.status is Status.SKIPPED
    assert "would wait for h2 GPU 0: pid 75 python3 (120000 MiB) in unit " \
           "vllm-lab-occupy-0.service" in result.message
    assert not [e for e in log if not e.startswith("read")]


# -- Ray: a placement group waiting for resources ----------------------------------------------

HEAD, WORKER = "10.213.6.11", "10.213.6.12"


def ray_snapshot(worker_free_gpus: float, state: str = "NO_RESOURCES") -> RaySnapshot:
    nodes = [{"ip": HEAD, "alive": True, "resources": {"GPU": 4.0, "CPU": 2.0}},
             {"ip": WORKER, "alive": True, "resources": {"GPU": 4.0, "CPU": 2.0}}]
    bundles = [{"GPU": 1.0, f"node:{HEAD}": 0.001}] + [{"GPU": 1.0}] * 7
    pg = {"id": "a1b2c3d4e5f6a7b8", "name": "", "state": "PENDING", "strategy": "PACK",
          "bundles": bundles, "scheduling_state": state, "nodes": []}
    free = {HEAD: {"GPU": 4.0, "CPU": 2.0}, WORKER: {"GPU": worker_free_gpus, "CPU": 2.0}}
    holders = [{"kind": "actor", "name": "GpuHolder", "job": "07000000", "pid": 705,
                "ip": WORKER}]
    return RaySnapshot(nodes, {"GPU": 8.0}, {"GPU": 4.0 + worker_free_gpus}, [pg], free,
                       holders)


def test_a_group_waiting_for_resources_names_demand_free_resources_and_holder() -> None:
    assert pending_resources(ray_snapshot(3.0)) == (
        "placement group a1b2c3d4e5f6 (PACK) is pending (NO_RESOURCES): it needs "
        f"1 x {{GPU: 1, node:{HEAD}: 0.001}} + 7 x {{GPU: 1}}; free now: {HEAD}: 4 of 4 GPU; "
        f"{WORKER}: 3 of 4 GPU; held on {WORKER} by actor GpuHolder (pid 705, job 07000000)")
    # it is a wait, not a failure; an infeasible group is neither waited on nor explained so
    assert pending_placement_problem(ray_snapshot(3.0), "r") is None
    assert pending_resources(ray_snapshot(3.0, "INFEASIBLE")) is None


def test_without_per_node_figures_the_cluster_wide_free_gpus_are_shown() -> None:
    old = ray_snapshot(3.0)
    older_ray = RaySnapshot(old.nodes, old.total, old.available, old.placement_groups)
    assert "free now: cluster-wide 7 of 8 GPU" in (pending_resources(older_ray) or "")


def test_an_infeasible_group_names_the_bundle_no_node_can_hold() -> None:
    snapshot = ray_snapshot(4.0, "INFEASIBLE")
    snapshot.placement_groups[0]["bundles"] = [{"GPU": 4.0}, {"GPU": 8.0}]
    problem = pending_placement_problem(snapshot, "r")
    assert problem is not None and "no node can ever hold bundle 1 {GPU: 8}" in problem.message


def test_a_snapshot_of_an_older_tool_version_parses_without_free_or_holders() -> None:
    parsed = parse_snapshot('RAY-SNAPSHOT {"nodes": [], "total": {}, "available": {}, '
                            '"placement_groups": []}')
    assert parsed == RaySnapshot([], {}, {}, [], {}, [])
    assert format_resources({"node:__internal_head__": 0.001, "GPU": 1.0}) == "{GPU: 1}"


# --- vllm_fresh_followers: a follower left from a rank 0 that no longer runs ----------------------

def test_followers_of_a_rank_0_that_no_longer_runs_are_stopped_before_the_start() -> None:
    from vllm_provision.modules import vllm_fresh_followers

    ctx, log = ctx_for([False], [False])
    ctx.connections["h2"].active = True  # the headless node still runs; rank 0 does not
    result = vllm_fresh_followers.run(ctx, {})  # type: ignore[arg-type]
    assert result.status is Status.CHANGED and result.data == {"stopped": ["h2"]}
    assert log == ["stop h2"] and "so they start again with the new rank 0" in result.message
    # run again: nothing runs, nothing to stop
    again = vllm_fresh_followers.run(ctx, {})  # type: ignore[arg-type]
    assert again.status is Status.OK and log == ["stop h2"]


def test_followers_of_a_running_rank_0_are_left_alone_and_check_mode_says_what_it_would_do(
        ) -> None:
    from vllm_provision.modules import vllm_fresh_followers

    ctx, log = ctx_for([False], [False])
    ctx.connections["h1"].active = ctx.connections["h2"].active = True
    assert vllm_fresh_followers.run(ctx, {}).status is Status.OK  # type: ignore[arg-type]
    ctx.connections["h1"].active = False
    ctx.check_mode = True
    checked = vllm_fresh_followers.run(ctx, {})  # type: ignore[arg-type]
    assert checked.status is Status.SKIPPED and "would stop h2 vllm.service" in checked.message
    assert log == []


def test_fresh_followers_reads_rank_0_from_the_play_s_batch_and_nothing_elsewhere() -> None:
    """Its read_command is exactly the first command run sends on the master, so the play's
    batch carries it (runner/prefetch.py) and a run whose rank 0 runs sends nothing live; a
    follower has none (run skips there)."""
    from vllm_provision.modules import vllm_fresh_followers
    from vllm_provision.runner.prefetch import PrefetchingConnection

    ctx, log = ctx_for([False], [False])
    sent: list[str] = []
    master = ctx.connections["h1"]
    master.active = True
    inner_run = master.run

    def counted(command: str, **kwargs: Any) -> Result:
        sent.append(command)
        return inner_run(command, **kwargs)

    master.run = counted  # type: ignore[method-assign]
    command = vllm_fresh_followers.read_command(ctx, {})  # type: ignore[arg-type]
    assert command == "systemctl is-active -- vllm.service"
    batched = PrefetchingConnection(master)
    batched.prefetch([command])
    assert sent == [command]
    ctx.connections["h1"] = batched  # type: ignore[assignment]
    result = vllm_fresh_followers.run(ctx, {})  # type: ignore[arg-type]
    assert result.status is Status.OK and "rank 0 runs" in result.message
    assert sent == [command] and log == []  # answered from the batch

    class FollowerCtx(Ctx):
        @property
        def node(self) -> Node:
            return self.replica.nodes[1]

    follower = FollowerCtx(ctx.replica, ctx.connections, ctx.vars)
    assert vllm_fresh_followers.read_command(follower, {}) is None  # type: ignore[arg-type]
