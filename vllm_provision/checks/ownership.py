"""Ownership: a host deployed by another replica or another inventory is not changed silently.

Each host's state record (``vllm_provision.state``, written after every good ``provision up``)
names the inventory (its identity: :func:`vllm_provision.state.inventory_identity`) and the
replica the host belonged to. Before ``up``, ``restart`` or ``down`` change a host, and in
``provision check``, that owner is compared with the run's: a host of another replica or of
another inventory is an error until the operator says ``--take-over`` (docs/deploy.md, "Who
owns a host"). A host without a record (never deployed, or deployed before records existed)
belongs to nobody and passes, and so does a host where the owner's replica is down (none of
the units it started runs): ``provision down`` hands the hosts back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllm_provision.checks.context import InventoryScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica
from vllm_provision.facts.model import HostOwner

CHECK = "ownership"


@dataclass(frozen=True)
class Conflict:
    """A host whose record names another owner than the run.

    Attributes:
        host: the host's name in the run's inventory.
        owner: what its record says.
        replica / inventory: the run's replica name and inventory identity.
    """

    host: str
    owner: HostOwner
    replica: str
    inventory: str

    def describe(self) -> str:
        """One line naming both owners: ``h1 belongs to replica 'lab' of /a.yml, not to
        replica 'llm' of /b.yml``."""
        old = f"replica {self.owner.replica!r}" if self.owner.replica else "a replica"
        return (f"{self.host} belongs to {old} of {self.owner.inventory or 'an unknown inventory'}"
                f", not to replica {self.replica!r} of {self.inventory}")


def conflict(replica: Replica, host: str, owner: HostOwner | None,
             inventory: str) -> Conflict | None:
    """The :class:`Conflict` of one node of ``replica`` (pure), or None when the host has no
    record, its record names this replica of this inventory, or the owner's replica is down
    there (``HostOwner.running``: ``provision down`` hands a host back).

    Args:
        replica: the run's replica. host: the node's inventory name.
        owner: the host's record (``HostFacts.owner``), or None.
        inventory: the run's inventory identity.
    """
    if owner is None:
        return None
    if (owner.inventory == inventory and owner.replica == replica.name) or not owner.running:
        return None
    return Conflict(host, owner, replica.name, inventory)


def take_over_fix(item: Conflict) -> str:
    """The fix line of a conflict: the two ways out."""
    return (f"run with --take-over to hand {item.host} to replica {item.replica!r} (what "
            f"replica {item.owner.replica!r} installed that this inventory does not is removed), "
            f"or use the inventory {item.owner.inventory}")


def check_ownership(replica: Replica, owners: Mapping[str, HostOwner | None],
                    inventory: str) -> list[Finding]:
    """One finding per node of ``replica`` with a known owner (pure).

    Args:
        replica: the replica to check.
        owners: host name -> its record's owner (None: no record); hosts left out were not
            probed and get no finding.
        inventory: the run's inventory identity.

    Returns:
        ``ownership`` findings: an error per node owned by another replica or inventory, with
        the fix; ok for a node this replica owns or that has no record.
    """
    findings = []
    for node in replica.nodes:
        if node.name not in owners:
            continue
        owner = owners[node.name]
        found = conflict(replica, node.name, owner, inventory)
        expected = f"replica {replica.name} of {inventory}, or no owner"
        if found is None:
            actual = ("no state record" if owner is None
                      else f"replica {owner.replica} of {owner.inventory}"
                      + ("" if owner.running else " (down there: the host is free)"))
            findings.append(Finding(CHECK, Severity.OK, node.name, "owner of the host",
                                    expected=expected, actual=actual))
        else:
            findings.append(Finding(
                CHECK, Severity.ERROR, node.name, "owner of the host", expected=expected,
                actual=f"replica {found.owner.replica or '?'} of {found.owner.inventory}",
                fix=take_over_fix(found), source="docs/deploy.md, \"Who owns a host\""))
    return findings


# -- registered checks (checks/context.py): what run.py runs, in this order ------------------

@check("ownership.ownership", order=10, scope="inventory")
def _ownership(scope: InventoryScope) -> list[Finding]:
    """No node belongs to another replica or inventory (the state records)."""
    return check_ownership(scope.replica, scope.owners, scope.identity)
