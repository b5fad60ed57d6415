"""Which hosts a play runs on: its ``hosts:`` pattern, intersected with ``--limit``."""

from __future__ import annotations

from vllm_provision.core.models import Host, Inventory


def select_play_hosts(inventory: Inventory, pattern: str, limit: str | None = None) -> list[Host]:
    """Return the hosts of ``pattern`` that also match ``limit`` (if given), in inventory order.

    Raises:
        InventoryError: either pattern names no known host or group
            (``vllm_provision.inventory.select_hosts``).
    """
    from vllm_provision.inventory import select_hosts

    hosts = select_hosts(inventory, pattern)
    if limit:
        allowed = {h.name for h in select_hosts(inventory, limit)}
        hosts = [h for h in hosts if h.name in allowed]
    return hosts
