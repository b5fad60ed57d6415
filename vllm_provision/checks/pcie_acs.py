"""PCIe ACS check of one node: no bridge above a used GPU redirects peer-to-peer traffic.

Reads the ``pcie_acs`` fact (``vllm_provision/facts/extra/pcie_acs.py``). A pure function
from one node's facts to findings.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from vllm_provision.checks.context import check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Node
from vllm_provision.facts.extra import value_of
from vllm_provision.facts.extra.pcie_acs import PcieAcs
from vllm_provision.facts.model import HostFacts, pci_key

SOURCE = ("NCCL docs, Troubleshooting: PCI Access Control Services (ACS); "
          "NVIDIA/nccl-tests #112; include/uapi/linux/pci_regs.h (PCI_ACS_*)")


@check("pcie_acs.redirect", order=125, scope="node",
       reads=("node", "facts", "used_gpus", "replica.nodes"), only="gpu")
def check_acs_redirect(node: Node, facts: HostFacts, used: Collection[int],
                       nodes: Sequence[Node]) -> list[Finding]:
    """A warning when a PCIe switch port above a GPU the replica uses has P2P Request
    Redirect, P2P Completion Redirect or Upstream Forwarding set in its ACS Control register,
    and peer-to-peer traffic would cross it: NCCL's GPU-to-GPU traffic over PCIe and
    GPUDirect RDMA to the NIC then go up to the CPU's root complex, far slower, or hang
    (:data:`SOURCE`).

    Which bridges count: a GPU's path ends at its root port, and traffic between two root
    ports goes through the root complex whatever their ACS says (Linux sets these bits on
    every ACS-capable port when the IOMMU is on: drivers/pci/pci.c, ``pci_std_enable_acs``),
    so the root port is left out. A switch port counts when another used GPU of the node sits
    below the same switch (they share a bridge other than the root port), or when the
    replica spans several nodes (its GPUs talk to the NICs, which may sit below the switch).
    Nothing when the registers could not be read (the probe did not run as root: ``provision
    facts`` says so); GPUs joined by NVLink alone are slowed only on the GPU-to-NIC path.

    Args:
        node: the node. facts: its facts. used: the indexes of the GPUs the replica uses on
            it (``Replica.node_gpus``). nodes: the replica's nodes (``Replica.nodes``).
    """
    value = value_of(facts, "pcie_acs")
    if not isinstance(value, PcieAcs):
        return []
    keys = {gpu.pci_key: gpu.index for gpu in facts.gpus if gpu.index in used and gpu.pci_key}
    # each used GPU's switch ports (its bridges but the last, its root port)
    switches = {keys[pci_key(address)]: bridges[:-1] for address, bridges in value.gpus.items()
                if pci_key(address) in keys}
    found: dict[str, tuple[str, list[int]]] = {}
    for index, ports in switches.items():
        mine = {port.address for port in ports}
        shared = any(mine & {port.address for port in other}
                     for peer, other in switches.items() if peer != index)
        if not (shared or len(nodes) > 1):
            continue
        for port in ports:
            if port.redirects:
                found.setdefault(port.address, (port.describe, []))[1].append(index)
    if not found:
        return []
    actual = "; ".join(f"{describe}, above GPU {', '.join(map(str, sorted(gpus)))}"
                       for describe, gpus in found.values())
    setpci = "; ".join(f"setpci -s {address} ECAP_ACS+0x6.w=0000" for address in found)
    return [Finding(
        "pcie_acs.redirect", Severity.WARNING, node.name, "PCIe ACS above the GPUs",
        expected="no switch port between the replica's GPUs, or between them and the NICs, "
                 "redirects peer-to-peer traffic (ReqRedir-, CmpltRedir-, UpstreamFwd-)",
        actual=actual,
        fix=f"turn off IO virtualization (VT-d/IOMMU) or ACS in {node.name}'s BIOS, or clear "
            f"it as root after each boot: {setpci}; then run nccl-tests' all_reduce_perf "
            "to compare",
        source=SOURCE)]
