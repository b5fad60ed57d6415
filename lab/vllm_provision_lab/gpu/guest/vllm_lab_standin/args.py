"""``vllm serve`` command line: the real flag names and the checks vLLM makes before starting.

Flag names and defaults: vLLM ``vllm/engine/arg_utils.py`` and
``vllm/entrypoints/openai/cli_args.py``; the checks: ``vllm/config/parallel.py``
(``ParallelConfig.__post_init__``) and ``vllm/entrypoints/cli/serve.py``, in
https://github.com/vllm-project/vllm (the quoted texts are from those files).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any


class ConfigError(Exception):
    """A configuration vLLM rejects before starting; ``str()`` is vLLM's message."""


def build_parser() -> argparse.ArgumentParser:
    """Return the ``vllm serve`` parser (unknown flags fail as argparse does in vLLM: exit 2)."""
    parser = argparse.ArgumentParser(prog="vllm serve")
    add = parser.add_argument
    add("model", nargs="?", default=None)
    add("--model", dest="model_flag", default=None)
    add("--tensor-parallel-size", "-tp", type=int, default=1)
    add("--pipeline-parallel-size", "-pp", type=int, default=1)
    add("--data-parallel-size", "-dp", type=int, default=1)
    add("--nnodes", "-n", type=int, default=1)
    add("--node-rank", "-r", type=int, default=0)
    add("--master-addr", default="127.0.0.1")
    add("--master-port", type=int, default=29501)
    add("--headless", action="store_true")
    add("--api-server-count", "-asc", type=int, default=None)
    add("--distributed-executor-backend", default=None)
    add("--distributed-timeout-seconds", type=int, default=None)
    add("--host", default=None)
    add("--port", type=int, default=8000)
    add("--served-model-name", nargs="+", default=None)
    add("--api-key", default=None)
    add("--max-model-len", type=int, default=None)
    add("--gpu-memory-utilization", type=float, default=0.9)
    add("--dtype", default="auto")
    add("--enforce-eager", action="store_true")
    add("--trust-remote-code", action="store_true")
    add("--tokenizer", default=None)
    add("--seed", type=int, default=0)
    add("--max-num-seqs", type=int, default=None)
    add("--max-num-batched-tokens", type=int, default=None)
    add("--kv-cache-dtype", default="auto")
    add("--swap-space", type=float, default=None)
    add("--uvicorn-log-level", default="info")
    add("--disable-log-requests", action="store_true")
    add("--enable-prefix-caching", action="store_true")
    add("--generation-config", default=None)
    return parser


@dataclass(frozen=True)
class ServeConfig:
    """The checked ``vllm serve`` configuration the stand-in runs.

    Attributes (units): ``world_size`` = TP x PP; ``local_world_size`` = world_size / nnodes;
    ``backend`` is ``mp``, ``uni`` or ``ray``; ``max_model_len`` in tokens; ``port`` TCP.
    """

    model: str
    served_model_name: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    world_size: int
    local_world_size: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    backend: str
    host: str | None
    port: int
    api_key: str | None
    max_model_len: int
    gpu_memory_utilization: float
    distributed_timeout_s: float | None


def resolve(ns: argparse.Namespace, spec: dict[str, Any]) -> ServeConfig:
    """Apply vLLM's checks to parsed flags, for a host with ``spec["gpus"]`` GPUs.

    Raises:
        ConfigError: with vLLM's text, for: ``--headless`` with ``--api-server-count``
            (serve.py); world size larger than the local GPUs with no backend and one node, and
            ``nnodes > 1`` with a backend other than mp/uni/external_launcher
            (ParallelConfig.__post_init__); a model path that does not exist.
    """
    model = ns.model or ns.model_flag
    if not model:
        raise ConfigError("the following arguments are required: model_tag")
    if ns.headless and ns.api_server_count is not None and ns.api_server_count > 0:
        raise ConfigError(f"--api-server-count={ns.api_server_count} cannot be used with "
                          "--headless (no API servers are started in headless mode).")
    world_size = ns.tensor_parallel_size * ns.pipeline_parallel_size
    gpu_count = int(spec["gpus"])
    backend = ns.distributed_executor_backend
    if backend is None and world_size > 1:
        if ns.nnodes > 1:
            backend = "mp"
        elif gpu_count < world_size:
            raise ConfigError(
                "1 validation error for ParallelConfig\n  Value error, World size "
                f"({world_size}) is larger than the number of available GPUs ({gpu_count}) in "
                "this node. If this is intentional and you are using:\n"
                "- ray, set '--distributed-executor-backend ray'.\n"
                "- multiprocessing, set '--nnodes' appropriately.")
        else:
            backend = "mp"
    if backend is None:
        backend = "uni"
    if backend not in ("mp", "uni", "external_launcher") and ns.nnodes > 1:
        raise ConfigError("1 validation error for ParallelConfig\n  Value error, nnodes > 1 can "
                          "only be set when distributed executor backend is mp, uni or "
                          "external_launcher.")
    if backend not in ("mp", "uni", "ray"):
        raise ConfigError(f"Unrecognized distributed executor backend {backend}. Supported "
                          "values are 'ray', 'mp' 'uni', 'external_launcher' or custom "
                          "Executor subclass.")
    if world_size % ns.nnodes:
        raise ConfigError(f"world_size ({world_size}) must be divisible by nnodes "
                          f"({ns.nnodes}) for multi-node mp.")
    local_world_size = world_size // ns.nnodes
    if backend in ("mp", "uni") and local_world_size > gpu_count:
        raise ConfigError(f"local_world_size ({local_world_size}) must be less than or equal to "
                          f"the number of visible devices ({gpu_count}).")
    if not os.path.isdir(model):
        raise ConfigError(
            f"Invalid repository ID or local directory specified: '{model}'.\nPlease verify "
            "the following requirements:\n1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.")
    names = ns.served_model_name or [model]
    return ServeConfig(
        model=model, served_model_name=names[0],
        tensor_parallel_size=ns.tensor_parallel_size,
        pipeline_parallel_size=ns.pipeline_parallel_size, world_size=world_size,
        local_world_size=local_world_size, nnodes=ns.nnodes, node_rank=ns.node_rank,
        master_addr=ns.master_addr, master_port=ns.master_port, headless=ns.headless,
        backend=backend, host=ns.host, port=ns.port,
        api_key=ns.api_key or os.environ.get("VLLM_API_KEY") or None,
        max_model_len=ns.max_model_len or 2048,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        distributed_timeout_s=ns.distributed_timeout_seconds)
