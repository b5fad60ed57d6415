"""Switching a replica's backend in place: mp -> Ray -> mp on the same two lab hosts.

One inventory, its ``vllm_backend`` edited between the runs, as an operator would. Each ``up``
must serve, and after it no unit of the old backend may be running or enabled, and the old
backend's unit and env files are gone (read over the lab's SSH with testinfra). Before the first
switch ``up --check --diff`` shows the removals and changes nothing; at the end ``down --purge``
leaves no unit or file of ours (those the hosts' state records list, and the known names).
The tests run in file order and share the hosts' state (one ``up`` per switch).

Cost: about 161 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from lab_support import provision

pytestmark = pytest.mark.lab

UNIT_DIR = "/etc/systemd/system"
# rank 0 (h1), rank 1 (h2): each backend's units (vllm_provision/backends)
UNITS = {"mp": (["vllm.service"], ["vllm.service"]),
         "ray": (["ray-head.service", "vllm.service"], ["ray-worker.service"])}
ENV_FILES = {"mp": (["vllm.env"], ["vllm.env"]), "ray": (["ray.env", "vllm.env"], ["ray.env"])}


@pytest.fixture(scope="module")
def switch(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An mp replica served on the lab's two hosts from an inventory of its own."""
    root = tmp_path_factory.mktemp("switch")
    state = root / "state"
    doc = yaml.safe_load(lab.inventory_path("mp").read_text())
    inventory = root / "switch.yml"

    def write(backend: str) -> None:
        doc["all"]["children"]["vllm_replicas"]["children"]["lab"]["vars"]["vllm_backend"] = \
            backend
        inventory.write_text(yaml.safe_dump(doc))

    def run(*args: str) -> Any:
        return provision(*args, state_home=state)

    write("mp")
    # --take-over: hosts another lab module left deployed are handed to this inventory (no
    # separate `down` per lab inventory first)
    up = run("up", "-i", str(inventory), "--take-over")
    assert up.returncode == 0, up.stdout + up.stderr
    context: dict[str, Any] = {"inventory": str(inventory), "write": write, "run": run}
    yield context
    if not context.get("purged"):  # a test failed before the last one: leave the hosts clean
        run("down", "-i", str(inventory), "--purge")


def _enabled(host: Any, unit: str) -> bool:
    """``systemctl is-enabled`` says enabled (testinfra's ``is_enabled`` raises for a unit
    that no longer exists)."""
    return bool(host.run("systemctl is-enabled -- %s", unit).stdout.strip() == "enabled")


def _assert_backend(lab: Any, lab_host: Any, now: str, old: str) -> None:
    """``now``'s units run and are enabled; no unit of ``old`` that ``now`` lacks is running,
    enabled or installed, nor its env files."""
    for index, node in enumerate(lab.hosts[:2]):
        host = lab_host(node.name)
        for unit in UNITS[now][index]:
            assert host.service(unit).is_running and _enabled(host, unit), \
                f"{node.name}: {unit} not up"
        for unit in set(UNITS[old][index]) - set(UNITS[now][index]):
            service = host.service(unit)
            assert not service.is_running, f"{node.name}: {old}'s {unit} still runs"
            assert not _enabled(host, unit), f"{node.name}: {old}'s {unit} still enabled"
            assert not host.file(f"{UNIT_DIR}/{unit}").exists, f"{node.name}: {unit} left"
        for name in set(ENV_FILES[old][index]) - set(ENV_FILES[now][index]):
            assert not host.file(f"/etc/vllm-provision/{name}").exists, f"{node.name}: {name}"


def _switch_to(switch: dict[str, Any], lab: Any, lab_host: Any, now: str, old: str) -> None:
    """Rewrite the inventory for backend ``now`` and run ``up``: it serves, and of ``old``
    only what ``now`` shares is left (:func:`_assert_backend`)."""
    switch["write"](now)
    up = switch["run"]("up", "-i", switch["inventory"])
    assert up.returncode == 0, up.stdout + up.stderr
    assert "completion from" in up.stdout, up.stdout
    _assert_backend(lab, lab_host, now, old)


def test_check_diff_shows_the_removals_and_changes_nothing(switch: dict[str, Any], lab: Any,
                                                         lab_host: Any) -> None:
    switch["write"]("ray")
    check = switch["run"]("up", "-i", switch["inventory"], "--check", "--diff")
    out = check.stdout + check.stderr
    assert check.returncode == 2, out  # changes pending
    h1, h2 = (node.name for node in lab.hosts[:2])
    assert f"would stop vllm.service on {h1}, then {h2}" in out, out
    assert f"would remove {UNIT_DIR}/vllm.service on {h2} (unit vllm.service" in out, out
    assert f"--- {UNIT_DIR}/vllm.service\n+++ /dev/null" in out, out
    assert ", 2 to remove, " in out, out  # h2's vllm.service and vllm.env
    for node in lab.hosts[:2]:  # the mp replica still runs, untouched
        host = lab_host(node.name)
        assert host.service("vllm.service").is_running, node.name
        assert _enabled(host, "vllm.service"), node.name
        assert host.file(f"{UNIT_DIR}/vllm.service").exists, node.name
        assert not host.file(f"{UNIT_DIR}/ray-worker.service").exists, node.name


def test_switch_mp_to_ray_serves_and_leaves_no_mp_unit(switch: dict[str, Any], lab: Any,
                                                      lab_host: Any) -> None:
    _switch_to(switch, lab, lab_host, "ray", "mp")


def test_switch_ray_to_mp_serves_and_leaves_no_ray_unit(switch: dict[str, Any], lab: Any,
                                                       lab_host: Any) -> None:
    _switch_to(switch, lab, lab_host, "mp", "ray")


def test_down_purge_after_the_switches_leaves_nothing_of_ours(switch: dict[str, Any],
                                                             lab: Any, lab_host: Any) -> None:
    recorded: dict[str, list[str]] = {}
    for node in lab.hosts[:2]:
        record = json.loads(lab_host(node.name).file("/var/lib/vllm-provision/state.json")
                            .content_string)
        recorded[node.name] = list(record["hosts"][node.name]["files"])
        assert recorded[node.name], node.name
    down = switch["run"]("down", "-i", switch["inventory"], "--purge")
    assert down.returncode == 0, down.stdout + down.stderr
    for node in lab.hosts[:2]:
        host = lab_host(node.name)
        for path in recorded[node.name]:
            assert not host.file(path).exists, f"{node.name}: {path} left"
        for unit in ("vllm.service", "ray-head.service", "ray-worker.service",
                     "vllm-watchdog.service"):
            assert not host.service(unit).is_running, f"{node.name}: {unit}"
            assert not host.file(f"{UNIT_DIR}/{unit}").exists, f"{node.name}: {unit}"
        assert not host.file("/etc/vllm-provision").exists, node.name
    switch["purged"] = True
