"""Parsers of the fabric, GPU-health and clock facts, on recorded outputs (tests/data/preflight)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_provision.facts import parsers
from vllm_provision.facts.gather import parse_probe_output
from vllm_provision.facts.model import Gpu, pci_key

DATA = Path(__file__).resolve().parents[1] / "data" / "preflight"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def four_gpus() -> list[Gpu]:
    buses = ["18", "2A", "3A", "5D"]
    return [Gpu(i, "NVIDIA H200", 143771, f"GPU-{i}", f"00000000:{bus}:00.0")
            for i, bus in enumerate(buses)]


@pytest.mark.parametrize(("name", "mtu"), [("ip-link-mtu1500.json", 1500),
                                           ("ip-link-mtu9000.json", 9000)])
def test_ip_link_mtu(name, mtu):
    interfaces = parsers.parse_ip_addr_json(read(name))
    assert interfaces["eth0"].mtu == mtu
    assert interfaces["eth0"].is_up
    assert interfaces["lo"].mtu == 65536


def test_sys_speed():
    assert parsers.parse_sys_speed("400000\n") == 400000
    assert parsers.parse_sys_speed("-1\n") is None
    assert parsers.parse_sys_speed(None) is None
    assert parsers.parse_sys_speed("") is None


def test_ibv_devinfo_active_and_down():
    [active] = parsers.parse_ibv_devinfo(read("ibv_devinfo-active.txt"))
    assert (active.device, active.port, active.state, active.link_layer, active.firmware) == (
        "mlx5_0", 1, "ACTIVE", "Ethernet", "28.39.1002")
    assert active.active
    [down] = parsers.parse_ibv_devinfo(read("ibv_devinfo-down.txt"))
    assert down.state == "DOWN" and not down.active


def test_infiniband_sysfs_active_and_down():
    ports = parsers.parse_infiniband_sysfs(json.loads(read("infiniband-sysfs-active.json")))
    assert [(p.device, p.port, p.state, p.link_layer) for p in ports] == [
        ("mlx5_0", 1, "ACTIVE", "InfiniBand"), ("mlx5_1", 1, "ACTIVE", "InfiniBand")]
    assert ports[0].rate == "400 Gb/sec (4X NDR)"
    [down] = parsers.parse_infiniband_sysfs(json.loads(read("infiniband-sysfs-down.json")))
    assert down.state == "DOWN" and not down.active
    assert parsers.parse_infiniband_sysfs({}) == []


def test_gpu_health_healthy():
    gpus = parsers.parse_gpu_health_csv(read("gpu-health-ok.csv"), four_gpus())
    assert [(g.memory_used_mib, g.ecc_uncorrected, g.persistence_mode, g.mig_mode)
            for g in gpus] == [(0, 0, True, False)] * 4


def test_gpu_health_faulty():
    gpus = parsers.parse_gpu_health_csv(read("gpu-health-faulty.csv"), four_gpus())
    assert gpus[0].memory_used_mib == 71234
    assert gpus[1].ecc_uncorrected == 2
    assert gpus[2].mig_mode is True
    assert (gpus[3].persistence_mode, gpus[3].ecc_uncorrected, gpus[3].mig_mode) == (
        False, None, None)
    assert gpus[3].uuid == "GPU-3" and gpus[3].memory_total_mib == 143771


def test_xid_lines_map_to_the_gpu_by_pci():
    events = parsers.parse_xid_lines(read("kernel-xid.txt"))
    assert [(e.pci, e.code) for e in events] == [("0000:2a:00", 79), ("0000:2a:00", 48)]
    assert pci_key(events[0].pci) == four_gpus()[1].pci_key
    assert parsers.parse_xid_lines("kernel: mlx5_core Link ACTIVE\n") == []


def test_modules_and_os_release():
    modules = ("nvidia_peermem 16384 0 - Live 0x0000000000000000\n"
               "nvidia 56000000 10 nvidia_peermem, Live 0x0000000000000000 (POE)\n")
    assert parsers.parse_modules(modules, ("nvidia_peermem", "nvidia_fs")) == ["nvidia_peermem"]
    assert parsers.parse_os_release('NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux '
                                    '12 (bookworm)"\n') == "Debian GNU/Linux 12 (bookworm)"


def test_clock_synced_unsynced_and_offset():
    synced = parsers.parse_clock(read("timedatectl-show-synced.txt"),
                                 read("chronyc-tracking-ok.txt"))
    assert synced.synchronized is True and synced.source == "chrony"
    assert synced.offset_s == pytest.approx(-0.000001501)
    unsynced = parsers.parse_clock(read("timedatectl-show-unsynced.txt"), "")
    assert (unsynced.synchronized, unsynced.ntp_enabled, unsynced.offset_s) == (False, False,
                                                                               None)
    assert parsers.parse_chronyc_offset(read("chronyc-tracking-offset.txt")) == pytest.approx(
        2.413000072)


@pytest.mark.parametrize(("name", "state"), [("fabricmanager-active.txt", "active"),
                                             ("fabricmanager-failed.txt", "failed"),
                                             ("fabricmanager-notfound.txt", "not-found")])
def test_fabric_manager_state_from_the_probe(name, state):
    raw = {"fabric": {"nvswitch_count": 4, "unit": {"rc": 0, "stdout": read(name)}}}
    facts = parse_probe_output("h1", raw)
    assert (facts.nvswitch_count, facts.fabric_manager) == (4, state)
    assert parse_probe_output("h1", {"fabric": {"nvswitch_count": 0}}).fabric_manager == ""


def test_probe_output_carries_every_new_fact():
    gpu_csv = "".join(f"{g.index}, NVIDIA H200, 580.95.05, 143771, {g.uuid}, {g.pci_bus_id}\n"
                      for g in four_gpus())
    raw = {
        "nvidia_smi": {"query_gpu": {"rc": 0, "stdout": gpu_csv},
                       "health": {"rc": 0, "stdout": read("gpu-health-faulty.csv")}},
        "ip_addr": {"rc": 0, "stdout": read("ip-link-mtu9000.json")},
        "net_speeds": {"eth0": "10000\n", "lo": None},
        "infiniband": json.loads(read("infiniband-sysfs-down.json")),
        "modules": "nvidia_fs 249856 0 - Live 0x0\n", "kernel_release": "6.1.0-18-amd64",
        "os_release": 'PRETTY_NAME="Ubuntu 22.04.4 LTS"\n',
        "xid": {"rc": 0, "stdout": read("kernel-xid.txt")},
        "clock": {"timedatectl": {"rc": 0, "stdout": read("timedatectl-show-unsynced.txt")},
                  "chronyc": {"rc": 127, "stdout": ""}, "container": "systemd-nspawn\n"},
    }
    facts = parse_probe_output("h1", raw)
    assert facts.gpus[1].ecc_uncorrected == 2
    assert facts.interfaces["eth0"].speed_mbps == 10000
    assert facts.interfaces["eth0"].mtu == 9000
    assert facts.rdma_ports[0].state == "DOWN"
    assert facts.kernel_modules == ("nvidia_fs",)
    assert (facts.kernel_release, facts.os_release) == ("6.1.0-18-amd64", "Ubuntu 22.04.4 LTS")
    assert [e.code for e in facts.xid_events] == [79, 48]
    assert facts.clock.container == "systemd-nspawn" and facts.clock.synchronized is False


def test_health_query_failure_keeps_the_gpus_and_says_why():
    raw = {"nvidia_smi": {"query_gpu": {"rc": 0, "stdout": "0, NVIDIA H200, 580.95.05, 143771, "
                                                           "GPU-0, 00000000:18:00.0\n"},
                          "health": {"rc": 2, "stdout": 'Field "mig.mode.current" is not a '
                                                        'valid field to query.\n'}}}
    facts = parse_probe_output("h1", raw)
    assert len(facts.gpus) == 1 and facts.gpus[0].mig_mode is None
    assert any("mig.mode.current" in p for p in facts.problems)
