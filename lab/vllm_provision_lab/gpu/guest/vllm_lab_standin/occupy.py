"""A foreign process holding GPUs (the shared-pool case): ``python3 -m vllm_lab_standin.occupy``.

Usage: ``occupy GPU_INDEXES [MIB]`` (e.g. ``0,1 120000``): a plain process (another team's
training job) that registers itself so the stand-in nvidia-smi lists it under
``--query-compute-apps`` and counts its memory, then sleeps until killed. Ray does not see it.

``occupy --ray COUNT [MIB]``: another Ray job on the node's Ray cluster. It runs as a Ray driver
(``ray.init(address="auto")``) that creates one actor with ``num_gpus=COUNT`` pinned to this
node (``NodeAffinitySchedulingStrategy``); the actor registers the GPUs Ray gave it
(``ray.get_gpu_ids()``) as a compute app, so both Ray's free resources and nvidia-smi show the
hold. The actor runs in the raylet's worker process (the node's Ray unit), as a real Ray job's
would; it dies with the driver (Ray ends an actor whose owner exited), so stopping the driver's
unit frees the GPUs in Ray and in nvidia-smi.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from .common import register_compute_app

HOLDER_NAME = "ray::GpuHolder"


def _sleep_until_terminated() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


class GpuHolder:
    """The actor: registers the GPUs Ray gave it as a compute app; :meth:`release` drops it."""

    def __init__(self, mib: int) -> None:
        import ray

        self.gpus = [int(g) for g in ray.get_gpu_ids()]
        self.path = register_compute_app(self.gpus, mib, HOLDER_NAME)

    def held(self) -> list[int]:
        """The GPU indexes Ray assigned (what ``CUDA_VISIBLE_DEVICES`` names)."""
        return self.gpus

    def release(self) -> None:
        """Free the memory (leave nvidia-smi's list) before Ray gets the GPUs back."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def hold_with_ray(count: float, mib: int) -> int:
    """Hold ``count`` logical GPUs of this node's Ray cluster with one actor until SIGTERM.

    On SIGTERM the actor first leaves nvidia-smi's list (a process that exits frees its CUDA
    memory), then is killed, so Ray never hands its GPUs to a worker while they still look used.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    node = ray.get_runtime_context().get_node_id()
    holder = ray.remote(num_cpus=0, num_gpus=count)(GpuHolder).options(
        name="GpuHolder", scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    ).remote(mib)
    gpus = ray.get(holder.held.remote())
    print(f"holding Ray GPUs {gpus} on node {node} (actor GpuHolder)", flush=True)
    try:
        _sleep_until_terminated()
    finally:
        ray.get(holder.release.remote(), timeout=30)
        ray.kill(holder)
    return 0


def main(argv: list[str]) -> int:
    """``GPUS [MIB]``: register and sleep; ``--ray COUNT [MIB]``: hold Ray GPUs (module doc)."""
    if argv and argv[0] == "--ray":
        return hold_with_ray(float(argv[1]), int(argv[2]) if len(argv) > 2 else 120000)
    gpus = [int(g) for g in argv[0].split(",") if g.strip()]
    mib = int(argv[1]) if len(argv) > 1 else 120000
    path = register_compute_app(gpus, mib, "python3")
    try:
        _sleep_until_terminated()
    finally:
        if path is not None:
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
