"""Parsers of the fact probe's raw outputs, on real nvidia-smi outputs of several drivers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_provision.facts import parsers

REAL = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi-real"
STANDIN_REFS = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"


# Each recorded table is named after what its driver printed: table-<driver>-cuda<CUDA>.txt.
TABLES = sorted(REAL.glob("table-*.txt"))


def test_every_driver_generation_from_515_to_595_is_recorded():
    assert len(TABLES) >= 5 and {p.name.split(".")[0] for p in TABLES} >= {
        "table-515", "table-535", "table-565", "table-570", "table-595"}


@pytest.mark.parametrize("path", TABLES, ids=lambda path: path.name)
def test_header_gives_driver_and_cuda_version_on_every_driver_generation(path):
    driver, cuda = re.fullmatch(r"table-(.+)-cuda(.+)\.txt", path.name).groups()
    assert parsers.parse_smi_header(path.read_text()) == (driver, cuda)


def test_header_of_nvidia_smi_q_gives_driver_and_cuda_version():
    text = (REAL / "query-q-565.57.01.txt").read_text()
    assert parsers.parse_smi_header(text) == ("565.57.01", "12.7")


def test_header_of_r610_kmd_and_umd_names_is_read():
    text = "| NVIDIA-SMI 610.12   KMD Version: 610.12   CUDA UMD Version: 13.3 |"
    assert parsers.parse_smi_header(text) == ("610.12", "13.3")


def test_header_without_versions_gives_none():
    assert parsers.parse_smi_header("No devices were found\n") == (None, None)


def test_csv_with_header_line_and_driver_drift_between_gpus():
    fields = ("index", "name", "driver_version", "pci.bus_id")
    gpus, driver = parsers.parse_gpu_csv((REAL / "query-gpu-550-driver-drift.csv").read_text(),
                                         fields)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[2].pci_bus_id == "00000000:3D:00.0"
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert driver == "550.90.07"


def test_csv_with_mib_units_gives_memory_in_mib():
    fields = ("index", "name", "driver_version", "memory.total")
    gpus, driver = parsers.parse_gpu_csv((REAL / "query-gpu-575.57.08-units.csv").read_text(),
                                         fields)
    assert len(gpus) == 4
    assert gpus[0].memory_total_mib == 81559
    assert driver == "575.57.08"


def test_csv_with_many_columns_reads_uuid_by_field_name():
    fields = ("index", "name", "driver_version", "pstate", "pci.bus_id", "serial", "uuid",
              "power.draw", "power.limit", "clocks.sm", "clocks.max.sm")
    gpus, driver = parsers.parse_gpu_csv((REAL / "query-gpu-535.161.07-wide.csv").read_text(),
                                         fields)
    assert gpus[0].uuid == "GPU-e6a1d5e1-9a00-c86a-769a-1e2d4d438a4d"
    assert gpus[0].pci_bus_id == "00000000:C4:04.0"
    assert driver == "535.161.07"


def test_standin_reference_with_header_is_read_by_field_name():
    fields = ("compute_cap", "compute_mode", "driver_version", "name", "index")
    text = (STANDIN_REFS / "query-gpu-570.86.15.csv").read_text()
    gpus, driver = parsers.parse_gpu_csv(text, fields)
    assert gpus and driver == "570.86.15"


def test_gpu_name_with_a_comma_stays_whole():
    line = "0, NVIDIA H100 80GB HBM3, MIG 1g.10gb, 535.104.05, 81559, GPU-1, 00000000:18:00.0\n"
    gpus, _ = parsers.parse_gpu_csv(line)
    assert gpus[0].name == "NVIDIA H100 80GB HBM3, MIG 1g.10gb"
    assert gpus[0].uuid == "GPU-1"


def test_warning_lines_and_blank_lines_are_skipped():
    text = ("\nWARNING: infoROM is corrupted at gpu 0000:01:00.0\n"
            "0, Tesla T4, 470.1, 15360, GPU-x, 0\n")
    gpus, _ = parsers.parse_gpu_csv(text)
    assert [g.name for g in gpus] == ["Tesla T4"]


def test_compute_apps_real_rows():
    fields = ("pid", "used_memory", "gpu_uuid")
    apps = parsers.parse_compute_apps_csv((REAL / "query-compute-apps-uuid.csv").read_text(),
                                          fields)
    assert [(a.pid, a.used_memory_mib) for a in apps] == [(1726992, 5746), (1726993, 5920)]
    assert apps[1].gpu_uuid == "GPU-9eb34eec-449b-7839-d362-d1e995e95239"


def test_compute_apps_with_no_process_is_empty():
    assert parsers.parse_compute_apps_csv("") == []
    assert parsers.parse_compute_apps_csv("No running processes found\n") == []


def test_ip_addr_json_gives_state_and_addresses():
    text = json.dumps([
        {"ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "operstate": "UNKNOWN",
         "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {"ifname": "eth0", "flags": ["BROADCAST", "UP", "LOWER_UP"], "operstate": "UP",
         "mtu": 1500, "addr_info": [{"family": "inet", "local": "10.213.5.11", "prefixlen": 24}]},
        {"ifname": "eth1", "flags": ["BROADCAST"], "operstate": "DOWN", "addr_info": []},
    ])
    interfaces = parsers.parse_ip_addr_json(text)
    assert interfaces["eth0"].addresses == ("10.213.5.11",)
    assert interfaces["eth0"].is_up and interfaces["lo"].is_up
    assert not interfaces["eth1"].is_up


def test_route_get_json_and_its_failure():
    route = parsers.parse_ip_route_get_json(
        "10.0.0.12", '[{"dst":"10.0.0.12","dev":"eth0","prefsrc":"10.0.0.11","flags":[]}]')
    assert (route.dev, route.src, route.error) == ("eth0", "10.0.0.11", "")
    assert parsers.parse_ip_route_get_json("10.0.0.12", "").error == "no route"


def test_ss_listening_with_owning_process_and_unit():
    text = (
        "LISTEN 0      4096         0.0.0.0:8000      0.0.0.0:*    "
        'users:(("python3",pid=812,fd=12))\n'
        "LISTEN 0      128          0.0.0.0:22        0.0.0.0:*    "
        'users:(("sshd",pid=101,fd=3))\n'
        "LISTEN 0      4096            [::]:6379         [::]:*\n"
        "LISTEN 0      4096    127.0.0.1%lo:53        0.0.0.0:*\n"
    )
    sockets = parsers.parse_ss_listening(text, {812: "vllm.service"})
    assert [(s.address, s.port) for s in sockets] == [
        ("0.0.0.0", 8000), ("0.0.0.0", 22), ("::", 6379), ("127.0.0.1", 53)]
    assert (sockets[0].process, sockets[0].pid, sockets[0].unit) == ("python3", 812,
                                                                     "vllm.service")
    assert sockets[2].pid is None


@pytest.mark.parametrize(("text", "unit"), [
    ("0::/system.slice/vllm.service\n", "vllm.service"),
    ("12:pids:/\n1:name=systemd:/system.slice/ray-head.service\n0::/\n", "ray-head.service"),
    ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
    ("0::/\n", ""),
])
def test_unit_from_cgroup(text, unit):
    assert parsers.unit_from_cgroup(text) == unit


def test_remove_ipc_defaults_to_yes_and_drop_ins_win_in_order():
    debian_default = "[Login]\n#RemoveIPC=yes\n#KillUserProcesses=no\n"
    assert parsers.parse_logind_remove_ipc([debian_default]) is True
    assert parsers.parse_logind_remove_ipc([debian_default, "[Login]\nRemoveIPC=no\n"]) is False
    assert parsers.parse_logind_remove_ipc(
        ["[Login]\nRemoveIPC=no\n", "[Login]\nRemoveIPC=yes\n"]) is True
    assert parsers.parse_logind_remove_ipc(["[Other]\nRemoveIPC=no\n"]) is True


def test_sys_uid_max_from_login_defs_or_default():
    assert parsers.parse_sys_uid_max("#SYS_UID_MAX 100\nSYS_UID_MAX  499\n") == 499
    assert parsers.parse_sys_uid_max("UID_MIN 1000\n") == 999


def test_meminfo_in_bytes():
    values = parsers.parse_meminfo("MemTotal:       24684092 kB\nHugePages_Total:       0\n")
    assert values["MemTotal"] == 24684092 * 1024
    assert values["HugePages_Total"] == 0


@pytest.mark.parametrize(("version", "build", "major"), [
    ("2.9.0+cu130", "cu130", 13), ("2.8.0+cu128", "cu128", 12), ("2.14.0", None, None),
])
def test_torch_cuda_build(version, build, major):
    assert parsers.torch_cuda_build(version) == build
    assert parsers.cuda_major_of_build(build) == major


def test_systemd_version_and_python_micro():
    assert parsers.parse_systemd_version("systemd 252 (252.38-1~deb12u1)\n+PAM +AUDIT") == 252
    assert parsers.python_micro("3.11.2 (main, Mar 13 2023, 12:18:29) [GCC 12.2.0]") == "3.11.2"
