"""`provision status` with a node it cannot reach: reported as `unreachable`, never an abort."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_runner_support import make_inventory

from vllm_provision.cli import status
from vllm_provision.cli.options import CommonOptions
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.transport import connection
from vllm_provision.transport.api import Endpoint
from vllm_provision.transport.base import CommandResult, UnreachableError

REFUSED = "cannot connect to 10.0.0.12:22: [Errno 111] Connection refused"
PROBE = {"enabled": True, "unit": "vllm.service", "armed": True, "waiting": "",
         "last_result": "failure", "last_detail": "no answer within 60 s", "age_s": 3.0,
         "consecutive_failures": 1, "failures_to_restart": 3, "restarts": 0}


def _show(unit: str, active: bool) -> str:
    state = ("ActiveState=active\nSubState=running\nMainPID=42" if active
             else "ActiveState=inactive\nSubState=dead\nMainPID=0")
    return (f"Id={unit}\nLoadState=loaded\n{state}\nResult=success\nNRestarts=0\n"
            "ExecMainStartTimestamp=@1764410000\nExecMainStatus=0\n\n")


class FakeNode:
    """A connection that answers status's one round trip: ``systemctl show`` and the watchdog.

    ``error`` makes ``open`` (``on="open"``) or every ``run`` (``on="run"``) raise it.
    """

    def __init__(self, name: str, units: tuple[str, ...] = ("vllm.service",), *,
                 active: bool = True, error: str | None = None, on: str = "open") -> None:
        self.name = name
        self.units = units
        self.active = active
        self.error = error
        self.on = on
        self.closed = False

    def open(self) -> None:
        if self.error and self.on == "open":
            raise UnreachableError.single(self.name, self.error, fix="check that the host is up")

    def close(self) -> None:
        self.closed = True

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        if self.error and self.on == "run":
            raise UnreachableError.single(self.name, self.error)
        probe = PROBE if self.name == "h1" else None
        watchdog = json.dumps({"node": self.name, "held_until": None, "whole": self.active,
                               "probe": probe, "time": 1764410098.0})
        # a stopped watchdog's file is left behind, but status never reads it then
        word = "active" if self.active else "inactive"
        text = ("".join(_show(u, self.active) for u in self.units) + "1764410100.0\n"
                "== vllm-provision unit vllm.service\n"
                f"== vllm-provision watchdog {word} 1764410100\n"
                + (watchdog + "\n" if self.active else ""))
        return CommandResult(0, text, "")


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    return make_inventory(tmp_path)


@pytest.fixture
def health(monkeypatch: pytest.MonkeyPatch) -> dict[str, int | None]:
    """Rank 0's /health answer, settable per test (200 unless changed)."""
    answer: dict[str, int | None] = {"status": 200}
    monkeypatch.setattr(Endpoint, "health", lambda self: answer["status"])
    return answer


def _ray(replica: Replica) -> Replica:
    return replace(replica, backend="ray")


# --- replica_status --------------------------------------------------------------------------

def test_an_unreachable_node_is_reported_with_its_reason_and_the_replica_is_not_whole(
        inventory: Inventory, health: dict[str, int | None]) -> None:
    (replica,) = inventory.replicas
    info = status.replica_status(replica, {"h1": FakeNode("h1")}, {},
                                 unreachable={"h2": f"h2: {REFUSED}"})
    assert info["unreachable"] == {"h2": f"h2: {REFUSED}"}
    assert {(u["host"], u["state"]) for u in info["units"]} == {
        ("h1", "active (running)"), ("h2", "unreachable")}
    assert info["whole"] is False
    assert info["verdict"] == "degraded"


def test_a_command_that_times_out_makes_its_node_unreachable_not_an_error(
        inventory: Inventory, health: dict[str, int | None]) -> None:
    (replica,) = inventory.replicas
    lost = "an operation on 10.0.0.12:22 timed out after 30 s; the connection is considered lost"
    nodes = {"h1": FakeNode("h1"), "h2": FakeNode("h2", error=lost, on="run")}
    info = status.replica_status(replica, nodes, {})
    assert info["unreachable"] == {"h2": f"h2: {lost}"}
    assert info["whole"] is False and info["verdict"] == "degraded"


def test_unreachable_rank0_without_an_answer_and_the_other_node_stopped_is_down(
        inventory: Inventory, health: dict[str, int | None]) -> None:
    (replica,) = inventory.replicas
    health["status"] = None
    info = status.replica_status(replica, {"h2": FakeNode("h2", active=False)}, {},
                                 unreachable={"h1": "h1: cannot connect to 10.0.0.11:22"})
    assert info["verdict"] == "down" and info["whole"] is False


def test_every_node_reachable_and_serving_reports_no_unreachable_node(
        inventory: Inventory, health: dict[str, int | None]) -> None:
    (replica,) = inventory.replicas
    info = status.replica_status(replica, {"h1": FakeNode("h1"), "h2": FakeNode("h2")}, {})
    assert info["unreachable"] == {}
    assert info["whole"] is True and info["verdict"] == "serving"


def test_ray_head_unreachable_is_named_instead_of_asking_its_cluster(
        inventory: Inventory, health: dict[str, int | None]) -> None:
    replica = _ray(inventory.replicas[0])
    info = status.replica_status(replica, {"h2": FakeNode("h2", ("ray-worker.service",))}, {},
                                 unreachable={"h1": "h1: cannot connect to 10.0.0.11:22"})
    assert info["ray"] == {"error": "h1: cannot connect to 10.0.0.11:22"}
    assert {(u["host"], u["unit"], u["state"]) for u in info["units"]} == {
        ("h1", "ray-head.service", "unreachable"), ("h1", "vllm.service", "unreachable"),
        ("h2", "ray-worker.service", "active (running)")}
    assert info["verdict"] == "degraded"


class LostDuringSnapshot(FakeNode):
    """A Ray head whose connection is lost after status read its units (at Ray's snapshot)."""

    def run(self, command: str, **kwargs: Any) -> CommandResult:
        if "RAY_USAGE_STATS_ENABLED=0" in command:  # Ray's snapshot, as the service user
            raise UnreachableError.single(self.name, "connection to 10.0.0.11:22 lost: closed")
        return super().run(command, **kwargs)


def test_ray_head_lost_at_the_snapshot_keeps_its_units_and_names_the_loss(
        inventory: Inventory, health: dict[str, int | None]) -> None:
    replica = _ray(inventory.replicas[0])
    nodes = {"h1": LostDuringSnapshot("h1", ("ray-head.service", "vllm.service")),
             "h2": FakeNode("h2", ("ray-worker.service",))}
    info = status.replica_status(replica, nodes, {})
    assert info["ray"] == {"error": "h1: connection to 10.0.0.11:22 lost: closed"}
    assert info["unreachable"] == {"h1": "h1: connection to 10.0.0.11:22 lost: closed"}
    assert ("h1", "active (running)") in {(u["host"], u["state"]) for u in info["units"]}
    assert info["whole"] is False and info["verdict"] == "degraded"


# --- the command -----------------------------------------------------------------------------

@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, inventory: Inventory,
            health: dict[str, int | None]) -> dict[str, FakeNode]:
    """The fake nodes ``provision status`` connects to (h2 refuses SSH unless changed)."""
    nodes = {"h1": FakeNode("h1"), "h2": FakeNode("h2", error=REFUSED)}
    monkeypatch.setattr(CommonOptions, "load_inventory", lambda self: inventory)
    monkeypatch.setattr(connection, "HostConnection",
                        lambda host, options=None: nodes[host.name])
    return nodes


def _status(*args: str) -> Any:
    return CliRunner().invoke(status.command, ["-i", "inventory.yml", *args])


def test_json_reports_the_unreachable_node_and_exits_1(cluster: dict[str, FakeNode]) -> None:
    run = _status("--json")
    assert run.exit_code == 1, run.output
    assert run.exception is None or isinstance(run.exception, SystemExit)
    (info,) = json.loads(run.stdout)["replicas"]
    assert info["unreachable"] == {"h2": f"h2: {REFUSED}"}
    assert "\n" not in info["unreachable"]["h2"]
    assert info["whole"] is False and info["verdict"] == "degraded"
    assert cluster["h1"].closed


def test_table_shows_the_unreachable_node_with_host_and_address(
        cluster: dict[str, FakeNode]) -> None:
    run = _status()
    assert run.exit_code == 1, run.output
    assert "Traceback" not in run.output
    lines = run.stdout.splitlines()
    assert any("h2" in line and "unreachable" in line and "10.0.0.12:22" in line
               for line in lines), run.stdout
    assert "h2 unreachable" in run.stdout  # the node's watchdog cannot be read either
    assert "whole: no" in run.stdout
    assert lines[-1] == "llama: degraded"


@pytest.mark.parametrize(("active", "code", "verdict"), [(True, 0, "serving"),
                                                          (False, 3, "down")])
def test_exit_status_with_every_node_reachable_is_0_serving_else_3(
        cluster: dict[str, FakeNode], health: dict[str, int | None], active: bool, code: int,
        verdict: str) -> None:
    cluster["h1"] = FakeNode("h1", active=active)
    cluster["h2"] = FakeNode("h2", active=active)
    health["status"] = 200 if active else None
    run = _status("--json")
    assert run.exit_code == code, run.output
    assert json.loads(run.stdout)["replicas"][0]["verdict"] == verdict


def test_rank0_watchdog_shows_its_completion_probe(cluster: dict[str, FakeNode]) -> None:
    cluster["h2"] = FakeNode("h2")
    run = _status()
    # 3 s old when written, written 2 s before the host's clock was read: 5 s old now
    assert ("  completion probe on h1: failure 5 s ago (no answer within 60 s), 1/3 failures, "
            "0 restarts by the probe") in run.stdout.splitlines(), run.stdout
    assert "(watchdogs: h1 bound 2 s ago, h2 bound 2 s ago)" in run.stdout
    (info,) = json.loads(_status("--json").stdout)["replicas"]
    assert info["watchdogs"]["h1"]["probe"] == PROBE and info["watchdogs"]["h2"]["probe"] is None


def test_after_down_status_says_down_and_nothing_else(cluster: dict[str, FakeNode],
                                                     health: dict[str, int | None]) -> None:
    cluster["h1"] = FakeNode("h1", active=False)
    cluster["h2"] = FakeNode("h2", active=False)
    health["status"] = None
    run = _status()
    assert run.exit_code == 3 and run.stdout == "llama: down\n", run.stdout
    (info,) = json.loads(_status("--json").stdout)["replicas"]
    assert info["down"] is True and info["whole"] is None
    assert {w["running"] for w in info["watchdogs"].values()} == {False}
    assert all(w["probe"] is None for w in info["watchdogs"].values())


def test_deployment_times_reads_the_record() -> None:
    record = {"replicas": {"llama": {"deployed_at": "2025-11-29T09:53:20Z"},
                           "old": {"deployed_at": None}}}
    assert status.deployment_times(record) == {"llama": 1764410000.0}
    assert status.deployment_times(None) == {}


# --- the front door ------------------------------------------------------------------------------

def test_front_door_view_per_replica_in_json_and_text_one_bad_gateway_apart(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        health: dict[str, int | None]) -> None:
    from inventory_support import llama_yaml, write_inventory

    from vllm_provision.cli import json_schemas
    from vllm_provision.inventory import load_inventory
    from vllm_provision.transport import router

    gateways = ("    vllm_gateways:\n      vars: {vllm_gateway_wheelhouse: wheels}\n"
                "      hosts:\n        h3: {ansible_host: 10.0.0.13}\n"
                "        h4: {ansible_host: 10.0.0.14}\n")
    inventory = load_inventory(write_inventory(tmp_path, llama_yaml("mp") + gateways))
    nodes = {"h1": FakeNode("h1"), "h2": FakeNode("h2"), "h3": FakeNode("h3"),
             "h4": FakeNode("h4", error=REFUSED)}
    monkeypatch.setattr(CommonOptions, "load_inventory", lambda self: inventory)
    monkeypatch.setattr(connection, "HostConnection",
                        lambda host, options=None: nodes[host.name])
    url = inventory.replicas[0].api_url
    monkeypatch.setattr(router.RouterClient, "workers", lambda self, timeout_s=10.0: {
        url: router.WorkerView(url, True, 2)})
    run = _status("--json")
    assert run.exit_code == 0, run.output  # a gateway it cannot reach changes no exit code
    document = json.loads(run.stdout)
    json_schemas.validate("status", document)
    (info,) = document["replicas"]
    assert info["front_door"] == {
        "h3": {"state": "healthy", "load": 2, "error": None},
        "h4": {"state": "unknown", "load": None, "error": f"h4: {REFUSED}"}}
    assert document["gateways"]["h3"]["workers"] == [{"url": url, "is_healthy": True,
                                                       "load": 2}]
    broken = json.loads(run.stdout)
    broken["replicas"][0]["front_door"]["h3"]["state"] = "drained"
    with pytest.raises(Exception, match="drained"):
        json_schemas.validate("status", broken)
    text = _status()
    assert "  front door h3: healthy (load 2)" in text.stdout.splitlines()
    assert f"  front door h4: unknown (h4: {REFUSED})" in text.stdout.splitlines()
