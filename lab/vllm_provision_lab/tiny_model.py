"""Build the lab's tiny random-weight Llama and its tokenizer, with no download.

Run inside the real-vLLM base with its venv's python: ``python tiny_model.py /srv/models/tiny``.
Recipe (docs/measured.md, "Real vLLM on CPU in the lab"): a byte-level BPE tokenizer trained
locally with ``tokenizers`` on generated text (about 300 tokens), and
``LlamaConfig(hidden 128, intermediate 256, 2 layers, 4 heads of 32, 4 kv heads, max position
256)``, seeded, saved as safetensors (about 1.6 MB). Head size 32: the CPU attention backend of
vLLM 0.32.0 refuses 16 (supported: 32, 64, 80, 96, ...), and only at the first completion.
"""

from __future__ import annotations

import os
import random
import sys

WORDS = ("hello", "world", "gpu", "node", "cluster", "ray", "vllm", "serve", "token", "model",
         "the", "a", "is", "of", "and", "to")


def build(out: str) -> None:
    """Write the tokenizer and the model into ``out`` (created if missing)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    rng = random.Random(0)
    text = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=len(fast),
                         max_position_embeddings=256, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                         torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    # safetensors writes the weights 0600: the units run as the vllm system user, not root
    for name in os.listdir(out):
        os.chmod(os.path.join(out, name), 0o644)
    print("vocab", len(fast), "params", sum(p.numel() for p in model.parameters()), "->", out)


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/srv/models/tiny")
