"""The Ray part of the peer watchdog and of the Ray units: the GCS node table, the worker's
decision, vLLM's start gate, the health-check bound, ``ray_env`` and the compiled-graph
settings (docs/recovery.md, "Ray: what the GCS knows" and "Compiled graphs")."""

from __future__ import annotations

import shlex
from types import SimpleNamespace
from typing import Any

import pytest
from test_templates import _replica, env_values, render
from test_watchdog_rules import rules
from vllm_provision_lab.gpu.guest.vllm_lab_standin import ray_engine

from vllm_provision.backends.ray import RayBackend, health_check_bound_s, ray_environment
from vllm_provision.settings import kinds

WORKER = "ray-worker.service"


def _info(node_id: bytes, ip: str, state: int, gpus: float = 4, reason: str = "",
          start_ms: int = 0) -> Any:
    return SimpleNamespace(node_id=node_id, node_manager_address=ip, state=state,
                           resources_total={"GPU": gpus, "CPU": 2.0},
                           death_info=SimpleNamespace(reason_message=reason),
                           start_time_ms=start_ms)


def test_node_table_reads_ray_gcs_node_info() -> None:
    rows = rules.node_table({"a": _info(b"\x01\x02", "10.0.0.1", 0, start_ms=1500),
                          "b": _info(b"\xff", "10.0.0.2", 1, 0, "health check failed")})
    assert rows == [{"id": "0102", "ip": "10.0.0.1", "alive": True, "gpus": 4.0, "reason": "",
                     "started_s": 1.5},
                    {"id": "ff", "ip": "10.0.0.2", "alive": False, "gpus": 0.0,
                     "reason": "health check failed", "started_s": 0.0}]


def test_cluster_gaps_need_every_node_alive_and_the_world_size_in_gpus() -> None:
    alive = [{"ip": "10.0.0.1", "alive": True, "gpus": 4}, {"ip": "10.0.0.2", "alive": True,
                                                             "gpus": 4}]
    assert rules.cluster_gaps(alive, ["10.0.0.1", "10.0.0.2"], 8) == []
    old_dead = [*alive[:1], {"ip": "10.0.0.2", "alive": False, "gpus": 4}]
    assert rules.cluster_gaps(old_dead, ["10.0.0.1", "10.0.0.2"], 8) == [
        "node 10.0.0.2 is not alive in Ray", "4 GPUs alive in Ray, vLLM needs 8"]
    assert rules.cluster_gaps(alive + [{"ip": "10.0.0.9", "alive": True, "gpus": 8}],
                           ["10.0.0.1", "10.0.0.2"], 12) == ["8 GPUs alive in Ray, vLLM needs 12"]


def test_the_gate_waits_out_a_restarted_workers_old_raylet_then_lets_the_new_one_settle() -> None:
    """The sequence a SIGKILL of a worker's raylet gives (Ray 2.60 on the lab, docs/recovery.md):
    the old node alone, still alive; old and new both alive; the new one alone."""
    ips = ["10.0.0.1", "10.0.0.2"]
    head = {"ip": "10.0.0.1", "alive": True, "gpus": 4, "started_s": 100.0}
    old = {"ip": "10.0.0.2", "alive": True, "gpus": 4, "started_s": 110.0}
    new = {"ip": "10.0.0.2", "alive": True, "gpus": 4, "started_s": 207.0}
    starts = {"10.0.0.2": 205.0}  # the worker unit's ExecStartPre, before its new raylet
    # the old raylet alone: its unit restarted after it registered, so it is the old one
    assert rules.cluster_gaps([head, old], ips, 8, starts=starts, now_s=206.0) == [
        "node 10.0.0.2's Ray worker is restarting: the alive node is its old raylet, which Ray "
        "has not yet declared dead"]
    # without the mark (a head that did not answer the worker) the table alone cannot tell
    assert rules.cluster_gaps([head, old], ips, 8, now_s=206.0) == []
    both = rules.cluster_gaps([head, old, new], ips, 8, starts=starts, now_s=208.0)
    assert both == ["node 10.0.0.2 has 2 alive Ray nodes: its raylet restarted and Ray has not "
                    "yet declared the old one dead"]
    dead_old = {**old, "alive": False}
    assert rules.cluster_gaps([head, dead_old, new], ips, 8, starts=starts, now_s=208.5) == [
        "node 10.0.0.2 joined Ray 1.5 s ago; letting it settle 3 s"]
    assert rules.cluster_gaps([head, dead_old, new], ips, 8, starts=starts, now_s=210.0) == []
    # a worker clock ahead of the head's never blocks the gate; no start time (older Ray) either
    assert rules.cluster_gaps([head, new], ips, 8, now_s=150.0) == []
    assert rules.cluster_gaps([head, {**new, "started_s": 0.0}], ips, 8, starts=starts,
                              now_s=207.0) == []


def test_raylet_node_ids_come_from_the_raylet_argv_only() -> None:
    cmdlines = [["/opt/vllm/lib/ray/core/src/ray/raylet/raylet", "--node_ip_address=10.0.0.2",
                 "--node_id=abc123"],
                ["/opt/vllm/bin/python3", "agent.py", "--node-id=zzz", "--node_id=not-a-raylet"],
                ["raylet", "--node_id="], []]
    assert rules.raylet_node_ids(cmdlines) == {"abc123"}


def _worker(invocation: str = "w1", sub: str = "running") -> Any:
    return rules.UnitView(unit=WORKER, invocation=invocation, active="active", sub=sub, age_s=30)


def test_a_worker_restarts_when_the_gcs_reports_its_raylet_dead() -> None:
    table = [{"id": "old", "ip": "10.0.0.2", "alive": False, "reason": "missed heartbeats"},
             {"id": "mine", "ip": "10.0.0.2", "alive": True}]
    assert rules.decide_ray_worker(_worker(), {"mine"}, table, 0, 65).action == "keep"
    table[1]["alive"] = False
    decision = rules.decide_ray_worker(_worker(), {"mine"}, table, 0, 65)
    assert decision.action == "restart" and "dead" in decision.reason
    # a raylet the GCS does not know yet (registering) is not dead; nor is an unknown table
    assert rules.decide_ray_worker(_worker(), {"new"}, table, 0, 65).action == "keep"
    assert rules.decide_ray_worker(_worker(), {"mine"}, None, 0, 65).action == "keep"


def test_a_worker_restarts_when_the_gcs_stays_unreachable_for_the_bound() -> None:
    assert rules.decide_ray_worker(_worker(), set(), None, 64.0, 65).action == "keep"
    decision = rules.decide_ray_worker(_worker(), set(), None, 65.0, 65)
    assert decision.action == "restart" and "65 s" in decision.reason


def test_a_stopped_or_restarting_worker_is_left_alone() -> None:
    dead = [{"id": "mine", "ip": "10.0.0.2", "alive": False}]
    for local in (None, _worker(sub="auto-restart")):
        assert rules.decide_ray_worker(local, {"mine"}, dead, 999, 65).action == "wait"


def test_a_rule_grace_overrides_the_watchdog_grace() -> None:
    rule = rules.Rule(WORKER, "h1", "ray-head.service", False, grace_s=65.0)
    bound = rules.Binding(WORKER, "w1", "h1", "ray-head.service", "h")
    settings = rules.Settings(grace_s=5.0)
    assert rules.decide(rule, _worker(), None, False, bound, 10.0, settings).action == "keep"
    assert rules.decide(rule, _worker(), None, False, bound, 65.0, settings).action == "restart"


def test_health_check_bound_follows_ray_defaults_and_ray_env() -> None:
    assert health_check_bound_s({}) == 65.0  # 5 x (10 s + 3 s), ray_config_def.h
    fast = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": 2000,
            "RAY_health_check_failure_threshold": "3"}
    assert health_check_bound_s(fast) == 9.0
    assert health_check_bound_s({"RAY_health_check_period_ms": "soon"}) == 65.0
    merged = ray_environment({"vllm_env": {"A": "1", "B": "1"}, "ray_env": {"B": "2", "C": "2"},
                              "vllm_node_env": {"C": "3"}})
    assert merged == {"A": "1", "B": "2", "C": "3"}


def test_vllm_on_ray_waits_for_every_node_before_it_starts() -> None:
    replica = _replica("ray")
    unit = render("vllm_ray/templates/vllm.service.j2", replica, 0)
    line = next(x for x in unit.splitlines() if x.startswith("ExecStartPre="))
    words = shlex.split(line.removeprefix("ExecStartPre="))
    assert words == ["/opt/vllm/bin/python3", "/usr/local/lib/vllm-provision/vllm_watchdog.py",
                     "--wait-ray-cluster", "10.213.6.11:6379", "300", "8", "10.213.6.11",
                     "10.213.6.12"]
    assert RayBackend().start_gate_argv(replica, "120.0")[2] == "120"


def test_vllm_on_ray_restarts_the_ray_head_as_root_only_when_the_gate_left_its_marker(
        tmp_path: Any) -> None:
    """The gate's marker (rules.RAY_STUCK_MARKER) restarts the head once; no marker (every other
    stop of vLLM: down, restart, a crash) changes nothing. The shell runs here with a stand-in
    systemctl that records its arguments."""
    import os
    import subprocess

    unit = render("vllm_ray/templates/vllm.service.j2", _replica("ray"), 0)
    line = next(x for x in unit.splitlines() if x.startswith("ExecStopPost="))
    assert line.startswith("ExecStopPost=+/bin/sh "), line  # "+": as root, whatever User= says
    words = [w.replace("$$", "$") for w in shlex.split(line.removeprefix("ExecStopPost=+"))]
    assert words[3:] == ["sh", rules.RAY_STUCK_MARKER, "ray-head.service"]
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "systemctl"
    fake.write_text('#!/bin/sh\necho "$@" >> "$CALLS"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "CALLS": str(tmp_path / "calls")}
    for marker in (False, True, False):
        if marker:
            (tmp_path / rules.RAY_STUCK_MARKER).write_text("gave up: ...\n")
        done = subprocess.run(words, cwd=tmp_path, env=env, check=False)
        assert done.returncode == 0 and not (tmp_path / rules.RAY_STUCK_MARKER).exists()
    assert (tmp_path / "calls").read_text() == "restart --no-block -- ray-head.service\n"


def test_compiled_graph_timeouts_are_rendered_for_pipeline_parallel_only() -> None:
    pp = env_values(render("vllm_ray/templates/vllm.env.j2", _replica("ray"), 0))
    assert pp["RAY_CGRAPH_get_timeout"] == "600" and pp["RAY_CGRAPH_submit_timeout"] == "600"
    tp_only = env_values(render("vllm_ray/templates/vllm.env.j2",
                                _replica("ray", pipeline_parallel_size=1), 0))
    assert "RAY_CGRAPH_get_timeout" not in tp_only
    override = env_values(render("vllm_ray/templates/vllm.env.j2", _replica("ray"), 0,
                                 ray_cgraph_get_timeout_s=30,
                                 vllm_env={"RAY_CGRAPH_submit_timeout": "45"}))
    assert override["RAY_CGRAPH_get_timeout"] == "30"
    assert override["RAY_CGRAPH_submit_timeout"] == "45"  # vllm_env wins


def test_ray_env_reaches_the_ray_units_only_after_vllm_env() -> None:
    extra = {"vllm_env": {"X": "1"}, "ray_env": {"X": "2", "RAY_health_check_period_ms": "1000"}}
    ray_env = env_values(render("ray/templates/ray.env.j2", _replica("ray"), 1, **extra))
    assert ray_env["X"] == "2" and ray_env["RAY_health_check_period_ms"] == "1000"
    vllm_env = env_values(render("vllm_ray/templates/vllm.env.j2", _replica("ray"), 0, **extra))
    assert vllm_env["X"] == "1" and "RAY_health_check_period_ms" not in vllm_env


@pytest.mark.parametrize(("value", "ok"), [(1, True), (600, True), (2.0, True), (0, False),
                                           (2.5, False), (True, False), ("10", False)])
def test_compiled_graph_timeouts_are_whole_seconds(value: Any, ok: bool) -> None:
    assert (kinds.check("ray_cgraph_get_timeout_s", value) is None) is ok


def test_standin_reads_the_compiled_graph_timeout_and_stage_time(monkeypatch: Any) -> None:
    monkeypatch.delenv("RAY_CGRAPH_get_timeout", raising=False)
    monkeypatch.delenv("VLLM_LAB_STAGE_S", raising=False)
    assert ray_engine.cgraph_get_timeout_s() == 300  # vLLM's own default (vllm #15301)
    assert ray_engine.stage_s({"stage_s": 1.5}) == 1.5
    monkeypatch.setenv("RAY_CGRAPH_get_timeout", "1")
    monkeypatch.setenv("VLLM_LAB_STAGE_S", "2")
    assert ray_engine.cgraph_get_timeout_s() == 1 and ray_engine.stage_s({"stage_s": 0}) == 2.0
