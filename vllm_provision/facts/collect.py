"""Open connections, gather facts and close: the I/O edge used by ``provision facts``/``check``."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host, Inventory
from vllm_provision.facts.gather import ProbeOptions, gather_facts
from vllm_provision.facts.model import HostFacts
from vllm_provision.transport.base import ConnectionOptions
from vllm_provision.transport.connection import close_all, open_connections


def collect_facts(inventory: Inventory, hosts: Sequence[Host],
                  probe: ProbeOptions | None = None,
                  connection: ConnectionOptions | None = None,
                  ) -> tuple[dict[str, HostFacts], dict[str, ProvisionError]]:
    """Connect to ``hosts`` (one SSH connection each), probe them all at once, then disconnect.

    Args:
        inventory: the loaded inventory.
        hosts: the hosts to probe.
        probe: what the probe gathers.
        connection: SSH settings (default :class:`ConnectionOptions`).

    Returns:
        ``(facts by host, errors by host)``: unreachable hosts and failed probes are errors.
    """
    options = connection or ConnectionOptions()
    connections, unreachable = open_connections(hosts, options)
    try:
        facts, errors = gather_facts(inventory, connections, probe)
    finally:
        close_all(connections)
    return facts, {**unreachable, **errors}
