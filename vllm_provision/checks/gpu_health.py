"""GPU health checks of one node: ECC and Xid errors, MIG, persistence mode, fabric manager,
and the clock.

Pure functions from one node's facts to findings; ``used`` is the indexes of the GPUs the
replica may take on the node (``Replica.node_gpus``: its ``vllm_gpus``, else ``0..N-1``, as
vLLM places its local ranks on the first visible devices). Faults on the node's other GPUs
are not this replica's: ECC and Xid errors there are named in the ok finding (a note), MIG and
persistence mode there are not read. Each names its source.
"""

from __future__ import annotations

from collections.abc import Collection

from vllm_provision.checks.context import check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Node
from vllm_provision.facts.model import Gpu, HostFacts, pci_key

XID_SOURCE = "NVIDIA GPU deployment guide: Xid Errors; nvidia-smi(1) ECC error counts"
# Above this, merged logs of the nodes cannot be ordered and timings across nodes mislead.
CLOCK_OFFSET_WARN_S = 0.1


def used_gpus(facts: HostFacts, used: Collection[int]) -> list[Gpu]:
    """The GPUs the replica uses on the node: those whose index is in ``used``
    (``Replica.node_gpus``), in nvidia-smi's order."""
    return [gpu for gpu in facts.gpus if gpu.index in used]


def _faults(facts: HostFacts, gpu: Gpu) -> list[str]:
    """``gpu``'s uncorrectable ECC errors and the Xid codes of its PCI address, in words."""
    xids = sorted({e.code for e in facts.xid_events
                   if gpu.pci_key and pci_key(e.pci) == gpu.pci_key})
    faults = []
    if gpu.ecc_uncorrected:
        faults.append(f"{gpu.ecc_uncorrected} uncorrectable ECC errors")
    if xids:
        faults.append("Xid " + ", ".join(str(code) for code in xids) + " in the last 24 h")
    return faults


@check("gpu_health.errors", order=90, scope="node", reads=("node", "facts", "used_gpus"),
       only="gpu")
def check_gpu_errors(node: Node, facts: HostFacts, used: Collection[int]) -> list[Finding]:
    """No used GPU has uncorrectable ECC errors or an Xid in the kernel log of the last day.

    An uncorrectable ECC error retires memory pages and may need a GPU reset; an Xid (79:
    fallen off the bus, 48: double-bit ECC, 94/95: contained/uncontained ECC, ...) means the
    driver saw a fault. A rank on such a GPU crashes or hangs its peers. With ``vllm_gpus``
    (``node.gpus``) a fault on another GPU of the host is not this replica's: the ok finding
    names it, as a note for whoever runs that GPU.

    Args:
        used: the indexes of the GPUs the replica uses on the node (``Replica.node_gpus``).
    """
    findings = []
    for gpu in used_gpus(facts, used):
        faults = _faults(facts, gpu)
        item = f"GPU {gpu.index} ({gpu.pci_bus_id or gpu.uuid})"
        if faults:
            findings.append(Finding(
                "gpu.errors", Severity.ERROR, node.name, item,
                expected="no uncorrectable ECC error, no Xid", actual="; ".join(faults),
                fix=f"drain {node.name}: check GPU {gpu.index} (nvidia-smi -q -d ECC, "
                    "journalctl -k | grep Xid), reset or replace it",
                source=XID_SOURCE))
    if not findings and used_gpus(facts, used):
        actual = "none"
        if node.gpus is not None:
            others = []
            for gpu in facts.gpus:
                faults = _faults(facts, gpu) if gpu.index not in used else []
                if faults:
                    others.append(f"GPU {gpu.index}: {'; '.join(faults)}")
            actual = "none on GPU " + ", ".join(map(str, used)) + (
                " (not this replica's, outside vllm_gpus: " + "; ".join(others) + ")"
                if others else "")
        findings.append(Finding("gpu.errors", Severity.OK, node.name, "GPU ECC / Xid",
                                expected="none", actual=actual))
    return findings


@check("gpu_health.mig", order=100, scope="node", reads=("node", "facts", "used_gpus"),
       only="gpu")
def check_mig(node: Node, facts: HostFacts, used: Collection[int]) -> list[Finding]:
    """MIG is off on every used GPU (error otherwise).

    With MIG on, CUDA sees MIG instances instead of the GPU and NCCL does not support
    peer-to-peer across them (NVIDIA MIG user guide: "CUDA IPC across GPU instances is not
    supported"); vLLM's tensor parallelism needs whole GPUs.
    """
    mig = [gpu.index for gpu in used_gpus(facts, used) if gpu.mig_mode]
    if mig:
        indexes = ", ".join(str(i) for i in mig)
        return [Finding(
            "gpu.mig", Severity.ERROR, node.name, "MIG mode",
            expected="Disabled on the used GPUs", actual=f"Enabled on GPU {indexes}",
            fix=f"disable MIG on {node.name} (nvidia-smi -i {indexes} -mig 0, then reset "
                "the GPUs)", source="NVIDIA MIG user guide: CUDA and NCCL limitations")]
    if any(gpu.mig_mode is False for gpu in used_gpus(facts, used)):
        return [Finding("gpu.mig", Severity.OK, node.name, "MIG mode", expected="Disabled",
                        actual="Disabled")]
    return []


@check("gpu_health.persistence", order=110, scope="node", reads=("node", "facts", "used_gpus"),
       only="gpu")
def check_persistence(node: Node, facts: HostFacts, used: Collection[int]) -> list[Finding]:
    """Persistence mode is on for every used GPU (warning otherwise).

    Without it the driver tears the GPU state down when the last client exits, so every
    start pays the initialisation again (NVIDIA driver docs: "Persistence Daemon").
    """
    off = [gpu.index for gpu in used_gpus(facts, used) if gpu.persistence_mode is False]
    if off:
        return [Finding(
            "gpu.persistence", Severity.WARNING, node.name, "persistence mode",
            expected="Enabled", actual="Disabled on GPU " + ", ".join(str(i) for i in off),
            fix=f"enable nvidia-persistenced on {node.name} (systemctl enable --now "
                "nvidia-persistenced)",
            source="NVIDIA driver documentation: Persistence Daemon")]
    if any(gpu.persistence_mode for gpu in used_gpus(facts, used)):
        return [Finding("gpu.persistence", Severity.OK, node.name, "persistence mode",
                        expected="Enabled", actual="Enabled")]
    return []


@check("gpu_health.fabric_manager", order=120, scope="node", reads=("node", "facts"), only="gpu")
def check_fabric_manager(node: Node, facts: HostFacts) -> list[Finding]:
    """On a node with NVSwitches, nvidia-fabricmanager is active (error otherwise).

    Without the fabric manager the NVSwitch fabric is not set up and CUDA fails on those GPUs
    (NVIDIA Fabric Manager user guide: required on NVSwitch-based HGX/DGX systems).
    """
    if not facts.nvswitch_count:
        return []
    if facts.fabric_manager != "active":
        return [Finding(
            "gpu.fabric_manager", Severity.ERROR, node.name, "nvidia-fabricmanager",
            expected=f"active ({facts.nvswitch_count} NVSwitches)",
            actual=facts.fabric_manager or "unknown",
            fix=f"install and start nvidia-fabricmanager (same version as the driver) on "
                f"{node.name}: systemctl enable --now nvidia-fabricmanager",
            source="NVIDIA Fabric Manager user guide; CUDA error 802 'system not yet "
                   "initialized' without it (aws-samples/aws-deep-learning-ami-ubuntu-dcv-"
                   "desktop #33)")]
    return [Finding("gpu.fabric_manager", Severity.OK, node.name, "nvidia-fabricmanager",
                    expected="active", actual=f"active ({facts.nvswitch_count} NVSwitches)")]


@check("gpu_health.clock", order=130, scope="node", reads=("node", "facts"))
def check_clock(node: Node, facts: HostFacts,
                max_offset_s: float = CLOCK_OFFSET_WARN_S) -> list[Finding]:
    """The clock is synchronised and chrony's offset is within ``max_offset_s`` seconds.

    A warning only: nothing fails, but the merged logs of the nodes and the timings across
    them are only as good as the clocks (chronyc(1) tracking; timedatectl(1)).
    """
    clock = facts.clock
    if clock.offset_s is not None and abs(clock.offset_s) > max_offset_s:
        return [Finding(
            "host.clock", Severity.WARNING, node.name, "clock offset",
            expected=f"<= {max_offset_s:g} s", actual=f"{clock.offset_s:+.3f} s (chrony)",
            fix=f"let chrony converge or fix its sources on {node.name} (chronyc sources)",
            source="chronyc(1) tracking")]
    if clock.synchronized is False and clock.container:
        return [Finding("host.clock", Severity.OK, node.name, "clock",
                        expected="synchronised",
                        actual=f"in a container ({clock.container}): the clock is its host's")]
    if clock.synchronized is False:
        return [Finding(
            "host.clock", Severity.WARNING, node.name, "clock synchronised",
            expected="NTPSynchronized=yes",
            actual="no" + ("" if clock.ntp_enabled else " (no NTP service enabled)"),
            fix=f"enable chrony or systemd-timesyncd on {node.name} (timedatectl set-ntp true)",
            source="timedatectl(1)")]
    if clock.source:
        actual = (f"offset {clock.offset_s:+.6f} s" if clock.offset_s is not None
                  else "synchronised")
        return [Finding("host.clock", Severity.OK, node.name, "clock", expected="synchronised",
                        actual=actual)]
    return []
