"""Fact ``pcie_acs``: the PCIe bridges above each NVIDIA GPU and their ACS Control register.

PCIe Access Control Services (ACS) on a bridge can redirect peer-to-peer requests and
completions up to the CPU's root complex: GPU-to-GPU traffic over PCIe, and GPU-to-NIC traffic
of GPUDirect RDMA, then run far slower or hang (NCCL docs, Troubleshooting, "PCI Access Control
Services (ACS)"; NVIDIA/nccl-tests #112: ACS on halved RoCE bandwidth). The register's bits are
the kernel's ``PCI_ACS_*`` (include/uapi/linux/pci_regs.h): SV 0x01, TB 0x02, RR 0x04 (P2P
Request Redirect), CR 0x08 (P2P Completion Redirect), UF 0x10 (Upstream Forwarding), EC 0x20,
DT 0x40; ``lspci -vvv`` prints them as ``ACSCtl: SrcValid+ ... ReqRedir+ CmpltRedir+``.

Read from sysfs with no program: the GPUs are the devices of vendor 0x10de and class 0x03xxxx
(display and 3D controllers: not an NVSwitch, not a GPU's audio function); a GPU's bridges
are the PCI devices its sysfs path passes through, nearest first; a bridge's register is found
by walking the extended capabilities of its configuration space (ACS is extended capability
0x000D, the control register at offset 6). Reading past the first 64 bytes of a device's
configuration space needs root, so a probe run by another user reads ``unreadable``.

Value (:class:`PcieAcs`): GPU PCI address -> its bridges, each with its register (None: no ACS
capability). No GPU on the PCI bus (a CPU host, the test lab's stand-ins): no entries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_provision.facts.extra import fact

# P2P Request Redirect, P2P Completion Redirect, Upstream Forwarding: the bits that send
# peer-to-peer traffic up to the root complex (include/uapi/linux/pci_regs.h)
REDIRECT_BITS = 0x04 | 0x08 | 0x10
_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_BITS = ((0x01, "SrcValid"), (0x02, "TransBlk"), (0x04, "ReqRedir"), (0x08, "CmpltRedir"),
         (0x10, "UpstreamFwd"), (0x20, "EgressCtrl"), (0x40, "DirectTrans"))


@dataclass(frozen=True)
class Bridge:
    """One PCIe bridge above a GPU.

    Attributes:
        address: its PCI address (``0000:3a:00.0``).
        control: its ACS Control register; None when it has no ACS capability.
        readable: False when its configuration space past 64 bytes could not be read (not
            root); ``control`` is then None and says nothing.
    """

    address: str
    control: int | None = None
    readable: bool = True

    @property
    def redirects(self) -> bool:
        """Any of RR, CR, UF set: peer-to-peer traffic goes up to the root complex."""
        return self.control is not None and bool(self.control & REDIRECT_BITS)

    @property
    def describe(self) -> str:
        """``0000:3a:00.0 ACSCtl 0x001d (SrcValid ReqRedir CmpltRedir UpstreamFwd)``, as
        lspci names the bits."""
        if not self.readable:
            return f"{self.address} unreadable (needs root)"
        if self.control is None:
            return f"{self.address} no ACS"
        names = " ".join(name for bit, name in _BITS if self.control & bit)
        if self.control & ~0x7F:  # bits past DT: named by their value, as pci_regs.h has no name
            names = f"{names} {self.control & ~0x7F:#06x}".strip()
        return f"{self.address} ACSCtl {self.control:#06x} ({names or 'none set'})"


@dataclass(frozen=True)
class PcieAcs:
    """The ``pcie_acs`` fact of one host.

    Attributes:
        gpus: GPU PCI address -> its bridges, nearest first, in address order.
    """

    gpus: Mapping[str, tuple[Bridge, ...]]

    def redirecting(self) -> dict[str, Bridge]:
        """The bridges that redirect peer-to-peer traffic, by address (each once)."""
        return {b.address: b for bridges in self.gpus.values() for b in bridges if b.redirects}

    @property
    def unreadable(self) -> bool:
        """Some bridge's register could not be read (the probe did not run as root)."""
        return any(not b.readable for bridges in self.gpus.values() for b in bridges)


def probe_pcie_acs(config):
    """On the host (Python >= 3.8, standard library): {"gpus": {GPU address: [[bridge
    address, ACS Control register, or None (no ACS), or "unreadable"], ...]}}.
    ``config["sysfs_pci"]`` may name another folder than /sys/bus/pci/devices (tests)."""
    import os

    root = config.get("sysfs_pci") or "/sys/bus/pci/devices"

    def read(path):
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError:
            return ""

    def acs_control(device):
        # the file's size is the device's configuration space (256 bytes: conventional PCI,
        # no extended capabilities; 4096: PCI Express); a reader without CAP_SYS_ADMIN gets
        # only its first 64 bytes (drivers/pci/pci-sysfs.c, pci_read_config)
        try:
            with open(os.path.join(device, "config"), "rb") as handle:
                size = min(os.fstat(handle.fileno()).st_size, 4096)
                space = handle.read(4096)
        except OSError:
            return "unreadable"
        if len(space) < size:
            return "unreadable"
        if len(space) <= 256:
            return None
        offset, hops = 0x100, 0
        while 0x100 <= offset <= len(space) - 8 and hops < 96:
            header = int.from_bytes(space[offset:offset + 4], "little")
            if header in (0, 0xFFFFFFFF):
                return None
            if header & 0xFFFF == 0x000D:
                return int.from_bytes(space[offset + 6:offset + 8], "little")
            offset, hops = (header >> 20) & 0xFFC, hops + 1
        return None

    gpus, controls = {}, {}
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    for name in names:
        device = os.path.join(root, name)
        if read(os.path.join(device, "vendor")) != "0x10de":
            continue
        if not read(os.path.join(device, "class")).startswith("0x03"):
            continue
        bridges = []
        path = os.path.dirname(os.path.realpath(device))
        while os.path.basename(path).count(":") == 2 and len(bridges) < 16:
            if path not in controls:  # a switch's bridges sit above several GPUs
                controls[path] = acs_control(path)
            bridges.append([os.path.basename(path), controls[path]])
            path = os.path.dirname(path)
        gpus[name] = bridges
    return {"gpus": gpus}


def _bridge(item: Any) -> Bridge:
    address, control = item
    if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
        raise ValueError(f"not a PCI address: {str(address)[:40]!r}")
    if control == "unreadable":
        return Bridge(address, None, readable=False)
    if control is not None and (type(control) is not int or not 0 <= control <= 0xFFFF):
        raise ValueError(f"{address}: not a 16-bit register: {str(control)[:20]!r}")
    return Bridge(address, control)


def text(value: PcieAcs) -> str:
    """One line for ``provision facts``: the redirecting bridges, else how many were read."""
    if not value.gpus:
        return "no NVIDIA GPU on PCI"
    redirecting = value.redirecting()
    if redirecting:
        return "P2P redirected: " + "; ".join(b.describe for b in redirecting.values())
    count = len({b.address for bridges in value.gpus.values() for b in bridges})
    bridges = "1 bridge" if count == 1 else f"{count} bridges"
    if value.unreadable:
        return f"{bridges}, ACS unreadable (the probe needs root)"
    return f"{bridges}, none redirects P2P"


@fact("pcie_acs", probe=probe_pcie_acs, order=10, text=text, label="PCIe ACS (P2P)",
      compared=False)  # bridge addresses differ between hosts by nature
def pcie_acs(raw: Any) -> PcieAcs:
    """What :func:`probe_pcie_acs` sent -> :class:`PcieAcs`.

    Raises:
        ValueError, TypeError: not that shape (the host sent something else).
    """
    gpus = raw["gpus"]
    if not isinstance(gpus, dict):
        raise TypeError("gpus is not an object")
    parsed = {}
    for gpu, bridges in sorted(gpus.items()):
        if not _ADDRESS.fullmatch(str(gpu)) or not isinstance(bridges, list):
            raise ValueError(f"not a GPU address and its bridges: {str(gpu)[:40]!r}")
        parsed[gpu] = tuple(_bridge(item) for item in bridges[:16])
    return PcieAcs(parsed)
