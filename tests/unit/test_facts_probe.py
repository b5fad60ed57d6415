"""The probe runs locally through one connection call and returns parseable facts."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import check_replica, settings_for
from vllm_provision.core.models import EngineArgs, Group, Host, Inventory, Node, Replica
from vllm_provision.facts.gather import (
    ProbeOptions,
    gather_facts,
    parse_probe_output,
    probe_command,
    probe_config,
)
from vllm_provision.transport.local import LocalConnection


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 holds now: a fixed one can be held by another test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


MASTER_PORT = free_port()


def make_inventory(tmp_path: Path) -> Inventory:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    venv = str(Path(sys.executable).parent.parent)
    hosts = {name: Host(name, "127.0.0.1", vars={"vllm_venv": venv, "vllm_service_user": "root"})
             for name in ("h1", "h2")}
    nodes = (Node(hosts["h1"], 0, "127.0.0.1"), Node(hosts["h2"], 1, "127.0.0.1"))
    replica = Replica("r", "mp", nodes, EngineArgs(model=str(model), master_port=MASTER_PORT))
    return Inventory(tmp_path / "inv.yml", hosts, {"all": Group("all", ("h1", "h2"))},
                     (replica,))


def test_probe_config_asks_master_to_listen_and_follower_to_connect(tmp_path):
    inventory = make_inventory(tmp_path)
    replica = inventory.replicas[0]
    master = probe_config(inventory.hosts["h1"], replica, ProbeOptions())
    follower = probe_config(inventory.hosts["h2"], replica, ProbeOptions())
    assert master["listen"]["port"] == MASTER_PORT and master["listen"]["expect"] == 1
    timeout = ProbeOptions().reach_timeout_s
    # the rendezvous first, then the peer's API and watchdog ports
    assert follower["connect"] == [{"address": "127.0.0.1", "port": port, "timeout_s": timeout}
                                   for port in (MASTER_PORT, 8000, 29510)]
    assert [(x["port"], x["expect"]) for x in master["listens"]] == [(8000, 1), (29510, 1)]
    assert [x["port"] for x in follower["listens"]] == [29510]
    assert [x["port"] for x in master["connect"]] == [29510]
    quiet = probe_config(inventory.hosts["h2"], replica, ProbeOptions(reachability=False))
    assert "listen" not in quiet and "listens" not in quiet and "connect" not in quiet


def test_probe_command_falls_back_to_python3_when_the_venv_is_missing():
    command = probe_command("/nonexistent/venv", {"packages": []})
    conn = LocalConnection()
    from vllm_provision.facts.gather import probe_source

    result = conn.run(command, stdin=probe_source())
    raw = json.loads(result.stdout)
    assert raw["venv_found"] is False


def test_gather_facts_is_one_call_per_host_and_proves_reachability(tmp_path):
    inventory = make_inventory(tmp_path)
    connections = {"h1": LocalConnection("h1"), "h2": LocalConnection("h2")}
    facts, errors = gather_facts(inventory, connections, ProbeOptions(reach_timeout_s=5))
    assert errors == {}
    assert [len(c.calls) for c in connections.values()] == [1, 1]
    assert facts["h1"].venv_found and facts["h1"].packages["vllm"] is None
    assert facts["h1"].python_micro == ".".join(map(str, sys.version_info[:3]))
    assert [f.name for f in facts["h1"].model_files or ()] == ["config.json"]
    assert facts["h1"].listener is not None and facts["h1"].listener.bound
    assert facts["h2"].reachability[0].ok
    assert not any(s.port == MASTER_PORT for s in facts["h1"].listening)  # the probe's own listener


@pytest.mark.skipif(shutil.which("ss") is None, reason="the probe lists sockets with ss")
def test_the_one_round_trip_finds_who_holds_the_watchdog_port(tmp_path):
    inventory = make_inventory(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        replica = replace(inventory.replicas[0], vars={"vllm_watchdog_port": port})
        connections = {"h1": LocalConnection("h1"), "h2": LocalConnection("h2")}
        facts, errors = gather_facts(inventory, connections, ProbeOptions(reachability=False))
    assert errors == {} and [len(c.calls) for c in connections.values()] == [1, 1]
    [held] = [s for s in facts["h2"].listening if s.port == port]
    assert held.pid == os.getpid()
    [finding] = [f for f in check_replica(replica, facts, settings_for(replica))
                 if f.host == "h2" and f.item == f"watchdog port {port}"]
    assert finding.severity is Severity.ERROR and f"pid {os.getpid()}" in finding.actual


def test_parse_probe_output_reports_missing_nvidia_smi():
    raw = {"nvidia_smi": {"query_gpu": {"rc": 127, "stdout": "",
                                        "stderr": "nvidia-smi: command not found"}}}
    facts = parse_probe_output("h1", raw)
    assert facts.nvidia_smi_error == "nvidia-smi: command not found" and facts.gpus == ()


def test_a_listener_that_exited_before_its_cgroup_was_read_holds_no_port():
    # ss listed two listeners; pid 41's /proc entry was gone when the probe read its cgroup
    # (null: a unit's old process during a restart), pid 42 is a foreign process in a session.
    ss = ('LISTEN 0 128 0.0.0.0:29501 0.0.0.0:* users:(("python",pid=41,fd=5))\n'
          'LISTEN 0 128 0.0.0.0:8000 0.0.0.0:* users:(("python",pid=42,fd=6))\n')
    raw = {"ss": {"rc": 0, "stdout": ss},
           "cgroups": {"41": None, "42": "0::/user.slice/user-0.slice/session-3.scope\n"}}
    facts = parse_probe_output("h1", raw)
    assert [(s.port, s.pid, s.unit) for s in facts.listening] == [(8000, 42, "session-3.scope")]


def test_the_facts_table_fits_80_columns_and_marks_differences_without_colour(tmp_path):
    import io

    from rich.console import Console

    from vllm_provision.cli.facts import all_rows, facts_table

    inventory = make_inventory(tmp_path)
    facts, errors = gather_facts(inventory, {"h1": LocalConnection("h1"),
                                             "h2": LocalConnection("h2")},
                                 ProbeOptions(reachability=False))
    assert not errors
    iface = next(name for name in facts["h2"].interfaces if name != "lo")
    changed = replace(facts["h2"].interfaces[iface], mtu=9000)
    facts["h2"] = replace(facts["h2"], interfaces={**facts["h2"].interfaces, iface: changed})
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(
        facts_table(facts, [["h1", "h2"]]))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    labels = [line.split("│")[1].strip() for line in lines if line.count("│") >= 3]
    for label, _read in all_rows():  # every fact name whole, on one line
        assert label in labels, label
    mtu = [line for line in lines if line.count("│") >= 3 and line.split("│")[1].strip() == "MTU"]
    assert mtu and mtu[0].count("* ") == 2, lines  # both hosts' MTU cells marked
    python = [line for line in lines
              if line.count("│") >= 3 and line.split("│")[1].strip() == "python"]
    assert python and "* " not in python[0]  # equal values are not marked


def test_the_probe_sent_in_the_run_lock_answer_parses_as_gather_facts_would(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from vllm_provision import resources
    from vllm_provision.operations import deploy
    from vllm_provision.runner.playbook import load_playbook

    inventory = make_inventory(tmp_path)
    hosts = list(inventory.hosts.values())
    assert deploy.first_probe(inventory, load_playbook(resources.playbook("down")), hosts) is None
    probe = deploy.first_probe(inventory, load_playbook(resources.playbook("up")), hosts)
    assert probe is not None and set(probe.commands) == {"h1", "h2"}
    # the commands read no standard input: the lock's holder runs them with </dev/null
    # (at once, as the lock sends them: each node's reachability test waits for the other)
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = dict(pool.map(lambda item: (item[0], LocalConnection(item[0]).run(
            item[1] + " </dev/null").stdout), probe.commands.items()))
    facts = probe.facts(inventory, {**outputs, "h2": "Traceback: no JSON"})
    assert set(facts) == {"h1"}  # h2's answer was not facts: preflight probes it again
    assert facts["h1"].venv_found and facts["h1"].model_path == str(tmp_path / "model")


def test_a_state_record_the_probe_could_not_read_is_one_of_the_hosts_problems():
    from vllm_provision.facts.gather import parse_probe_output

    error = "cannot read /var/lib/vllm-provision/state.json: Permission denied"
    facts = parse_probe_output("h1", {"state": {"error": error}})
    assert error in facts.problems and facts.owner is None
    facts = parse_probe_output("h1", {"state": {"record": {"version": 1}}})
    assert "the state record has no hosts" in facts.problems and facts.owner is None
