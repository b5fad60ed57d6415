"""The stack lock is the expected state: every node's venv runs exactly the locked versions.

A lock (``vllm_stack_lock``, docs/stack.md) pins every distribution of the replica's Python
stack; ``provision stack sync`` installs it. Preflight compares each node with the lock as well
as with the other nodes (:mod:`vllm_provision.checks.parity`), so a node changed by hand, or not
synced yet, is named with the package and both versions.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_provision.checks.context import InventoryScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica
from vllm_provision.facts.model import HostFacts
from vllm_provision.stack.lock import Lock, compare

SOURCE = "docs/stack.md (the lock is the expected state)"


def check_lock(replica: Replica, facts: Mapping[str, HostFacts], lock: Lock) -> list[Finding]:
    """One ``stack.lock`` error per node and package whose version differs from the lock, or
    one ``ok`` finding per node that matches it.

    Args:
        replica: the replica.
        facts: facts by host name; ``HostFacts.packages`` holds the lock's packages (the probe
            reads them: ``ProbeOptions.extra_packages``). Nodes without facts are skipped.
        lock: the replica's parsed lock.
    """
    findings = []
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None:
            continue
        differences = compare(lock, node.name, f.packages)
        for d in differences:
            findings.append(Finding(
                "stack.lock", Severity.ERROR, node.name, f"{d.package} (stack lock)",
                expected=f"{d.expected} ({lock.path or 'the lock'})",
                actual=d.actual or "not installed",
                fix="run `provision stack sync -i INVENTORY` (or `provision stack rollback` and "
                    "revert the lock)", source=SOURCE))
        if not differences:
            findings.append(Finding("stack.lock", Severity.OK, node.name, "stack lock",
                                    expected=f"{len(lock.pins)} packages of stack {lock.id}",
                                    actual="all as locked", source=SOURCE))
    return findings


# -- checks that read their scope (checks/context.py) -----------------------------------

@check("stack.lock", order=20, scope="inventory")
def _lock(scope: InventoryScope) -> list[Finding]:
    """The nodes' Python stack matches the replica's lock (when it has one)."""
    lock = scope.locks.get(scope.replica.name)
    return [] if lock is None else check_lock(scope.replica, scope.of.facts, lock)
