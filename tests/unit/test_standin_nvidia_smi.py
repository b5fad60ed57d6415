"""The stand-in nvidia-smi against real outputs kept in tests/data/nvidia-smi/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_provision_lab.gpu.install import GUEST_PACKAGE
from vllm_provision_lab.gpu.spec import effective_spec

DATA = Path(__file__).parent.parent / "data" / "nvidia-smi"
SMI = GUEST_PACKAGE / "nvidia_smi.py"


@pytest.fixture
def smi(tmp_path: Path):  # type: ignore[no-untyped-def]
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(effective_spec(tmp_path, "h1")))
    env = dict(os.environ, VLLM_LAB_SPEC=str(spec_file), VLLM_LAB_APPS_DIR=str(tmp_path / "apps"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SMI), *args], env=env, capture_output=True,
                              text=True, check=False)
    run.apps = tmp_path / "apps"  # type: ignore[attr-defined]
    return run


def test_query_gpu_noheader_gives_one_row_per_gpu(smi) -> None:  # type: ignore[no-untyped-def]
    out = smi("--query-gpu=name,driver_version", "--format=csv,noheader").stdout
    assert out.splitlines() == ["NVIDIA H200, 580.95.05"] * 4


def test_csv_header_and_units_follow_the_real_format(smi) -> None:  # type: ignore[no-untyped-def]
    real_header = (DATA / "query-gpu-570.86.15.csv").read_text().splitlines()[0]
    out = smi("--query-gpu=compute_cap,compute_mode,driver_version,name,index",
              "--format=csv").stdout.splitlines()
    assert out[0] == real_header
    with_units = smi("--query-gpu=index,memory.total", "--format=csv").stdout.splitlines()
    assert with_units[0] == "index, memory.total [MiB]" and with_units[1] == "0, 143771 MiB"
    no_units = smi("--query-gpu=memory.total", "--format=csv,noheader,nounits").stdout
    assert no_units.splitlines()[0] == "143771"


def test_list_gpus_matches_the_real_line_shape(smi) -> None:  # type: ignore[no-untyped-def]
    import re
    pattern = re.compile(r"^GPU \d+: .+ \(UUID: GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\)$")
    real = (DATA / "list-gpus-535.txt").read_text().splitlines()
    assert all(pattern.match(line) for line in real)
    lines = smi("-L").stdout.splitlines()
    assert len(lines) == 4 and all(pattern.match(line) for line in lines)


def test_table_has_the_r550_layout_and_header(smi) -> None:  # type: ignore[no-untyped-def]
    real = (DATA / "table-550.40.07.txt").read_text().splitlines()
    out = smi().stdout.splitlines()
    assert {len(line) for line in out[1:12]} == {len(line) for line in real[1:]}
    assert out[3] == real[3] and out[4:8] == real[4:8]
    assert "Driver Version: 580.95.05" in out[2] and "CUDA Version: 13.0" in out[2]
    assert out[2].index("Driver Version") == real[2].index("Driver Version")


def test_unknown_field_fails_like_the_real_one(smi) -> None:  # type: ignore[no-untyped-def]
    result = smi("--query-gpu=driver_version,cuda_version", "--format=csv,noheader")
    assert result.stdout == (DATA / "invalid-field.txt").read_text()
    assert result.returncode == 2


def test_unknown_option_is_an_invalid_combination(smi) -> None:  # type: ignore[no-untyped-def]
    result = smi("--bogus")
    assert result.returncode == 2 and "Invalid combination of input arguments" in result.stdout


def test_compute_apps_lists_live_registered_processes(smi) -> None:  # type: ignore[no-untyped-def]
    smi.apps.mkdir()
    (smi.apps / "1.json").write_text(json.dumps(
        {"pid": os.getpid(), "process_name": "python3", "gpus": [1], "used_memory_mib": 1000}))
    (smi.apps / "2.json").write_text(json.dumps(
        {"pid": 2 ** 22 + 7, "process_name": "gone", "gpus": [0], "used_memory_mib": 5}))
    out = smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv")
    lines = out.stdout.splitlines()
    assert lines[0] == "pid, process_name, used_gpu_memory [MiB], gpu_uuid"
    assert lines[1].startswith(f"{os.getpid()}, python3, 1000 MiB, GPU-") and len(lines) == 2
    used = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "1").stdout
    assert used.strip() == "1000"


def test_unknown_gpu_id_finds_no_device(smi) -> None:  # type: ignore[no-untyped-def]
    result = smi("-L", "-i", "9")
    assert result.returncode == 6 and "No devices were found" in result.stdout
