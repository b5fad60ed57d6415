"""Summarise what the probe read of a model (config.json, safetensors headers) into
:class:`~vllm_provision.facts.model.ModelWeights` (pure; ``checks/memory.py`` uses it).

A safetensors header gives each tensor's dtype, shape and byte range (``data_offsets``) without
the weights (safetensors docs, "Format"). Tensors are grouped by where vLLM puts them when it
splits a model over pipeline stages: the input embedding on the first stage, the LM head on the
last, decoder layer N on the stage :func:`vllm_provision.checks.memory.pp_indices` gives it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_provision.facts.model import ModelWeights

# Bytes per element of every safetensors dtype (safetensors/src/tensor.rs, ``Dtype``).
DTYPE_BYTES: Mapping[str, float] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
    "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}
# Floating-point dtypes vLLM casts to the serving dtype when it loads an unquantized checkpoint
# (``default_weight_loader`` copies into a parameter created in ``model_config.dtype``).
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
# The config.json keys the estimate reads (vllm/config/model.py, ModelConfig.get_* and
# vllm/transformers_utils/model_arch_config_convertor.py).
CONFIG_KEYS = (
    "model_type", "architectures", "torch_dtype", "dtype", "hidden_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "num_kv_heads", "n_head_kv",
    "multi_query_group_num", "multi_query", "head_dim", "kv_lora_rank", "qk_rope_head_dim",
    "vocab_size", "tie_word_embeddings", "max_position_embeddings", "quantization_config",
    "num_local_experts", "num_experts", "n_routed_experts", "sliding_window",
    "intermediate_size",
)
# A decoder layer's tensors: ``model.layers.12.``, ``transformer.h.3.``, ``gpt_neox.layers.0.``,
# ``language_model.model.layers.5.``.
LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
EMBED_NAMES = ("embed_tokens.", "wte.", "word_embeddings.", "embed_in.", "tok_embeddings.")
LM_HEAD_PREFIXES = ("lm_head.", "embed_out.", "output.")


def tensor_group(name: str) -> str:
    """``embed``, ``lm_head``, ``layer.<N>`` or ``other`` for a tensor name (pure)."""
    if any(part in name for part in EMBED_NAMES) and not LAYER_RE.search(name):
        return "embed"
    if name.startswith(LM_HEAD_PREFIXES) or ".lm_head." in f".{name}":
        return "lm_head"
    found = LAYER_RE.search(name)
    if found:
        return f"layer.{int(found.group(1))}"
    return "other"


def config_subset(config: Any) -> dict[str, Any]:
    """The :data:`CONFIG_KEYS` of a config.json object; a multimodal model's ``text_config``
    (vLLM's ``hf_text_config``) wins over the top level."""
    if not isinstance(config, Mapping):
        return {}
    merged = {k: config[k] for k in CONFIG_KEYS if k in config}
    text = config.get("text_config") or config.get("llm_config")
    if isinstance(text, Mapping):
        merged.update({k: text[k] for k in CONFIG_KEYS if k in text})
    return merged


def summarise(config: Any, files: Iterable[Mapping[str, Any]],
              errors: Sequence[str] = ()) -> ModelWeights:
    """Build :class:`ModelWeights` from the probe's ``weights`` section (pure).

    Args:
        config: the parsed config.json (anything else counts as unreadable).
        files: ``{"name": str, "tensors": [[name, dtype, shape, nbytes], ...]}`` per file, as
            ``probe_script.model_weights`` returns them.
        errors: the probe's messages (files it could not read).
    """
    by_dtype: dict[str, int] = {}
    groups: dict[str, dict[str, int]] = {}
    count = total = nfiles = 0
    for item in files:
        nfiles += 1
        for name, dtype, _shape, nbytes in item.get("tensors") or ():
            size = int(nbytes)
            count += 1
            total += size
            by_dtype[str(dtype)] = by_dtype.get(str(dtype), 0) + size
            bucket = groups.setdefault(tensor_group(str(name)), {})
            bucket[str(dtype)] = bucket.get(str(dtype), 0) + size
    return ModelWeights(config=config_subset(config), files=nfiles, tensors=count,
                        total_bytes=total, by_dtype=by_dtype, groups=groups,
                        errors=tuple(str(e) for e in errors))


def tensor_nbytes(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of ``dtype`` and ``shape`` (product of the dimensions x element size);
    raises KeyError for a dtype safetensors does not define."""
    elements = 1
    for dim in shape:
        elements *= int(dim)
    return int(elements * DTYPE_BYTES[dtype])
