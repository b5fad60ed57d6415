"""Ray executor of the stand-in, on the real Ray cluster of the node.

Follows vLLM's ``vllm/v1/executor/ray_utils.py`` (``initialize_ray_cluster``,
``_wait_until_pg_ready``) and ``ray_executor.py``: ``ray.init(address="auto")``; one
``{"GPU": 1}`` bundle per worker, bundle 0 pinned with ``{"node:<VLLM_HOST_IP>": 0.001}``,
strategy PACK; wait up to 1800 s (spec ``pg_timeout_s``, or ``VLLM_LAB_PG_TIMEOUT_S``) logging
vLLM's message with back-off; one real actor per bundle (``num_gpus=1``); no actor restarts, so a
dead worker ends the engine (exit 1).

Each request runs one step on every worker, each taking ``stage_s`` (spec, or
``VLLM_LAB_STAGE_S``); the driver waits ``RAY_CGRAPH_get_timeout`` seconds for it as vLLM's
compiled graph does (vLLM's default 300, vllm #15301; Ray reads it with ``int()``,
ray/dag/context.py) and then fails with Ray's ``RayChannelTimeoutError`` and its message
(ray/dag/compiled_dag_node.py): the engine is dead.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from .args import ServeConfig
from .common import check_free_memory, log, register_compute_app, startup_phases
from .server import EngineDead


class StandinWorker:
    """What runs in each Ray actor: shows up in nvidia-smi on its node, 'loads', answers steps."""

    def __init__(self, spec: dict[str, Any], utilization: float) -> None:
        import ray

        self.spec = spec
        self.gpu_ids = [int(g) for g in ray.get_gpu_ids()]
        self.stopped = threading.Event()
        check_free_memory(spec, self.gpu_ids, utilization)
        register_compute_app(self.gpu_ids, int(utilization * int(spec["gpu_memory_mib"])),
                             "ray::RayWorkerWrapper")

    def info(self) -> dict[str, Any]:
        """Return where this worker runs: node IP, host name, GPU ids, CUDA_VISIBLE_DEVICES."""
        import ray

        return {"node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
                "gpu_ids": self.gpu_ids, "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def load(self) -> bool:
        """Sleep ``load_s`` seconds (the weights 'load')."""
        time.sleep(float(self.spec["load_s"]))
        return True

    def step(self, number: int, stage_s: float = 0.0) -> int:
        """One engine step: ``stage_s`` seconds of this stage's forward."""
        if stage_s > 0:
            time.sleep(stage_s)
        return number

    def wait_until_stopped(self) -> None:
        """Block forever; the driver watches this call to learn that the actor died."""
        self.stopped.wait()


def pg_timeout_s(spec: dict[str, Any]) -> float:
    """Return the placement-group wait, seconds (vLLM: PG_WAIT_TIMEOUT = 1800)."""
    return float(os.environ.get("VLLM_LAB_PG_TIMEOUT_S") or spec.get("pg_timeout_s") or 1800)


def stage_s(spec: dict[str, Any]) -> float:
    """Return the seconds one step takes on each worker (spec ``stage_s``, env wins)."""
    return float(os.environ.get("VLLM_LAB_STAGE_S") or spec.get("stage_s") or 0.0)


def cgraph_get_timeout_s() -> int:
    """Return the compiled graph's get timeout, seconds: ``RAY_CGRAPH_get_timeout``, else 300
    (vLLM sets that default before importing ray.dag: vllm #15301, #19725).

    Raises:
        ValueError: not an integer (Ray's ``int()`` fails the same way).
    """
    return int(os.environ.get("RAY_CGRAPH_get_timeout") or 300)


class RayEngine:
    """Driver side: placement group, actors, per-request steps, death watch."""

    def __init__(self, config: ServeConfig, spec: dict[str, Any]) -> None:
        self.config, self.spec = config, spec
        self.actors: list[Any] = []
        self.steps = 0
        self.lock = threading.Lock()

    def start(self) -> None:
        """Connect, place, start and load the workers.

        Raises:
            ValueError: the placement group was not ready within the timeout (vLLM's text).
            ConnectionError: no Ray cluster on this node (Ray's own error).
        """
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        log("INFO", "ray_distributed_executor.py:1",
            f"RAY_CGRAPH_get_timeout is set to {cgraph_get_timeout_s()}")
        ray.init(address="auto", logging_level="WARNING")
        driver_ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
        specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(self.config.world_size)]
        specs[0][f"node:{driver_ip}"] = 0.001
        group = placement_group(specs, strategy="PACK")
        timeout_s = pg_timeout_s(self.spec)
        start = time.monotonic()
        interval = min(10.0, max(1.0, timeout_s / 4))
        while True:
            ready, _ = ray.wait([group.ready()], timeout=interval)
            if ready:
                break
            waited = time.monotonic() - start
            if waited >= timeout_s:
                remove_placement_group(group)
                raise ValueError(
                    f"Cannot provide a placement group of placement_group_specs={specs} within "
                    f"{int(timeout_s)} seconds. See `ray status` and `ray list nodes` to make "
                    "sure the cluster has enough resources.")
            log("INFO", "ray_utils.py:1", f"Waiting for creating a placement group of specs for "
                f"{int(waited)} seconds. specs={specs}. Check `ray status` and `ray list nodes` "
                "to see if you have enough resources, and make sure the IP addresses used by "
                "ray cluster are the same as VLLM_HOST_IP environment variable specified in "
                "each node if you are running on a multi-node.")
            interval = min(interval * 2, max(1.0, timeout_s - waited))
        remote_worker = ray.remote(num_cpus=0, num_gpus=1, max_concurrency=4)(StandinWorker)
        self.actors = [
            remote_worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_capture_child_tasks=True,
                placement_group_bundle_index=index)).remote(self.spec,
                                                            self.config.gpu_memory_utilization)
            for index in range(self.config.world_size)]
        infos = ray.get([actor.info.remote() for actor in self.actors])
        per_node: dict[str, int] = {}
        for info in infos:
            per_node[info["node_ip"]] = per_node.get(info["node_ip"], 0) + 1
        log("INFO", "ray_executor.py:1", f"workers per node: {per_node}")
        if driver_ip not in per_node:
            raise ValueError(f"Ray does not allocate any GPUs on the driver node {driver_ip}. "
                             "Consider adjusting the Ray placement group or running the driver "
                             "on a GPU node.")
        loading = [actor.load.remote() for actor in self.actors]
        # the driver prints vLLM's start-up lines while the actors 'load' (both take load_s)
        startup_phases(self.spec, self.config.model, self.config.max_model_len,
                       first_rank=True)
        ray.get(loading)
        watch = [actor.wait_until_stopped.remote() for actor in self.actors]
        threading.Thread(target=self._watch, args=(watch,), daemon=True).start()

    def _watch(self, calls: list[Any]) -> None:
        import ray

        ray.wait(calls, num_returns=1)
        log("ERROR", "ray_executor.py:1", "A Ray worker died (RayActorError); vLLM sets no "
            "actor restarts, the engine is dead")
        os._exit(1)

    def step(self) -> None:
        """One step on every worker; raise EngineDead if one is gone."""
        import ray

        with self.lock:
            self.steps += 1
            timeout = cgraph_get_timeout_s()
            refs = [a.step.remote(self.steps, stage_s(self.spec)) for a in self.actors]
            try:
                ray.get(refs, timeout=timeout)
            except ray.exceptions.GetTimeoutError as exc:
                message = ("If the execution is expected to take a long time, increase "
                           f"RAY_CGRAPH_get_timeout which is currently {timeout} seconds. "
                           "Otherwise, this may indicate that the execution is hanging.")
                log("ERROR", "core.py:1", "EngineCore encountered a fatal error.")
                log("ERROR", "core.py:1", "ray.exceptions.RayChannelTimeoutError: System error: "
                    "Timed out waiting for object available to read. ObjectID: "
                    f"{refs[-1].hex()}")
                log("ERROR", "core.py:1", f"ray.exceptions.RayChannelTimeoutError: {message}")
                raise EngineDead(f"RayChannelTimeoutError: {message}") from exc
            except Exception as exc:  # noqa: BLE001 - any Ray failure means the engine is dead
                raise EngineDead(f"{type(exc).__name__}: {exc}") from exc
