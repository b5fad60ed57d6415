"""Fact modules (vllm_provision/facts/extra/): a fact is one file whose probe function is sent
inside the probe and whose parser fills HostFacts.extra; the pcie_acs fact and its check.

The sysfs trees are built here from the kernel's layout: a GPU's sysfs path passes through its
bridges (/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0), and a bridge's ``config`` holds
the PCIe extended capabilities from offset 0x100 (header: ID bits 15:0, next offset bits
31:20), ACS being ID 0x000D with its control register at +6 (include/uapi/linux/pci_regs.h).
"""

from __future__ import annotations

import ast
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_provision.checks.pcie_acs import check_acs_redirect
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host, Node
from vllm_provision.core.registry import Registry
from vllm_provision.facts import extra, probe_script
from vllm_provision.facts.extra import fact, parse_extra
from vllm_provision.facts.extra.pcie_acs import Bridge, PcieAcs, pcie_acs, probe_pcie_acs, text
from vllm_provision.facts.gather import parse_probe_output, probe_source
from vllm_provision.facts.model import Gpu, HostFacts

AER, ACS = 0x0001, 0x000D


def config_space(control: int | None, size: int = 4096) -> bytes:
    """A bridge's configuration space: AER at 0x100 pointing to ACS at 0x148 (with
    ``control``), or AER alone when ``control`` is None."""
    space = bytearray(size)
    if size > 0x150:
        nxt = 0x148 if control is not None else 0
        space[0x100:0x104] = (AER | 1 << 16 | nxt << 20).to_bytes(4, "little")
        if control is not None:
            space[0x148:0x14C] = (ACS | 1 << 16).to_bytes(4, "little")
            space[0x14E:0x150] = control.to_bytes(2, "little")
    return bytes(space)


def device(folder: Path, vendor: str, klass: str, config: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "class").write_text(klass + "\n")
    (folder / "config").write_bytes(config)
    return folder


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """Two GPUs behind a switch (upstream port 0000:3a:00.0 -> downstream 0000:3b:00.0 and
    0000:3b:01.0), the first downstream port redirecting; a GPU's audio function, an NVSwitch
    and a NIC, which are not GPUs."""
    root = tmp_path / "devices" / "pci0000:3a"
    up = device(root / "0000:3a:00.0", "0x8086", "0x060400", config_space(0x0001))
    down0 = device(up / "0000:3b:00.0", "0x1000", "0x060400", config_space(0x001D))
    down1 = device(up / "0000:3b:01.0", "0x1000", "0x060400", config_space(None))
    gpu0 = device(down0 / "0000:3c:00.0", "0x10de", "0x030200", config_space(None, 64))
    audio = device(down0 / "0000:3c:00.1", "0x10de", "0x040300", b"")
    gpu1 = device(down1 / "0000:3d:00.0", "0x10de", "0x030000", b"")
    switch = device(root / "0000:3e:00.0", "0x10de", "0x068000", b"")
    nic = device(root / "0000:3f:00.0", "0x15b3", "0x020700", b"")
    bus = tmp_path / "bus"
    bus.mkdir()
    for item in (up, down0, down1, gpu0, audio, gpu1, switch, nic):
        (bus / item.name).symlink_to(item)
    return bus


def test_the_probe_reads_each_gpus_bridges_and_their_acs_control(sysfs: Path) -> None:
    assert probe_pcie_acs({"sysfs_pci": str(sysfs)}) == {"gpus": {
        "0000:3c:00.0": [["0000:3b:00.0", 0x001D], ["0000:3a:00.0", 0x0001]],
        "0000:3d:00.0": [["0000:3b:01.0", None], ["0000:3a:00.0", 0x0001]]}}


def test_a_config_space_cut_at_64_bytes_reads_unreadable(sysfs: Path, monkeypatch) -> None:
    # sysfs gives a reader without CAP_SYS_ADMIN the first 64 bytes of a file whose size is
    # the whole space (drivers/pci/pci-sysfs.c): here, a 64-byte file said to hold 4096
    bridge = sysfs.resolve() / ".." / "devices" / "pci0000:3a" / "0000:3a:00.0"
    (bridge / "config").write_bytes(config_space(0x001D, 64))
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result(
        (*real(fd)[:6], 4096, *real(fd)[7:10])))
    raw = probe_pcie_acs({"sysfs_pci": str(sysfs)})
    assert raw["gpus"]["0000:3c:00.0"][1] == ["0000:3a:00.0", "unreadable"]
    value = pcie_acs(json.loads(json.dumps(raw)))
    assert value.unreadable
    assert value.gpus["0000:3c:00.0"][1] == Bridge("0000:3a:00.0", None, readable=False)


def test_a_conventional_pci_bridge_read_whole_has_no_acs(sysfs: Path) -> None:
    # 256 bytes, all of it read (as root): no extended capabilities, so no ACS, not unreadable
    bridge = sysfs.resolve() / ".." / "devices" / "pci0000:3a" / "0000:3a:00.0"
    (bridge / "config").write_bytes(config_space(None, 256))
    raw = probe_pcie_acs({"sysfs_pci": str(sysfs)})
    assert raw["gpus"]["0000:3d:00.0"] == [["0000:3b:01.0", None], ["0000:3a:00.0", None]]
    assert text(pcie_acs(raw)).startswith("P2P redirected: 0000:3b:00.0")
    assert not pcie_acs(raw).unreadable


def test_no_pci_bus_means_no_gpus(tmp_path: Path) -> None:
    assert probe_pcie_acs({"sysfs_pci": str(tmp_path / "absent")}) == {"gpus": {}}
    assert text(pcie_acs({"gpus": {}})) == "no NVIDIA GPU on PCI"


def test_parse_names_the_redirecting_bridge_as_lspci_names_its_bits(sysfs: Path) -> None:
    value = pcie_acs(json.loads(json.dumps(probe_pcie_acs({"sysfs_pci": str(sysfs)}))))
    assert list(value.redirecting()) == ["0000:3b:00.0"]
    assert text(value) == ("P2P redirected: 0000:3b:00.0 ACSCtl 0x001d "
                           "(SrcValid ReqRedir CmpltRedir UpstreamFwd)")
    calm = PcieAcs({"0000:3d:00.0": (Bridge("0000:3b:01.0"), Bridge("0000:3a:00.0", 0x0001))})
    assert text(calm) == "2 bridges, none redirects P2P"
    one = PcieAcs({"0000:3d:00.0": (Bridge("0000:3b:01.0", 0x0100),)})
    assert text(one) == "1 bridge, none redirects P2P"
    assert one.gpus["0000:3d:00.0"][0].describe == "0000:3b:01.0 ACSCtl 0x0100 (0x0100)"
    assert Bridge("0000:3b:01.0", 0).describe == "0000:3b:01.0 ACSCtl 0x0000 (none set)"


@pytest.mark.parametrize("raw", [
    {"gpus": []}, {"gpus": {"0000:3c:00.0": [["$(reboot)", 4]]}},
    {"gpus": {"0000:3c:00.0": [["0000:3b:00.0", 1 << 16]]}},
    {"gpus": {"0000:3c:00.0": [["0000:3b:00.0", "4"]]}},
    {"gpus": {"not-an-address": []}}, {"gpus": {"0000:3c:00.0": [["0000:3b:00.0"]]}}, {}])
def test_what_a_host_sends_is_checked_and_a_bad_document_is_a_problem(raw) -> None:
    problems: list[str] = []
    assert parse_extra({"pcie_acs": json.dumps(raw)}, problems) == {"pcie_acs": None}
    assert len(problems) == 1 and problems[0].startswith(
        "fact pcie_acs: cannot read what the host sent: ")


def test_the_probe_sent_holds_each_fact_and_stays_python_3_8() -> None:
    source = probe_source()
    ast.parse(source, feature_version=(3, 8))
    table = ast.parse(extra.probe_additions()).body
    sent = {node.targets[0].slice.value: node.value.value for node in table}
    assert set(sent) == {"pcie_acs"}
    assert sent["pcie_acs"].startswith("def probe_pcie_acs(config):")
    for fact_source in sent.values():  # each fact is compiled on the host on its own
        ast.parse(fact_source, feature_version=(3, 8))
    assert source.index("EXTRA_FACTS['pcie_acs'] = 'def probe_pcie_acs(config)") < (
        source.index('if __name__ == "__main__":'))


def test_the_whole_probe_runs_and_its_document_fills_extra(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(probe_source())
    done = subprocess.run([sys.executable, str(script), "{}"], capture_output=True, text=True,
                          timeout=120, check=True)
    raw = json.loads(done.stdout)
    assert set(raw["extra"]) == {"pcie_acs"}
    facts = parse_probe_output("h1", raw)
    assert isinstance(facts.extra["pcie_acs"], PcieAcs)
    assert not [p for p in facts.problems if p.startswith("fact ")]


BROKEN_FACTS = {  # name -> a probe function's source, each broken in its own way
    "syntax": "def probe_syntax(config):\n    return 1 +\n",
    "noisy": "def probe_noisy(config):\n    import subprocess\n"
             "    subprocess.run(['printf', 'noise-from-a-program'])\n"
             "    print('noise-from-python', end='')\n"
             "    return {'ok': 1}\n",
    "slow": "def probe_slow(config):\n    import time\n    time.sleep(60)\n",
    "deep": "def probe_deep(config):\n    value = []\n    for _ in range(100000):\n"
            "        value = [value]\n    return value\n",
}


def python_3_8() -> str | None:
    """A Python 3.8 of this machine (on PATH, or installed by pyenv), or None."""
    found = [shutil.which("python3.8"),
             *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))]
    for candidate in filter(None, found):
        try:
            subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                           capture_output=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            continue
        return candidate
    return None


PYTHON_3_8 = python_3_8()
PYTHONS = [pytest.param(sys.executable, id="this-python"),
           pytest.param(PYTHON_3_8, id="python3.8", marks=pytest.mark.skipif(
               PYTHON_3_8 is None, reason="no Python 3.8 on this machine"))]


@pytest.mark.parametrize("python", PYTHONS)
def test_broken_facts_leave_the_probe_document_whole(tmp_path: Path, python: str) -> None:
    """The whole probe, run as the host runs it (on the probe's floor, Python 3.8, where this
    machine has it), with facts that do not compile, print through a program, hang past the
    per-fact timer, or answer nested past the recursion limit: its last line is still the
    document, with the good facts and a line of errors for each broken one."""
    added = "".join(f"EXTRA_FACTS[{name!r}] = {text!r}\n" for name, text in BROKEN_FACTS.items())
    guard = '\nif __name__ == "__main__":'
    source = probe_source().replace(guard, added + guard, 1).replace(
        "FACT_TIMEOUT_S = 20\n", "FACT_TIMEOUT_S = 1\n", 1)
    script = tmp_path / "probe.py"
    script.write_text(source)
    done = subprocess.run([python, str(script), "{}"], capture_output=True, text=True,
                          timeout=120, check=True)
    assert "noise-from" not in done.stdout  # what the fact printed, itself or by a program
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    assert raw["extra"]["noisy"] == '{"ok": 1}' and raw["extra"]["pcie_acs"] is not None
    failed = {e.split()[1]: e for e in raw["errors"] if e.startswith("fact ")}
    assert set(failed) == {"syntax", "slow", "deep"}, raw["errors"]
    assert "SyntaxError" in failed["syntax"] and "ran past 1s" in failed["slow"]
    assert "RecursionError" in failed["deep"]
    facts = parse_probe_output("h1", raw)
    assert isinstance(facts.extra["pcie_acs"], PcieAcs)


def test_a_fact_that_fails_on_the_host_costs_only_itself(monkeypatch, capsys) -> None:
    monkeypatch.setattr(probe_script, "EXTRA_FACTS", {
        "a": "def probe_a(config):\n    raise OSError('no sysfs')\n",
        "b": "def probe_b(config):\n    print('noise', end='')\n    return {'x': 1}\n",
        "c": "def probe_c(config):\n    return object()\n",
        "d": "def probe_d(config):\n    import sys\n    sys.exit(3)\n",
        "e": "def probe_e(config):\n    return 1 +\n",  # does not compile
        "f": "def probe_f(config):\n    return 'x' * (2 << 20)\n"})
    monkeypatch.setattr(probe_script, "ERRORS", [])
    assert probe_script.extra_facts({}) == {"a": None, "b": '{"x": 1}', "c": None, "d": None,
                                            "e": None, "f": None}
    assert capsys.readouterr().out == ""  # what a probe prints never reaches the document
    errors = probe_script.ERRORS
    assert errors[0] == "fact a failed on the host: OSError: no sysfs"
    assert errors[1].startswith("fact c failed on the host: TypeError")
    assert errors[2] == "fact d failed on the host: SystemExit: 3"
    assert errors[3].startswith("fact e failed on the host: SyntaxError")
    assert errors[4] == ("fact f failed on the host: ValueError: its answer is 2097154 bytes "
                         "of JSON, over 1048576")
    assert sys.stdout is not None and len(errors) == 5


@pytest.mark.parametrize(("text", "why"), [
    ({"gpus": {}}, "not a JSON text but dict"),        # each fact comes as its own text
    ('{"gpus": ', "Expecting value"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply")])  # past the recursion limit
def test_a_facts_text_that_is_not_json_costs_only_that_fact(text, why) -> None:
    problems: list[str] = []
    assert parse_extra({"pcie_acs": text}, problems) == {"pcie_acs": None}
    assert len(problems) == 1 and why in problems[0], problems


def test_a_fact_the_probe_did_not_send_is_left_out() -> None:
    assert parse_extra(None, []) == {} and parse_extra({"other": 1}, []) == {}
    assert parse_extra({"pcie_acs": None}, []) == {"pcie_acs": None}


def probe_annotated(config: dict) -> dict:  # noqa: D103  (a probe function breaking a rule)
    return {}


def probe_wrong(config):
    return {}


def probe_defaulted(config, root=Path("/sys")):  # the host has no Path when the probe loads
    return {}


def probe_global(config):
    return {"root": str(Path("/sys"))}  # Path is this module's, not the host's


def probe_nested_global(config):
    import os

    def inner():
        return os.listdir(AER)  # AER: a global of this module, read by a nested function

    return inner()


@pytest.mark.parametrize(("name", "probe", "why"), [
    ("annotated", probe_annotated, "has annotations"),
    ("defaulted", probe_defaulted, "has default values"),
    ("global", probe_global, "reads Path from its module"),
    ("nested_global", probe_nested_global, "reads AER from its module"),
    ("right", probe_wrong, "is called 'probe_wrong', not probe_right")])
def test_a_probe_function_that_cannot_run_on_the_host_is_refused(monkeypatch, name, probe,
                                                                    why) -> None:
    monkeypatch.setattr(extra, "FACTS", Registry("fact"))
    with pytest.raises(ProvisionError) as caught:
        fact(name, probe=probe)(lambda raw: raw)
    assert why in str(caught.value) and "test_fact_modules" in str(caught.value)


def node_facts(value: PcieAcs | None, gpus: int = 2) -> HostFacts:
    listed = tuple(Gpu(index=i, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559,
                       uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x3c + i:02X}:00.0")
                   for i in range(gpus))
    return HostFacts(host="g1", gpus=listed,
                     extra={} if value is None else {"pcie_acs": value})


NODE = Node(Host("g1", "10.0.0.11"), 0, "10.0.0.11")
ONE, TWO = (NODE,), (NODE, Node(Host("g2", "10.0.0.12"), 1, "10.0.0.11"))
# two GPUs below one switch (upstream port 3a:00.0, downstream ports 3b:00.0 and 3b:01.0)
# on root port 00:01.0; the root port redirects, as Linux sets it with the IOMMU on
REDIRECTING = PcieAcs({
    "0000:3c:00.0": (Bridge("0000:3b:00.0", 0x001D), Bridge("0000:3a:00.0"),
                     Bridge("0000:00:01.0", 0x001D)),
    "0000:3d:00.0": (Bridge("0000:3b:01.0"), Bridge("0000:3a:00.0"),
                     Bridge("0000:00:01.0", 0x001D))})
# each GPU on a root port of its own: their traffic crosses the root complex anyway
ROOT_PORTS = PcieAcs({"0000:3c:00.0": (Bridge("0000:00:01.0", 0x001D),),
                      "0000:3d:00.0": (Bridge("0000:00:02.0", 0x001D),)})


def test_a_switch_port_redirecting_p2p_between_used_gpus_is_a_warning_with_the_fix() -> None:
    [finding] = check_acs_redirect(NODE, node_facts(REDIRECTING), (0, 1), ONE)
    assert finding.check == "pcie_acs.redirect" and finding.severity == "warning"
    assert finding.actual == ("0000:3b:00.0 ACSCtl 0x001d (SrcValid ReqRedir CmpltRedir "
                              "UpstreamFwd), above GPU 0")  # not the root port
    assert "setpci -s 0000:3b:00.0 ECAP_ACS+0x6.w=0000;" in finding.fix
    assert "NCCL docs" in finding.source


def test_a_replica_over_several_nodes_warns_for_one_gpu_below_a_redirecting_switch() -> None:
    # GPUDirect RDMA: the GPU talks to a NIC that may sit below the same switch
    both = PcieAcs({"0000:3c:00.0": (Bridge("0000:3b:00.0", 0x001D),
                                     Bridge("0000:3a:00.0", 0x0004), Bridge("0000:00:01.0"))})
    [finding] = check_acs_redirect(NODE, node_facts(both, gpus=1), (0,), TWO)
    assert finding.actual.count("above GPU 0") == 2
    # one command per bridge, each runnable: setpci takes one -s a command
    assert ("setpci -s 0000:3b:00.0 ECAP_ACS+0x6.w=0000; "
            "setpci -s 0000:3a:00.0 ECAP_ACS+0x6.w=0000; then") in finding.fix


@pytest.mark.parametrize(("value", "used", "nodes"), [
    (REDIRECTING, (0,), ONE),     # one GPU on one node: no peer-to-peer traffic to redirect
    (REDIRECTING, (1,), TWO),     # the redirecting port is above GPU 0 only
    (ROOT_PORTS, (0, 1), ONE),    # root ports only: the root complex is on the way anyway
    (ROOT_PORTS, (0, 1), TWO),
    (None, (0, 1), ONE),          # not gathered (an older probe)
    (PcieAcs({}), (0, 1), ONE),   # no GPU on the PCI bus
    (PcieAcs({"0000:3c:00.0": (Bridge("0000:3b:00.0", None, readable=False),
                               Bridge("0000:00:01.0"))}), (0,), TWO),
    (PcieAcs({"0000:3c:00.0": (Bridge("0000:3b:00.0", 0x0003),
                               Bridge("0000:00:01.0"))}), (0,), TWO),  # SV, TB only
])
def test_no_warning_without_a_redirecting_switch_port_on_a_peer_path(value, used,
                                                                     nodes) -> None:
    assert check_acs_redirect(NODE, node_facts(value), used, nodes) == []


def test_the_facts_table_has_a_row_per_fact_module() -> None:
    from vllm_provision.cli.facts import all_rows

    rows = dict(all_rows())
    assert list(rows)[-1] == "probe problems"
    assert rows["PCIe ACS (P2P)"](node_facts(REDIRECTING)).startswith(
        "P2P redirected: 0000:3b:00.0")
    assert rows["PCIe ACS (P2P)"](node_facts(None)) == "-"


def test_a_fact_that_differs_by_nature_is_not_marked_as_a_difference() -> None:
    from vllm_provision.cli.facts import facts_table_rows

    other = PcieAcs({"0000:3c:00.0": (Bridge("0000:5b:00.0", 0x001D), Bridge("0000:00:03.0"))})
    rows = dict(facts_table_rows({"g1": node_facts(REDIRECTING),
                                  "g2": node_facts(other, gpus=1)}, [["g1", "g2"]]))
    cells = rows["PCIe ACS (P2P)"]
    assert cells[0][0] != cells[1][0] and not any(differs for _value, differs in cells)
    assert rows["GPUs"][0][1] is True  # a compared row still marks its difference


def test_a_parser_that_fails_costs_only_its_fact(monkeypatch) -> None:
    monkeypatch.setattr(extra, "FACTS", Registry("fact"))

    def probe_broken(config):
        return {}

    def parse(raw):
        raise AttributeError("a bug of the parser")

    extra.FACTS.add("broken", extra.Fact("broken", probe_broken, parse, str, "broken"))
    monkeypatch.setattr(extra, "import_submodules", lambda name: [])
    problems: list[str] = []
    assert parse_extra({"broken": "{}"}, problems) == {"broken": None}
    assert problems == ["fact broken: its parser failed (test_fact_modules): AttributeError: "
                        "a bug of the parser"]
