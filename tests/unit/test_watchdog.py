"""The peer watchdog (role vllm_watchdog): its decisions, its parsers, its rendered config/unit.

The decisions are checked as the sequences of polls the lab measured (docs/recovery.md): a
follower killed, rank 0 killed, a peer unreachable, a Ray head restarted; and that two nodes
applying the rules to each other converge instead of restarting each other in turn.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest
import yaml

from vllm_provision import quoting
from vllm_provision.models import EngineArgs, Host, Node, Replica

ROLE = Path(__file__).resolve().parents[2] / "roles" / "vllm_watchdog"
SCRIPT = ROLE / "templates" / "vllm_watchdog.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_watchdog_script", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


wd = _load_script()
SETTINGS = wd.Settings(poll_s=1.0, grace_s=5.0, slack_s=2.0)
MUTUAL = wd.Rule("vllm.service", "h2", "vllm.service", True)
ONE_WAY = wd.Rule("ray-worker.service", "h1", "ray-head.service", False)


def view(invocation: str, age_s: float, active: str = "active", sub: str = "running",
         unit: str = "vllm.service") -> Any:
    return wd.UnitView(unit=unit, invocation=invocation, active=active, sub=sub, age_s=age_s)


def decide(rule: Any = MUTUAL, local: Any = None, peer: Any = None, bound_me: bool = False,
           bound: Any = None, missing_s: float = 0.0) -> Any:
    return wd.decide(rule, local, peer, bound_me, bound, missing_s, SETTINGS)


# --- decisions ----------------------------------------------------------------------------------

def test_a_unit_that_does_not_run_is_never_restarted_nor_bound() -> None:
    for local in (None, view("a", 10, "inactive", "dead"), view("a", 10, "activating",
                                                                   "auto-restart")):
        decision = decide(local=local, peer=view("x", 1))
        assert decision.action == "wait" and decision.binding is None


def test_mutual_binds_a_younger_peer_and_waits_for_an_older_one() -> None:
    younger = decide(local=view("a", 30), peer=view("x", 10))
    assert younger.action == "bind" and younger.binding.peer_invocation == "x"
    older = decide(local=view("a", 10), peer=view("x", 30))
    assert older.action == "wait" and older.binding is None


def test_mutual_binds_an_older_peer_that_already_bound_this_invocation() -> None:
    decision = decide(local=view("a", 10), peer=view("x", 30), bound_me=True)
    assert decision.action == "bind" and decision.binding.invocation == "a"


def test_ages_within_the_slack_count_as_started_together() -> None:
    assert decide(local=view("a", 10), peer=view("x", 11.5)).action == "bind"
    assert decide(local=view("a", 10), peer=view("x", 12.5)).action == "wait"


def test_a_bound_peer_that_restarted_or_stopped_restarts_this_unit() -> None:
    bound = wd.Binding("vllm.service", "a", "h2", "vllm.service", "x")
    assert decide(local=view("a", 50), peer=view("x", 40), bound=bound).action == "keep"
    restarted = decide(local=view("a", 50), peer=view("y", 1), bound=bound)
    assert restarted.action == "restart" and "restarted" in restarted.reason
    # kill -9 of the headless main process: the unit waits for its SIGTERM-deaf worker.
    dying = decide(local=view("a", 50), peer=view("x", 40, "deactivating", "stop-sigterm"),
                   bound=bound)
    assert dying.action == "restart" and "deactivating" in dying.reason


def test_an_unreachable_peer_is_tolerated_for_the_grace_period_only() -> None:
    bound = wd.Binding("vllm.service", "a", "h2", "vllm.service", "x")
    assert decide(local=view("a", 50), bound=bound, missing_s=4.0).action == "keep"
    late = decide(local=view("a", 50), bound=bound, missing_s=5.0)
    assert late.action == "restart" and "not answered" in late.reason


def test_a_binding_of_an_earlier_local_invocation_is_forgotten() -> None:
    stale = wd.Binding("vllm.service", "old", "h2", "vllm.service", "x")
    decision = decide(local=view("new", 5), peer=view("y", 1), bound=stale)
    assert decision.action == "bind" and decision.binding.invocation == "new"


def test_one_way_binds_an_older_dependency_and_restarts_after_a_newer_one() -> None:
    older = decide(ONE_WAY, local=view("w", 10, unit="ray-worker.service"),
                   peer=view("h", 40, unit="ray-head.service"))
    assert older.action == "bind"
    newer = decide(ONE_WAY, local=view("w", 40, unit="ray-worker.service"),
                   peer=view("h", 3, unit="ray-head.service"))
    assert newer.action == "restart" and "started after" in newer.reason


class Pair:
    """Two nodes applying the mutual rule to each other, poll by poll (same clock)."""

    def __init__(self) -> None:
        self.units = {"h1": ["a1", 100.0], "h2": ["b1", 100.0]}
        self.bindings: dict[str, Any] = {}
        self.restarts: list[str] = []

    def restart(self, node: str, new_invocation: str) -> None:
        self.units[node] = [new_invocation, 0.0]

    def poll(self) -> None:
        decisions = {}
        for me, other in (("h1", "h2"), ("h2", "h1")):
            rule = wd.Rule("vllm.service", other, "vllm.service", True)
            mine, theirs = self.units[me], self.units[other]
            their_binding = self.bindings.get(other)
            bound_me = bool(their_binding and their_binding.peer_invocation == mine[0]
                            and their_binding.invocation == theirs[0])
            decisions[me] = wd.decide(rule, view(mine[0], mine[1]), view(theirs[0], theirs[1]),
                                      bound_me, self.bindings.get(me), 0.0, SETTINGS)
        for me, decision in decisions.items():
            self.bindings[me] = decision.binding
            if decision.action == "restart":
                self.restarts.append(me)
                self.restart(me, self.units[me][0] + "'")
        for unit in self.units.values():
            unit[1] += 1.0


def test_two_nodes_converge_after_one_restart_without_ping_pong() -> None:
    pair = Pair()
    for _ in range(3):
        pair.poll()
    assert pair.bindings["h1"] and pair.bindings["h2"] and not pair.restarts
    pair.restart("h2", "b2")  # systemd restarted the follower (crash + Restart=always)
    for _ in range(20):
        pair.poll()
    assert pair.restarts == ["h1"], "exactly one restart of the other node"
    assert pair.bindings["h1"].peer_invocation == "b2"
    assert pair.bindings["h2"].peer_invocation == pair.units["h1"][0]


# --- parsers and hold ---------------------------------------------------------------------------

def test_parse_show_computes_ages_from_the_monotonic_start() -> None:
    text = ("Id=vllm.service\nInvocationID=abc\nActiveState=active\nSubState=running\n"
            "MainPID=42\nExecMainStartTimestampMonotonic=90000000\n\n"
            "Id=ray-head.service\nInvocationID=\nActiveState=inactive\nSubState=dead\n"
            "MainPID=0\nExecMainStartTimestampMonotonic=0\n")
    views = wd.parse_show(text, now_monotonic_s=100.0)
    assert views["vllm.service"].age_s == pytest.approx(10.0)
    assert views["vllm.service"].running and views["vllm.service"].main_pid == 42
    assert views["ray-head.service"].age_s == -1.0 and not views["ray-head.service"].running


def test_hold_file_counts_only_until_its_deadline(tmp_path: Path) -> None:
    hold = tmp_path / "watchdog.hold"
    assert wd.held_until(str(hold), 1000.0) is None
    hold.write_text("1500\n")
    assert wd.held_until(str(hold), 1000.0) == 1500.0
    assert wd.held_until(str(hold), 2000.0) is None
    hold.write_text("garbage")
    assert wd.held_until(str(hold), 1000.0) is None


# --- rendered files -----------------------------------------------------------------------------

def _replica(backend: str, nodes: int = 3) -> Replica:
    hosts = [Host(name=f"h{i}", address=f"10.213.6.{10 + i}") for i in range(1, nodes + 1)]
    return Replica(name="llama", backend=backend,  # type: ignore[arg-type]
                   nodes=tuple(Node(host=h, rank=i, host_ip=h.address)
                               for i, h in enumerate(hosts)),
                   engine=EngineArgs(model="/srv/models/m", tensor_parallel_size=2,
                                     pipeline_parallel_size=nodes))


def render(name: str, replica: Replica, rank: int) -> str:
    roles = ["vllm_common", *(["vllm_mp"] if replica.backend == "mp" else ["ray", "vllm_ray"]),
             "vllm_watchdog"]
    values: dict[str, Any] = {}
    for role in roles:
        values.update(yaml.safe_load((ROLE.parent / role / "defaults" / "main.yml").read_text()))
    values |= {"vllm_venv": "/opt/vllm", "replica": replica, "node": replica.nodes[rank]}
    for _ in range(3):  # defaults refer to other variables
        values = {k: jinja2.Template(v).render(values) if isinstance(v, str) and "{{" in v else v
                  for k, v in values.items()}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["systemd_exec_quote"] = quoting.systemd_exec_quote
    return env.from_string((ROLE / "templates" / name).read_text()).render(values)


def test_mp_config_makes_every_node_depend_on_every_other_node_both_ways() -> None:
    replica = _replica("mp")
    configs = [json.loads(render("watchdog.json.j2", replica, r)) for r in range(3)]
    for rank, config in enumerate(configs):
        assert config["units"] == ["vllm.service"]
        assert {r["peer"] for r in config["rules"]} == {f"h{i}" for i in (1, 2, 3)} - {
            f"h{rank + 1}"}
        assert all(r["mutual"] for r in config["rules"])
        assert config["listen_host"] == replica.nodes[rank].host_ip
        assert set(config["peers"]) == {r["peer"] for r in config["rules"]}
    assert configs[0]["peers"]["h2"] == "10.213.6.12:29510"


def test_ray_config_makes_vllm_and_workers_depend_on_the_head_one_way() -> None:
    replica = _replica("ray", nodes=2)
    head = json.loads(render("watchdog.json.j2", replica, 0))
    worker = json.loads(render("watchdog.json.j2", replica, 1))
    assert head["rules"] == [{"unit": "vllm.service", "peer": "h1",
                              "peer_unit": "ray-head.service", "mutual": False}]
    assert worker["rules"] == [{"unit": "ray-worker.service", "peer": "h1",
                                "peer_unit": "ray-head.service", "mutual": False}]
    assert head["units"] == ["ray-head.service", "vllm.service"]


def test_watchdog_unit_is_enabled_ordered_after_its_units_and_never_gives_up() -> None:
    unit = render("vllm-watchdog.service.j2", _replica("ray", nodes=2), 0)
    assert "Before=ray-head.service vllm.service" in unit  # stop after them: peers see it at once
    assert "StartLimitIntervalSec=0" in unit and "Restart=always" in unit
    assert "WantedBy=multi-user.target" in unit
    assert "ExecStart=/opt/vllm/bin/python3 /usr/local/lib/vllm-provision/vllm_watchdog.py " \
           "/etc/vllm-provision/watchdog.json" in unit


def test_the_installed_script_is_the_file_itself() -> None:
    source = SCRIPT.read_text()
    rendered = jinja2.Environment(keep_trailing_newline=True).from_string(source).render()
    assert rendered.splitlines()[0] == "#!/usr/bin/python3"
    assert "def decide(" in rendered and "{% raw %}" not in rendered
    compile(rendered, "vllm_watchdog.py", "exec")
