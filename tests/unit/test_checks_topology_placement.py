"""Topology rules and Ray placement feasibility (pure)."""

from __future__ import annotations

import pytest

from vllm_provision.checks import placement, topology
from vllm_provision.checks.finding import Severity
from vllm_provision.core.models import EngineArgs, Host, Node, Replica


def make_replica(tp: int = 4, pp: int = 2, ranks: tuple[int, ...] = (0, 1), backend: str = "mp",
                 extra_args: tuple[str, ...] = ()) -> Replica:
    nodes = tuple(Node(Host(f"h{i + 1}", f"10.0.0.{11 + i}"), rank, f"10.0.0.{11 + i}")
                  for i, rank in enumerate(ranks))
    return Replica("llama", backend, nodes,  # type: ignore[arg-type]
                   EngineArgs(model="/srv/models/m", tensor_parallel_size=tp,
                              pipeline_parallel_size=pp, extra_args=extra_args))


def severities(findings, check=None):
    return [f.severity for f in findings if check is None or f.check == check]


def test_reference_scenario_passes_every_rule():
    findings = topology.check_topology(make_replica(), {"h1": 4, "h2": 4})
    assert Severity.ERROR not in severities(findings)
    assert Severity.WARNING not in severities(findings)


@pytest.mark.parametrize(("tp", "pp", "nodes", "ok"), [
    (4, 2, 2, True), (3, 1, 2, False), (1, 1, 2, False), (8, 1, 2, True), (2, 3, 3, True),
])
def test_world_size_must_be_a_multiple_of_the_node_count(tp, pp, nodes, ok):
    findings = topology.check_parallel_sizes(make_replica(tp, pp, tuple(range(nodes))))
    assert (Severity.ERROR not in severities(findings)) is ok


def test_local_world_size_larger_than_gpus_is_an_error_naming_the_node():
    findings = topology.check_gpus_per_node(make_replica(4, 4), {"h1": 8, "h2": 4})
    errors = [f for f in findings if f.severity is Severity.ERROR]
    assert [f.host for f in errors] == ["h2"]
    assert errors[0].expected.startswith(">= 8") and errors[0].actual == "4"


def test_tensor_parallel_spanning_nodes_is_a_warning():
    findings = topology.check_tensor_parallel_in_node(make_replica(8, 1))
    assert severities(findings) == [Severity.WARNING]
    assert "TP=4" in findings[0].fix


@pytest.mark.parametrize(("ranks", "checks"), [
    ((0, 1), set()),
    ((0, 0), {"topology.ranks", "topology.master"}),
    ((1, 2), {"topology.ranks", "topology.master"}),
    ((0, 2), {"topology.ranks"}),
])
def test_node_ranks_unique_complete_with_one_master(ranks, checks):
    findings = topology.check_node_ranks(make_replica(ranks=ranks))
    assert {f.check for f in findings if f.severity is Severity.ERROR} == checks


def test_ray_backend_never_takes_nnodes():
    findings = topology.check_backend_args(
        make_replica(backend="ray", extra_args=("--nnodes", "2")))
    errors = [f for f in findings if f.severity is Severity.ERROR]
    assert errors and topology.NNODES_BACKEND_ERROR in errors[0].actual


def test_mp_backend_rejects_a_conflicting_backend_in_extra_args():
    findings = topology.check_backend_args(
        make_replica(extra_args=("--distributed-executor-backend=ray",)))
    assert severities(findings) == [Severity.ERROR]


def test_mp_backend_renders_nnodes_explicitly():
    findings = topology.check_backend_args(make_replica())
    assert findings[0].actual == "--distributed-executor-backend mp --nnodes 2"


@pytest.mark.parametrize(("world", "nnodes", "gpus", "backend"), [
    (1, 1, 4, "uni"), (8, 2, 4, "mp"), (4, 1, 4, "mp"), (8, 1, 4, None),
])
def test_default_backend_follows_parallel_config(world, nnodes, gpus, backend):
    chosen, error = topology.default_backend(world, nnodes, gpus)
    assert chosen == backend
    if backend is None:
        assert error.startswith("World size (8) is larger than the number of available GPUs (4)")
        assert "set '--nnodes' appropriately" in error


TWO_BY_FOUR = {"h1": placement.node_resources(4, "10.0.0.11"),
               "h2": placement.node_resources(4, "10.0.0.12")}


def test_one_eight_gpu_bundle_on_two_four_gpu_nodes_is_never_placeable():
    decision = placement.decide_placement([{"GPU": 8}], "PACK", TWO_BY_FOUR)
    assert not decision.feasible
    assert "no node has 8 GPUs" in decision.reason
    assert "a bundle cannot span nodes" in decision.reason
    assert "adding more 4-GPU nodes will not help" in decision.reason


def test_eight_gpu_bundle_stays_infeasible_with_more_four_gpu_nodes():
    many = {f"h{i}": placement.node_resources(4, f"10.0.0.{i}") for i in range(10)}
    assert not placement.decide_placement([{"GPU": 8}], "SPREAD", many).feasible


def test_two_four_gpu_bundles_spread_fit():
    decision = placement.decide_placement([{"GPU": 4}, {"GPU": 4}], "SPREAD", TWO_BY_FOUR)
    assert decision.feasible and sorted(decision.assignment) == ["h1", "h2"]


def test_vllm_bundles_pack_on_two_by_four_with_bundle_zero_on_the_head():
    bundles = placement.vllm_bundles(8, "10.0.0.11")
    assert len(bundles) == 8 and bundles[0]["node:10.0.0.11"] == 0.001
    decision = placement.decide_placement(bundles, "PACK", TWO_BY_FOUR)
    assert decision.feasible
    assert decision.assignment[0] == "h1"
    assert decision.assignment.count("h1") == 4 and decision.assignment.count("h2") == 4


def test_strict_pack_of_eight_single_gpu_bundles_on_two_by_four_fails():
    decision = placement.decide_placement([{"GPU": 1}] * 8, "STRICT_PACK", TWO_BY_FOUR)
    assert not decision.feasible and "STRICT_PACK" in decision.reason


def test_strict_pack_fits_when_one_node_holds_everything():
    assert placement.decide_placement([{"GPU": 1}] * 4, "STRICT_PACK", TWO_BY_FOUR).feasible


def test_bundle_pinned_to_an_unknown_ip_is_never_placeable():
    decision = placement.decide_placement(placement.vllm_bundles(8, "192.168.1.5"), "PACK",
                                          TWO_BY_FOUR)
    assert not decision.feasible
    assert "192.168.1.5" in decision.reason and "VLLM_HOST_IP" in decision.reason


def test_strict_spread_needs_as_many_nodes_as_bundles():
    assert not placement.decide_placement([{"GPU": 1}] * 3, "STRICT_SPREAD", TWO_BY_FOUR).feasible
    assert placement.decide_placement([{"GPU": 2}] * 2, "STRICT_SPREAD", TWO_BY_FOUR).feasible


def test_bin_packing_that_cannot_fit_whole_bundles_is_infeasible():
    decision = placement.decide_placement([{"GPU": 3}, {"GPU": 3}, {"GPU": 2}], "PACK",
                                          TWO_BY_FOUR)
    assert not decision.feasible


def test_unknown_strategy_is_rejected():
    with pytest.raises(ValueError):
        placement.decide_placement([{"GPU": 1}], "BEST_EFFORT", TWO_BY_FOUR)


def test_check_placement_reports_custom_shape_and_skips_mp():
    ray = make_replica(backend="ray")
    findings = placement.check_placement(ray, TWO_BY_FOUR, [{"GPU": 8}], "PACK")
    assert [f.severity for f in findings] == [Severity.OK, Severity.ERROR]
    assert "adding more 4-GPU nodes will not help" in findings[1].actual
    assert placement.check_placement(make_replica(), TWO_BY_FOUR) == []


@pytest.mark.parametrize(("words", "item", "how"), [
    (("--nnode", "2"), "--nnode in vllm_extra_args", "--nnode abbreviates --nnodes for vLLM "
                                                     "0.26.0"),
    (("--tensor_parallel_size=8",), "--tensor_parallel_size in vllm_extra_args", ""),
    (("--tensor-parallel", "8"), "--tensor-parallel in vllm_extra_args",
     "--tensor-parallel abbreviates --tensor-parallel-size for vLLM 0.26.0"),
    (("-n", "2"), "-n in vllm_extra_args", ""),
])
def test_backend_args_resolve_spellings_as_vllm_does(small_table, words, item, how):
    findings = topology.check_backend_args(make_replica(backend="ray", extra_args=words))
    [error] = [f for f in findings if f.severity is Severity.ERROR]
    assert error.item == item
    assert error.actual.endswith(f"({how})") if how else "abbreviates" not in error.actual
    if item.startswith(("--nnode ", "-n ")):
        assert topology.NNODES_BACKEND_ERROR in error.actual


def test_an_abbreviated_backend_override_is_refused(small_table):
    findings = topology.check_backend_args(
        make_replica(extra_args=("--distributed-exec", "ray")))
    [error] = [f for f in findings if f.severity is Severity.ERROR]
    assert error.actual == ("vllm_extra_args sets --distributed-exec ray (--distributed-exec "
                            "abbreviates --distributed-executor-backend for vLLM 0.26.0)")


def test_backend_args_without_the_table_check_exact_names(monkeypatch):
    from vllm_table_support import clear, no_table

    no_table(monkeypatch)
    findings = topology.check_backend_args(make_replica(extra_args=("--nnodes", "2", "--nnode")))
    assert [f.item for f in findings if f.severity is Severity.ERROR] == [
        "--nnodes in vllm_extra_args"]
    clear()
