"""Ray cluster readiness and placement diagnosis (pure functions of a Ray API snapshot)."""

from __future__ import annotations

import json

from vllm_provision.modules.ray_wait_cluster import (
    RaySnapshot,
    cluster_gaps,
    parse_snapshot,
    pending_placement_problem,
    placement_problem,
)

HEAD, WORKER = "10.213.6.11", "10.213.6.12"


def _snapshot(worker_alive: bool = True, pgs: list[dict] | None = None) -> RaySnapshot:
    nodes = [{"ip": HEAD, "alive": True, "resources": {"GPU": 4.0, "CPU": 2.0}},
             {"ip": WORKER, "alive": worker_alive, "resources": {"GPU": 4.0, "CPU": 2.0}}]
    total = 8.0 if worker_alive else 4.0
    return RaySnapshot(nodes, {"GPU": total}, {"GPU": total}, pgs or [])


def _pg(bundles: list[dict], scheduling_state: str) -> dict:
    return {"id": "a1b2c3d4e5f6a7b8", "name": "", "state": "PENDING", "strategy": "PACK",
            "bundles": bundles, "scheduling_state": scheduling_state}


def test_snapshot_line_is_parsed_among_other_output() -> None:
    data = {"nodes": [], "total": {}, "available": {}, "placement_groups": []}
    out = "2026 INFO something\nRAY-SNAPSHOT " + json.dumps(data) + "\n"
    assert parse_snapshot(out) == RaySnapshot([], {}, {}, [])
    assert parse_snapshot("Traceback ...") is None


def test_cluster_is_whole_when_every_node_is_alive_with_its_gpus() -> None:
    assert cluster_gaps(_snapshot(), {HEAD: 4, WORKER: 4}) == []


def test_a_dead_worker_or_missing_gpus_is_named() -> None:
    assert cluster_gaps(_snapshot(worker_alive=False), {HEAD: 4, WORKER: 4}) == [
        f"node {WORKER} is not alive in Ray"]
    assert cluster_gaps(_snapshot(), {HEAD: 8, WORKER: 4}) == [
        f"node {HEAD} has 4 GPUs in Ray, expected 8"]


def test_placement_is_feasible_for_eight_one_gpu_bundles_on_two_nodes() -> None:
    assert placement_problem(_snapshot(), 8, HEAD, "r") is None


def test_placement_names_a_vllm_host_ip_unknown_to_ray() -> None:
    problem = placement_problem(_snapshot(), 8, "10.213.6.99", "r")
    assert problem is not None and "10.213.6.99" in problem.message
    assert HEAD in problem.expected


def test_placement_needs_world_size_gpus() -> None:
    problem = placement_problem(_snapshot(worker_alive=False), 8, HEAD, "r")
    assert problem is not None and "4 GPUs, vLLM needs 8" in problem.message


def test_pending_group_pinned_to_an_unknown_ip_is_an_ip_mismatch() -> None:
    bundles = [{"GPU": 1.0, "node:10.213.6.99": 0.001}] + [{"GPU": 1.0}] * 7
    problem = pending_placement_problem(_snapshot(pgs=[_pg(bundles, "INFEASIBLE")]), "r")
    assert problem is not None
    assert "VLLM_HOST_IP does not match" in problem.message and problem.actual == "10.213.6.99"


def test_pending_infeasible_group_names_the_bundle_and_the_nodes() -> None:
    problem = pending_placement_problem(_snapshot(pgs=[_pg([{"GPU": 8.0}], "INFEASIBLE")]), "r")
    assert problem is not None and "INFEASIBLE" in problem.message
    assert f"{HEAD}: 4 GPU" in problem.actual


def test_a_group_waiting_for_resources_or_created_is_not_a_problem() -> None:
    waiting = _pg([{"GPU": 1.0}] * 8, "NO_RESOURCES")
    created = _pg([{"GPU": 1.0}] * 8, "FINISHED") | {"state": "CREATED"}
    assert pending_placement_problem(_snapshot(pgs=[waiting, created]), "r") is None


def test_expected_gpus_are_each_nodes_own_not_the_heads() -> None:
    """``ray_num_gpus`` on the head alone is not the worker's: the worker's ``ray start`` gets
    none, so Ray shows the GPUs it found (here the 4 preflight found); a node's own value wins."""
    from types import SimpleNamespace

    from vllm_provision.core.models import EngineArgs, Host, Node, Replica
    from vllm_provision.modules.ray_wait_cluster import expected_gpus

    head = Host(name="h1", address=HEAD, vars={"ray_num_gpus": 8})
    worker = Host(name="h2", address=WORKER)
    replica = Replica(name="r", backend="ray",
                      nodes=(Node(host=head, rank=0, host_ip=HEAD),
                             Node(host=worker, rank=1, host_ip=WORKER)),
                      engine=EngineArgs(model="/srv/m", tensor_parallel_size=4,
                                        pipeline_parallel_size=2))
    ctx = SimpleNamespace(facts={"h2": SimpleNamespace(gpus=[0, 1, 2, 3])},
                          vars={"ray_num_gpus": 8})
    assert expected_gpus(ctx, replica, None) == {HEAD: 8.0, WORKER: 4.0}  # type: ignore[arg-type]
    assert expected_gpus(ctx, replica, 2) == {HEAD: 2.0, WORKER: 2.0}  # type: ignore[arg-type]
    ctx.facts = {}
    assert expected_gpus(ctx, replica, None) == {HEAD: 8.0, WORKER: 4.0}  # world 8 / 2 nodes
