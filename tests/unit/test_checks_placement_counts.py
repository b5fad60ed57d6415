"""Ray placement when the cluster is short of GPUs: the totals answer at once and the finding
names the shortfall, from decide_placement, through the replica's checks, to `provision check`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from inventory_support import replicas_yaml
from test_checks_parity_host import make_facts

from vllm_provision.checks import placement
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import check_replica, settings_for
from vllm_provision.cli import cli
from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.facts.model import Gpu

IPS = ("10.0.0.11", "10.0.0.12", "10.0.0.13")


def nodes_of(*gpus: int) -> dict[str, dict[str, float]]:
    return {f"h{i + 1}": placement.node_resources(count, IPS[i]) for i, count in enumerate(gpus)}


def ray_replica(tp: int, pp: int, count: int = 3) -> Replica:
    nodes = tuple(Node(Host(f"h{i + 1}", IPS[i]), i, IPS[i]) for i in range(count))
    return Replica("llama", "ray", nodes,  # type: ignore[arg-type]
                   EngineArgs(model="/srv/models/m", tensor_parallel_size=tp,
                              pipeline_parallel_size=pp))


def facts_with(*gpus: int) -> dict[str, Any]:
    return {f"h{i + 1}": replace(make_facts(f"h{i + 1}", IPS[i]), gpus=tuple(
        Gpu(g, "NVIDIA H200", 143771, f"GPU-h{i + 1}-{g}") for g in range(count)))
        for i, count in enumerate(gpus)}


@pytest.mark.parametrize(("gpus", "tp", "pp", "cluster", "need"), [
    ((8, 8, 7), 8, 3, "23 GPUs on 3 nodes (8, 8, 7)", 24),   # a node lost a GPU
    ((6, 6, 5), 6, 3, "17 GPUs on 3 nodes (6, 6, 5)", 18),   # the same on 6-GPU nodes
    ((8, 8, 8), 8, 4, "24 GPUs on 3 nodes (8, 8, 8)", 32),   # a PP typo
])
def test_a_gpu_shortfall_is_answered_from_the_totals(gpus, tp, pp, cluster, need):
    bundles = placement.vllm_bundles(tp * pp, IPS[0])
    decision = placement.decide_placement(bundles, "PACK", nodes_of(*gpus))
    assert not decision.feasible and decision.decided
    assert decision.reason == f"the cluster has {cluster}; the {need} bundles need {need}"
    assert decision.shortfall == (("GPU", float(sum(gpus)), float(need)),)
    [finding] = placement.check_placement(ray_replica(tp, pp), nodes_of(*gpus))
    assert finding.severity is Severity.ERROR
    assert finding.actual == (f"can never be placed: the cluster has {cluster}; "
                              f"TP={tp} x PP={pp} needs {need}")
    assert f"TP x PP at most {sum(gpus)}" in finding.fix


def test_one_lost_gpu_asks_for_it_back_and_a_typo_for_lower_tp_pp():
    [lost] = placement.check_placement(ray_replica(8, 3), nodes_of(8, 8, 7))
    assert lost.fix.startswith("bring the missing GPU back or lower TP/PP")
    [typo] = placement.check_placement(ray_replica(8, 4), nodes_of(8, 8, 8))
    assert typo.fix.startswith("bring the 8 missing GPUs back (or add nodes) or lower TP/PP")


def test_the_same_cluster_with_its_gpu_back_places_eight_per_node():
    decision = placement.decide_placement(placement.vllm_bundles(24, IPS[0]), "PACK",
                                          nodes_of(8, 8, 8))
    assert decision.feasible and decision.assignment[0] == "h1"
    assert [decision.assignment.count(f"h{i}") for i in (1, 2, 3)] == [8, 8, 8]


def test_whole_bundles_that_do_not_pack_are_still_searched_after_the_totals():
    # 3 x 3 GPUs need 9 of 12, but each 4-GPU node holds one: no shortfall, still no placement
    decision = placement.decide_placement([{"GPU": 3}] * 4, "PACK", nodes_of(4, 4, 4))
    assert not decision.feasible and decision.shortfall == ()
    assert "no assignment of whole bundles" in decision.reason


@pytest.mark.parametrize(("shapes", "gpus"), [
    ([{"GPU": 5}, {"GPU": 3}] * 2, (8, 8)),           # each large bundle beside a small one
    ([{"GPU": 2}] * 4, (4, 4)),                        # identical nodes, identical splits
    ([{"GPU": 6}, {"GPU": 2}, {"GPU": 4}, {"GPU": 4}], (8, 8)),
    ([{"GPU": 4}] * 3 + [{"GPU": 2}] * 2 + [{"GPU": 1}] * 4, (8, 8, 4)),
])
def test_bundles_that_fill_the_nodes_exactly_are_placed(shapes, gpus):
    nodes = nodes_of(*gpus)
    decision = placement.decide_placement(shapes, "PACK", nodes)
    assert decision.feasible, decision.reason
    for name, resources in nodes.items():
        used = sum(b["GPU"] for b, where in zip(shapes, decision.assignment, strict=True)
                   if where == name)
        assert used == resources["GPU"]


def test_a_custom_group_short_of_a_custom_resource_names_it():
    nodes = nodes_of(8, 8)
    nodes["h1"]["accel"] = 1.0
    decision = placement.decide_placement([{"GPU": 1, "accel": 1}] * 2, "SPREAD", nodes)
    assert decision.reason == "the cluster has 1 accel on 2 nodes (1, 0); the 2 bundles need 2"


def test_a_search_that_meets_its_step_limit_is_a_warning_not_a_verdict(monkeypatch):
    monkeypatch.setattr(placement, "SEARCH_STEPS", 0)
    bundles = [{"GPU": 3}] * 4  # no bound says no on 5+4+4 GPUs: only a search can
    decision = placement.decide_placement(bundles, "PACK", nodes_of(5, 4, 4))
    assert not decision.decided and decision.feasible and "not decided" in decision.reason
    findings = placement.check_placement(ray_replica(1, 1), nodes_of(5, 4, 4), bundles, "PACK")
    custom = findings[-1]
    assert (custom.item, custom.severity) == ("custom placement group", Severity.WARNING)
    monkeypatch.undo()
    assert not placement.decide_placement(bundles, "PACK", nodes_of(5, 4, 4)).feasible


def test_the_replica_checks_report_the_shortfall_from_the_nodes_facts():
    replica = ray_replica(8, 3)
    findings = check_replica(replica, facts_with(8, 8, 7), settings_for(replica))
    [finding] = [f for f in findings if f.check == "placement"]
    assert finding.severity is Severity.ERROR
    assert "the cluster has 23 GPUs on 3 nodes (8, 8, 7); TP=8 x PP=3 needs 24" in finding.actual


INVENTORY = replicas_yaml("""\
        llama:
          vars: {vllm_backend: ray, vllm_model: /srv/models/m, vllm_tensor_parallel_size: 8,
                 vllm_pipeline_parallel_size: 3}
          hosts:
            h1: {ansible_host: 10.0.0.11, vllm_node_rank: 0}
            h2: {ansible_host: 10.0.0.12, vllm_node_rank: 1}
            h3: {ansible_host: 10.0.0.13, vllm_node_rank: 2}
""", all_vars="{ansible_user: root}")


def test_provision_check_reports_the_missing_gpu(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    monkeypatch.setattr("vllm_provision.facts.collect.collect_facts",
                        lambda *args, **kwargs: (facts_with(8, 8, 7), {}))
    result = CliRunner().invoke(cli, ["check", "-i", str(path), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    [finding] = [f for f in report["findings"] if f["check"] == "placement"]
    assert finding["severity"] == "error" and finding["item"] == "vLLM placement group"
    assert finding["actual"] == ("can never be placed: the cluster has 23 GPUs on 3 nodes "
                                 "(8, 8, 7); TP=8 x PP=3 needs 24")
