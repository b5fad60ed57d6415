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


def visible_devices(spec: dict[str, Any]) -> list[int]:
    """Return the GPU indexes CUDA shows this process, in CUDA's order: those of
    ``CUDA_VISIBLE_DEVICES`` up to the first one that names no GPU of the host (CUDA C
    Programming Guide, "CUDA Environment Variables": "only the devices whose index precedes
    the invalid index are visible"), else ``0..gpus-1`` of the spec. An empty value counts as
    unset, as the stand-in always read it."""
    total = int(spec["gpus"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible:
        return list(range(total))
    shown: list[int] = []
    for word in visible.split(","):
        word = word.strip()
        if not word.isdigit() or int(word) >= total or int(word) in shown:
            break
        shown.append(int(word))
    return shown


def visible_gpus(count: int, spec: dict[str, Any]) -> list[int]:
    """Return the GPU indexes a node's ``count`` local ranks use: the first ``count`` devices
    CUDA shows (:func:`visible_devices`), local rank i on device i as vLLM places them."""
    return visible_devices(spec)[:count]


def versions(spec: dict[str, Any]) -> dict[str, str]:
    """Return what a torch.distributed group must agree on: vLLM, torch build and NCCL."""
    return {"vllm": str(spec["vllm"]), "torch": f"{spec['torch']}+{spec['torch_cuda']}",
            "nccl": str(spec["nccl"])}


def stall_if(spec: dict[str, Any], phase: str) -> None:
    """Sit here for ever, printing nothing more, when the host's spec says ``stall: <phase>``
    (``lab set h2 stall=load``): a start stuck in that phase, as a vLLM waiting on a slow
    mount, a collective that never completes or a hung graph capture prints no further line.
    SIGTERM is left as the caller set it (a headless worker ignores it: systemd's stop ends
    with SIGKILL after TimeoutStopSec, as for a real stuck worker)."""
    if str(spec.get("stall") or "none") != phase:
        return
    while True:
        time.sleep(3600)


def startup_phases(spec: dict[str, Any], model: str, max_model_len: int, *,
                   first_rank: bool) -> None:
    """Go through vLLM's start-up phases in ``spec["load_s"]`` seconds, printing at each the
    line vLLM 0.32.0 prints there (sources: vllm_provision/output/phases.py): weights (half the
    time; rank 0 draws the safetensors bar, one line per shard), profiling and KV-cache sizing
    (a fifth), CUDA graph capture (the rest; rank 0 prints the bar, every rank the summary).

    ``spec["stall"]`` stops it for ever in one phase (:func:`stall_if`): ``init`` before the
    first line, ``load`` after ``Starting to load model`` (and rank 0's bar at 0%), ``kv_cache``
    after ``Available KV cache memory``, ``graphs`` inside the capture: tqdm's bar there steps with
    carriage returns, which journald keeps only at the bar's closing line break, so the journal
    of a capture that hangs ends with the KV-cache lines, as a real vLLM's does.
    """
    stall_if(spec, "init")
    load_s = float(spec["load_s"])
    try:
        shards = max(1, sum(1 for n in os.listdir(model) if n.endswith(".safetensors")))
    except OSError:
        shards = 1
    log("INFO", "gpu_model_runner.py:1", f"Starting to load model {model}...")
    weights_s = load_s * 0.5
    for done in range(shards + 1):
        if first_rank:  # tqdm with vLLM's _BAR_FORMAT (ends in a line break): a line a step
            per = weights_s / shards
            sys.stderr.write(f"Loading safetensors checkpoint shards: {100 * done // shards:3d}% "
                             f"Completed | {done}/{shards} [00:{int(done * per):02d}<"
                             f"00:{int((shards - done) * per):02d}, {per:.2f}s/it]\n")
            sys.stderr.flush()
        if done == 0:
            stall_if(spec, "load")
        if done < shards:
            time.sleep(weights_s / shards)
    log("INFO", "default_loader.py:1", f"Loading weights took {weights_s:.2f} seconds")
    log("INFO", "gpu_model_runner.py:1",
        f"Model loading took 0.0003 GiB memory and {weights_s:.6f} seconds")
    time.sleep(load_s * 0.2)
    log("INFO", "gpu_worker.py:1", "Available KV cache memory: 100.25 GiB")
    stall_if(spec, "kv_cache")
    if first_rank:
        log("INFO", "kv_cache_utils.py:1", f"GPU KV cache size: 3,284,992 tokens, Maximum "
            f"concurrency for {max_model_len:,} tokens per request: "
            f"{3284992 / max(1, max_model_len):.2f}x")
    graphs_s = load_s - weights_s - load_s * 0.2
    time.sleep(graphs_s)
    stall_if(spec, "graphs")
    if first_rank:  # tqdm's own bar (carriage returns): journald keeps only the last state
        sys.stderr.write("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|"
                         f"##########| 67/67 [00:{int(graphs_s):02d}<00:00, 30.00it/s]\n")
        sys.stderr.flush()
    log("INFO", "gpu_model_runner.py:1",
        f"Graph capturing finished in {round(graphs_s)} secs, took 0.45 GiB")
