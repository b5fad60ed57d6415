"""Replicas that share a server (``vllm_instance``, docs/inventory.md "Shared servers"): the
names an instance derives, the loader's rules for two inventory hosts on one server, the
per-host folders of the run lock, the state record and pending notifications, the firewall
table, preflight's ``servers.one_node`` with instances, and the runner running the tasks of
one server's hosts one at a time."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_one_node_per_server import refusals
from test_replicas_independent import facts_for

from vllm_provision import settings
from vllm_provision.checks.servers import check_one_node_per_server
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.paths import STATE_DIR
from vllm_provision.core.results import Status
from vllm_provision.inventory import load_inventory
from vllm_provision.modules import ModuleResult
from vllm_provision.runner.executor import TaskExecutor
from vllm_provision.runner.outcome import NullReporter, RunOptions, RunOutcome, RunState
from vllm_provision.runner.playbook import Task
from vllm_provision.runner.variables import VariableResolver
from vllm_provision.settings import firewall, instance
from vllm_provision.settings.masking import Masker
from vllm_provision.state import host_record_path
from vllm_provision.transport import runlock

A = {"vllm_instance": "a", "vllm_gpus": [0, 1], "vllm_api_port": 8000}
B = {"vllm_instance": "b", "vllm_gpus": [2, 3], "vllm_api_port": 8001,
     "vllm_master_port": 29601, "vllm_watchdog_port": 29611}


def _write(tmp_path: Path, a: dict[str, Any], b: dict[str, Any],
           servers: tuple[str, str] = ("10.0.0.11", "10.0.0.12")) -> Path:
    """Replicas ``a`` and ``b`` of two nodes each (TP 2 x PP 2) on the same two servers."""
    path = tmp_path / "inventory.yml"
    children = {name: {"vars": {"vllm_model": "/srv/m", "vllm_backend": "mp",
                                "vllm_tensor_parallel_size": 2,
                                "vllm_pipeline_parallel_size": 2, **values},
                       "hosts": {f"{name}{rank + 1}": {"ansible_host": server,
                                                       "vllm_node_rank": rank}
                                 for rank, server in enumerate(servers)}}
                for name, values in (("a", a), ("b", b))}
    path.write_text(yaml.safe_dump({"all": {"children": {"vllm_replicas": {
        "children": children}}}}))
    return path


def _messages(path: Path) -> list[str]:
    return [p.message for p in refusals(path)]


# -- what an instance names ----------------------------------------------------------------

def test_an_instance_names_every_unit_file_folder_and_table_of_its_replica() -> None:
    names = instance.derived("a")
    assert names["vllm_unit_name"] == "vllm-a.service"
    assert names["vllm_watchdog_unit_name"] == "vllm-watchdog-a.service"
    assert names["vllm_firewall_unit_name"] == "vllm-firewall-a.service"
    assert names["vllm_env_file"] == "/etc/vllm-provision/a/vllm.env"
    assert names["vllm_watchdog_hold_file"] == "/run/vllm-provision/a/watchdog.hold"
    assert names["vllm_firewall_table"] == "vllm_provision_a"
    assert names["provision_state_dir"] == f"{STATE_DIR}/instances/a"
    assert instance.derived(None) == {} and instance.derived("") == {}


@pytest.mark.parametrize("value", ["A", "1a", "a-b", "a/b", "a b", "x" * 17, "", "a\n"])
def test_an_instance_is_a_short_lower_case_name(value: str) -> None:
    assert instance.check_instance(value) is not None
    assert instance.check_instance("llama_small2") is None


def test_two_replicas_load_on_one_server_each_with_its_own_names(tmp_path: Path) -> None:
    inventory = load_inventory(_write(tmp_path, A, B))
    a, b = inventory.replicas
    assert settings.replica_settings(a)["vllm_unit_name"] == "vllm-a.service"
    assert settings.node_settings(b, b.nodes[1])["vllm_watchdog_unit_name"] == \
        "vllm-watchdog-b.service"
    assert host_record_path(inventory.hosts["a1"].vars) == \
        f"{STATE_DIR}/instances/a/state.json"
    assert host_record_path(inventory.hosts["b1"].vars) == \
        f"{STATE_DIR}/instances/b/state.json"
    assert firewall.ruleset(a).count("table inet vllm_provision_a") == 3  # create, delete, define
    assert "vllm_provision_b" not in firewall.ruleset(a)


def test_a_name_the_inventory_sets_wins_over_the_derived_one(tmp_path: Path) -> None:
    inventory = load_inventory(_write(tmp_path, {**A, "vllm_unit_name": "llm-a.service"}, B))
    a, _b = inventory.replicas
    assert settings.replica_settings(a)["vllm_unit_name"] == "llm-a.service"
    assert settings.replica_settings(a)["vllm_watchdog_unit_name"] == "vllm-watchdog-a.service"


def test_without_an_instance_every_name_is_as_before(tmp_path: Path) -> None:
    path = tmp_path / "one.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"vllm_replicas": {"children": {
        "a": {"vars": {"vllm_model": "/srv/m", "vllm_tensor_parallel_size": 1},
              "hosts": {"h1": {"ansible_host": "10.0.0.11"}}}}}}}}))
    inventory = load_inventory(path)
    [a] = inventory.replicas
    assert settings.replica_settings(a)["vllm_unit_name"] == "vllm.service"
    assert host_record_path(inventory.hosts["h1"].vars) == f"{STATE_DIR}/state.json"
    assert "table inet vllm_provision {" in firewall.ruleset(a)


def test_a_table_name_set_by_hand_must_be_one_of_ours() -> None:
    with pytest.raises(ProvisionError, match="not a table name of ours"):
        instance.firewall_table({"vllm_firewall_table": "filter; flush ruleset"})
    assert instance.firewall_table({"vllm_firewall_table": "vllm_provision_x"}) == \
        "vllm_provision_x"


# -- the loader's rules ----------------------------------------------------------------------

@pytest.mark.parametrize(("a", "b", "says"), [
    ({**A, "vllm_instance": "b"}, B, "both use vllm_instance 'b'"),
    ({**A, "vllm_gpus": [1, 2]}, B, "their vllm_gpus overlap (GPU 2)"),
    ({k: v for k, v in A.items() if k != "vllm_gpus"}, B,
     "a1 has no vllm_gpus, so it would take GPUs 0..N-1 of the server"),
    (A, {**B, "vllm_api_port": 8000}, "both listen on port 8000 (vllm_api_port of 'a', "
                                      "vllm_api_port of 'b')"),
    (A, {**B, "vllm_watchdog_port": 29510}, "both listen on port 29510"),
    (A, {**B, "vllm_backend": "ray"}, "replica 'b' runs on Ray, which cannot share a server yet"),
])
def test_two_replicas_that_may_not_share_a_server_are_refused_naming_both(
        tmp_path: Path, a: dict[str, Any], b: dict[str, Any], says: str) -> None:
    messages = _messages(_write(tmp_path, a, b))
    assert any(m.startswith("hosts a1 and b1 (replicas 'a' and 'b') are one server "
                            "(10.0.0.11 port 22): ") and says in m for m in messages), messages


def test_an_invalid_instance_is_refused_with_what_is_expected(tmp_path: Path) -> None:
    messages = _messages(_write(tmp_path, {**A, "vllm_instance": "Big-A"}, B))
    assert any("vllm_instance" in m for m in messages), messages


# -- per-host folders on the host --------------------------------------------------------------

def test_the_run_lock_of_each_host_is_in_its_own_folder(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = load_inventory(_write(tmp_path, A, B))
    seen: dict[str, Any] = {}

    def acquire(opened: Any, command: str, warn: Any, **kwargs: Any) -> Any:
        seen.update(kwargs["state_dir"])
        raise runlock.RunLockError([])

    monkeypatch.setattr(runlock, "open_connections", lambda hosts, options: ({}, {}))
    monkeypatch.setattr(runlock.RunLock, "acquire", acquire)
    with pytest.raises(runlock.RunLockError), runlock.locked_run(
            list(inventory.hosts.values()), runlock.ConnectionOptions(), "up", print):
        pass
    assert seen == {"a1": f"{STATE_DIR}/instances/a", "a2": f"{STATE_DIR}/instances/a",
                    "b1": f"{STATE_DIR}/instances/b", "b2": f"{STATE_DIR}/instances/b"}
    assert runlock.folder_of(seen, "a1") == f"{STATE_DIR}/instances/a"
    assert runlock.folder_of(seen, "gone") == STATE_DIR
    assert runlock.folder_of("/tmp/x", "a1") == "/tmp/x"


def test_pending_notifications_of_each_host_are_in_its_own_folder(tmp_path: Path) -> None:
    inventory = load_inventory(_write(tmp_path, A, B))
    state = RunState(inventory, RunOptions(), NullReporter(), Masker.from_inventory(inventory),
                     RunOutcome())
    assert state.pending_dir("a1") == f"{STATE_DIR}/instances/a/pending"
    assert state.pending_dir("b2") == f"{STATE_DIR}/instances/b/pending"
    chosen = RunState(inventory, RunOptions(pending_dir="/tmp/p"), NullReporter(),
                      Masker.from_inventory(inventory), RunOutcome())
    assert chosen.pending_dir("a1") == "/tmp/p"  # a run that names its folder keeps it


# -- the runner: one server's hosts one task at a time -----------------------------------------

def _most_at_once(executor: TaskExecutor, inventory: Any, names: tuple[str, str]) -> int:
    running, most, guard = [0], [0], threading.Lock()

    def execute(play: Any, task: Any, host: Any) -> tuple[ModuleResult, bool]:
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with guard:
            running[0] -= 1
        return ModuleResult(Status.OK), False

    executor._execute = execute  # type: ignore[method-assign]
    task = Task(name="Install", module="command", args={"cmd": "true"}, where="test")
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda n: executor.run_on_host(None, task, inventory.hosts[n]),
                      names))
    return most[0]


def test_the_tasks_of_two_hosts_on_one_server_run_one_at_a_time(tmp_path: Path) -> None:
    inventory = load_inventory(_write(tmp_path, A, B))
    state = RunState(inventory, RunOptions(), NullReporter(), Masker.from_inventory(inventory),
                     RunOutcome())
    executor = TaskExecutor(state, VariableResolver(inventory), lambda host, options: None)
    assert _most_at_once(executor, inventory, ("a1", "b1")) == 1  # one server
    assert _most_at_once(executor, inventory, ("a1", "a2")) == 2  # two servers


# -- preflight: the same machine under two addresses, shared by design -------------------------

def test_replicas_with_their_own_instances_and_gpus_may_share_one_machine(
        tmp_path: Path) -> None:
    inventory = load_inventory(_write(tmp_path, A, B))
    a, b = inventory.replicas
    ids = ("a" * 32, "1" * 32)
    facts = {name: replace(f, machine_id=ids[0] if name.endswith("1") else "c" * 32,
                           boot_id=ids[1]) for name, f in facts_for(inventory).items()}
    nodes = {node.name: r for r in inventory.replicas for node in r.nodes}
    assert check_one_node_per_server(a, facts, nodes) == []
    overlapping = replace(b, nodes=tuple(replace(n, gpus=(1, 2)) for n in b.nodes))
    nodes.update({node.name: overlapping for node in overlapping.nodes})
    first, second = check_one_node_per_server(a, facts, nodes)
    assert first.host == "a1" and first.actual.endswith(
        "as b1 (replica 'b'): their vllm_gpus overlap (GPU 1)")
    assert second.host == "a2" and "as b2 (replica 'b')" in second.actual
