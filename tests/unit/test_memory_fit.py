"""Memory fit: weight bytes from real safetensors headers, per-GPU figures by hand, findings.

The models are header-only copies of public checkpoints (tests/data/models/README.md).
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import replace
from math import prod
from pathlib import Path

import pytest

from vllm_provision.checks import memory
from vllm_provision.checks.finding import Severity
from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.facts import probe_script, weights
from vllm_provision.facts.model import Gpu, HostFacts

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
GIB = 1024 ** 3
MIB = 1024 ** 2


@functools.cache
def read_model(name: str) -> tuple[dict, list[dict]]:
    """What the probe returns for a model folder (config.json and headers only)."""
    raw = probe_script.model_weights(str(MODELS / name), 1 << 28)
    assert raw["errors"] == []
    return raw["config"], raw["files"]


def facts_for(name: str, nodes: int = 2, gpus: int = 4, mib: int = 81920,
              ) -> dict[str, HostFacts]:
    config, files = read_model(name)
    cards = tuple(Gpu(i, "NVIDIA H100 80GB HBM3", mib, f"GPU-{i}") for i in range(gpus))
    out = {f"h{n + 1}": HostFacts(f"h{n + 1}", gpus=cards) for n in range(nodes)}
    out["h1"] = replace(out["h1"], model_weights=weights.summarise(config, files))
    return out


def replica_of(name: str, tp: int = 4, pp: int = 2, nodes: int = 2, **engine) -> Replica:
    members = tuple(Node(Host(f"h{n + 1}", f"10.0.0.{n + 1}"), n, f"10.0.0.{n + 1}")
                    for n in range(nodes))
    return Replica("r", "mp", members, EngineArgs(
        model=str(MODELS / name), tensor_parallel_size=tp, pipeline_parallel_size=pp, **engine))


@pytest.mark.parametrize(("name", "params"), [
    # published parameter counts: TinyLlama 1,100,048,384; Qwen2.5-0.5B 494,032,768 (tied);
    # Mixtral-8x7B 46,702,792,704
    ("tinyllama-1.1b-chat-v1.0", 1_100_048_384),
    ("qwen2.5-0.5b-instruct", 494_032_768),
    ("mixtral-8x7b-v0.1", 46_702_792_704),
])
def test_weight_bytes_are_the_sum_of_the_tensor_sizes(name, params):
    config, files = read_model(name)
    summary = weights.summarise(config, files)
    # each tensor's size from its header: product of the shape x bytes of the dtype
    sizes = [prod(shape) * {"BF16": 2}[dtype] for item in files
             for _n, dtype, shape, _b in item["tensors"]]
    assert summary.total_bytes == sum(sizes) == params * 2
    assert summary.by_dtype == {"BF16": params * 2}
    assert summary.tensors == len(sizes)
    assert sum(sum(g.values()) for g in summary.groups.values()) == summary.total_bytes


def test_header_length_and_json_are_read_without_the_data(tmp_path):
    path = tmp_path / "x.safetensors"
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode())  # no data after it
    assert probe_script.safetensors_header(str(path), 1 << 20) == (
        [["a", "F32", [2, 3], 24]], len(header) + 8)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="not a safetensors header"):
        probe_script.safetensors_header(str(path), 1 << 20)


def test_only_the_shards_the_index_names_are_read(tmp_path):
    source = MODELS / "mixtral-8x7b-v0.1"
    for item in source.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    (tmp_path / "consolidated.safetensors").write_bytes(b"\xff" * 16)  # not in the weight_map
    raw = probe_script.model_weights(str(tmp_path), 1 << 28)
    assert raw["errors"] == [] and len(raw["files"]) == 4


def test_tensor_groups():
    assert weights.tensor_group("model.embed_tokens.weight") == "embed"
    assert weights.tensor_group("lm_head.weight") == "lm_head"
    assert weights.tensor_group("model.layers.17.mlp.up_proj.weight") == "layer.17"
    assert weights.tensor_group("model.norm.weight") == "other"


@pytest.mark.parametrize(("layers", "pp", "expected"), [
    (32, 2, [(0, 16), (16, 32)]),
    (81, 2, [(0, 41), (41, 81)]),               # the extra layer goes to the first stage
    (10, 4, [(0, 2), (2, 5), (5, 8), (8, 10)]),  # 2 extra layers to the middle stages
    (22, 3, [(0, 7), (7, 15), (15, 22)]),
])
def test_pp_split_follows_get_pp_indices(layers, pp, expected):
    assert [memory.pp_indices(layers, rank, pp) for rank in range(pp)] == expected


def test_mixtral_tp4_pp2_on_two_4_gpu_nodes_of_80_gib_by_hand():
    result = memory.estimate(replica_of("mixtral-8x7b-v0.1", max_model_len=32768),
                             facts_for("mixtral-8x7b-v0.1"), 2048)
    # One decoder layer, in parameters (config: hidden 4096, intermediate 14336, 32 heads of
    # 128, 8 KV heads, 8 experts):
    #   q, o: 4096 x 4096 = 16,777,216 each; k, v: 1024 x 4096 = 4,194,304 each -> 41,943,040
    #   router gate 8 x 4096 = 32,768; experts 8 x 3 x 14336 x 4096 = 1,409,286,144
    #   two RMSNorms 2 x 4096 = 8,192            -> 1,451,270,144 params = 2,902,540,288 bytes
    layer = 2 * (16_777_216 * 2 + 4_194_304 * 2 + 32_768 + 8 * 3 * 14336 * 4096 + 8192)
    assert layer == 2_902_540_288
    embed = lm_head = 32000 * 4096 * 2        # 262,144,000 bytes each (untied)
    norm = 4096 * 2                           # model.norm: on every stage (conservative)
    # PP=2 splits 32 layers 16 + 16; stage 0 has the embedding, stage 1 the LM head
    stage0 = (16 * layer + embed + norm) // 4  # TP=4 shares each stage's weights
    stage1 = (16 * layer + lm_head + norm) // 4
    assert stage0 == stage1 == 11_675_699_200  # 10.87 GiB per GPU
    budget = int(80 * GIB * 0.9)               # 77,309,411,328
    room = budget - stage0 - 2048 * MIB        # 63,486,228,480
    # KV per token per GPU: 16 layers x (8 KV heads / TP 4) x 128 x 2 (K and V) x 2 bytes
    per_token = 16 * 2 * 128 * 2 * 2
    assert per_token == 16_384
    tokens = room // (per_token * 16) * 16     # whole blocks of 16 tokens: 3,874,880
    assert [s.layers for s in result.stages] == [(0, 16), (16, 32)]
    assert [s.hosts for s in result.stages] == [("h1",), ("h2",)]
    assert [s.weights for s in result.stages] == [stage0, stage1]
    assert [s.budget for s in result.stages] == [budget, budget]
    assert [s.kv_room for s in result.stages] == [room, room] == [63_486_228_480] * 2
    assert [s.kv_per_token for s in result.stages] == [per_token] * 2
    assert [s.tokens for s in result.stages] == [tokens] * 2 == [3_874_880] * 2
    assert result.weights_loaded == result.weights_stored == 46_702_792_704 * 2
    [finding], _ = memory.check_memory_fit(replica_of("mixtral-8x7b-v0.1", max_model_len=32768),
                                           facts_for("mixtral-8x7b-v0.1"), 2048)
    assert finding.severity is Severity.OK and "3874880 tokens" in finding.actual


def test_tinyllama_tp4_pp2_by_hand_uneven_heads_and_layers():
    result = memory.estimate(replica_of("tinyllama-1.1b-chat-v1.0"),
                             facts_for("tinyllama-1.1b-chat-v1.0"), 2048)
    # 22 layers -> 11 + 11; layer = q,o 2048^2 + k,v 256 x 2048 + 3 x 5632 x 2048 + 2 x 2048
    layer = 2 * (2 * 2048 * 2048 + 2 * 256 * 2048 + 3 * 5632 * 2048 + 2 * 2048)
    embed = 32000 * 2048 * 2
    assert [s.weights for s in result.stages] == [
        -(-(11 * layer + embed + 4096) // 4), -(-(11 * layer + embed + 4096) // 4)]
    # 4 KV heads over TP 4: 1 per GPU; head 2048 / 32 = 64
    assert [s.kv_per_token for s in result.stages] == [11 * 1 * 64 * 2 * 2] * 2
    assert result.max_model_len == 2048  # max_position_embeddings when vllm_max_model_len unset


def test_tied_embeddings_cost_nothing_with_pp1_and_a_copy_on_the_last_stage():
    facts = facts_for("qwen2.5-0.5b-instruct", nodes=1, gpus=2)
    one = memory.estimate(replica_of("qwen2.5-0.5b-instruct", tp=2, pp=1, nodes=1), facts, 0)
    two = memory.estimate(replica_of("qwen2.5-0.5b-instruct", tp=1, pp=2, nodes=1), facts, 0)
    embed = 151936 * 896 * 2
    assert one.weights_loaded == 494_032_768 * 2          # no lm_head.weight in the file
    assert one.stages[0].weights == -(-(494_032_768 * 2) // 2)
    # PP=2: stage 1 builds its own LM head from the embedding (tie_word_embeddings)
    assert two.stages[1].weights - two.stages[0].weights == 0  # embed on 0, its copy on 1
    assert two.stages[0].weights > embed


def test_float32_checkpoint_counts_at_the_serving_dtype_and_dtype_float32_doubles_it():
    config, files = read_model("tinyllama-1.1b-chat-v1.0")
    as_f32 = [{"name": f["name"], "tensors": [[n, "F32", s, b * 2] for n, _d, s, b in
                                              f["tensors"]]} for f in files]
    facts = facts_for("tinyllama-1.1b-chat-v1.0", nodes=1, gpus=1)
    facts["h1"] = replace(facts["h1"], model_weights=weights.summarise(
        {**config, "torch_dtype": "float32"}, as_f32))
    auto = memory.estimate(replica_of("tinyllama-1.1b-chat-v1.0", tp=1, pp=1, nodes=1), facts, 0)
    full = memory.estimate(replica_of("tinyllama-1.1b-chat-v1.0", tp=1, pp=1, nodes=1,
                                      extra_args=("--dtype", "float32")), facts, 0)
    assert auto.dtype == "bfloat16" and auto.weights_loaded == 1_100_048_384 * 2
    assert full.weights_loaded == auto.weights_stored == 1_100_048_384 * 4


def test_fp8_kv_cache_halves_the_bytes_per_token():
    facts = facts_for("mixtral-8x7b-v0.1")
    fp8 = memory.estimate(replica_of("mixtral-8x7b-v0.1", extra_args=(
        "--kv-cache-dtype", "fp8")), facts, 2048)
    assert fp8.kv_cache_dtype == "fp8" and fp8.stages[0].kv_per_token == 8192


def test_weights_that_do_not_fit_are_an_error_with_the_numbers():
    facts = facts_for("mixtral-8x7b-v0.1")
    [finding], result = memory.check_memory_fit(replica_of(
        "mixtral-8x7b-v0.1", gpu_memory_utilization=0.1), facts, 2048)
    assert finding.severity is Severity.ERROR and result is not None
    assert "10.87 GiB of weights per GPU" in finding.actual
    assert "<= 8.00 GiB (0.1 x 80.00 GiB" in finding.expected
    assert "vllm_gpu_memory_utilization" in finding.fix


def test_too_little_kv_room_is_a_warning_with_the_largest_context():
    facts = facts_for("mixtral-8x7b-v0.1")
    # budget 0.16 x 80 GiB = 12.8 GiB; weights 10.87 GiB; overhead 1 GiB -> 0.93 GiB room
    [finding], result = memory.check_memory_fit(replica_of(
        "mixtral-8x7b-v0.1", gpu_memory_utilization=0.16, max_model_len=131072), facts, 1024)
    room = int(80 * GIB * 0.16) - 11_675_699_200 - 1024 * MIB
    largest = room // (16_384 * 16) * 16
    assert finding.severity is Severity.WARNING and 0 < largest < 131072
    assert f"the largest context that fits is {largest} tokens" in finding.actual
    assert f"at most {largest}" in finding.fix
    assert result is not None and result.stages[0].tokens == largest


def test_a_hub_name_is_skipped_and_unreadable_headers_warn(tmp_path):
    facts = facts_for("mixtral-8x7b-v0.1")
    facts["h1"] = replace(facts["h1"], model_weights=None)
    [skipped], _ = memory.check_memory_fit(replica_of("mixtral-8x7b-v0.1"), facts, 2048)
    assert skipped.severity is Severity.OK and "not a local folder" in skipped.actual
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    raw = probe_script.model_weights(str(tmp_path), 1 << 20)
    facts["h1"] = replace(facts["h1"], model_weights=weights.summarise(
        raw["config"], raw["files"], raw["errors"]))
    [warned], _ = memory.check_memory_fit(replica_of("mixtral-8x7b-v0.1"), facts, 2048)
    assert warned.severity is Severity.WARNING
    assert "model.safetensors: header length" in warned.actual


def ray_replica(env: dict | None = None, num_gpus: int | None = None) -> Replica:
    worker_vars = {} if num_gpus is None else {"ray_num_gpus": num_gpus}
    members = (Node(Host("h1", "10.0.0.1"), 0, "10.0.0.1"),
               Node(Host("h2", "10.0.0.2", vars=worker_vars), 1, "10.0.0.2"))
    return Replica("r", "ray", members, EngineArgs(model="/m", tensor_parallel_size=4,
                                                    pipeline_parallel_size=2),
                   vars={"vllm_env": env or {}})


def test_ray_logical_gpus_fractional_workers_and_more_than_physical_warn():
    from vllm_provision.checks import placement

    physical = {"h1": 4, "h2": 4}
    clean = placement.check_logical_gpus(ray_replica(), physical, {"h1": None, "h2": None})
    assert clean == []
    [share] = placement.check_logical_gpus(ray_replica({"VLLM_RAY_PER_WORKER_GPUS": "0.5"}),
                                           physical, {"h1": None, "h2": None})
    assert share.severity is Severity.WARNING and share.host == "h1"
    assert "0.5: Ray may place 2 workers on one GPU" in share.actual
    assert "do not isolate or reserve memory" in share.actual
    [extra] = placement.check_logical_gpus(ray_replica(num_gpus=8), physical,
                                           {"h1": None, "h2": 8})
    assert extra.host == "h2" and "8 logical GPUs declared to Ray" in extra.actual
    assert "at most the 4 GPUs" in extra.expected
    [bundles] = placement.check_logical_gpus(ray_replica(), physical, {"h1": None, "h2": None},
                                             [{"GPU": 0.5}, {"GPU": 1}])
    assert "GPU amounts 0.5" in bundles.actual
    mp = replace(ray_replica({"VLLM_RAY_PER_WORKER_GPUS": "0.5"}), backend="mp")
    assert placement.check_logical_gpus(mp, physical, {"h1": None, "h2": None}) == []


def test_vllm_pp_layer_partition_moves_layers_between_stages():
    replica = replace(replica_of("tinyllama-1.1b-chat-v1.0"),
                      vars={"vllm_env": {"VLLM_PP_LAYER_PARTITION": "12,10"}})
    result = memory.estimate(replica, facts_for("tinyllama-1.1b-chat-v1.0"), 2048)
    assert [s.layers for s in result.stages] == [(0, 12), (12, 22)]
    assert result.stages[0].weights > result.stages[1].weights


INVENTORY = """all:
  children:
    vllm_replicas:
      children:
        r:
          vars: {vllm_model: /srv/models/m, vllm_backend: mp}
          hosts:
            h1: {ansible_host: 10.0.0.1}
"""


@pytest.mark.parametrize(("value", "expected"), [("0.5", 0.5), ("1", 1.0), ("0.95", 0.95)])
def test_gpu_memory_utilization_is_read_as_a_number_and_rendered(tmp_path, value, expected):
    from vllm_provision.cli.options import parse_extra_vars
    from vllm_provision.inventory import load_inventory
    from vllm_provision.inventory.view import engine_argv

    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    inventory = load_inventory(path, parse_extra_vars([f"vllm_gpu_memory_utilization={value}"]))
    [replica] = inventory.replicas
    assert replica.engine.gpu_memory_utilization == expected
    argv = engine_argv(replica)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == str(expected)


@pytest.mark.parametrize("value", ["0", "1.5", "lots", "nan", "-0.2"])
def test_gpu_memory_utilization_outside_0_1_is_refused_naming_it(tmp_path, value):
    from vllm_provision.cli.options import parse_extra_vars
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.inventory import load_inventory

    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    with pytest.raises(ProvisionError) as caught:
        load_inventory(path, parse_extra_vars([f"vllm_gpu_memory_utilization={value}"]))
    text = caught.value.render()
    assert "vllm_gpu_memory_utilization" in text and "Traceback" not in text


def test_mla_caches_one_latent_vector_per_layer():
    # DeepSeek-V3's config: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64 (MLA)
    config = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
              "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168}
    # (512 + 64) x 2 bytes x 61 layers = 70,272 bytes per token, the same on every TP rank
    assert memory.kv_bytes_per_token(config, 61, 8, 2) == 70_272
    assert memory.kv_bytes_per_token(config, 61, 1, 2) == 70_272


def _with_config(facts: dict[str, HostFacts], **config) -> dict[str, HostFacts]:
    mw = facts["h1"].model_weights
    assert mw is not None
    return {**facts, "h1": replace(facts["h1"], model_weights=replace(
        mw, config={**mw.config, **config}))}


@pytest.mark.parametrize("layers", [10 ** 12, 0, -3, "9" * 5000])
def test_an_absurd_layer_count_is_refused_at_once_naming_the_value(layers):
    """config.json is the host's word: num_hidden_layers of 10**12 used to make the estimate
    loop once per layer (check hung); now it is refused, and the work never follows it."""
    facts = _with_config(facts_for("tinyllama-1.1b-chat-v1.0"), num_hidden_layers=layers)
    with pytest.raises(memory.CannotEstimate, match="num_hidden_layers"):
        memory.estimate(replica_of("tinyllama-1.1b-chat-v1.0"), facts, 2048)


def test_a_large_layer_count_within_the_bound_costs_what_the_tensors_cost():
    """A layer the checkpoint has no tensors for loads nothing: 22 layers of tensors under a
    declared 100,000 give the same weights as under 22, the rest of the stages empty."""
    facts = facts_for("tinyllama-1.1b-chat-v1.0")
    declared = _with_config(facts, num_hidden_layers=memory.MAX_LAYERS)
    real = memory.estimate(replica_of("tinyllama-1.1b-chat-v1.0", pp=1, nodes=1), facts, 0)
    big = memory.estimate(replica_of("tinyllama-1.1b-chat-v1.0", pp=1, nodes=1), declared, 0)
    assert big.weights_loaded == real.weights_loaded
    assert big.stages[0].layers == (0, memory.MAX_LAYERS)
