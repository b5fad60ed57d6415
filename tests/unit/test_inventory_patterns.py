"""Ansible host patterns: ``select_hosts`` for ``--limit`` and play ``hosts:``."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_provision.core.errors import InventoryError
from vllm_provision.core.models import Inventory
from vllm_provision.inventory import load_inventory, select_hosts

GOOD = Path(__file__).resolve().parents[1] / "data" / "inventories" / "good"


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return load_inventory(GOOD / "precedence" / "inventory.yml")


@pytest.fixture(scope="module")
def replicas() -> Inventory:
    return load_inventory(GOOD / "names-and-ssh" / "inventory.yml")


@pytest.mark.parametrize(("pattern", "hosts"), [
    ("all", ["h1", "h2"]),
    ("*", ["h1", "h2"]),
    ("h2", ["h2"]),
    ("beta", ["h1"]),
    ("gpu", ["h1", "h2"]),
    ("h2:beta", ["h1", "h2"]),            # union, returned in inventory order
    ("h2,h1", ["h1", "h2"]),
    ("alpha:&beta", ["h1"]),              # intersection
    ("gpu:!beta", ["h2"]),                # exclusion
    ("!h1", ["h2"]),                      # only an exclusion: starts from all
    ("h?", ["h1", "h2"]),                 # shell wildcard
    ("b*", ["h1"]),                       # wildcard over group names
    ("~h[2-9]", ["h2"]),                  # regex
    ("all:!alpha", []),
])
def test_pattern_selects_hosts_in_inventory_order(inventory: Inventory, pattern: str,
                                                  hosts: list[str]) -> None:
    assert [h.name for h in select_hosts(inventory, pattern)] == hosts


@pytest.mark.parametrize(("pattern", "hosts"), [
    ("vllm_master", ["gpu-a.example.com"]),
    ("vllm_followers", ["gpu-b.example.com"]),
    ("vllm_mp:!vllm_master", ["gpu-b.example.com"]),
    ("llama:&vllm_master", ["gpu-a.example.com"]),
    ("gpu-*.example.com", ["gpu-b.example.com", "gpu-a.example.com"]),
    ("vllm_replicas,monitoring", ["gpu-b.example.com", "gpu-a.example.com", "monitoring"]),
])
def test_synthetic_groups_and_dotted_names_in_patterns(replicas: Inventory, pattern: str,
                                                       hosts: list[str]) -> None:
    assert [h.name for h in select_hosts(replicas, pattern)] == hosts


def test_unknown_name_lists_known_groups_and_a_close_match(inventory: Inventory) -> None:
    with pytest.raises(InventoryError) as caught:
        select_hosts(inventory, "gpu:!alfa")
    text = caught.value.render()
    assert "no host or group named 'alfa' (did you mean 'alpha'?)" in text
    assert "known groups: alpha, beta, gpu, ungrouped" in text


@pytest.mark.parametrize("pattern", ["", " , ", "zz*", "~["])
def test_empty_or_matchless_patterns_are_errors(inventory: Inventory, pattern: str) -> None:
    with pytest.raises(InventoryError):
        select_hosts(inventory, pattern)
