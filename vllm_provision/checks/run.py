"""Run every preflight check of every replica: settings from the role defaults and inventory.

``run_checks(inventory, facts)`` is the one entry point used by ``provision check`` and the
``vllm_preflight`` task of ``provision up``; it is pure (facts in, findings out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from vllm_provision.checks import memory
from vllm_provision.checks.context import (  # noqa: F401 - own_units & co. are used from here
    CHECKS,
    InventoryScope,
    NodeScope,
    ReplicaScope,
    device_counts,
    own_units,
    shared_pool_wait,
)
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.checks.options import (  # noqa: F401 - callers import them from here
    DEFAULT_OVERHEAD_MIB,
    PreflightSettings,
    load_defaults,
    settings_for,
)
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.core.registry import Entry, import_submodules
from vllm_provision.facts.model import HostFacts
from vllm_provision.settings import replica_settings

# modules of this package that hold no check: the runner, the finding type, the registry
NOT_CHECKS = ("run", "finding", "context", "options")

SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.OK: 2}


def is_skipped(check: str, skip: Iterable[str]) -> bool:
    """True when ``check`` equals a skip name or starts with ``<name>.`` (``parity`` skips all)."""
    return any(check == name or check.startswith(name + ".") for name in skip)


def discover() -> list[str]:
    """Import every check module of this package (``pkgutil`` over it) so that their
    ``@check`` decorators fill :data:`~vllm_provision.checks.context.CHECKS`; cheap after the
    first call. Returns the modules' full names.

    Raises:
        ProvisionError: two checks share a name, or one has an invalid name or scope.
    """
    return import_submodules(__package__ or "vllm_provision.checks", skip=NOT_CHECKS)


def checks_of(scope: str) -> list[Entry[Callable[[Any], list[Finding]]]]:
    """The registered checks of ``scope`` (``replica``, ``node`` or ``inventory``) in their
    declared order (:func:`vllm_provision.checks.context.check`)."""
    discover()
    return [e for e in CHECKS.entries() if e.meta["scope"] == scope]


def check_replica(replica: Replica, facts: Mapping[str, HostFacts],
                  settings: PreflightSettings) -> list[Finding]:
    """Every ``replica`` check, then every ``node`` check of each node with facts, in their
    declared order (topology, placement, parity, pins, network, host...; checks/context.py).

    Args:
        replica: the replica.
        facts: facts by host name (nodes without facts get no node-level findings).
        settings: merged preflight settings.
    """
    scope = ReplicaScope(replica, facts, settings)
    findings: list[Finding] = []
    for entry in checks_of("replica"):
        findings += entry.obj(scope)
    node_checks = checks_of("node")
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None:
            continue
        node_scope = NodeScope(scope, node, f)
        for entry in node_checks:
            findings += entry.obj(node_scope)
    return findings


def memory_estimates(replicas: Iterable[Replica], facts: Mapping[str, HostFacts],
                     defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Replica name -> its memory estimate as JSON (:mod:`vllm_provision.checks.memory`), or
    ``{"skipped": why}``; CPU replicas are left out. For ``provision check --json`` and
    ``provision facts --json``."""
    out: dict[str, Any] = {}
    for replica in replicas:
        if replica_settings(replica)["vllm_device"] == "cpu":
            continue
        settings = settings_for(replica, defaults)
        try:
            out[replica.name] = memory.estimate(replica, facts,
                                                settings.gpu_overhead_mib).to_json()
        except memory.CannotEstimate as exc:
            out[replica.name] = {"skipped": str(exc)}
    return out


def unreachable_findings(errors: Mapping[str, ProvisionError]) -> list[Finding]:
    """One ``facts`` error per host whose facts could not be gathered."""
    findings = []
    for name, error in errors.items():
        problem = error.problems[0] if error.problems else None
        findings.append(Finding(
            "facts", Severity.ERROR, name, "facts",
            expected="facts gathered over SSH",
            actual=(problem.message + (f": {problem.actual}" if problem and problem.actual
                                       else "")) if problem else str(error),
            fix=(problem.fix if problem and problem.fix else
                 f"check SSH access to {name} (provision facts -i INVENTORY --limit {name})")))
    return findings


def run_checks(inventory: Inventory, facts: Mapping[str, HostFacts],
               errors: Mapping[str, ProvisionError] | None = None,
               skip: Sequence[str] = (), replicas: Sequence[Replica] | None = None,
               defaults: Mapping[str, Any] | None = None) -> list[Finding]:
    """Run all checks on the replicas and return findings sorted by severity, then host.

    Args:
        inventory: the inventory.
        facts: facts by host name.
        errors: hosts whose facts could not be gathered (each becomes an error finding).
        skip: check names or prefixes to leave out (``--skip-check``), besides each replica's
            ``preflight_skip_checks``.
        replicas: the replicas to check (default: all of the inventory).
        defaults: role defaults (default: read ``roles/preflight/defaults/main.yml``).
    """
    from vllm_provision.stack.lock import replica_locks
    from vllm_provision.state import inventory_identity

    defaults = load_defaults() if defaults is None else defaults
    findings = unreachable_findings(errors or {})
    identity = inventory_identity(inventory.path)
    locks = replica_locks(inventory)
    nodes = {node.name: r for r in inventory.replicas for node in r.nodes}
    for replica in inventory.replicas if replicas is None else replicas:
        settings = settings_for(replica, defaults)
        skipped = (*skip, *settings.skip_checks)
        found = check_replica(replica, facts, settings)
        scope = InventoryScope(ReplicaScope(replica, facts, settings), identity, locks, nodes)
        for entry in checks_of("inventory"):
            found += entry.obj(scope)
        findings += [replace(f, replica=replica.name) for f in found
                     if not is_skipped(f.check, skipped)]
    findings = [f for f in findings if not is_skipped(f.check, skip)]
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.check, f.host))


def findings_of(replica: Replica, findings: Iterable[Finding]) -> list[Finding]:
    """The findings that belong to ``replica``: those its own checks made (``replica`` set to
    its name, replica-wide ``*`` findings included), and host-level findings made outside any
    replica's checks (``replica`` empty, e.g. facts that could not be gathered) on a host that
    is one of its nodes. A finding of another replica never belongs to it, so one replica's
    error does not fail the others.
    """
    nodes = {node.name for node in replica.nodes}
    return [f for f in findings
            if f.replica == replica.name or (not f.replica and f.host in nodes)]


def has_errors(findings: Iterable[Finding]) -> bool:
    """True when any finding is an error."""
    return any(f.severity is Severity.ERROR for f in findings)
