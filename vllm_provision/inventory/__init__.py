"""Load, validate and query an Ansible-compatible YAML inventory.

``load_inventory(path, extra_vars)`` returns a validated
:class:`~vllm_provision.core.models.Inventory`
or raises one :class:`~vllm_provision.core.errors.InventoryError` listing every problem;
``select_hosts(inventory, pattern)`` resolves an Ansible host pattern (``--limit``, ``hosts:``).
"""

from vllm_provision.inventory.loader import load_inventory, require_replicas
from vllm_provision.inventory.patterns import select_hosts

__all__ = ["load_inventory", "require_replicas", "select_hosts"]
