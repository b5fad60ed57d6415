"""Write the header-only safetensors test models of this folder (run from the repo root:
``python tests/data/models/build_headers.py``). See README.md for where each comes from.

A file is the safetensors layout without the data: an 8-byte little-endian header length, then
the JSON header (dtype, shape, data_offsets of every tensor), padded with spaces to a multiple
of 8 bytes as the safetensors writer does. The data offsets are those of the real layout (each
tensor right after the one before), so the header sizes are exact; the data is absent.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).parent
SIZES = {"BF16": 2, "F16": 2, "F32": 4}


def llama_layer(i: int, c: dict, bias: bool = False, moe: int = 0) -> list[tuple[str, list]]:
    """One decoder layer's tensors in transformers' Llama / Qwen2 / Mixtral naming."""
    h = c["hidden_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    inter = c["intermediate_size"]
    p = f"model.layers.{i}."
    out = [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
           (p + "self_attn.q_proj.weight", [h, h]), (p + "self_attn.k_proj.weight", [kv, h]),
           (p + "self_attn.v_proj.weight", [kv, h]), (p + "self_attn.o_proj.weight", [h, h])]
    if bias:
        out += [(p + "self_attn.q_proj.bias", [h]), (p + "self_attn.k_proj.bias", [kv]),
                (p + "self_attn.v_proj.bias", [kv])]
    if moe:
        out.append((p + "block_sparse_moe.gate.weight", [moe, h]))
        for e in range(moe):
            q = f"{p}block_sparse_moe.experts.{e}."
            out += [(q + "w1.weight", [inter, h]), (q + "w2.weight", [h, inter]),
                    (q + "w3.weight", [inter, h])]
    else:
        out += [(p + "mlp.gate_proj.weight", [inter, h]), (p + "mlp.up_proj.weight", [inter, h]),
                (p + "mlp.down_proj.weight", [h, inter])]
    return out


def tensors(c: dict, bias: bool = False, moe: int = 0) -> list[tuple[str, list]]:
    h, v = c["hidden_size"], c["vocab_size"]
    out = [("model.embed_tokens.weight", [v, h])]
    for i in range(c["num_hidden_layers"]):
        out += llama_layer(i, c, bias, moe)
    out.append(("model.norm.weight", [h]))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", [v, h]))
    return out


def header(items: list[tuple[str, str, list]], metadata: dict | None = None) -> tuple[bytes, int]:
    """The start of a safetensors file holding ``items`` (name, dtype, shape; each tensor's data
    right after the one before): the 8-byte little-endian header length, then the JSON header
    (``__metadata__`` is ``metadata``, ``{"format": "pt"}`` when none) padded with spaces to a
    multiple of 8 bytes; and the size in bytes of the data that follows it. Also used by
    tests/unit/test_model_content.py, which appends the data."""
    head: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, dtype, shape in items:
        size = SIZES[dtype]
        for dim in shape:
            size *= dim
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def write(path: Path, items: list[tuple[str, list]], dtype: str) -> None:
    path.write_bytes(header([(name, dtype, shape) for name, shape in items])[0])


def build(folder: str, config: dict, shards: int = 1, bias: bool = False, moe: int = 0) -> None:
    target = HERE / folder
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    items = tensors(config, bias, moe)
    if shards == 1:
        write(target / "model.safetensors", items, "BF16")
        return
    per = -(-len(items) // shards)
    weight_map = {}
    for n in range(shards):
        name = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        part = items[n * per:(n + 1) * per]
        write(target / name, part, "BF16")
        weight_map.update({t: name for t, _ in part})
    (target / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")


if __name__ == "__main__":
    for folder, extra in (("tinyllama-1.1b-chat-v1.0", {}),
                          ("qwen2.5-0.5b-instruct", {"bias": True}),
                          ("mixtral-8x7b-v0.1", {"shards": 4, "moe": 8})):
        config = json.loads((HERE / folder / "config.json").read_text())
        build(folder, config, **extra)
