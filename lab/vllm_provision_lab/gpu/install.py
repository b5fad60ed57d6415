"""Write the simulated GPU stack into a lab host's root (before boot) or push it over SSH."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

GUEST_PACKAGE = Path(__file__).parent / "guest" / "vllm_lab_standin"
VENV = "/opt/vllm"
SITE_FALLBACK = "lib/python3.11/site-packages"
MODEL_DIR = "/srv/models/lab-model"
SPEC_JSON = "/etc/vllm-lab/spec.json"
TMPFILES = "d /run/vllm-lab 0755 root root -\nd /run/vllm-lab/compute-apps 1777 root root -\n"
VLLM_SCRIPT = (f"#!{VENV}/bin/python\n# vllm-provision lab stand-in for vLLM (not vLLM)\n"
               "import sys\nfrom vllm_lab_standin.cli import main\nsys.exit(main())\n")


def site_packages(root: Path) -> Path:
    """Return the venv's site-packages under ``root`` (``/opt/vllm/lib/python3.X/...``)."""
    found = sorted((root / VENV.lstrip("/")).glob("lib/python3*/site-packages"))
    return found[-1] if found else root / VENV.lstrip("/") / SITE_FALLBACK


# The lab model: a tiny Llama (2 layers, hidden 64, 4 heads, 2 KV heads), so preflight's memory
# estimate reads real safetensors headers (docs/preflight.md, "Will the model fit").
LAB_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 320, "max_position_embeddings": 2048,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "_comment": "vllm-provision lab model: the stand-in vLLM never reads the weights"}


def safetensors_file(tensors: list[tuple[str, list[int]]], seed: bytes) -> bytes:
    """A BF16 safetensors file (8-byte little-endian header length, JSON header padded to 8
    bytes, then the data) whose data bytes are a deterministic function of ``seed``."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    data = b"".join(hashlib.sha256(seed + i.to_bytes(4, "little")).digest()
                    for i in range(-(-offset // 32)))[:offset]
    return len(raw).to_bytes(8, "little") + raw + data


def model_files() -> dict[str, bytes]:
    """Return the lab model's files (name -> bytes): a config and two weight shards with real
    safetensors headers (embedding + layer 0, layer 1 + norm + LM head; about 230 KB)."""
    c = LAB_MODEL_CONFIG
    h, inter = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]

    def layer(i: int) -> list[tuple[str, list[int]]]:
        p = f"model.layers.{i}."
        return [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
                (p + "self_attn.q_proj.weight", [h, h]), (p + "self_attn.k_proj.weight", [kv, h]),
                (p + "self_attn.v_proj.weight", [kv, h]), (p + "self_attn.o_proj.weight", [h, h]),
                (p + "mlp.gate_proj.weight", [inter, h]), (p + "mlp.up_proj.weight", [inter, h]),
                (p + "mlp.down_proj.weight", [h, inter])]

    shards = ([("model.embed_tokens.weight", [c["vocab_size"], h]), *layer(0)],
              [*layer(1), ("model.norm.weight", [h]), ("lm_head.weight", [c["vocab_size"], h])])
    files = {"config.json": (json.dumps(c, indent=2) + "\n").encode(),
             "generation_config.json": b'{"max_new_tokens": 16}\n'}
    for number, tensors in enumerate(shards, 1):
        files[f"model-0000{number}-of-00002.safetensors"] = safetensors_file(
            tensors, f"lab-model-shard-{number}".encode())
    return files


def write_host_root(root: Path, spec: dict[str, Any]) -> None:
    """Install the stand-ins into a host root (``root`` is that host's ``/``).

    Writes /etc/vllm-lab/spec.json, /usr/bin/nvidia-smi, the stand-in package and
    /opt/vllm/bin/vllm into the venv, /etc/tmpfiles.d/vllm-lab.conf, /srv/models/lab-model/,
    then the per-spec metadata (:func:`vllm_lab_standin.apply.apply`).
    """
    from .guest.vllm_lab_standin import apply as guest_apply

    def put(path: str, data: bytes | str, mode: int = 0o644) -> None:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)

    put(SPEC_JSON, json.dumps(spec, indent=2, sort_keys=True) + "\n")
    put("/usr/bin/nvidia-smi", (GUEST_PACKAGE / "nvidia_smi.py").read_bytes(), 0o755)
    put("/etc/tmpfiles.d/vllm-lab.conf", TMPFILES)
    site = site_packages(root)
    package = site / "vllm_lab_standin"
    package.mkdir(parents=True, exist_ok=True)
    for source in GUEST_PACKAGE.glob("*.py"):
        (package / source.name).write_bytes(source.read_bytes())
    put(f"{VENV}/bin/vllm", VLLM_SCRIPT, 0o755)
    for name, data in model_files().items():
        put(f"{MODEL_DIR}/{name}", data)
    guest_apply.apply(spec, site)


def remote_apply_command(spec: dict[str, Any]) -> str:
    """Return a shell command that rewrites spec.json in a running guest and re-applies it.

    The JSON is compact: the release's ``serve_options`` make it tens of KiB, and the command
    is one argument of ``sh -c``, which Linux caps at 128 KiB (``MAX_ARG_STRLEN``)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":")) + "\n"
    site = f"$(ls -d {VENV}/lib/python3*/site-packages | tail -n1)"
    return (f"mkdir -p /etc/vllm-lab && printf %s {shlex.quote(text)} > {SPEC_JSON}.new && "
            f"mv {SPEC_JSON}.new {SPEC_JSON} && "
            f"PYTHONPATH={site} python3 -m vllm_lab_standin.apply >/dev/null")
