"""One settings resolver: the value of every variable for a host, a node or a replica, in one
precedence chain (Ansible's order, docs/runner-contract.md "Variable precedence"):

1. the variables table's defaults (``vllm_provision.settings.variables``, lowest);
2. role defaults (``roles/*/defaults/main.yml``: every role's, so a playbook task, a check and
   the verify suite see the same watchdog port without repeating it);
3. inventory variables: group vars, then host vars, then ``-e`` (the inventory loader merges
   these into ``Host.vars``, ``vllm_provision.inventory.loader``);
4. play ``vars`` (the runner only);
5. values ``register``-ed by earlier tasks of the run (the runner only);
6. ``-e`` extra variables again (highest, as in Ansible: they beat play vars and registers).

The runner's templates (``runner.variables.VariableResolver.templar_for``), the preflight checks
(``checks.run.settings_for``), the plan (``operations.deploy.run_plan``), the facts probe's
ports and the verify suite all read it; none keeps a default of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_provision.core.models import Inventory, Node, Replica


@lru_cache(maxsize=1)
def _base() -> dict[str, Any]:
    from vllm_provision.settings import variables

    merged = dict(variables.defaults())
    merged.update(variables.role_defaults())
    return merged


def base() -> dict[str, Any]:
    """Levels 1 and 2: the table's defaults under every role's defaults (a fresh copy).

    Raises:
        ProvisionError: the roles are missing from the installation or a defaults file is
            unreadable (``variables.role_defaults``).
    """
    return {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
            for k, v in _base().items()}


def layered(inventory_vars: Mapping[str, Any], *,
            role_defaults: Mapping[str, Any] | None = None,
            play_vars: Mapping[str, Any] | None = None,
            registered: Mapping[str, Any] | None = None,
            extra_vars: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole chain for one host (pure but for :func:`base`).

    Layering a mapping that is already resolved (a task module's ``ctx.vars``, built by the
    runner with this function) again gives the same values, and fills in any default a
    hand-made mapping (a test's) lacks: product code reads ``layered(vars_)[name]`` rather than
    ``vars_.get(name, default)``, so every default stays in the variables table or a role's
    defaults (``tests/unit/test_settings_reads.py`` keeps it so).

    Args:
        inventory_vars: level 3, a host's merged inventory variables (``Host.vars``) or a
            replica's (``Replica.vars``).
        role_defaults: the play's own role defaults, over every role's (level 2).
        play_vars: level 4. registered: level 5. extra_vars: level 6.
    """
    merged = base()
    for level in (role_defaults, inventory_vars, play_vars, registered, extra_vars):
        if level:
            merged.update(level)
    return merged


def host_settings(inventory: Inventory, host_name: str) -> dict[str, Any]:
    """Every variable of ``host_name`` outside a play (levels 1-3 and 6).

    Raises:
        KeyError: no host of that name in the inventory.
    """
    return layered(inventory.hosts[host_name].vars, extra_vars=inventory.extra_vars)


def replica_settings(replica: Replica, extra_vars: Mapping[str, Any] | None = None,
                     ) -> dict[str, Any]:
    """The replica-scope settings: the variables every node of ``replica`` agrees on
    (``Replica.vars``, checked at inventory load) over the defaults, then ``extra_vars``."""
    return layered(replica.vars, extra_vars=extra_vars)


def node_settings(replica: Replica, node: Node, extra_vars: Mapping[str, Any] | None = None,
                  ) -> dict[str, Any]:
    """The settings of one node of ``replica``: the node's own host variables win over its
    replica's values, which win over the defaults; then ``extra_vars``.

    This is the "node, else replica, else default" rule of the per-node variables
    (``vllm_watchdog_port``, ``vllm_cluster_interface``: docs/recovery.md, docs/inventory.md).

    Args:
        replica: the node's replica (``Replica.vars``: its group's merged, agreed values).
        node: one of ``replica.nodes`` (``node.host.vars``: its merged inventory variables).
        extra_vars: ``-e`` values, highest (already inside ``Host.vars`` when loaded).
    """
    return layered({**dict(replica.vars), **dict(node.host.vars)}, extra_vars=extra_vars)


def master_settings(replica: Replica, extra_vars: Mapping[str, Any] | None = None,
                    ) -> dict[str, Any]:
    """The settings of ``replica``'s rank 0 host: its replica's values, under its own host
    variables (a per-host unit name, say); :func:`node_settings` of ``replica.master``."""
    return node_settings(replica, replica.master, extra_vars)


def watchdog_port(replica: Replica, node: Node | None = None) -> int:
    """The TCP port ``node``'s peer watchdog serves its state on (``vllm_watchdog_port``).

    The one rule for it (docs/recovery.md, "2. Peer watchdog" and "Limits";
    roles/vllm_watchdog/defaults/main.yml): the node's own host variable, else the replica's,
    else the role default (:func:`node_settings`). The firewall, the facts probe's peer ports
    and the preflight port checks all read it here.

    Args:
        replica: the replica.
        node: one of its nodes; None for rank 0 (the firewall's one port per replica).

    Raises:
        ValueError: the value is not an integer (the loader has checked its kind already).
    """
    return int(node_settings(replica, replica.master if node is None else node)
               ["vllm_watchdog_port"])
