"""Replicas are independent: preflight findings belong to their own replica, a readiness failure
stops only its replica (``fatal_scope: replica``), and `up` reports one result per replica."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_checks_parity_host import make_facts
from test_runner import run, statuses, write_playbook

from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import findings_of, run_checks
from vllm_provision.cli.up import replica_lines
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import EngineArgs, Group, Host, Inventory, Node, Replica
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.modules import vllm_preflight
from vllm_provision.operations.deploy import replica_results
from vllm_provision.runner.playbook import load_playbook
from vllm_provision.transport.local import LocalConnection


def two_replicas(tmp_path: Path, layout: dict[str, tuple[str, ...]],
                 tp: dict[str, int] | None = None, extra_hosts: tuple[str, ...] = ()
                 ) -> Inventory:
    """An inventory with one mp replica per ``layout`` entry (name -> its hosts, rank order),
    tensor parallel size ``tp[name]`` (default 4 per node), plus hosts in no replica."""
    names = [h for hosts in layout.values() for h in hosts] + list(extra_hosts)
    hosts = {}
    for index, name in enumerate(names):
        (tmp_path / name).mkdir(exist_ok=True)
        hosts[name] = Host(name, f"10.0.0.{11 + index}", vars={"root": str(tmp_path / name)})
    replicas = tuple(
        Replica(replica, "mp",
                tuple(Node(hosts[h], rank, hosts[h].address) for rank, h in enumerate(members)),
                EngineArgs(model="/srv/models/m",
                           tensor_parallel_size=(tp or {}).get(replica, 4 * len(members))))
        for replica, members in layout.items())
    groups = {"all": Group("all", hosts=tuple(extra_hosts), children=("vllm_replicas",)),
              "vllm_replicas": Group("vllm_replicas", children=tuple(layout)),
              "vllm_master": Group("vllm_master", hosts=tuple(m[0] for m in layout.values())),
              "vllm_followers": Group("vllm_followers",
                                      hosts=tuple(h for m in layout.values() for h in m[1:]))}
    groups.update({name: Group(name, hosts=members) for name, members in layout.items()})
    return Inventory(tmp_path / "inventory.yml", hosts, groups, replicas)


def facts_for(inventory: Inventory) -> dict[str, Any]:
    return {name: make_facts(name, host.address) for name, host in inventory.hosts.items()}


# -- preflight: a finding belongs to its replica -----------------------------------------------

def test_an_impossible_tp_size_fails_only_its_own_replica(tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path, {"good": ("h1",), "bad": ("h2",)}, tp={"bad": 8})
    good, bad = inventory.replicas
    findings = run_checks(inventory, facts_for(inventory))
    assert [f for f in findings_of(good, findings) if f.severity is Severity.ERROR] == []
    [error] = [f for f in findings_of(bad, findings) if f.severity is Severity.ERROR]
    assert (error.check, error.host, error.replica, error.actual) == (
        "topology.gpus", "h2", "bad", "4")


def test_a_replica_wide_finding_is_not_given_to_the_other_replica(tmp_path: Path) -> None:
    # TP=3 over 2 nodes: the world size is not a multiple of the nodes, a "*" finding
    inventory = two_replicas(tmp_path, {"good": ("h1", "h2"), "bad": ("h3", "h4")},
                             tp={"bad": 3})
    good, bad = inventory.replicas
    findings = run_checks(inventory, facts_for(inventory))
    star = [f for f in findings if f.host == "*" and f.severity is Severity.ERROR]
    assert star and {f.replica for f in star} == {"bad"}
    assert not [f for f in findings_of(good, findings) if f.severity is Severity.ERROR]
    assert set(star) <= set(findings_of(bad, findings))


def test_a_host_level_finding_belongs_to_every_replica_with_that_host(tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path, {"good": ("h1",), "bad": ("h2",)})
    good, bad = inventory.replicas
    facts = facts_for(inventory)
    del facts["h2"]
    findings = run_checks(inventory, facts,
                          {"h2": ProvisionError.single("h2", "connection refused")})
    [unreachable] = [f for f in findings if f.check == "facts"]
    assert unreachable.replica == ""  # made outside any replica's checks
    assert unreachable in findings_of(bad, findings)
    assert unreachable not in findings_of(good, findings)
    # a replica listing the same host (as two inventories of one cluster may) gets it too
    shared = Replica("shared", "mp", (bad.nodes[0],), bad.engine)
    assert unreachable in findings_of(shared, findings)


def test_preflight_module_fails_the_invalid_replica_and_passes_the_valid_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bad: TP=3 over 2 nodes, a replica-wide ("*") error that once failed every replica
    inventory = two_replicas(tmp_path, {"good": ("h1", "h2"), "bad": ("h3", "h4")},
                             tp={"bad": 3})
    facts = facts_for(inventory)
    monkeypatch.setattr(vllm_preflight, "gather_facts", lambda *a, **k: (facts, {}))
    ctx = SimpleNamespace(inventory=inventory, vars={}, facts={}, run_state={},
                          connections={name: LocalConnection(name) for name in inventory.hosts})
    # the fake facts hold no port-reachability probe (a live TCP test between the nodes)
    result = vllm_preflight.run(ctx, {"skip_checks": ["network.reach"]})
    statuses = {name: r.status for name, r in result.host_results.items()}
    assert statuses == {"h1": Status.OK, "h2": Status.OK, "h3": Status.FAILED,
                        "h4": Status.FAILED}, result.host_results["h1"].message
    h1, h4 = result.host_results["h1"], result.host_results["h4"]
    assert "replica bad" in h4.message and "world size per node" in h4.message
    assert h1.data["replica"] == "good" and h1.data["errors"] == 0
    assert {f["check"] for f in h4.data["findings"] if f["severity"] == "error"} == {
        "topology.world_size"}


# -- engine: any_errors_fatal scoped to the failed host's replica ------------------------------

FATAL_PER_REPLICA = """
- hosts: vllm_master
  any_errors_fatal: true
  fatal_scope: replica
  tasks:
    - name: Wait on rank 0
      command: "test {{ inventory_hostname }} != FAILING"
      changed_when: false
    - name: Next on rank 0
      command: "true"
      changed_when: false
- hosts: all
  tasks:
    - name: Later everywhere
      command: "true"
      changed_when: false
"""


def test_a_failing_master_stops_its_replica_and_the_other_goes_on(tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path, {"a": ("h1", "h2"), "b": ("h3", "h4")})
    playbook = write_playbook(tmp_path, FATAL_PER_REPLICA.replace("FAILING", "h1"))
    runner, summary = run(inventory, playbook)
    assert statuses(runner, "Wait on rank 0") == {"h1": "failed", "h3": "ok",
                                                  "h2": "skipped"}
    assert statuses(runner, "Next on rank 0") == {"h3": "ok"}
    assert statuses(runner, "Later everywhere") == {"h3": "ok", "h4": "ok"}
    assert not runner.outcome.aborted
    [skipped] = [r for r in runner.outcome.results if r.host == "h2"]
    assert "replica a stopped: h1 failed" in skipped.message
    assert summary["failed"] == 1


def test_a_failing_host_in_no_replica_still_stops_the_whole_run(tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path, {"a": ("h1",)}, extra_hosts=("lone",))
    playbook = write_playbook(tmp_path, FATAL_PER_REPLICA.replace("vllm_master", "all")
                              .replace("FAILING", "lone"))
    runner, _ = run(inventory, playbook)
    assert runner.outcome.aborted
    assert statuses(runner, "Later everywhere") == {}


def test_fatal_scope_needs_any_errors_fatal_and_a_known_value(tmp_path: Path) -> None:
    without = write_playbook(tmp_path, "- hosts: all\n  fatal_scope: replica\n  tasks: []\n")
    with pytest.raises(ProvisionError, match="fatal_scope only narrows any_errors_fatal"):
        load_playbook(without)
    wrong = write_playbook(tmp_path, "- hosts: all\n  any_errors_fatal: true\n"
                                     "  fatal_scope: cluster\n  tasks: []\n", "wrong.yml")
    with pytest.raises(ProvisionError, match="invalid fatal scope"):
        load_playbook(wrong)


def test_the_shipped_up_and_restart_scope_readiness_to_the_replica() -> None:
    from vllm_provision import resources

    for name in ("up", "restart"):
        [play] = [p for p in load_playbook(resources.playbook(name))
                  if any(t.module == "vllm_wait_ready" for t in p.tasks)]
        assert play.any_errors_fatal and play.fatal_scope == "replica"


# -- up: one result per replica ----------------------------------------------------------------

def test_up_reports_one_result_per_replica(tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path, {"good": ("h1",), "bad": ("h2",)}, tp={"bad": 8})
    finding = {"check": "topology.gpus", "severity": "error", "host": "h2", "replica": "bad",
               "item": "GPUs on the node", "expected": ">= 8", "actual": "4", "fix": "",
               "source": ""}
    results = [
        TaskResult("h1", "Gather facts and run the preflight checks", Status.OK,
                   data={"replica": "good", "errors": 0, "findings": []},
                   register="vllm_preflight"),
        TaskResult("h2", "Gather facts and run the preflight checks", Status.FAILED,
                   "preflight of replica bad found 1 error(s)",
                   data={"replica": "bad", "errors": 1, "findings": [finding]},
                   register="vllm_preflight"),
        TaskResult("h1", "Wait until rank 0 serves the model", Status.OK,
                   data={"start_to_serving_s": 5.2, "served_model": "m"}, register="vllm_ready"),
        TaskResult("h1", "Send one completion and compare the running vLLM version",
                   Status.OK, data={"completion": " hello", "ttft_s": 0.05},
                   register="vllm_verified"),
    ]
    good, bad = replica_results(inventory, results, ["h1", "h2"])
    assert (good["name"], good["served"], good["failed"]) == ("good", True, False)
    assert (good["completion"], good["start_to_serving_s"]) == (" hello", 5.2)
    assert (bad["name"], bad["served"], bad["failed"]) == ("bad", False, True)
    assert bad["failed_findings"] == [finding]
    assert "completion" not in bad and bad["failures"][0]["host"] == "h2"
    lines = replica_lines([good, bad])
    assert lines[0].startswith("replica good: served; completion from m: ' hello'")
    assert lines[2] == "replica bad: FAILED"
    assert "topology.gpus on h2: GPUs on the node: expected >= 8, got 4" in lines[3]
    # a failure after the completion (a follower's watchdog release) fails it, yet it served
    later = TaskResult("h1", "Wait until the watchdog is released and bound to its peers",
                       Status.FAILED, "timed out")
    [good] = replica_results(inventory, results + [later], ["h1"])
    assert (good["served"], good["failed"]) == (True, True)
    failed_completion = replace(results[3], status=Status.FAILED)
    [good] = replica_results(inventory, results[:3] + [failed_completion], ["h1"])
    assert not good["served"]
    # a replica the run did not target (--limit) is left out
    assert [r["name"] for r in replica_results(inventory, results[:1], ["h1"])] == ["good"]
