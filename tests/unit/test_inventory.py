"""Inventory parsing, Ansible precedence, connection variables, replicas and synthetic groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_provision.core.errors import InventoryError
from vllm_provision.inventory import load_inventory

GOOD = Path(__file__).resolve().parents[1] / "data" / "inventories" / "good"
LEVELS = ["inv_all", "inv_parent", "inv_child", "gv_all", "gv_group", "inv_host", "hv_host",
          "extra"]


@pytest.fixture(scope="module")
def precedence() -> dict:
    inventory = load_inventory(GOOD / "precedence" / "inventory.yml",
                               {"win_extra": "extra"})
    return dict(inventory.hosts["h1"].vars)


@pytest.mark.parametrize("level", LEVELS)
def test_each_precedence_level_beats_every_lower_one(precedence: dict, level: str) -> None:
    assert precedence[f"win_{level}"] == level


def test_sibling_groups_merge_by_name_not_file_order(precedence: dict) -> None:
    assert precedence["sibling"] == "beta"


def test_group_vars_of_a_child_group_beat_its_parent(precedence: dict) -> None:
    assert precedence["group_file_depth"] == "beta"


def test_group_vars_folder_files_merge_in_name_order(precedence: dict) -> None:
    assert precedence["dir_order"] == "second"


def test_a_host_outside_a_group_does_not_see_its_vars() -> None:
    h2 = load_inventory(GOOD / "precedence" / "inventory.yml").hosts["h2"].vars
    assert h2["sibling"] == "alpha"
    assert "win_hv_host" in h2 and h2["win_hv_host"] == "gv_parent"


def test_host_groups_are_sorted_all_first_then_by_depth_and_name() -> None:
    inventory = load_inventory(GOOD / "precedence" / "inventory.yml")
    assert inventory.hosts["h1"].groups == ("all", "gpu", "alpha", "beta")
    assert inventory.hosts["h2"].groups == ("all", "gpu", "alpha")


def test_hosts_keep_file_order_and_ungrouped_holds_hosts_without_group() -> None:
    inventory = load_inventory(GOOD / "ray-one-node" / "inventory.yml")
    assert list(inventory.hosts) == ["bastion", "g1"]
    assert inventory.groups["ungrouped"].hosts == ("bastion",)
    assert "vllm_replicas" in inventory.groups["all"].children


def test_connection_variables_are_resolved() -> None:
    inventory = load_inventory(GOOD / "names-and-ssh" / "inventory.yml")
    folder = (GOOD / "names-and-ssh").resolve()
    b = inventory.hosts["gpu-b.example.com"]
    assert (b.address, b.port, b.user, b.become, b.become_user) == (
        "gpu-b.example.com", 2222, "deploy", True, "root")
    assert b.known_hosts_files == (Path("/etc/ssh/a"), Path("/etc/ssh/b"),
                                   Path("~/lab/known_hosts").expanduser())
    a = inventory.hosts["gpu-a.example.com"]
    assert a.key_file == Path("/keys/id_ed25519")
    assert a.known_hosts_files == (folder / "kh" / "extra", Path("~/lab/known_hosts").expanduser())
    assert a.port == 22 and a.user is None


def test_relative_key_file_is_relative_to_the_inventory_folder() -> None:
    inventory = load_inventory(GOOD / "mp-two-nodes" / "inventory.yml")
    assert inventory.hosts["h1"].key_file == (GOOD / "mp-two-nodes" / "keys" / "id_ed25519")


def test_mp_replica_nodes_ranks_and_engine_args() -> None:
    inventory = load_inventory(GOOD / "mp-two-nodes" / "inventory.yml")
    (replica,) = inventory.replicas
    assert replica.name == "llama" and replica.backend == "mp"
    assert [(n.name, n.rank, n.host_ip) for n in replica.nodes] == [
        ("h1", 0, "10.213.0.11"), ("h2", 1, "10.213.0.12")]
    assert replica.master_addr == "10.213.0.11"
    assert replica.engine.world_size == 8
    assert (replica.engine.api_port, replica.engine.master_port) == (8000, 29501)
    assert replica.vars["vllm_venv"] == "/opt/vllm"
    assert inventory.replica_of("h2") is replica


def test_nodes_are_ordered_by_rank_not_file_order() -> None:
    inventory = load_inventory(GOOD / "names-and-ssh" / "inventory.yml")
    (replica,) = inventory.replicas
    assert [n.name for n in replica.nodes] == ["gpu-a.example.com", "gpu-b.example.com"]
    assert replica.master.host_ip == "10.1.0.11"
    assert replica.vars["vllm_cluster_interface"] == "eth1"


def test_single_host_ray_replica_defaults_rank_zero_and_converts_values() -> None:
    inventory = load_inventory(GOOD / "ray-one-node" / "inventory.yml")
    (replica,) = inventory.replicas
    assert replica.backend == "ray"
    assert [(n.name, n.rank, n.host_ip) for n in replica.nodes] == [("g1", 0, "2001:db8::11")]
    assert replica.engine.api_port == 8100
    assert replica.engine.extra_args == ("--max-num-seqs", "64", "--enforce-eager")
    assert replica.engine.api_key == "sk-test-key"
    assert replica.vars["vllm_env"] == {"HF_TOKEN": "hf_abc", "NCCL_DEBUG": "WARN",
                                        "VLLM_USE_V1": "1"}


def test_synthetic_groups() -> None:
    inventory = load_inventory(GOOD / "mp-two-nodes" / "inventory.yml")
    assert inventory.groups["vllm_master"].hosts == ("h1",)
    assert inventory.groups["vllm_followers"].hosts == ("h2",)
    assert inventory.groups["vllm_mp"].hosts == ("h1", "h2")
    assert inventory.groups["vllm_ray"].hosts == ()
    assert inventory.hosts["h2"].groups[-2:] == ("vllm_followers", "vllm_mp")
    assert inventory.replicas[0].nodes[1].host.groups == inventory.hosts["h2"].groups


def test_extra_vars_win_and_strings_are_converted() -> None:
    inventory = load_inventory(GOOD / "mp-two-nodes" / "inventory.yml",
                               {"vllm_api_port": "8001", "vllm_extra_args": "[--enforce-eager]",
                                "ansible_become": "yes", "custom": "kept"})
    assert inventory.replicas[0].engine.api_port == 8001
    assert inventory.replicas[0].engine.extra_args == ("--enforce-eager",)
    assert inventory.hosts["h1"].become is True
    assert inventory.extra_vars["custom"] == "kept"


def test_foreign_variables_pass_through_untouched() -> None:
    inventory = load_inventory(GOOD / "names-and-ssh" / "inventory.yml")
    assert inventory.hosts["monitoring"].vars["prometheus_port"] == 9090
    assert inventory.replica_of("monitoring") is None


def test_an_engine_arg_set_on_every_node_alike_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "inventory.yml").write_text(
        (GOOD / "mp-two-nodes" / "inventory.yml").read_text())
    for host in ("h1", "h2"):
        (tmp_path / "host_vars" / f"{host}.yml").write_text("vllm_max_model_len: 4096\n")
    inventory = load_inventory(tmp_path / "inventory.yml")
    assert inventory.replicas[0].engine.max_model_len == 4096


def test_group_vars_for_an_unrelated_group_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "databases.yml").write_text("pg_port: 5432\n")
    (tmp_path / "inventory.yml").write_text("all:\n  hosts:\n    h1:\n")
    assert "pg_port" not in load_inventory(tmp_path / "inventory.yml").hosts["h1"].vars


def test_a_variable_differing_per_node_names_both_hosts_and_values(tmp_path: Path) -> None:
    (tmp_path / "inventory.yml").write_text(
        (GOOD / "mp-two-nodes" / "inventory.yml").read_text().replace(
            "vllm_node_rank: 1}", "vllm_node_rank: 1, vllm_api_key: other-secret}"))
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path / "inventory.yml")
    text = caught.value.render()
    assert "vllm_api_key differs between nodes: h1 has nothing (unset)" in text
    assert "h2 has ********" in text
    assert "other-secret" not in text


@pytest.mark.parametrize(("name", "hosts"), [
    ("gpu1", ["gpu1"]),
    ("gpu[1:3]", ["gpu1", "gpu2", "gpu3"]),
    ("gpu[08:10].lab", ["gpu08.lab", "gpu09.lab", "gpu10.lab"]),
    ("n[a:c]", ["na", "nb", "nc"]),
    ("n[1:7:3]", ["n1", "n4", "n7"]),
    ("r[1:2]-g[a:b]", ["r1-ga", "r1-gb", "r2-ga", "r2-gb"]),
])
def test_host_ranges_expand_as_in_ansible(name: str, hosts: list[str]) -> None:
    from vllm_provision.inventory.ranges import expand_host_range

    assert expand_host_range(name) == hosts


@pytest.mark.parametrize("name", ["gpu[1]", "gpu[1:]", "gpu[a:10]", "gpu[3:1]", "gpu[1:3:x]"])
def test_invalid_host_ranges_are_refused(name: str) -> None:
    from vllm_provision.inventory.ranges import expand_host_range

    with pytest.raises(ValueError):
        expand_host_range(name)


def test_a_host_range_in_an_inventory_defines_every_host(tmp_path: Path) -> None:
    (tmp_path / "inventory.yml").write_text(
        "all:\n  children:\n    gpus:\n      hosts:\n        gpu[01:03]: {ansible_user: ops}\n")
    inventory = load_inventory(tmp_path / "inventory.yml")
    assert list(inventory.hosts) == ["gpu01", "gpu02", "gpu03"]
    assert inventory.hosts["gpu03"].user == "ops"
