"""One node per server: the loader refuses two nodes with one SSH address and port, preflight's
``servers.one_node`` finds one running system under two addresses (same machine-id and boot
id), and neither confuses cloned installations, containers of one kernel or a front door host
with a node (docs/inventory.md, "One node per server")."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_replicas_independent import facts_for, two_replicas

from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import findings_of, run_checks
from vllm_provision.checks.servers import check_one_node_per_server
from vllm_provision.core.errors import InventoryError
from vllm_provision.inventory import load_inventory

MACHINE_A, MACHINE_B = "a" * 32, "b" * 32
BOOT_1, BOOT_2 = "1" * 32, "2" * 32


def _write(tmp_path: Path, replicas: dict[str, dict[str, dict[str, Any]]]) -> Path:
    path = tmp_path / "inventory.yml"
    children = {name: {"vars": {"vllm_model": "/srv/m", "vllm_tensor_parallel_size": 1,
                                "vllm_api_port": 8000 + index},
                       "hosts": {host: {"vllm_node_rank": rank, **values}
                                 for rank, (host, values) in enumerate(hosts.items())}}
                for index, (name, hosts) in enumerate(replicas.items())}
    path.write_text(yaml.safe_dump({"all": {"children": {"vllm_replicas": {
        "children": children}}}}))
    return path


def refusals(path: Path) -> list[Any]:
    """The problems the loader records for ``path`` (it must refuse it)."""
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return caught.value.problems


def test_two_replicas_on_one_server_are_refused_naming_both_hosts_and_replicas(
        tmp_path: Path) -> None:
    path = _write(tmp_path, {
        "a": {"gpu1-a": {"ansible_host": "10.0.0.11", "vllm_gpus": [0, 1]}},
        "b": {"gpu1-b": {"ansible_host": "10.0.0.11", "vllm_gpus": [2, 3]}}})
    [problem] = refusals(path)
    assert problem.where == f"{path}: all.children.vllm_replicas.children.b.hosts.gpu1-b"
    assert problem.message == ("hosts gpu1-a and gpu1-b (replicas 'a' and 'b') are one server "
                               "(10.0.0.11 port 22): without a vllm_instance on each")
    assert problem.fix.startswith("give 'a' and 'b' each a vllm_instance of its own")


def test_one_name_written_in_two_cases_is_one_server(tmp_path: Path) -> None:
    # DNS names compare without case (RFC 4343)
    path = _write(tmp_path, {
        "a": {"h1": {"ansible_host": "gpu1.example.com", "vllm_host_ip": "10.0.0.11"}},
        "b": {"h2": {"ansible_host": "GPU1.example.com", "vllm_host_ip": "10.0.0.12"}}})
    [problem] = refusals(path)
    assert "hosts h1 and h2 (replicas 'a' and 'b') are one server (GPU1" in problem.message


def test_two_nodes_of_one_replica_on_one_server_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, {"a": {
        "h1": {"ansible_host": "10.0.0.11", "vllm_host_ip": "192.168.0.1"},
        "h2": {"ansible_host": "10.0.0.11", "vllm_host_ip": "192.168.0.2"}}})
    [problem] = refusals(path)
    assert problem.message == ("hosts h1 and h2 (replica 'a') are one server (10.0.0.11 port "
                               "22): two nodes of one replica")


def test_one_address_on_two_ssh_ports_is_two_servers(tmp_path: Path) -> None:
    # a NAT gateway forwarding one port per machine: the address alone names no machine
    path = _write(tmp_path, {
        "a": {"h1": {"ansible_host": "203.0.113.5", "ansible_port": 2201,
                     "vllm_host_ip": "10.0.0.11"}},
        "b": {"h2": {"ansible_host": "203.0.113.5", "ansible_port": 2202,
                     "vllm_host_ip": "10.0.0.12"}}})
    assert [r.name for r in load_inventory(path).replicas] == ["a", "b"]


# -- preflight: the same machine under two addresses ----------------------------------------

def _facts(inventory: Any, ids: dict[str, tuple[str, str]]) -> dict[str, Any]:
    facts = facts_for(inventory)
    return {name: replace(f, machine_id=ids[name][0], boot_id=ids[name][1])
            if name in ids else f for name, f in facts.items()}


def test_one_machine_under_two_addresses_fails_both_replicas_naming_the_other(
        tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path, {"a": ("h1",), "b": ("h2",), "c": ("h3",)})
    facts = _facts(inventory, {"h1": (MACHINE_A, BOOT_1), "h2": (MACHINE_A, BOOT_1),
                               "h3": (MACHINE_B, BOOT_1)})
    findings = [f for f in run_checks(inventory, facts) if f.check == "servers.one_node"]
    a, b, c = inventory.replicas
    [on_a] = findings_of(a, findings)
    assert (on_a.severity, on_a.host) == (Severity.ERROR, "h1")
    assert on_a.actual == ("the same machine (machine-id aaaaaaaaaaaa..., the same boot) as h2 "
                           "(replica 'b'): without a vllm_instance on each replica")
    [on_b] = findings_of(b, findings)
    assert on_b.host == "h2" and "as h1 (replica 'a')" in on_b.actual
    assert findings_of(c, findings) == []  # the third replica is not held back


@pytest.mark.parametrize(("second", "why"), [
    ((MACHINE_A, BOOT_2), "a cloned installation: the same machine-id, another boot"),
    ((MACHINE_B, BOOT_1), "containers sharing a boot id, each with a machine-id of its own"),
    (("", BOOT_1), "a probe that could not read /etc/machine-id"),
])
def test_only_the_same_running_system_counts(tmp_path: Path, second: tuple[str, str],
                                             why: str) -> None:
    inventory = two_replicas(tmp_path, {"a": ("h1",), "b": ("h2",)})
    facts = _facts(inventory, {"h1": (MACHINE_A, BOOT_1), "h2": second})
    a, b = inventory.replicas
    assert check_one_node_per_server(a, facts, {"h1": a, "h2": b}) == [], why


def test_a_host_that_is_no_node_may_share_a_node_s_machine(tmp_path: Path) -> None:
    # the front door or Prometheus run on rank 0's server, declared as a host of their own
    inventory = two_replicas(tmp_path, {"a": ("h1",)}, extra_hosts=("door",))
    facts = _facts(inventory, {"h1": (MACHINE_A, BOOT_1), "door": (MACHINE_A, BOOT_1)})
    assert [f for f in run_checks(inventory, facts) if f.check == "servers.one_node"] == []
