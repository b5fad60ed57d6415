"""Will the model fit (docs/preflight.md): the memory estimate against the stand-in's GPUs.

The model is the header-only Mixtral-8x7B checkpoint of tests/data/models (config.json and
safetensors headers, no weights; the estimate reads nothing else), copied to both hosts. The
lab's mp replica is TP=4 x PP=2 on two hosts of 4 stand-in GPUs of 143771 MiB
(docs/lab-standin.md); ``vllm_gpu_memory_utilization`` from ``-e`` sets each GPU's budget.

Cost: about 15 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from lab_support import provision

pytestmark = pytest.mark.lab

SOURCE = Path(__file__).resolve().parents[1] / "data" / "models" / "mixtral-8x7b-v0.1"
MODEL = "/srv/models/fit-mixtral"
MIB, GIB = 1024 ** 2, 1024 ** 3
GPU_TOTAL = 143771 * MIB            # the stand-in's nvidia-smi memory.total
# Per GPU of either stage, by hand (tests/unit/test_memory_fit.py writes it out): 16 layers of
# 2,902,540,288 bytes, plus the embedding (stage 0) or the LM head (stage 1) of 262,144,000
# bytes, plus model.norm's 8,192, over TP=4.
WEIGHTS_PER_GPU = (16 * 2_902_540_288 + 262_144_000 + 8_192) // 4   # 11,675,699,200 = 10.87 GiB
OVERHEAD = 2048 * MIB               # preflight_gpu_overhead_mib
KV_PER_TOKEN = 16 * 2 * 128 * 2 * 2  # 16 layers x 2 KV heads per GPU x 128 x K,V x BF16


@pytest.fixture(scope="module")
def model_on_hosts(lab: Any) -> Any:
    """The header-only Mixtral at MODEL on h1 and h2 (removed afterwards)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for item in sorted(SOURCE.iterdir()):
            if item.name.endswith((".json", ".safetensors")):
                archive.add(item, arcname=item.name)
    for host in ("h1", "h2"):
        done = subprocess.run(["ssh", "-F", str(lab.ssh_config), host,
                               f"rm -rf {MODEL} && mkdir -p {MODEL} && tar -x -C {MODEL}"],
                              input=buffer.getvalue(), capture_output=True, timeout=60,
                              check=False)
        assert done.returncode == 0, done.stderr
    yield lab
    for host in ("h1", "h2"):
        lab.ssh(host, f"rm -rf {MODEL}")


def check(lab: Any, state: Path, utilization: str) -> tuple[int, dict[str, Any]]:
    result = provision("check", "-i", str(lab.inventory_path("mp")), "--json",
                       "-e", f"vllm_model={MODEL}", "-e",
                       f"vllm_gpu_memory_utilization={utilization}", state_home=state,
                       timeout=180)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout)


def fit_finding(document: dict[str, Any]) -> dict[str, Any]:
    [finding] = [f for f in document["findings"] if f["check"] == "memory.fit"]
    return finding


def test_weights_too_large_for_the_gpus_are_refused_by_check_and_up(model_on_hosts, tmp_path):
    lab = model_on_hosts
    # 0.05 x 140.40 GiB = 7.02 GiB per GPU < 10.87 GiB of weights
    code, document = check(lab, tmp_path, "0.05")
    finding = fit_finding(document)
    assert code == 1 and finding["severity"] == "error"
    assert f"{WEIGHTS_PER_GPU / GIB:.2f} GiB of weights per GPU" in finding["actual"]
    assert finding["expected"].startswith(
        f"weights per GPU <= {int(GPU_TOTAL * 0.05) / GIB:.2f} GiB (0.05 x "
        f"{GPU_TOTAL / GIB:.2f} GiB")
    stages = document["memory"]["lab"]["stages"]
    assert [s["weights"] for s in stages] == [WEIGHTS_PER_GPU] * 2
    assert [s["hosts"] for s in stages] == [["h1"], ["h2"]]

    for host in ("h1", "h2"):
        lab.ssh(host, "touch /run/fit-before-up")
    run = provision("up", "-i", str(lab.inventory_path("mp")), "-e", f"vllm_model={MODEL}",
                    "-e", "vllm_gpu_memory_utilization=0.05", state_home=tmp_path,
                    timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert "nothing was changed" in output and "memory per GPU" in output
    assert f"got {WEIGHTS_PER_GPU / GIB:.2f} GiB of weights per GPU" in output
    for host in ("h1", "h2"):
        # The run lock's empty file is the one thing a first run leaves on a fresh host (the
        # lock is taken before the preflight: docs/security.md, "Run lock"); its holder file
        # goes when the refused run releases the lock.
        changed = lab.ssh(host, "find /etc/systemd/system /etc/vllm* /var/lib/vllm-provision "
                                "/opt/vllm -type f -newer /run/fit-before-up "
                                "! -path /var/lib/vllm-provision/run.lock 2>/dev/null")
        assert changed.stdout.strip() == "", (host, changed.stdout)
        holder = lab.ssh(host, "test -e /var/lib/vllm-provision/run.lock.holder && echo left")
        assert holder.stdout.strip() == "", host


def test_fitting_weights_with_too_little_kv_room_warn_with_the_largest_context(
        model_on_hosts, tmp_path):
    # 0.094 x 140.40 GiB = 13.20 GiB: weights 10.87 GiB + overhead 2 GiB leave 0.32 GiB,
    # fewer tokens than Mixtral's max_position_embeddings (32768, the default max_model_len)
    room = int(GPU_TOTAL * 0.094) - WEIGHTS_PER_GPU - OVERHEAD
    largest = room // (KV_PER_TOKEN * 16) * 16  # whole blocks of 16 tokens
    assert 0 < largest < 32768
    code, document = check(model_on_hosts, tmp_path, "0.094")
    finding = fit_finding(document)
    assert code == 0 and finding["severity"] == "warning"
    assert f"the largest context that fits is {largest} tokens" in finding["actual"]
    assert "max_model_len 32768" in finding["expected"]
    assert f"vllm_max_model_len to at most {largest}" in finding["fix"]
    assert [s["tokens"] for s in document["memory"]["lab"]["stages"]] == [largest] * 2


def test_facts_show_the_headers_read_on_rank_0_and_the_estimate(model_on_hosts, tmp_path):
    result = provision("facts", "-i", str(model_on_hosts.inventory_path("mp")), "--json",
                       "-e", f"vllm_model={MODEL}", state_home=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    weights = document["hosts"]["h1"]["model_weights"]
    assert weights["total_bytes"] == 46_702_792_704 * 2  # Mixtral's parameters in BF16
    assert weights["files"] == 4 and weights["errors"] == []
    assert document["hosts"]["h2"]["model_weights"] is None  # headers are read on rank 0 only
    stages = document["memory"]["lab"]["stages"]
    assert [s["weights"] for s in stages] == [WEIGHTS_PER_GPU] * 2
    assert [s["budget"] for s in stages] == [int(GPU_TOTAL * 0.9)] * 2
