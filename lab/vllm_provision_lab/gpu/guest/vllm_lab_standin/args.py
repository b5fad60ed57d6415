"""``vllm serve`` command line: the real flag names and the checks vLLM makes before starting.

Flag names and defaults: vLLM ``vllm/engine/arg_utils.py`` and
``vllm/entrypoints/openai/cli_args.py``; the checks: ``vllm/config/parallel.py``
(``ParallelConfig.__post_init__``) and ``vllm/entrypoints/cli/serve.py``, in
https://github.com/vllm-project/vllm (the quoted texts are from those files).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any

from .common import visible_devices


class ConfigError(Exception):
    """A configuration vLLM rejects before starting; ``str()`` is vLLM's message."""


# The defaults the stand-in's checks read (vLLM's own, arg_utils.py and cli_args.py): set on a
# release's parser too, so a release without an option (``--nnodes`` before the mp multi-node
# options) still reads as vLLM's default.
DEFAULTS: dict[str, Any] = {
    "model": None, "model_flag": None, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
    "data_parallel_size": 1, "nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1",
    "master_port": 29501, "headless": False, "api_server_count": None,
    "distributed_executor_backend": None, "distributed_timeout_seconds": None, "host": None,
    "port": 8000, "served_model_name": None, "api_key": None, "max_model_len": None,
    "gpu_memory_utilization": 0.9, "data_parallel_size_local": None,
    "data_parallel_start_rank": None, "data_parallel_address": None,
    "data_parallel_rpc_port": None, "data_parallel_hybrid_lb": False,
}
_TYPES = {"int": int, "float": float}


def build_parser(options: list[dict[str, Any]] | None = None,
                 allow_abbrev: bool = True) -> argparse.ArgumentParser:
    """Return the ``vllm serve`` parser (unknown flags fail as argparse does in vLLM: exit 2).

    Args:
        options: one release's options, as the lab writes them into the host's spec
            (``serve_options``: the product's table of ``vllm serve`` by release, entries
            ``{"name", "aliases", "takes_value", "kind", "choices", "nargs", "negatable"}``);
            None for the stand-in's own short list below.
        allow_abbrev: whether that release's parser resolves unique prefixes.
    """
    if options is not None:
        return _release_parser(options, allow_abbrev)
    parser = argparse.ArgumentParser(prog="vllm serve")
    add = parser.add_argument
    add("model", nargs="?", default=None)
    add("--model", dest="model_flag", default=None)
    add("--tensor-parallel-size", "-tp", type=int, default=1)
    add("--pipeline-parallel-size", "-pp", type=int, default=1)
    add("--data-parallel-size", "-dp", type=int, default=1)
    add("--data-parallel-size-local", "-dpl", type=int, default=None)
    add("--data-parallel-start-rank", "-dpr", type=int, default=None)
    add("--data-parallel-address", "-dpa", default=None)
    add("--data-parallel-rpc-port", "-dpp", type=int, default=None)
    add("--data-parallel-hybrid-lb", "-dph", action="store_true")
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


def _release_parser(options: list[dict[str, Any]], allow_abbrev: bool) -> argparse.ArgumentParser:
    """A parser with exactly one release's options, as its argparse would accept them."""
    parser = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=allow_abbrev)
    parser.add_argument("model", nargs="?", default=None)
    for option in options:
        name = str(option["name"])
        if name in ("-h", "--help"):
            continue
        words = [name, *[str(a) for a in option.get("aliases") or () if a not in ("-h",)]]
        kwargs: dict[str, Any] = {"default": None}
        if name == "--model":
            kwargs["dest"] = "model_flag"
        if not option.get("takes_value", True):
            # BooleanOptionalAction exists from Python 3.9 (the oldest lab guest)
            kwargs["action"] = (argparse.BooleanOptionalAction if option.get("negatable")
                                else "store_true")
            if kwargs["action"] == "store_true":
                kwargs["default"] = False
        else:
            kind = str(option.get("kind") or "str")
            kwargs["type"] = _TYPES.get(kind, str)
            if option.get("nargs"):
                kwargs["nargs"] = option["nargs"]
            if option.get("choices") and kind not in _TYPES:
                kwargs["choices"] = [str(c) for c in option["choices"]]
        parser.add_argument(*words, **kwargs)
    # vLLM's defaults where the release has no such option or left it unset (set_defaults
    # also sets the default of an option the release has)
    parser.set_defaults(**DEFAULTS)
    return parser


def rewrite(argv: list[str], has_level: bool) -> list[str]:
    """vLLM's own rewrites before argparse (``FlexibleArgumentParser.parse_args``,
    vllm/utils/argparse_utils.py): underscores to dashes in a ``--`` option up to its first
    dot; ``-O3``/``-O=3`` to ``--optimization-level 3`` (``-O.level=3`` before that option
    existed, ``has_level`` False) and ``-O 3`` likewise; every ``--option.key value`` (or
    ``=value``) merged into one JSON value of ``--option``. The product's reader makes the same
    rewrites (``vllm_provision.settings.vllm_cli.argv``); this copy exists because the guest
    runs on its own (Python 3.9 up, without the product installed)."""
    words: list[str] = []
    for i, word in enumerate(argv):
        if word.startswith("--"):
            key, sep, value = word.partition("=")
            head, dot, rest = key[2:].partition(".")
            words.append("--" + head.replace("_", "-") + dot + rest + sep + value)
        elif word.startswith("-O") and word != "-O" and (has_level or word[2] != "."):
            level = word[3:] if word[2] == "=" else word[2:]
            words += (["--optimization-level", level] if has_level else [f"-O.level={level}"])
        elif word == "-O" and has_level and argv[i + 1:i + 2] in (["0"], ["1"], ["2"], ["3"]):
            words.append("--optimization-level")
        else:
            words.append(word)
    merged: dict[str, dict[str, Any]] = {}
    out: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        key = word.split("=", 1)[0]
        if word.startswith("-") and "." in key:
            if "=" in word:
                value = word.split("=", 1)[1]
            else:
                value, skip = (words[i + 1] if i + 1 < len(words) else ""), True
            name, *path = key.split(".")
            node = merged.setdefault(name, {})
            for part in path[:-1]:
                node = node.setdefault(part, {})
            try:
                node[path[-1]] = json.loads(value)
            except ValueError:
                node[path[-1]] = value
            continue
        out.append(word)
    for name, value in merged.items():
        out += [name, json.dumps(value)]
    return out


def parse(argv: list[str], spec: dict[str, Any]) -> argparse.Namespace:
    """Parse ``vllm serve``'s arguments as the host's release would: its own options when the
    spec carries them (``serve_options``, ``serve_allow_abbrev``), else the short list; unset
    options read as vLLM's defaults (:data:`DEFAULTS`). vLLM's ``FlexibleArgumentParser``
    rewrites come first (:func:`rewrite`).

    Raises:
        SystemExit: 2 with argparse's message on stderr, as vLLM exits on a bad command line.
    """
    options = spec.get("serve_options")
    parser = build_parser(options, bool(spec.get("serve_allow_abbrev", True)))
    has_level = options is not None and any(o["name"] == "--optimization-level"
                                            for o in options)
    return parser.parse_args(rewrite(argv, has_level))


def _api_keys(value: Any) -> tuple[str, ...]:
    """The keys the API accepts: ``--api-key`` (one value, or several from 0.10.1 on, any of
    which is accepted: vllm/entrypoints/openai/api_server.py), else ``VLLM_API_KEY``."""
    if isinstance(value, list):
        return tuple(str(v) for v in value if v)
    if value:
        return (str(value),)
    env = os.environ.get("VLLM_API_KEY")
    return (env,) if env else ()


def _human_int(value: Any) -> int:
    """``--max-model-len`` as vLLM reads it (its ``human_readable_int``: ``4096``, ``4k`` =
    4000, ``4K`` = 4096; vllm/engine/arg_utils.py), in tokens."""
    text = str(value).strip()
    units = {"k": 10**3, "m": 10**6, "K": 2**10, "M": 2**20}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


@dataclass(frozen=True)
class ServeConfig:
    """The checked ``vllm serve`` configuration the stand-in runs.

    Attributes (units): ``api_keys``: the accepted API keys (none: open);
    ``world_size`` = TP x PP; ``local_world_size`` = world_size / nnodes;
    ``backend`` is ``mp``, ``uni`` or ``ray``; ``max_model_len`` in tokens; ``port`` TCP.

    Data parallel across nodes (``data_parallel_size`` > ``data_parallel_size_local``) reads as
    a group of ``nnodes`` = size / local size members: ``node_rank`` = start rank / local size,
    ``master_addr``/``master_port`` = the data-parallel address and RPC port (rank 0's
    handshake, vllm/v1/engine/utils.py), ``local_world_size`` = TP x PP x local size; the
    members meet rank 0 as mp nodes do (:mod:`.mp`), and ``hybrid`` members serve HTTP too.
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
    api_keys: tuple[str, ...]
    max_model_len: int
    gpu_memory_utilization: float
    distributed_timeout_s: float | None
    data_parallel_size: int = 1
    hybrid: bool = False


def resolve(ns: argparse.Namespace, spec: dict[str, Any]) -> ServeConfig:
    """Apply vLLM's checks to parsed flags, for a host with ``spec["gpus"]`` GPUs of which this
    process sees those of ``CUDA_VISIBLE_DEVICES`` (:func:`.common.visible_devices`: vLLM
    counts the visible devices, ``cuda_device_count_stateless``).

    Raises:
        ConfigError: with vLLM's text, for: ``--headless`` with ``--api-server-count``
            (serve.py); world size larger than the local GPUs with no backend and one node, and
            ``nnodes > 1`` with a backend other than mp/uni/external_launcher
            (ParallelConfig.__post_init__); a model path that does not exist; a local
            ``--tokenizer`` path that does not exist (transformers' text).
    """
    model = ns.model or ns.model_flag
    if not model:
        raise ConfigError("the following arguments are required: model_tag")
    if ns.headless and ns.api_server_count is not None and ns.api_server_count > 0:
        raise ConfigError(f"--api-server-count={ns.api_server_count} cannot be used with "
                          "--headless (no API servers are started in headless mode).")
    world_size = ns.tensor_parallel_size * ns.pipeline_parallel_size
    gpu_count = len(visible_devices(spec))
    dp = _data_parallel(ns, world_size)
    if dp is not None:
        if dp["local_world_size"] > gpu_count:
            raise ConfigError(f"local_world_size ({dp['local_world_size']}) must be less than "
                              f"or equal to the number of visible devices ({gpu_count}).")
        ns.distributed_executor_backend = ns.distributed_executor_backend or "mp"
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
    tokenizer = getattr(ns, "tokenizer", None)
    if tokenizer and os.path.isabs(tokenizer) and not os.path.isdir(tokenizer):
        # a local tokenizer path that is not there: the tokenizer load fails at start (vLLM's
        # get_tokenizer calls transformers' AutoTokenizer.from_pretrained; this is its text,
        # transformers/utils/hub.py)
        raise ConfigError(f"Incorrect path_or_model_id: '{tokenizer}'. Please provide either "
                          "the path to a local folder or the repo_id of a model on the Hub.")
    names = ns.served_model_name or [model]
    if dp is not None:
        nnodes, node_rank = dp["nnodes"], dp["node_rank"]
        master_addr, master_port = dp["address"], dp["rpc_port"]
        local_world_size = dp["local_world_size"]
    else:
        nnodes, node_rank = ns.nnodes, ns.node_rank
        master_addr, master_port = ns.master_addr, ns.master_port
    return ServeConfig(
        model=model, served_model_name=names[0],
        tensor_parallel_size=ns.tensor_parallel_size,
        pipeline_parallel_size=ns.pipeline_parallel_size, world_size=world_size,
        local_world_size=local_world_size, nnodes=nnodes, node_rank=node_rank,
        master_addr=master_addr, master_port=master_port, headless=ns.headless,
        backend=backend, host=ns.host, port=ns.port,
        api_keys=_api_keys(ns.api_key),
        max_model_len=_human_int(ns.max_model_len) if ns.max_model_len else 2048,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        distributed_timeout_s=ns.distributed_timeout_seconds,
        data_parallel_size=int(ns.data_parallel_size or 1),
        hybrid=dp is not None and dp["hybrid"])


def _data_parallel(ns: argparse.Namespace, world_size: int) -> dict[str, Any] | None:
    """Data parallel over several nodes as vLLM's ``EngineArgs.create_engine_config`` reads it
    (vllm/engine/arg_utils.py), or None for one node's engines (or none):

    * ``--data-parallel-hybrid-lb`` needs ``--data-parallel-size-local`` ("data_parallel_size_local
      must be set to use data_parallel_hybrid_lb.");
    * a start rank without ``--headless`` infers hybrid; a local size equal to the size turns
      hybrid off (one node);
    * ``--headless`` with hybrid: "data_parallel_hybrid_lb is not applicable in headless mode"
      (vllm/entrypoints/cli/serve.py);
    * the address defaults to ``--master-addr`` (127.0.0.1), the RPC port to 29550.

    Raises:
        ConfigError: with vLLM's text.
    """
    size = int(ns.data_parallel_size or 1)
    local = ns.data_parallel_size_local
    hybrid = bool(ns.data_parallel_hybrid_lb)
    if local is None:
        if hybrid:
            raise ConfigError("data_parallel_size_local must be set to use "
                              "data_parallel_hybrid_lb.")
        local = size
    start = int(ns.data_parallel_start_rank or 0)
    if start and not ns.headless:
        hybrid = True
    if local == size:
        hybrid = False
    if hybrid and ns.headless:
        raise ConfigError("data_parallel_hybrid_lb is not applicable in headless mode")
    if size <= 1 or local >= size:
        return None
    return {"nnodes": -(-size // local), "node_rank": start // local, "hybrid": hybrid,
            "address": ns.data_parallel_address or ns.master_addr or "127.0.0.1",
            "rpc_port": int(ns.data_parallel_rpc_port or 29550),
            "local_world_size": world_size * local}
