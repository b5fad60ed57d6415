"""All or none for the stack (docs/stack.md, "All or none"): a sync whose switch fails on one
node switches the nodes that did back, and a rollback that fails on one node rolls the nodes
already rolled back forward again, so a replica is never left on two stacks."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.operations import stack as stack_op
from vllm_provision.stack import sync as stack_sync

VENV = "/opt/vllm"


class Node:
    """A node's venv as node.py keeps it: an active and a previous stack; ``rollback`` swaps
    them (node.py), ``fail`` makes the named action fail."""

    def __init__(self, name: str, fail: str = "") -> None:
        self.name, self.fail = name, fail
        self.active, self.previous = f"{VENV}.stack-old", f"{VENV}.stack-older"
        self.actions: list[str] = []


def run_node(conn: Node, config: dict[str, Any], **_: Any) -> dict[str, Any]:
    action = config["action"]
    conn.actions.append(action)
    if action == conn.fail:
        raise ProvisionError.single(conn.name, f"stack {action}: the disk is full")
    before = conn.active
    if action == "switch":
        conn.previous, conn.active = conn.active, f"{VENV}.stack-{config['stack']}"
    elif action == "rollback":
        conn.active, conn.previous = conn.previous, conn.active
    return {"switched": action in ("switch", "rollback"), "active": conn.active,
            "before": before}


@pytest.fixture(autouse=True)
def fake_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_sync, "run_node", run_node)


def _switch_all(nodes: dict[str, Node]) -> list[Any]:
    results = []
    for node in nodes.values():
        result = stack_sync.NodeResult(node.name, installed=True, active=node.active)
        try:
            stack_sync.switch_node(node, result, VENV, "new", prune=False)
        except ProvisionError as exc:
            result.error = exc.render()
        results.append(result)
    with ThreadPoolExecutor(2) as pool:
        return stack_op._all_or_none(results, nodes, VENV, None, pool)


def test_when_every_node_switched_each_is_pruned_and_stays_switched() -> None:
    nodes = {n: Node(n) for n in ("h1", "h2", "h3")}
    results = _switch_all(nodes)
    assert {n.active for n in nodes.values()} == {f"{VENV}.stack-new"}
    assert all(n.actions == ["switch", "cleanup"] for n in nodes.values())
    assert all(r.switched and not r.error for r in results)


def test_a_switch_that_fails_on_one_node_switches_the_others_back() -> None:
    nodes = {"h1": Node("h1"), "h2": Node("h2", fail="switch"), "h3": Node("h3")}
    results = _switch_all(nodes)
    assert {n.active for n in nodes.values()} == {f"{VENV}.stack-old"}  # one stack: the old
    assert nodes["h1"].actions == ["switch", "rollback"] and "cleanup" not in nodes["h3"].actions
    by = {r.host: r for r in results}
    assert by["h2"].error and "disk is full" in by["h2"].error
    assert not by["h1"].switched and "switched back: h2 failed" in by["h1"].held
    assert "not switched (switched back: h2 failed" in by["h3"].line()


def test_a_node_that_cannot_be_switched_back_is_named_as_left_on_the_new_stack() -> None:
    nodes = {"h1": Node("h1", fail="rollback"), "h2": Node("h2", fail="switch")}
    results = _switch_all(nodes)
    by = {r.host: r for r in results}
    assert by["h1"].error.startswith("left on the new stack: switching back after h2 failed")


def test_a_rollback_that_fails_on_one_node_rolls_the_others_forward_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = {"h1": Node("h1"), "h2": Node("h2", fail="rollback"), "h3": Node("h3")}
    monkeypatch.setattr(stack_op, "connect", lambda replica, options, factory: nodes)
    monkeypatch.setattr(stack_op, "probe", lambda conns, venv: {
        n: stack_sync.NodeStack(n, previous=f"{VENV}.stack-older") for n in conns})
    monkeypatch.setattr(stack_op, "close_all", lambda conns: None)
    replica = SimpleNamespace(name="r1", vars={"vllm_venv": VENV})
    monkeypatch.setattr(stack_sync, "venv_of", lambda replica: VENV)
    failed, lines = stack_op.rollback_replica(replica, None)
    assert failed
    assert {n.active for n in nodes.values()} == {f"{VENV}.stack-old"}  # where they began
    assert nodes["h1"].actions == ["rollback", "rollback"] and nodes["h3"].actions == []
    assert any(line.startswith("h2: FAILED") for line in lines)
    assert any(line.startswith("h1: rolled forward again") and "h2 failed" in line
               for line in lines)
