"""Replicas that share a server: each one's names there (``vllm_instance``).

A server runs the nodes of one replica unless each replica on it declares ``vllm_instance``, a
short name (docs/inventory.md, "Shared servers"). Everything this tool installs or keeps on a
node is then named after it, so the replicas on one server never touch each other's units,
files, firewall table, state record, pending notifications or run lock:

=================================  =============================================================
variable                           with ``vllm_instance: a``
=================================  =============================================================
``vllm_unit_name``                 ``vllm-a.service``
``vllm_watchdog_unit_name``        ``vllm-watchdog-a.service``
``vllm_firewall_unit_name``        ``vllm-firewall-a.service``
``vllm_config_dir``                ``/etc/vllm-provision/a`` (and the env, firewall and watchdog
                                   files in it)
``vllm_watchdog_hold_file``,       ``/run/vllm-provision/a/watchdog.hold``, ``.../watchdog.json``
``vllm_watchdog_state_file``
``vllm_firewall_table``            ``vllm_provision_a`` (nftables table, ``inet`` family)
``provision_state_dir``            ``/var/lib/vllm-provision/instances/a``: the state record, the
                                   run lock, pending handler notifications, upgrade snapshots
=================================  =============================================================

A value the inventory sets itself wins over the derived one. Shared on purpose: the venv, the
model folder, ``vllm_state_dir`` (vLLM's compile caches are keyed by their inputs), the
watchdog's program, the node exporter, and ``systemctl daemon-reload``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vllm_provision.core.paths import STATE_DIR

# a letter, then letters, digits or _: valid in a unit name (systemd.unit(5)), a path and an
# nftables table name (nft(8), identifiers) without any quoting
INSTANCE_RE = re.compile(r"[a-z][a-z0-9_]{0,15}")

FIREWALL_TABLE = "vllm_provision"


def check_instance(value: str) -> str | None:
    """Return what a valid ``vllm_instance`` is when ``value`` is not one, else None."""
    return None if INSTANCE_RE.fullmatch(value) else (
        "a short name: a lower-case letter, then up to 15 lower-case letters, digits or _")


def derived(instance: str | None) -> dict[str, str]:
    """The variables ``vllm_instance`` names (the module's table); empty when it is unset."""
    if not instance:
        return {}
    config = f"/etc/vllm-provision/{instance}"
    run = f"/run/vllm-provision/{instance}"
    return {
        "vllm_unit_name": f"vllm-{instance}.service",
        "vllm_watchdog_unit_name": f"vllm-watchdog-{instance}.service",
        "vllm_firewall_unit_name": f"vllm-firewall-{instance}.service",
        "vllm_config_dir": config,
        "vllm_env_file": f"{config}/vllm.env",
        "ray_env_file": f"{config}/ray.env",
        "vllm_firewall_file": f"{config}/firewall.nft",
        "vllm_watchdog_config": f"{config}/watchdog.json",
        "vllm_watchdog_hold_file": f"{run}/watchdog.hold",
        "vllm_watchdog_state_file": f"{run}/watchdog.json",
        "vllm_firewall_table": f"{FIREWALL_TABLE}_{instance}",
        "provision_state_dir": f"{STATE_DIR}/instances/{instance}",
    }


def record_file(host_vars: Mapping[str, Any]) -> str:
    """The host's copy of the state record: ``state.json`` in its :func:`state_dir`."""
    return f"{state_dir(host_vars)}/state.json"


def state_dir(host_vars: Mapping[str, Any]) -> str:
    """Where this tool keeps its own files on the host (``provision_state_dir``: the state
    record ``state.json``, the run lock, ``pending/``, ``upgrade/``), from the host's merged
    variables (``Host.vars``)."""
    return str(host_vars.get("provision_state_dir") or STATE_DIR)


def check_firewall_table(value: Any) -> str | None:
    """Return what a valid ``vllm_firewall_table`` is when ``value`` is not one, else None:
    ``vllm_provision`` or ``vllm_provision_<instance>`` (the name is written into the nft file
    as it is)."""
    if value == FIREWALL_TABLE or (
            isinstance(value, str) and value.startswith(FIREWALL_TABLE + "_")
            and check_instance(value[len(FIREWALL_TABLE) + 1:]) is None):
        return None
    return f"{FIREWALL_TABLE}, or {FIREWALL_TABLE}_<instance> (vllm_instance names it)"


def firewall_table(host_vars: Mapping[str, Any]) -> str:
    """The name of the nftables table of ours (``vllm_firewall_table``) in a host's or a
    replica's variables (``Host.vars``, ``Replica.vars``).

    Raises:
        ProvisionError: a value set by hand that is not ``vllm_provision`` or
            ``vllm_provision_<instance>`` (the name is written into the nft file as it is).
    """
    table = host_vars.get("vllm_firewall_table") or FIREWALL_TABLE
    if check_firewall_table(table) is not None:
        from vllm_provision.core.errors import ProvisionError

        raise ProvisionError.single("vllm_firewall_table", "not a table name of ours",
                                    expected=f"{FIREWALL_TABLE} or {FIREWALL_TABLE}_<instance>",
                                    actual=repr(table),
                                    fix="remove vllm_firewall_table: vllm_instance names it")
    return str(table)
