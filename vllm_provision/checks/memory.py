"""Will the model fit: weights and KV cache per GPU against ``vllm_gpu_memory_utilization``.

Pure: the master's :class:`~vllm_provision.facts.model.ModelWeights` (config.json and the
safetensors headers) and every node's GPU memory in, an estimate and findings out. The memory
model and its limits are in docs/preflight.md ("Will the model fit"); each formula names the
vLLM source it follows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from vllm_provision import settings
from vllm_provision.checks.context import ReplicaScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica
from vllm_provision.facts.model import HostFacts, ModelWeights
from vllm_provision.facts.weights import DTYPE_BYTES, FLOAT_DTYPES

GIB = 1024 ** 3
MIB = 1024 ** 2
# vLLM's KV cache is allocated in blocks of this many tokens (CacheConfig.block_size, 16 on
# CUDA; vllm/config/cache.py); ``--block-size`` in vllm_extra_args wins.
DEFAULT_BLOCK_SIZE = 16
# The most decoder layers an estimate accepts from config.json: the largest public checkpoints
# have a few hundred; a value past this is a broken or hostile file, not a model.
MAX_LAYERS = 100_000
SOURCE = ("vllm/v1/worker/gpu_worker.py (determine_available_memory); "
          "vllm/v1/core/kv_cache_utils.py (check_enough_kv_cache_memory); "
          "vllm/v1/kv_cache_interface.py (AttentionSpec.page_size_bytes); "
          "vllm/distributed/utils.py (get_pp_indices)")
# Serving dtypes by --dtype word (vllm/config/model.py, _STR_DTYPE_TO_TORCH_DTYPE) -> bytes.
DTYPE_WORDS = {"half": ("float16", 2), "float16": ("float16", 2), "bfloat16": ("bfloat16", 2),
               "float": ("float32", 4), "float32": ("float32", 4)}
# --kv-cache-dtype words (vllm/config/cache.py, CacheDType) -> bytes; "auto" is the model dtype.
KV_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1,
                  "bfloat16": 2, "float16": 2}


def pp_indices(num_layers: int, pp_rank: int, pp_size: int,
               partition: Sequence[int] | None = None) -> tuple[int, int]:
    """The decoder layers ``[start, end)`` of pipeline stage ``pp_rank`` (pure).

    Follows ``get_pp_indices`` in vllm/distributed/utils.py: ``num_layers // pp_size`` each, and
    the remainder one more each on the stages before the last (``partitions[-i] += 1`` for
    ``i`` in ``2 .. remainder + 1``): the last stage holds the final norm and the LM head.
    ``partition`` is ``VLLM_PP_LAYER_PARTITION`` (layers per stage), when set.

    Raises:
        ValueError: ``partition`` does not have ``pp_size`` items summing to ``num_layers``.
    """
    if partition is not None:
        if len(partition) != pp_size or sum(partition) != num_layers:
            raise ValueError(f"VLLM_PP_LAYER_PARTITION must have {pp_size} numbers summing to "
                             f"{num_layers}")
        parts = list(partition)
    else:
        parts = [num_layers // pp_size] * pp_size
        for i in range(2, num_layers % pp_size + 2):
            parts[-i] += 1
    start = sum(parts[:pp_rank])
    return start, start + parts[pp_rank]


def engine_option(words: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``vllm_extra_args``, else None."""
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            return words[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def serving_dtype(config: Mapping[str, Any], dtype_arg: str | None) -> tuple[str, int]:
    """The dtype vLLM holds unquantized weights in, and its size in bytes.

    ``--dtype auto`` (the default) takes the config's ``torch_dtype`` (``dtype`` in newer
    configs) and downcasts float32 to the platform's preferred 16-bit type
    (``_resolve_auto_dtype``, vllm/config/model.py).
    """
    word = (dtype_arg or "auto").lower()
    if word in DTYPE_WORDS:
        return DTYPE_WORDS[word]
    found = str(config.get("torch_dtype") or config.get("dtype") or "float32").lower()
    if found in ("float16", "bfloat16"):
        return DTYPE_WORDS[found]
    return "bfloat16", 2  # float32 (or unknown) -> the preferred 16-bit dtype


def head_size(config: Mapping[str, Any]) -> int:
    """Attention head size: ``head_dim``, else hidden_size / num_attention_heads; an MLA model
    caches ``kv_lora_rank + qk_rope_head_dim`` per token (``get_head_size``,
    vllm/transformers_utils/model_arch_config_convertor.py)."""
    if config.get("kv_lora_rank"):
        return int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)
    if config.get("head_dim"):
        return int(config["head_dim"])
    return int(config["hidden_size"]) // int(config["num_attention_heads"])


def total_kv_heads(config: Mapping[str, Any]) -> int:
    """KV heads of the whole model (``get_total_num_kv_heads``, vllm/config/model.py): the
    first of n_head_kv, num_kv_heads, num_key_value_heads, multi_query_group_num, else
    num_attention_heads (no grouped-query attention); 1 for multi-query attention."""
    if config.get("multi_query"):
        return 1
    for key in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"):
        if config.get(key):
            return int(config[key])
    return int(config["num_attention_heads"])


def kv_heads_per_gpu(config: Mapping[str, Any], tp: int) -> int:
    """KV heads one GPU caches: ``max(1, total // TP)`` (replicated when fewer heads than TP
    ranks), 1 for MLA (``get_num_kv_heads``, vllm/config/model.py)."""
    if config.get("kv_lora_rank"):
        return 1
    return max(1, total_kv_heads(config) // tp)


def kv_bytes_per_token(config: Mapping[str, Any], layers: int, tp: int, kv_bytes: int) -> int:
    """KV-cache bytes one token takes on one GPU holding ``layers`` decoder layers.

    ``AttentionSpec.real_page_size_bytes`` (vllm/v1/kv_cache_interface.py) is
    ``2 * block_size * num_kv_heads * head_size * dtype_size`` per layer (K and V); divided by
    the block size that is per token. MLA caches one latent vector (no factor 2,
    ``MLAAttentionSpec``).
    """
    factor = 1 if config.get("kv_lora_rank") else 2
    return layers * kv_heads_per_gpu(config, tp) * head_size(config) * factor * kv_bytes


@dataclass(frozen=True)
class StageFit:
    """One pipeline stage's GPUs (every GPU of a stage holds the same share).

    Sizes in bytes. ``tokens``: how many tokens of KV cache the room holds, in whole blocks.
    """

    stage: int
    layers: tuple[int, int]
    hosts: tuple[str, ...]
    gpu_total: int
    budget: int
    weights: int
    overhead: int
    kv_room: int
    kv_per_token: int
    tokens: int


@dataclass(frozen=True)
class MemoryEstimate:
    """The replica's memory estimate (``provision check --json`` and ``provision facts
    --json``, key ``memory``). Sizes in bytes; ``utilization`` a fraction."""

    replica: str
    weights_stored: int
    weights_loaded: int
    dtype: str
    kv_cache_dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    utilization: float
    overhead_per_gpu: int
    max_model_len: int | None
    block_size: int
    stages: tuple[StageFit, ...]
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


class CannotEstimate(Exception):
    """The facts do not allow an estimate; the message says why."""


def _loaded(group: Mapping[str, int], serving_bytes: int, prequantized: bool,
            fp8_layers: bool) -> int:
    """Bytes a tensor group takes once loaded: a pre-quantized checkpoint (config has
    ``quantization_config``) as stored; else floating-point tensors in the serving dtype (1
    byte per parameter for decoder layers with on-the-fly ``--quantization fp8``,
    Fp8LinearMethod), other dtypes as stored."""
    total = 0
    for dtype, stored in group.items():
        if prequantized or dtype not in FLOAT_DTYPES:
            total += stored
            continue
        elements = stored / DTYPE_BYTES[dtype]
        total += int(elements * (1 if fp8_layers else serving_bytes))
    return total


def estimate(replica: Replica, facts: Mapping[str, HostFacts], overhead_mib: int,
             ) -> MemoryEstimate:
    """Estimate every pipeline stage's memory per GPU (pure).

    Per GPU of stage p: its decoder layers' weights / TP (layers from :func:`pp_indices`), plus
    the embedding / TP on the first stage and the LM head / TP on the last (a tied LM head is
    the embedding: no extra bytes with PP = 1, its own copy on the last stage with PP > 1, as
    ``LlamaForCausalLM`` builds it), plus other tensors / TP on every stage; then the room for
    the KV cache is ``GPU total x utilization - weights - overhead`` (``determine_available_
    memory``), and a sequence of ``max_model_len`` tokens needs ``ceil(len / block) x block x
    kv_per_token`` (``FullAttentionSpec.max_memory_usage_bytes``). ``GPU total`` is the
    smallest ``memory.total`` among the GPUs the stage's nodes give the replica
    (``Replica.node_gpus``: their ``vllm_gpus``, else the first GPUs), never another GPU of
    the host.

    Args:
        replica: the replica (engine arguments, nodes in rank order).
        facts: facts by host name; the master's must hold ``model_weights``.
        overhead_mib: the activation and overhead margin per GPU, MiB.

    Raises:
        CannotEstimate: no weights facts, no safetensors, a config without the layer counts, or
            no GPU memory on a node.
    """
    engine = replica.engine
    master = facts.get(replica.master.name)
    weights: ModelWeights | None = master.model_weights if master else None
    if weights is None:
        raise CannotEstimate("the model is not a local folder on the master "
                             f"({engine.model})")
    if weights.errors and not weights.files:
        raise CannotEstimate("; ".join(weights.errors[:3]))
    if not weights.files:
        raise CannotEstimate(f"no *.safetensors files in {engine.model}")
    config = weights.config
    try:
        num_layers = int(config["num_hidden_layers"])
        head_size(config)
        total_kv_heads(config)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise CannotEstimate("config.json lacks num_hidden_layers, hidden_size or "
                             "num_attention_heads") from None
    if not 1 <= num_layers <= MAX_LAYERS:  # the file is the host's word: bounded
        raise CannotEstimate(f"config.json's num_hidden_layers is {num_layers}, outside 1 to "
                             f"{MAX_LAYERS}")
    extra = list(engine.extra_args)
    notes = list(weights.errors)
    dtype, dtype_bytes = serving_dtype(config, engine_option(extra, "--dtype"))
    kv_word = (engine_option(extra, "--kv-cache-dtype") or "auto").lower()
    kv_bytes = KV_DTYPE_BYTES.get(kv_word, dtype_bytes)
    kv_name = dtype if kv_word == "auto" or kv_word not in KV_DTYPE_BYTES else kv_word
    block_word = engine_option(extra, "--block-size")
    block = int(block_word) if block_word and block_word.isdigit() else DEFAULT_BLOCK_SIZE
    prequantized = bool(config.get("quantization_config"))
    fp8 = not prequantized and (engine_option(extra, "--quantization") or "") == "fp8"
    if prequantized:
        method = config["quantization_config"]
        method = method.get("quant_method", "?") if isinstance(method, Mapping) else "?"
        notes.append(f"pre-quantized checkpoint ({method}): weights counted as stored")
    if fp8:
        notes.append("--quantization fp8: decoder-layer weights counted at 1 byte per parameter")
    groups = weights.groups
    # bytes per decoder layer that has tensors (a layer without any loads nothing): the work
    # follows the checkpoint's tensors, never num_hidden_layers, which the file may set to 10**12
    numbered = {int(name[6:]): name for name in groups
                if name.startswith("layer.") and name[6:].isdigit()}
    layer_bytes = {i: _loaded(groups[name], dtype_bytes, prequantized, fp8)
                   for i, name in numbered.items() if i < num_layers}
    beyond = [name for i, name in numbered.items() if i >= num_layers]
    if beyond:
        notes.append(f"{len(beyond)} layer(s) past num_hidden_layers ({num_layers}; MTP or draft "
                     "layers) not counted: vLLM loads them only for speculative decoding")
    embed = _loaded(groups.get("embed", {}), dtype_bytes, prequantized, False)
    other = _loaded(groups.get("other", {}), dtype_bytes, prequantized, False)
    has_head = bool(groups.get("lm_head"))
    tied = bool(config.get("tie_word_embeddings", not has_head))
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    if tied:
        head = embed if pp > 1 else 0
    else:
        head = _loaded(groups.get("lm_head", {}), dtype_bytes, prequantized, False)
    loaded = sum(layer_bytes.values()) + embed + other + (head if not tied else 0)
    max_len = engine.max_model_len or (int(config["max_position_embeddings"])
                                       if config.get("max_position_embeddings") else None)
    env = settings.replica_settings(replica)["vllm_env"]
    partition_text = str(env.get("VLLM_PP_LAYER_PARTITION", ""))
    try:
        partition = [int(x) for x in partition_text.split(",")] if partition_text else None
        pp_indices(num_layers, 0, engine.pipeline_parallel_size, partition)
    except ValueError as exc:
        raise CannotEstimate(f"VLLM_PP_LAYER_PARTITION {partition_text!r}: {exc}") from None
    local = max(1, replica.gpus_per_node)
    overhead = overhead_mib * MIB
    stages = []
    for stage in range(pp):
        start, end = pp_indices(num_layers, stage, pp, partition)
        ranks = range(stage * tp, (stage + 1) * tp)
        nodes = sorted({min(rank // local, replica.nnodes - 1) for rank in ranks})
        hosts = tuple(replica.nodes[n].name for n in nodes)
        # the GPUs the replica may use on each node (vllm_gpus, else the first `local`)
        sizes = [g.memory_total_mib for n in nodes if replica.nodes[n].name in facts
                 for g in facts[replica.nodes[n].name].gpus
                 if g.index in replica.node_gpus(replica.nodes[n]) and g.memory_total_mib]
        if len(sizes) < len(hosts) or not sizes:
            raise CannotEstimate(f"no GPU memory size from nvidia-smi on {', '.join(hosts)}")
        share = sum(b for i, b in layer_bytes.items() if start <= i < end) + other
        share += embed if stage == 0 else 0
        share += head if stage == pp - 1 else 0
        per_gpu = -(-share // tp)
        total = min(sizes) * MIB
        budget = int(total * engine.gpu_memory_utilization)
        per_token = kv_bytes_per_token(config, end - start, tp, kv_bytes)
        room = budget - per_gpu - overhead
        tokens = (room // (per_token * block)) * block if room > 0 and per_token else 0
        stages.append(StageFit(stage, (start, end), hosts, total, budget, per_gpu, overhead,
                               room, per_token, tokens))
    return MemoryEstimate(
        replica=replica.name, weights_stored=weights.total_bytes, weights_loaded=loaded,
        dtype=dtype, kv_cache_dtype=kv_name, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        utilization=engine.gpu_memory_utilization, overhead_per_gpu=overhead,
        max_model_len=max_len, block_size=block, stages=tuple(stages), notes=tuple(notes))


def gib(value: int) -> str:
    """``12.34 GiB`` (two decimals)."""
    return f"{value / GIB:.2f} GiB"


def check_memory_fit(replica: Replica, facts: Mapping[str, HostFacts], overhead_mib: int,
                     ) -> tuple[list[Finding], MemoryEstimate | None]:
    """The ``memory.fit`` finding of a GPU replica, and the estimate behind it.

    Error: a stage's weights per GPU exceed ``GPU total x vllm_gpu_memory_utilization``.
    Warning: a stage's KV room holds fewer than ``max_model_len`` tokens (vLLM refuses to start:
    "To serve at least one request with the models's max seq len ... KV cache is needed, which
    is larger than the available KV cache memory", ``check_enough_kv_cache_memory``,
    vllm/v1/core/kv_cache_utils.py), naming the largest context that fits. A warning, not an
    error, because the overhead is an estimate. Skipped (ok) for a model that is not a local
    folder; a warning when the headers cannot be read.
    """
    item = "memory per GPU (weights + KV cache)"
    if replica.master.name not in facts:
        return [], None  # the master's facts are missing: the `facts` error says why
    try:
        result = estimate(replica, facts, overhead_mib)
    except CannotEstimate as exc:
        severity = Severity.OK if "not a local folder" in str(exc) else Severity.WARNING
        return [Finding("memory.fit", severity, "*", item,
                        expected="an estimate from config.json and the safetensors headers",
                        actual=f"skipped: {exc}",
                        fix="" if severity is Severity.OK else
                        f"check the model folder {replica.engine.model} on "
                        f"{replica.master.name} (config.json, *.safetensors)",
                        source=SOURCE)], None
    util = f"{result.utilization:g}"
    over = [s for s in result.stages if s.weights > s.budget]
    if over:
        worst = max(over, key=lambda s: s.weights - s.budget)
        return [Finding(
            "memory.fit", Severity.ERROR, ",".join(worst.hosts), item,
            expected=f"weights per GPU <= {gib(worst.budget)} ({util} x {gib(worst.gpu_total)}, "
                     "vllm_gpu_memory_utilization)",
            actual=f"{gib(worst.weights)} of weights per GPU on stage {worst.stage} (layers "
                   f"{worst.layers[0]}-{worst.layers[1] - 1}; {gib(result.weights_loaded)} in "
                   f"{result.dtype} over TP={result.tensor_parallel_size} x "
                   f"PP={result.pipeline_parallel_size})",
            fix="use more GPUs (raise vllm_tensor_parallel_size or vllm_pipeline_parallel_size, "
                "with more nodes), a quantized checkpoint, or a higher "
                "vllm_gpu_memory_utilization",
            source=SOURCE)], result
    fits = min(result.stages, key=lambda s: s.tokens)
    per_gpu = (f"weights {gib(fits.weights)}, overhead {gib(fits.overhead)}, KV room "
               f"{gib(max(0, fits.kv_room))} = {fits.tokens} tokens at {fits.kv_per_token} "
               f"bytes per token ({result.kv_cache_dtype}) per GPU on stage {fits.stage}")
    need = result.max_model_len
    if need is None:
        return [Finding("memory.fit", Severity.OK, "*", item,
                        expected=f"weights within {gib(fits.budget)} per GPU",
                        actual=per_gpu + "; max_model_len unknown", source=SOURCE)], result
    needed = -(-need // result.block_size) * result.block_size
    if fits.tokens < needed:
        return [Finding(
            "memory.fit", Severity.WARNING, ",".join(fits.hosts), item,
            expected=f"KV room for one sequence of max_model_len {need} tokens "
                     f"({gib(needed * fits.kv_per_token)} per GPU)",
            actual=f"{per_gpu}; the largest context that fits is {fits.tokens} tokens",
            fix=f"set vllm_max_model_len to at most {fits.tokens}, raise "
                "vllm_gpu_memory_utilization, use an fp8 KV cache (--kv-cache-dtype fp8) or "
                "more GPUs",
            source=SOURCE)], result
    return [Finding("memory.fit", Severity.OK, "*", item,
                    expected=f"weights within {gib(fits.budget)} per GPU, KV room for "
                             f"max_model_len {need}",
                    actual=per_gpu, source=SOURCE)], result


# -- checks that read their scope (checks/context.py) -----------------------------------

@check("memory.fit", order=120, scope="replica", only="gpu")
def _fit(scope: ReplicaScope) -> list[Finding]:
    """The weights and KV cache fit the GPUs (GPU replicas only)."""
    return check_memory_fit(scope.replica, scope.facts, scope.settings.gpu_overhead_mib)[0]
