"""`provision status` additions: last failure per unit, watchdog state, whole replica, verdict."""

from __future__ import annotations

import json
import subprocess

from vllm_provision.state.recovery import (
    NodeRecovery,
    describe_probe,
    node_command,
    parse_node,
    replica_whole,
)
from vllm_provision.transport.api import UnitState, verdict

SAMPLE = (
    "== vllm-provision unit vllm.service\n"
    "1764400000.250000 h1 systemd[1]: vllm.service: Failed with result 'exit-code'.\n"
    "1764410050.000000 h1 systemd[1]: vllm.service: Main process exited, code=killed, "
    "status=9/KILL\n"
    "== vllm-provision unit vllm-watchdog.service\n"
    "-- No entries --\n"
    "== vllm-provision watchdog active 1764410100\n"
    + json.dumps({"node": "h1", "held_until": None, "whole": True, "bindings": [{}],
                  "time": 1764410096.5}) + "\n")


def test_parse_node_reads_the_last_failure_and_the_watchdog_state() -> None:
    node = parse_node(SAMPLE)
    assert "status=9/KILL" in node.last_failure["vllm.service"]
    assert node.last_failure["vllm-watchdog.service"] == ""
    assert node.whole is True and node.watchdog and node.watchdog["node"] == "h1"


def test_parse_node_without_watchdog_or_with_garbage_knows_nothing() -> None:
    assert parse_node("== vllm-provision watchdog\n").whole is None
    assert parse_node("== vllm-provision watchdog\n{not json\n").watchdog is None
    assert parse_node("").last_failure == {}


def test_node_command_is_valid_shell_and_names_every_unit() -> None:
    command = node_command(["ray-head.service", "vllm.service"])
    assert subprocess.run(["sh", "-n", "-c", command], check=False).returncode == 0
    for unit in ("ray-head.service", "vllm.service", "vllm-watchdog.service"):
        assert f"unit {unit}" in command


def test_replica_whole_needs_every_watchdog_and_every_ray_node() -> None:
    bound, unbound = NodeRecovery(watchdog={"whole": True}), NodeRecovery(watchdog={"whole": 0})
    assert replica_whole({"h1": bound, "h2": bound}) is True
    assert replica_whole({"h1": bound, "h2": unbound}) is False
    assert replica_whole({"h1": NodeRecovery(), "h2": NodeRecovery()}) is None
    assert replica_whole({"h1": bound}, ray_alive=1, nnodes=2) is False
    assert replica_whole({"h1": NodeRecovery()}, ray_alive=2, nnodes=2) is True


def test_verdict_is_degraded_when_the_replica_is_known_not_whole() -> None:
    states = [UnitState("h1", "vllm.service", active_state="active", sub_state="running"),
              UnitState("h2", "vllm.service", active_state="active", sub_state="running")]
    assert verdict(states, 200, 2) == "serving"
    assert verdict(states, 200, 2, whole=None) == "serving"
    assert verdict(states, 200, 2, whole=False) == "degraded"


PROBE = {"enabled": True, "unit": "vllm.service", "armed": True, "waiting": "", "in_flight": False,
         "last_result": "ok", "last_detail": "HTTP 200", "age_s": 12.4,
         "consecutive_failures": 0, "failures_to_restart": 3, "restarts": 1}


def test_describe_probe_says_last_result_age_failures_and_restarts() -> None:
    assert describe_probe(PROBE) == "ok 12 s ago, 0/3 failures, 1 restart by the probe"
    failing = {**PROBE, "last_result": "failure", "last_detail": "no answer within 60 s",
               "consecutive_failures": 2, "restarts": 0}
    assert describe_probe(failing) == ("failure 12 s ago (no answer within 60 s), 2/3 failures, "
                                       "0 restarts by the probe")
    held = {**PROBE, "last_result": None, "waiting": "the watchdog is held"}
    assert describe_probe(held) == ("no completion yet, 0/3 failures, 1 restart by the probe; "
                                    "not probing: the watchdog is held")


def test_describe_probe_of_a_node_without_probe_or_with_it_disabled() -> None:
    assert describe_probe(None) is None
    assert describe_probe({"enabled": False, "unit": "vllm.service"}) == "disabled"


def test_a_stopped_watchdog_s_leftover_file_is_not_read() -> None:
    left = SAMPLE.replace("watchdog active", "watchdog inactive")
    node = parse_node(left)
    assert node.watchdog is None and node.whole is None and node.watchdog_running is False


def test_watchdog_state_has_its_age_from_the_host_clock() -> None:
    node = parse_node(SAMPLE)
    assert node.watchdog_running is True and node.watchdog_age_s == 3.5
    assert describe_probe(PROBE, since_written_s=3.5) == (
        "ok 16 s ago, 0/3 failures, 1 restart by the probe")


def test_last_failure_is_scoped_to_the_current_deployment() -> None:
    node = parse_node(SAMPLE)
    current, older = node.failures_since("vllm.service", since=1764410000.0)
    assert current.startswith("2025-11-29T") and "status=9/KILL" in current
    assert len(older) == 1 and "exit-code" in older[0]
    # a deployment after both failures: none is current, both are history
    current, older = node.failures_since("vllm.service", since=1764410060.0)
    assert current == "" and len(older) == 2
    assert "status=9/KILL" in node.failures_since("vllm.service", since=None)[0]
