"""Shared helpers of the stand-in: host spec, vLLM-like log lines, compute-app registry."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SPEC_PATH = os.environ.get("VLLM_LAB_SPEC", "/etc/vllm-lab/spec.json")
APPS_DIR = os.environ.get("VLLM_LAB_APPS_DIR", "/run/vllm-lab/compute-apps")
STANDIN_NOTE = "lab stand-in (vllm-provision lab): no GPU, no model is run"


def load_spec() -> dict[str, Any]:
    """Return this host's spec (``/etc/vllm-lab/spec.json``, or ``$VLLM_LAB_SPEC``)."""
    with open(SPEC_PATH, encoding="utf-8") as handle:
        return json.load(handle)


def log(level: str, source: str, message: str) -> None:
    """Write one vLLM-style line to stderr: ``INFO 11-29 12:00:00 [api_server.py:1] message``."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stderr.write(f"{level} {stamp} [{source}] {message}\n")
    sys.stderr.flush()


def register_compute_app(gpus: list[int], used_memory_mib: int, name: str = "") -> Path | None:
    """Record this process as using ``gpus`` so the stand-in nvidia-smi lists it.

    Returns the registry file (removed by the caller or ignored once the process is gone), or
    None when the registry directory cannot be written (nvidia-smi then shows no process).
    """
    try:
        Path(APPS_DIR).mkdir(parents=True, exist_ok=True)
        path = Path(APPS_DIR) / f"{os.getpid()}.json"
        entry = {"pid": os.getpid(), "process_name": name or Path(sys.argv[0]).name or "python3",
                 "gpus": gpus, "used_memory_mib": used_memory_mib}
        path.write_text(json.dumps(entry), encoding="utf-8")
        return path
    except OSError:
        return None


def memory_used_by_others(gpus: list[int]) -> dict[int, int]:
    """Return MiB used on each of ``gpus`` by other live processes (from the registry)."""
    used = {index: 0 for index in gpus}
    try:
        names = os.listdir(APPS_DIR)
    except OSError:
        return used
    for name in names:
        try:
            app = json.loads((Path(APPS_DIR) / name).read_text(encoding="utf-8"))
            if int(app["pid"]) == os.getpid():
                continue
            os.kill(int(app["pid"]), 0)
        except (OSError, ValueError, KeyError):
            continue
        for index in app.get("gpus", []):
            if int(index) in used:
                used[int(index)] += int(app.get("used_memory_mib", 0))
    return used


def check_free_memory(spec: dict[str, Any], gpus: list[int], utilization: float) -> None:
    """Fail as vLLM's worker does when other processes hold too much of a GPU.

    Source: vLLM ``vllm/v1/worker/gpu_worker.py`` (request_memory): "Free memory on device ...
    on startup is less than desired GPU memory utilization".

    Raises:
        ValueError: with vLLM's message.
    """
    total = int(spec["gpu_memory_mib"])
    for index, used in memory_used_by_others(gpus).items():
        free = total - used
        if free < utilization * total:
            raise ValueError(
                f"Free memory on device cuda:{index} ({free / 1024:.2f}/{total / 1024:.2f} GiB) "
                f"on startup is less than desired GPU memory utilization ({utilization}, "
                f"{utilization * total / 1024:.2f} GiB). Decrease GPU memory utilization or "
                "reduce GPU memory used by other processes.")


def visible_gpus(count: int) -> list[int]:
    """Return the GPU indexes this process uses: ``CUDA_VISIBLE_DEVICES`` or ``0..count-1``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [int(x) for x in visible.split(",") if x.strip().isdigit()][:count]
    return list(range(count))


def versions(spec: dict[str, Any]) -> dict[str, str]:
    """Return what a torch.distributed group must agree on: vLLM, torch build and NCCL."""
    return {"vllm": str(spec["vllm"]), "torch": f"{spec['torch']}+{spec['torch_cuda']}",
            "nccl": str(spec["nccl"])}
