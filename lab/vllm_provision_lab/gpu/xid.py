"""``provision lab xid``: put an NVIDIA Xid line into a lab host's kernel log.

A lab guest (an nspawn container) has no kernel log of its own: ``journalctl -k`` shows only
entries with ``_TRANSPORT=kernel``, which no process inside the guest can write (journald sets
trusted ``_`` fields itself, systemd.journal-fields(7)). The product reads Xid errors from
exactly there (``vllm_provision/facts/probe_script.py``), so the lab writes what a real kernel
would: one journal entry, built in the Journal Export Format (systemd's "Journal Export
Formats" documentation) with ``_TRANSPORT=kernel``, the guest's machine and boot IDs and the
driver's line ``NVRM: Xid (PCI:<domain>:<bus>:<device>): <code>, pid=..., name=..., <text>``
(NVIDIA "Xid Errors"), turned into a journal file by ``systemd-journal-remote`` on the lab
machine and copied into the guest's runtime journal (``/run/log/journal/<machine-id>/``), where
``journalctl`` reads it with the guest's own entries. Nothing in the product knows of this.
"""

from __future__ import annotations

import base64
import gzip
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from vllm_provision_lab.errors import LabError

# Xid codes the GPU health check cares about and the driver's words for them (NVIDIA "Xid
# Errors" catalogue); any other code gets a generic text.
XID_TEXT = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU.",
    63: "ECC page retirement or row remapping recording event.",
    74: "NVLink Error.",
    79: "GPU has fallen off the bus.",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
}
FILE_NAME = "lab-xid.journal"  # journalctl reads every *.journal file of the machine's folder
JOURNAL_REMOTE = ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_BUS_ID = re.compile(r"^([0-9A-Fa-f]+):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-7]$")


def xid_line(bus_id: str, code: int, pid: int = 4711, name: str = "python3") -> str:
    """The driver's kernel line for ``code`` on the GPU at ``bus_id`` (nvidia-smi's
    ``pci.bus_id``, ``00000000:2A:00.0``): ``NVRM: Xid (PCI:0000:2a:00): 79, pid=4711,
    name=python3, GPU has fallen off the bus.``

    Raises:
        LabError: ``bus_id`` is not a PCI address.
    """
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        raise LabError.single("pci.bus_id", "not a PCI bus id", expected="00000000:2A:00.0",
                              actual=bus_id)
    domain, bus, device = match.groups()
    text = XID_TEXT.get(code, "Graphics Exception.")
    return (f"NVRM: Xid (PCI:{int(domain, 16):04x}:{bus.lower()}:{device.lower()}): {code}, "
            f"pid={pid}, name={name}, {text}")


def export_entry(message: str, *, machine_id: str, boot_id: str, hostname: str,
                 realtime_us: int) -> bytes:
    """One kernel entry in the Journal Export Format (text fields, ``KEY=value`` lines, an empty
    line at the end).

    Raises:
        LabError: an ID is not 32 lower-case hex digits, or a value holds a newline.
    """
    for label, value in (("machine-id", machine_id), ("boot_id", boot_id)):
        if not _HEX32.match(value):
            raise LabError.single(label, "not a 128-bit ID", expected="32 hex digits",
                                  actual=value)
    if any("\n" in v for v in (message, hostname)):
        raise LabError.single("journal entry", "a value holds a newline", actual=message)
    fields = [("__REALTIME_TIMESTAMP", str(realtime_us)), ("__MONOTONIC_TIMESTAMP", "1"),
              ("_BOOT_ID", boot_id), ("_MACHINE_ID", machine_id), ("_HOSTNAME", hostname),
              ("_TRANSPORT", "kernel"), ("PRIORITY", "3"), ("SYSLOG_FACILITY", "0"),
              ("SYSLOG_IDENTIFIER", "kernel"), ("MESSAGE", message)]
    return ("".join(f"{k}={v}\n" for k, v in fields) + "\n").encode()


def journal_remote() -> str:
    """The ``systemd-journal-remote`` program of the lab machine.

    Raises:
        LabError: it is not installed (scripts/setup.sh installs it).
    """
    for path in JOURNAL_REMOTE:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("systemd-journal-remote")
    if found:
        return found
    raise LabError.single("systemd-journal-remote", "not installed on the lab machine",
                          fix="apt-get install systemd-journal-remote (scripts/setup.sh does)")


def journal_file(entry: bytes) -> bytes:
    """The journal file holding ``entry`` (export format), written by systemd-journal-remote
    without compact mode, so that the older journalctl of bullseye reads it too."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "x.journal"
        run = subprocess.run([journal_remote(), "-o", str(out), "-"], input=entry,
                             capture_output=True, timeout=30, check=False,
                             env={**os.environ, "SYSTEMD_JOURNAL_COMPACT": "0"})
        if run.returncode != 0 or not out.exists():
            raise LabError.single("systemd-journal-remote", "could not write the journal file",
                                  actual=run.stderr.decode(errors="replace")[-300:])
        return out.read_bytes()


GUEST_IDS = ("cat /etc/machine-id; tr -d - < /proc/sys/kernel/random/boot_id; hostname; "
             "nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader")


def inject_command(guest_ids: str, gpu: int, code: int) -> tuple[str, str]:
    """The shell command that installs the Xid entry on the guest, from the guest's answer to
    :data:`GUEST_IDS`; and the kernel line it holds.

    Raises:
        LabError: the answer is not what :data:`GUEST_IDS` prints, or the GPU does not exist.
    """
    lines = guest_ids.strip().splitlines()
    if len(lines) < 4:
        raise LabError.single("lab xid", "unexpected answer from the host", actual=guest_ids)
    machine_id, boot_id, hostname = (line.strip() for line in lines[:3])
    buses: dict[str, str] = {}
    for line in lines[3:]:
        index, _, bus_id = line.partition(",")
        if bus_id:
            buses[index.strip()] = bus_id.strip()
    if str(gpu) not in buses:
        raise LabError.single("--gpu", "no such GPU on the host",
                              expected="one of " + ", ".join(buses), actual=str(gpu))
    message = xid_line(buses[str(gpu)], code)
    entry = export_entry(message, machine_id=machine_id, boot_id=boot_id, hostname=hostname,
                         realtime_us=int(time.time() * 1_000_000))
    payload = base64.b64encode(gzip.compress(journal_file(entry))).decode()
    path = f"/run/log/journal/{machine_id}/{FILE_NAME}"
    return f"echo {payload} | base64 -d | gunzip > {path}.tmp && mv {path}.tmp {path}", message


CLEAR_COMMAND = f"rm -f /run/log/journal/*/{FILE_NAME}"
