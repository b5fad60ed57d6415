"""`provision lab xid`: the kernel line and the journal entry it writes (vllm_provision_lab.gpu)."""

from __future__ import annotations

import pytest
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.gpu import xid

from vllm_provision.facts.model import pci_key
from vllm_provision.facts.parsers import parse_xid_lines

MID = "b306b6f4a87c49668a0c61334595a808"
BOOT = "0089a58a6cf6445b93f5556f50d43643"


def test_the_line_is_the_drivers_and_the_product_parses_it_onto_the_gpu() -> None:
    line = xid.xid_line("00000000:2A:00.0", 79)
    assert line == ("NVRM: Xid (PCI:0000:2a:00): 79, pid=4711, name=python3, "
                    "GPU has fallen off the bus.")
    [event] = parse_xid_lines(f"2026-12-01T16:51:10+0000 h1 kernel: {line}")
    assert event.code == 79 and pci_key(event.pci) == pci_key("00000000:2A:00.0")


def test_the_entry_is_a_kernel_entry_of_the_guests_boot() -> None:
    entry = xid.export_entry("NVRM: Xid (PCI:0000:2a:00): 79, x", machine_id=MID, boot_id=BOOT,
                             hostname="h1", realtime_us=1).decode()
    fields = dict(line.split("=", 1) for line in entry.splitlines() if line)
    assert fields["_TRANSPORT"] == "kernel" and fields["_BOOT_ID"] == BOOT
    assert fields["_MACHINE_ID"] == MID and entry.endswith("\n\n")


@pytest.mark.parametrize(("call", "where"), [
    (lambda: xid.xid_line("2a:00", 79), "pci.bus_id"),
    (lambda: xid.export_entry("m", machine_id="x", boot_id=BOOT, hostname="h",
                              realtime_us=1), "machine-id"),
    (lambda: xid.export_entry("m\nMESSAGE=forged", machine_id=MID, boot_id=BOOT,
                              hostname="h", realtime_us=1), "journal entry"),
    (lambda: xid.inject_command(f"{MID}\n{BOOT}\nh1\n0, 00000000:18:00.0\n", 3, 79), "--gpu"),
    (lambda: xid.inject_command("nonsense", 0, 79), "lab xid"),
])
def test_bad_input_is_a_lab_error_naming_the_item(call, where: str) -> None:
    with pytest.raises(LabError) as caught:
        call()
    assert caught.value.problems[0].where == where
