"""Ownership: a host deployed by another replica is not changed silently.

Each host's state record (``vllm_provision.state``, written after every good ``provision up``)
names the replica the host belongs to by its owner id (``Replica.replica_id``: the declared
``vllm_replica_id``, else an id derived from the replica's name, hosts and model), and says
where that run came from (the inventory's path, the controller's host name). Before ``up``,
``restart`` or ``down`` change a host, and in ``provision check``, the recorded id is compared
with the run's replica's: a host of another id is an error until the operator says
``--take-over`` (docs/deploy.md, "Who owns a host"). The inventory's path is not compared, so the
same inventory checked out at another path, or on another controller, is the same owner, and
another inventory at the same path is not.

A record written before records held a replica id is matched the old way, narrowed by what it
holds: the same inventory path and replica name, and (for a replica that declares no id) the
same node names and model. The next good ``up`` rewrites it with the id.

A host without a record (never deployed, or deployed before records existed) belongs to nobody
and passes, and so does a host where the owner's replica is down (none of the units it started
runs): ``provision down`` hands the hosts back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllm_provision.checks.context import check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica
from vllm_provision.facts.model import HostOwner

CHECK = "ownership"
SOURCE = "docs/deploy.md, \"Who owns a host\""


def owner_text(replica: str, replica_id: str, inventory: str = "", controller: str = "") -> str:
    """One owner in words: ``replica 'lab' (id lab@3f2a9c01d4e5b6a7) of /a/lab.yml on ctl1``.

    Args:
        replica: the replica's name (``""``: unknown). replica_id: its owner id (``""``: a
            record written before ids). inventory: the inventory's path (``""``: not said).
        controller: the controller's host name (``""``: not said).
    """
    text = f"replica {replica!r}" if replica else "a replica"
    text += f" (id {replica_id})" if replica_id else " (no replica id: an older record)"
    if inventory:
        text += f" of {inventory}"
    if controller:
        text += f" on {controller}"
    return text


def recorded_owner(owner: HostOwner) -> str:
    """:func:`owner_text` of a host's record."""
    return owner_text(owner.replica, owner.replica_id, owner.inventory or "an unknown inventory",
                      owner.controller)


@dataclass(frozen=True)
class Conflict:
    """A host whose record names another owner than the run.

    Attributes:
        host: the host's name in the run's inventory.
        owner: what its record says.
        replica / inventory: the run's replica name and inventory path.
        replica_id: the run's replica's owner id (``Replica.replica_id``).
    """

    host: str
    owner: HostOwner
    replica: str
    inventory: str
    replica_id: str = ""

    def run_owner(self) -> str:
        """The run's side in words (:func:`owner_text`)."""
        return owner_text(self.replica, self.replica_id, self.inventory)

    def describe(self) -> str:
        """One line naming both owners: ``h1 belongs to replica 'lab' (id lab@...) of /a.yml on
        ctl1, not to replica 'llm' (id llm@...) of /b.yml``."""
        return f"{self.host} belongs to {recorded_owner(self.owner)}, not to {self.run_owner()}"


def legacy_match(replica: Replica, owner: HostOwner, inventory: str) -> bool:
    """Whether a record without a replica id (written before ids existed) is this replica's
    (pure): the same inventory path and replica name, the old rule; for a replica without a
    declared id also the same node names (rank order) and model, where the record holds them,
    since those are what its derived id would have held."""
    if owner.inventory != inventory or owner.replica != replica.name:
        return False
    if replica.declared_id is not None:
        return True
    names = tuple(node.name for node in replica.nodes)
    return (not owner.nodes or owner.nodes == names) and \
        (not owner.model or owner.model == replica.engine.model)


def same_owner(replica: Replica, owner: HostOwner, inventory: str) -> bool:
    """Whether ``owner`` (a host's record) is ``replica`` (pure): the same replica id, or for a
    record without one, :func:`legacy_match`.

    Args:
        replica: the run's replica. owner: the host's record. inventory: the run's inventory
            path (``state.inventory_identity``), read only for a record without an id.
    """
    if owner.replica_id:
        return owner.replica_id == replica.replica_id
    return legacy_match(replica, owner, inventory)


def conflict(replica: Replica, host: str, owner: HostOwner | None,
             inventory: str) -> Conflict | None:
    """The :class:`Conflict` of one node of ``replica`` (pure), or None when the host has no
    record, its record is this replica's (:func:`same_owner`), or the owner's replica is down
    there (``HostOwner.running``: ``provision down`` hands a host back).

    Args:
        replica: the run's replica. host: the node's inventory name.
        owner: the host's record (``HostFacts.owner``), or None.
        inventory: the run's inventory path.
    """
    if owner is None or same_owner(replica, owner, inventory) or not owner.running:
        return None
    return Conflict(host, owner, replica.name, inventory, replica.replica_id)


def take_over_fix(item: Conflict) -> str:
    """The fix line of a conflict: the ways out."""
    where = item.owner.inventory or "the inventory that deployed it"
    if item.owner.controller:
        where += f" on {item.owner.controller}"
    return (f"if this inventory is now meant to run {item.host} (the replica's name, hosts or "
            f"model changed, or it is a copy that declares another vllm_replica_id), run once "
            f"with --take-over to hand it to replica {item.replica!r} (what the old owner "
            f"installed that this inventory does not is removed); "
            f"declare vllm_replica_id to keep the ownership across such changes. Otherwise "
            f"leave it to its owner ({where}), or run `provision down` from there to free it")


@check("ownership.ownership", order=10, scope="inventory", reads=("replica", "owners", "identity"))
def check_ownership(replica: Replica, owners: Mapping[str, HostOwner | None],
                    inventory: str) -> list[Finding]:
    """One finding per node of ``replica`` with a known owner (pure).

    Args:
        replica: the replica to check.
        owners: host name -> its record's owner (None: no record); hosts left out were not
            probed and get no finding.
        inventory: the run's inventory path (``state.inventory_identity``).

    Returns:
        ``ownership`` findings: an error per node owned by another replica, with the fix; ok for
        a node this replica owns or that has no record.
    """
    findings = []
    expected = f"{owner_text(replica.name, replica.replica_id)}, or no owner"
    for node in replica.nodes:
        if node.name not in owners:
            continue
        owner = owners[node.name]
        found = conflict(replica, node.name, owner, inventory)
        if found is None:
            actual = ("no state record" if owner is None
                      else recorded_owner(owner)
                      + ("" if owner.running or same_owner(replica, owner, inventory)
                         else " (down there: the host is free)"))
            findings.append(Finding(CHECK, Severity.OK, node.name, "owner of the host",
                                    expected=expected, actual=actual))
        else:
            findings.append(Finding(
                CHECK, Severity.ERROR, node.name, "owner of the host", expected=expected,
                actual=recorded_owner(found.owner), fix=take_over_fix(found), source=SOURCE))
    return findings
