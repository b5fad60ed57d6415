"""What the product reads on a real GPU host, from one capture on an NVIDIA H200 machine.

The captures in tests/data/gpu-h200/ (README there: when, driver 580.159.04, torch 2.11.0+cu130,
NCCL 2.28.9) are the outputs of the product's own probe, GPU-holder command and collective
script run unchanged on that machine, beside the nvidia-smi outputs they parse. These tests say
that the controller's parsers read them to the facts a real host has, that every nvidia-smi field
the product (and the lab's stand-in) asks for is one the real driver lists, and that the stand-in
prints the same shapes as the real driver. Cost: under 2 s, no lab.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_provision.checks.memory import serving_dtype
from vllm_provision.evidence import fabric
from vllm_provision.facts import gather, parsers
from vllm_provision.facts.gpu_pool import parse_holders
from vllm_provision.facts.weights import tensor_nbytes

DATA = Path(__file__).parent.parent / "data" / "gpu-h200"
ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(scope="module")
def raw() -> dict:
    return dict(json.loads((DATA / "probe.json").read_text()))


@pytest.fixture(scope="module")
def facts(raw: dict):  # type: ignore[no-untyped-def]
    return gather.parse_probe_output("gpu1", raw)


def test_the_probe_reads_the_gpu_driver_cuda_torch_and_nccl(facts, raw) -> None:  # type: ignore[no-untyped-def]
    torch_info = json.loads((DATA / "torch-info.json").read_text())
    assert len(facts.gpus) == torch_info["device_count"] == 1
    gpu = facts.gpus[0]
    # the table, -L and the CSV name the same GPU and memory
    table = (DATA / "smi-table.txt").read_text()
    listed = (DATA / "smi-L.txt").read_text()
    assert gpu.name == torch_info["name"] and gpu.name in table and gpu.uuid in listed
    assert f"{gpu.memory_total_mib}MiB" in table
    # torch counts bytes (its total excludes nothing nvidia-smi counts in MiB, less reserved)
    assert torch_info["total_memory"] <= gpu.memory_total_mib * 2**20
    assert facts.driver_version in table and f"CUDA Version: {facts.cuda_driver_version}" in table
    # the NCCL torch loads (torch.cuda.nccl.version() in another process) and the wheel's version
    assert facts.nccl_loaded == ".".join(str(n) for n in torch_info["nccl"])
    assert facts.packages["nvidia-nccl-cu13"] == facts.nccl_loaded
    assert torch_info["torch"].startswith(facts.packages["torch"])
    assert facts.torch_cuda == torch_info["cuda"]
    assert gpu.persistence_mode is True and gpu.mig_mode is False and gpu.ecc_uncorrected == 0


def test_a_process_holding_gpu_memory_is_seen_with_its_mib(facts) -> None:  # type: ignore[no-untyped-def]
    busy = (DATA / "smi-table-busy.txt").read_text()
    (app,) = facts.gpu_processes
    row = next(line for line in busy.splitlines() if f" {app.pid} " in line)
    assert app.process_name in row and f"{app.used_memory_mib}MiB" in row
    assert app.gpu_uuid == facts.gpus[0].uuid
    # memory.used counts the holder and the driver's own share
    assert facts.gpus[0].memory_used_mib >= app.used_memory_mib
    # a process outside any systemd unit (a container's cgroup) has no unit
    assert app.unit == ""


def test_a_host_without_iproute2_reports_what_is_missing_and_still_has_gpu_facts(facts) -> None:  # type: ignore[no-untyped-def]
    # the machine's image has no `ip` or `ss`: both are named, nothing else fails
    assert any("ip -j addr" in p and "not found" in p for p in facts.problems)
    assert any("ss -Hltnp" in p for p in facts.problems)
    assert facts.interfaces == {} and facts.listening == ()
    assert facts.gpus and facts.nvidia_smi_error == ""


def test_the_image_nccl_version_variable_is_not_an_nccl_setting(facts, raw) -> None:  # type: ignore[no-untyped-def]
    # NVIDIA's CUDA images export NCCL_VERSION (the libnccl they were built with), which
    # differs from the NCCL torch loads; parity must not compare it
    image_version = raw["nccl"]["env"]["NCCL_VERSION"]
    assert image_version.split("-")[0] != facts.nccl_loaded
    assert "NCCL_VERSION" not in facts.nccl_env
    assert gather.nccl_settings_env({"NCCL_VERSION": "2.1", "NCCL_IB_HCA": "mlx5"}) == {
        "NCCL_IB_HCA": "mlx5"}


def test_the_weights_read_from_real_safetensors_headers_add_up(facts) -> None:  # type: ignore[no-untyped-def]
    # each header as transformers' save_pretrained wrote it: 8-byte length, then JSON
    total = tensors = 0
    index = json.loads((DATA / "model" / "model.safetensors.index.json").read_text())
    for header_file in sorted((DATA / "model").glob("header-*.json")):
        header = json.loads(header_file.read_text())
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            assert end - start == tensor_nbytes(entry["dtype"], entry["shape"])
            assert index["weight_map"][name] == header_file.name[len("header-"):-len(".json")]
            total += end - start
            tensors += 1
    weights = facts.model_weights
    assert (weights.files, weights.tensors, weights.total_bytes) == (2, tensors, total)
    assert index["metadata"]["total_size"] == total
    # transformers 5 writes "dtype", not "torch_dtype": the memory estimate reads either
    assert "torch_dtype" not in weights.config
    assert serving_dtype(weights.config, None) == ("bfloat16", 2)
    assert weights.by_dtype == {"BF16": total}


def test_the_gpu_holder_command_output_parses(facts) -> None:  # type: ignore[no-untyped-def]
    (holder,) = parse_holders("gpu1", (DATA / "holders.txt").read_text())
    (app,) = facts.gpu_processes
    assert (holder.pid, holder.gpu, holder.used_memory_mib) == (app.pid, 0, app.used_memory_mib)
    assert holder.unit == ""


def test_the_collective_answer_is_found_among_nccl_debug_lines() -> None:
    text = (DATA / "collective-nccl-debug.txt").read_text()
    assert "NCCL INFO NCCL version 2.28.9+cuda13.0" in text
    answer = fabric.parse_line(text)
    assert answer["backend"] == "nccl" and answer["torch"].startswith("2.11.0")
    sizes = [row["bytes"] for row in answer["sizes"]]
    assert sizes == list(fabric.COLLECTIVE_SIZES)
    # one rank: nothing crosses a link, so nccl-tests' bus bandwidth is 0
    assert all(row["all_reduce"]["busbw_gbytes"] == 0 for row in answer["sizes"])


def _queried_fields(text: str, switch: str) -> set[str]:
    fields: set[str] = set()
    for match in re.finditer(rf"--{switch}=([a-z_.,]+)", text):
        fields.update(f for f in match.group(1).split(",") if f)
    return fields


def _listed(help_text: str) -> set[str]:
    return set(re.findall(r'"([a-z_.\[\]]+)"', help_text))


def test_every_field_the_product_and_the_stand_in_query_is_one_the_real_driver_lists() -> None:
    sources = [p for p in (ROOT / "vllm_provision").rglob("*.py")]
    sources += list((ROOT / "lab" / "vllm_provision_lab").rglob("*.py"))
    text = "\n".join(p.read_text() for p in sources)
    gpu_fields, app_fields = (_queried_fields(text, "query-gpu"),
                              _queried_fields(text, "query-compute-apps"))
    assert {"index", "memory.used", "uuid", "driver_version"} <= gpu_fields  # the scan works
    assert {"pid", "used_memory", "gpu_uuid"} <= app_fields
    real_gpu = _listed((DATA / "smi-help-query-gpu.txt").read_text())
    real_apps = _listed((DATA / "smi-help-query-compute-apps.txt").read_text())
    assert gpu_fields - real_gpu == set()
    assert app_fields - real_apps == set()


def test_the_real_csv_with_header_and_units_parses_like_nounits() -> None:
    plain, driver = parsers.parse_gpu_csv((DATA / "smi-query-gpu-default.csv").read_text())
    assert driver == "580.159.04" and plain[0].memory_total_mib == 143771
    header, units = (DATA / "smi-query-gpu-header-units.csv").read_text().splitlines()
    assert header.split(", ")[3] == "memory.total [MiB]" and "143771 MiB" in units


@pytest.fixture
def standin(tmp_path: Path):  # type: ignore[no-untyped-def]
    from vllm_provision_lab.gpu.install import GUEST_PACKAGE
    from vllm_provision_lab.gpu.spec import effective_spec

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(effective_spec(tmp_path, "h1")))
    apps = tmp_path / "apps"
    apps.mkdir()
    env = dict(os.environ, VLLM_LAB_SPEC=str(spec_file), VLLM_LAB_APPS_DIR=str(apps))

    def run(*args: str) -> str:
        return subprocess.run([sys.executable, str(GUEST_PACKAGE / "nvidia_smi.py"), *args],
                              env=env, capture_output=True, text=True, check=True).stdout
    run.apps = apps  # type: ignore[attr-defined]
    return run


def test_the_stand_in_prints_the_real_r580_shapes(standin) -> None:  # type: ignore[no-untyped-def]
    real_header = (DATA / "smi-query-gpu-header-units.csv").read_text().splitlines()[0]
    fields = [f.split(" [")[0] for f in real_header.split(", ")]
    assert standin(f"--query-gpu={','.join(fields)}", "--format=csv").splitlines()[0] \
        == real_header
    real_apps_header = (DATA / "smi-query-compute-apps-header.csv").read_text().splitlines()[0]
    assert standin("--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                   "--format=csv").splitlines()[0] == real_apps_header
    # the table: the same line widths, and the header line in the same columns
    real = (DATA / "smi-table.txt").read_text().splitlines()
    mine = standin().splitlines()
    assert {len(line) for line in mine[1:12]} == {len(line) for line in real[1:12]}
    header = re.compile(r"^\| NVIDIA-SMI (\S+) +Driver Version: (\S+) +CUDA Version: (\S+) +\|$")
    assert header.match(real[2]) and header.match(mine[2])
    assert real[2].index("Driver Version") == mine[2].index("Driver Version")


def test_the_capture_files_are_what_the_readme_says() -> None:
    readme = (DATA / "README.md").read_text()
    for path in DATA.rglob("*"):
        if path.is_file() and path.name != "README.md":
            assert path.name in readme, path
