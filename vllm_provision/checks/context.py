"""The check registry and what a registered check is given.

A check is a function in a module of this package, registered where it is defined. A rule
that keeps its own arguments names the scope's attributes it takes, in order (it stays callable
with them, as its unit tests call it)::

    from vllm_provision.checks.context import check

    @check("mything.thing", order=195, scope="node", reads=("node", "facts"), only="gpu")
    def check_thing(node: Node, facts: HostFacts) -> list[Finding]:
        ...

A check that must compute from the scope takes the scope itself (no ``reads``)::

    @check("mything.other", order=196, scope="node")
    def _other(scope: NodeScope) -> list[Finding]:
        return check_other(scope.node, scope.facts, derive(scope))

``checks/run.py`` imports every module of the package (:func:`vllm_provision.core.registry.
import_submodules`) and runs the registered checks in their declared ``order`` (the order of
their findings before ``run_checks`` sorts them), in three scopes:

``replica``
    once per replica (:class:`ReplicaScope`), first;
``node``
    then once per node that has facts (:class:`NodeScope`);
``inventory``
    last, from ``run_checks`` only, with what it reads once per inventory: the state record's
    identity and the stack locks (:class:`InventoryScope`).

A check returns its findings (a list, empty when it does not apply, such as a GPU check on a
CPU replica: ``only="gpu"`` says so). A rule registered with ``reads`` keeps its own arguments:
the registry picks them from the scope, and tests call the rule with its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, wraps
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from vllm_provision.core.registry import Registry
from vllm_provision.settings import node_settings, replica_settings

if TYPE_CHECKING:
    from vllm_provision.checks.finding import Finding
    from vllm_provision.checks.options import PreflightSettings
    from vllm_provision.core.models import Node, Replica
    from vllm_provision.facts.model import Gpu, HostFacts, HostOwner
    from vllm_provision.stack.lock import Lock

SCOPES = ("replica", "node", "inventory")

# name -> check; Entry.meta["scope"] is one of SCOPES
CHECKS: Registry[Callable[[Any], list[Finding]]] = Registry("check")


def check(name: str, *, order: float, scope: str, reads: Sequence[str] | None = None,
          only: str | None = None) -> Callable[[Callable[..., list[Finding]]],
                                               Callable[..., list[Finding]]]:
    """Register the decorated function as the check ``name`` (:data:`CHECKS`) and return it
    unchanged.

    Args:
        name: ``<module>.<what>`` in lower case (``network.routes``); unique.
        order: its place among the checks of its scope (today's are 10, 20, ...; a new one
            takes a free number between them).
        scope: ``replica`` (called with a :class:`ReplicaScope`), ``node``
            (:class:`NodeScope`) or ``inventory`` (:class:`InventoryScope`).
        reads: the scope's attributes the function takes, in order (dotted paths such as
            ``settings.min_shm_mib`` reach inside one); None: it takes the scope itself.
        only: ``gpu`` or ``cpu``: the check applies only to replicas on that device
            (``vllm_device``); elsewhere it finds nothing. None: every replica.

    Raises:
        ProvisionError: an unknown scope or ``only``, an invalid name, or a name taken by
            another check (naming both modules).
    """
    if scope not in SCOPES or only not in (None, "gpu", "cpu"):
        from vllm_provision.core.errors import ProvisionError

        what, want, got = (("scope", " or ".join(SCOPES), scope) if scope not in SCOPES
                           else ("only", "gpu or cpu", only))
        raise ProvisionError.single(f"check {name!r}", f"unknown check {what}",
                                    expected=want, actual=repr(got))
    if reads is None and only is None:
        return CHECKS.register(name, order=order, scope=scope)
    getters = [attrgetter(path) for path in reads] if reads is not None else None

    def decorate(rule: Callable[..., list[Finding]]) -> Callable[..., list[Finding]]:
        @wraps(rule)
        def run(given: Any) -> list[Finding]:
            if only is not None and given.gpu != (only == "gpu"):
                return []
            return rule(*(get(given) for get in getters)) if getters is not None else rule(given)

        CHECKS.add(name, run, order=order, module=rule.__module__, scope=scope)
        return rule

    return decorate


def device_counts(facts: Mapping[str, HostFacts], device: str,
                  replica: Replica | None = None) -> dict[str, int]:
    """Devices per host the topology checks count: GPUs (nvidia-smi), or CPU cores for ``cpu``.

    vLLM's CPU build runs one worker per rank, each bound to its own cores
    (``VLLM_CPU_OMP_THREADS_BIND``, vllm/v1/worker/cpu_worker.py), so a node can hold at most
    as many ranks as it has logical CPUs. A node of ``replica`` with ``vllm_gpus`` counts the
    GPUs of its set that nvidia-smi lists (:func:`chosen_gpus`): all CUDA shows its processes.
    """
    if device == "cpu":
        return {name: f.cpu_count or 0 for name, f in facts.items()}
    counts = {name: len(f.gpus) for name, f in facts.items()}
    for node in replica.nodes if replica is not None else ():
        if node.gpus is not None and node.name in facts:
            counts[node.name] = len(chosen_gpus(node, facts[node.name]))
    return counts


def chosen_gpus(node: Node, facts: HostFacts) -> tuple[Gpu, ...]:
    """The GPUs of ``facts`` that ``node``'s processes may see: those its ``vllm_gpus`` names
    (``Node.gpus``) and nvidia-smi lists, in nvidia-smi's order; every GPU when it is unset.
    An index the host lacks is left out (preflight's ``host.gpus`` names it)."""
    if node.gpus is None:
        return tuple(facts.gpus)
    return tuple(gpu for gpu in facts.gpus if gpu.index in node.gpus)


def gpu_view(replica: Replica, facts: Mapping[str, HostFacts]) -> dict[str, HostFacts]:
    """``facts`` with each node's GPU list cut to its ``vllm_gpus`` (:func:`chosen_gpus`), for
    rules that compare GPUs across nodes (parity's GPU model and count): the GPUs a replica
    does not use are not its business. Nodes without a set, and other hosts, are unchanged."""
    from dataclasses import replace

    view = dict(facts)
    for node in replica.nodes:
        if node.gpus is not None and node.name in facts:
            view[node.name] = replace(facts[node.name],
                                      gpus=chosen_gpus(node, facts[node.name]))
    return view


def shared_pool_wait(replica: Replica) -> float | None:
    """``vllm_gpu_wait_timeout_s`` when the replica's ``vllm_gpu_pool`` is ``shared``, else None
    (docs/preflight.md, "Shared GPU pool")."""
    values = replica_settings(replica)
    if values["vllm_gpu_pool"] != "shared":
        return None
    return float(values["vllm_gpu_wait_timeout_s"])


def own_units(replica: Replica, node: Node, facts: HostFacts,
              watchdog_unit: str) -> tuple[list[str], list[str]]:
    """``(planned, leaving)``: the units of this plan on ``node`` (its backend's
    ``node_units``), and the units the host's state record lists that this plan does not have
    (pure).

    Only these may hold the node's ports and GPUs. A unit that is leaving counts only because
    ``provision up`` stops it before anything starts (``vllm_provision.state.prune``, the play
    before
    the install plays), not because it is ours: a unit of the same name that no record of ours
    lists is another job's.
    """
    from vllm_provision.state.prune import unit_names

    planned = list(replica.backend_type.node_units(replica, node, node.host.vars))
    owner = facts.owner
    if owner is None:
        return planned, []
    recorded = owner.units if owner.units is not None else tuple(
        u for u in unit_names(owner.files) if u != watchdog_unit)
    return planned, [u for u in recorded if u not in planned]


@dataclass
class ReplicaScope:
    """What a ``replica`` check gets: one replica, every host's facts, its merged settings.

    Attributes:
        replica: the replica.
        facts: facts by host name (nodes without facts are absent).
        settings: the replica's merged preflight settings.
    """

    replica: Replica
    facts: Mapping[str, HostFacts]
    settings: PreflightSettings

    @cached_property
    def values(self) -> dict[str, Any]:
        """The replica's settings (``settings.replica_settings``)."""
        return dict(replica_settings(self.replica))

    @cached_property
    def device(self) -> str:
        """``vllm_device`` (``cpu`` for vLLM's CPU build)."""
        return str(self.values["vllm_device"])

    @property
    def gpu(self) -> bool:
        """True unless the replica runs on CPUs."""
        return self.device != "cpu"

    @cached_property
    def interface(self) -> Any:
        """The replica's ``vllm_cluster_interface`` (None when unset)."""
        return self.values.get("vllm_cluster_interface")

    @cached_property
    def model_bytes(self) -> int:
        """The model's size on the master (0 without its facts or files)."""
        master = self.facts.get(self.replica.master.name)
        if master is None or not master.model_files:
            return 0
        return sum(f.size for f in master.model_files)


@dataclass
class NodeScope:
    """What a ``node`` check gets: its replica's scope, one node and that node's facts.

    Attributes:
        of: the replica's :class:`ReplicaScope`.
        node: the node.
        facts: the node's facts.
    """

    of: ReplicaScope
    node: Node
    facts: HostFacts

    @property
    def replica(self) -> Replica:
        """The node's replica."""
        return self.of.replica

    @property
    def settings(self) -> PreflightSettings:
        """The replica's merged preflight settings."""
        return self.of.settings

    @property
    def gpu(self) -> bool:
        """True unless the replica runs on CPUs."""
        return self.of.gpu

    @property
    def used_gpus(self) -> tuple[int, ...]:
        """The GPU indexes the replica uses on this node (``Replica.node_gpus``)."""
        return self.replica.node_gpus(self.node)

    @cached_property
    def interface(self) -> Any:
        """The node's own ``vllm_cluster_interface`` (host vars win; None when unset)."""
        return node_settings(self.replica, self.node).get("vllm_cluster_interface")

    @cached_property
    def units(self) -> tuple[list[str], list[str]]:
        """``(planned, leaving)`` units on this node (:func:`own_units`)."""
        return own_units(self.replica, self.node, self.facts, self.settings.watchdog_unit)


@dataclass
class InventoryScope:
    """What an ``inventory`` check gets: the replica's scope and what ``run_checks`` reads once
    per inventory.

    Attributes:
        of: the replica's :class:`ReplicaScope`.
        identity: the inventory's path as state records hold it (``state.inventory_identity``);
            ownership compares replica ids and reads it only for records without one.
        locks: replica name -> its stack lock (``stack.replica_locks``).
        nodes: every node of the inventory's replicas, by host name -> its replica (the
            replicas this run does not check included).
    """

    of: ReplicaScope
    identity: Any
    locks: Mapping[str, Lock] = field(default_factory=dict)
    nodes: Mapping[str, Replica] = field(default_factory=dict)

    @property
    def replica(self) -> Replica:
        """The replica."""
        return self.of.replica

    @cached_property
    def owners(self) -> dict[str, HostOwner | None]:
        """Node name -> the owner its state record names (nodes with facts only)."""
        return {node.name: self.of.facts[node.name].owner for node in self.replica.nodes
                if node.name in self.of.facts}
