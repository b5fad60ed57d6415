"""The exporters a node of a replica serves metrics from, by the inventory's monitoring settings
(docs/monitoring.md, "Exporters on the nodes").

One rule read by three rooms: the scrape targets (``operations/monitor.py``), the firewall's
metrics rules (:mod:`vllm_provision.settings.firewall`) and the inventory's port-clash check
(``inventory/replicas.py``), so a port is named once.

- ``vllm_monitoring: node_exporter``: the distribution's Prometheus node exporter, which role
  ``vllm_monitoring`` installs and starts, on ``vllm_node_exporter_port`` (9100, the node
  exporter's own default: prometheus/node_exporter README, ``--web.listen-address``).
- ``vllm_gpu_exporter``: a GPU exporter the operator runs already, on
  ``vllm_gpu_exporter_port``, else the exporter's own default: 9400 for NVIDIA's dcgm-exporter
  (NVIDIA/dcgm-exporter README, ``-a :9400``) and 9835 for nvidia_gpu_exporter
  (utkuozdemir/nvidia_gpu_exporter README, ``--web.listen-address=:9835``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# vllm_gpu_exporter -> the exporter's own default port (see the module docstring).
GPU_EXPORTER_PORTS: dict[str, int] = {"dcgm-exporter": 9400, "nvidia_gpu_exporter": 9835}
GPU_EXPORTERS: tuple[str, ...] = ("none", *GPU_EXPORTER_PORTS)
MONITORING: tuple[str, ...] = ("off", "node_exporter")
# The inventory variables :func:`exporters` reads.
VARIABLES: tuple[str, ...] = ("vllm_monitoring", "vllm_node_exporter_port", "vllm_gpu_exporter",
                              "vllm_gpu_exporter_port")


@dataclass(frozen=True)
class Exporter:
    """One exporter on every node of a replica.

    Attributes:
        job: the Prometheus scrape job it belongs to (``node`` or ``gpu``; the targets file
            ``targets/<job>.json``).
        what: what it is, for messages and the firewall's comment ("node exporter").
        variable: the inventory variable that sets its port.
        port: its TCP port.
    """

    job: str
    what: str
    variable: str
    port: int


def gpu_exporter_port(name: str, port: Any) -> int | None:
    """The port of GPU exporter ``name`` (``vllm_gpu_exporter``): ``port``
    (``vllm_gpu_exporter_port``) when set, else the exporter's default; None for ``none`` or a
    name the inventory check refuses."""
    if name not in GPU_EXPORTER_PORTS:
        return None
    return int(port) if isinstance(port, int) and not isinstance(port, bool) \
        else GPU_EXPORTER_PORTS[name]


def exporters(values: Mapping[str, Any]) -> list[Exporter]:
    """The exporters a node with settings ``values`` serves (a node's settings:
    ``settings.node_settings``, or a template's variables), node exporter first.

    Args:
        values: ``vllm_monitoring``, ``vllm_node_exporter_port``, ``vllm_gpu_exporter`` and
            ``vllm_gpu_exporter_port`` (checked at load; missing ones read as off).
    """
    found = []
    if values.get("vllm_monitoring") == "node_exporter":
        port = values.get("vllm_node_exporter_port")
        if isinstance(port, int) and not isinstance(port, bool):
            found.append(Exporter("node", "node exporter", "vllm_node_exporter_port", port))
    name = str(values.get("vllm_gpu_exporter") or "none")
    gpu_port = gpu_exporter_port(name, values.get("vllm_gpu_exporter_port"))
    if gpu_port is not None:
        found.append(Exporter("gpu", f"GPU exporter {name}", "vllm_gpu_exporter_port", gpu_port))
    return found


def exporter_ports(monitoring: Any, node_port: Any, gpu_exporter: Any, gpu_port: Any,
                   ) -> list[tuple[str, int]]:
    """``[(what, port), ...]`` of :func:`exporters` from the four variables' values (the
    firewall template passes them one by one: a template never hands a whole scope on)."""
    return [(e.what, e.port) for e in exporters({
        "vllm_monitoring": monitoring, "vllm_node_exporter_port": node_port,
        "vllm_gpu_exporter": gpu_exporter, "vllm_gpu_exporter_port": gpu_port})]
