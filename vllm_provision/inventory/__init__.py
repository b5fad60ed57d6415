"""Load, validate and query an Ansible-compatible YAML inventory.

``load_inventory(path, extra_vars)`` returns a validated
:class:`~vllm_provision.core.models.Inventory`
or raises one :class:`~vllm_provision.core.errors.InventoryError` listing every problem;
``select_hosts(inventory, pattern)`` resolves an Ansible host pattern (``--limit``, ``hosts:``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_provision.inventory.loader import load_inventory, require_replicas
    from vllm_provision.inventory.patterns import select_hosts

__all__ = ["load_inventory", "require_replicas", "select_hosts"]

# Where each public name lives. The package imports them when first asked (PEP 562), so a
# command that only needs a light part of the package (a YAML limit for ``-e @file``, or its
# ``--help``) does not load the whole loader.
_HOMES = {"load_inventory": "loader", "require_replicas": "loader", "select_hosts": "patterns"}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
