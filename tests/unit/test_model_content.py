"""Model parity by content: the probe's fingerprint of real safetensors files (written by the
format: u64 little-endian header length, JSON header, data), parity across nodes, drift."""

from __future__ import annotations

import hashlib
import json
import runpy
import struct
import sys
from pathlib import Path

import pytest

from vllm_provision import state
from vllm_provision.checks import parity
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import load_defaults
from vllm_provision.core.models import EngineArgs, Group, Host, Inventory, Node, Replica
from vllm_provision.facts import parsers, probe_script
from vllm_provision.facts.gather import ProbeOptions, gather_facts, parse_probe_output
from vllm_provision.facts.model import HostFacts, ModelFile
from vllm_provision.state import drift
from vllm_provision.transport.local import LocalConnection

POLICY = load_defaults()["preflight_parity"]
LIMIT = 1 << 28
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
# the safetensors layout the header-only test models were written with (their build script)
HEADER = runpy.run_path(str(Path(__file__).resolve().parents[1] / "data" / "models"
                            / "build_headers.py"))["header"]


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], fill: int = 0,
                      metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file: 8-byte little-endian header length, the JSON header (padded with
    spaces to 8 bytes), then each tensor's bytes (all ``fill``)."""
    head, size = HEADER([(name, dtype, shape) for name, (dtype, shape) in tensors.items()],
                        metadata)
    return head + bytes([fill]) * size


def write_model(folder: Path, *, dtype: str = "BF16", theta: str = "10000.0", fill: int = 1,
                rows: int = 64) -> Path:
    """A two-shard model: config.json, the index, two shards (equal sizes for every argument
    but ``rows``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "num_hidden_layers": 2, "rope_theta": float(theta), "torch_dtype": "bfloat16"}))
    shards = [{"model.embed_tokens.weight": (dtype, [rows, 64]),
               "model.layers.0.mlp.up_proj.weight": (dtype, [64, 64])},
              {"model.layers.1.mlp.up_proj.weight": (dtype, [64, 64]),
               "lm_head.weight": (dtype, [rows, 64])}]
    weight_map = {}
    for name, tensors in zip(SHARDS, shards, strict=True):
        (folder / name).write_bytes(safetensors_bytes(tensors, fill))
        weight_map.update(dict.fromkeys(tensors, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder


def manifest(folder: Path) -> tuple[ModelFile, ...]:
    return tuple(ModelFile(p.name, p.stat().st_size) for p in sorted(folder.iterdir()))


def facts_of(name: str, folder: Path) -> HostFacts:
    """A node's facts as the probe gives them for ``folder`` (manifest and content)."""
    content, problems = parsers.parse_model_content(
        probe_script.model_content(str(folder), LIMIT, False)["fingerprint"])
    assert problems == []
    return HostFacts(host=name, model_path=str(folder), model_files=manifest(folder),
                     model_content=content)


def replica(model: str = "/srv/models/m") -> Replica:
    nodes = tuple(Node(Host(f"h{i + 1}", f"10.0.0.{11 + i}"), i, f"10.0.0.{11 + i}")
                  for i in range(2))
    return Replica("llama", "mp", nodes,
                   EngineArgs(model=model, tensor_parallel_size=1, pipeline_parallel_size=2))


def model_findings(facts: dict[str, HostFacts], policy=POLICY):
    return [f for f in parity.check_parity(replica(), facts, policy)
            if f.check in ("parity.model_manifest", "parity.model_content")]


def not_ok(findings):
    return [f for f in findings if f.severity is not Severity.OK]


# -- the probe ----------------------------------------------------------------------------------

def test_small_shards_hash_whole_and_json_files_hash_whole(tmp_path):
    folder = write_model(tmp_path / "m")
    raw = probe_script.model_content(str(folder), LIMIT, False)
    assert raw["weights"] is None and raw["fingerprint"]["errors"] == []
    files = dict(raw["fingerprint"]["files"])
    assert sorted(files) == sorted(["config.json", "model.safetensors.index.json", *SHARDS])
    # data of at most 4 x 64 KiB is read whole: the hash is the whole file's
    for name in files:
        assert files[name] == hashlib.sha256((folder / name).read_bytes()).hexdigest(), name
    assert raw["fingerprint"]["bytes_read"] == sum(p.stat().st_size for p in folder.iterdir())


def test_a_large_shard_hashes_its_header_and_four_samples(tmp_path):
    data = safetensors_bytes({"w": ("F32", [1024, 1024])})  # 4 MiB of data
    (tmp_path / "model.safetensors").write_bytes(data)
    [[name, digest]] = probe_script.model_content(str(tmp_path), LIMIT, False)[
        "fingerprint"]["files"]
    length = struct.unpack("<Q", data[:8])[0]
    start, span, block = 8 + length, len(data) - 8 - length, 64 * 1024
    step = (span - block) // 3
    expected = hashlib.sha256(data[:start])
    for i in range(4):
        expected.update(data[start + i * step:start + i * step + block])
    assert (name, digest) == ("model.safetensors", expected.hexdigest())
    # a change in the last block (the last tensor's end) changes it; the header is the same
    changed = data[:-1] + b"\x01"
    (tmp_path / "model.safetensors").write_bytes(changed)
    [[_n, after]] = probe_script.model_content(str(tmp_path), LIMIT, False)[
        "fingerprint"]["files"]
    assert after != digest


def test_one_read_gives_the_weights_and_the_same_fingerprint(tmp_path):
    folder = write_model(tmp_path / "m")
    both = probe_script.model_content(str(folder), LIMIT, True)
    alone = probe_script.model_content(str(folder), LIMIT, False)
    assert both["fingerprint"] == alone["fingerprint"]
    assert both["weights"] == probe_script.model_weights(str(folder), LIMIT)
    assert [f["name"] for f in both["weights"]["files"]] == list(SHARDS)
    assert both["weights"]["config"]["hidden_size"] == 64


def test_a_header_over_the_limit_is_a_fact_not_a_crash(tmp_path):
    folder = write_model(tmp_path / "m")
    (folder / SHARDS[1]).write_bytes(struct.pack("<Q", 200_000_000) + b"{}")
    raw = probe_script.model_content(str(folder), LIMIT, False)["fingerprint"]
    assert [n for n, _d in raw["files"]] == ["config.json", "model.safetensors.index.json",
                                              SHARDS[0]]
    [error] = raw["errors"]
    assert error.startswith(SHARDS[1]) and "header length 200000000" in error
    # the budget bounds all headers together
    tight = probe_script.model_content(str(folder), 100, False)["fingerprint"]
    assert any("limit 100" in e for e in tight["errors"])
    content, _problems = parsers.parse_model_content(raw)
    assert content is not None and content.errors == (error,)


def test_file_names_are_data(tmp_path):
    name = "a b;$(touch pwned)`x`'.safetensors"
    (tmp_path / name).write_bytes(safetensors_bytes({"w": ("F16", [2, 2])}))
    raw = probe_script.model_content(str(tmp_path), LIMIT, False)["fingerprint"]
    assert [n for n, _d in raw["files"]] == [name] and not (tmp_path / "pwned").exists()
    # host output: a control character in a name is shown escaped, a bad entry dropped
    content, problems = parsers.parse_model_content(
        {"files": [["\x1b[31mred.safetensors", "a" * 64], ["x", "not hex"]], "errors": []})
    assert content is not None and list(content.files) == ["\\x1b[31mred.safetensors"]
    assert len(problems) == 1 and "not a file hash" in problems[0]
    assert parsers.parse_model_content(None) == (None, [])


def test_the_fingerprint_rides_the_one_probe_round_trip(tmp_path):
    folder = write_model(tmp_path / "m")
    venv = str(Path(sys.executable).parent.parent)
    hosts = {n: Host(n, "127.0.0.1", vars={"vllm_venv": venv, "vllm_service_user": "root"})
             for n in ("h1", "h2")}
    nodes = (Node(hosts["h1"], 0, "127.0.0.1"), Node(hosts["h2"], 1, "127.0.0.1"))
    inventory = Inventory(tmp_path / "inv.yml", hosts, {"all": Group("all", ("h1", "h2"))},
                          (Replica("r", "mp", nodes, EngineArgs(model=str(folder))),))
    connections = {"h1": LocalConnection("h1"), "h2": LocalConnection("h2")}
    facts, errors = gather_facts(inventory, connections, ProbeOptions(reachability=False))
    assert errors == {} and [len(c.calls) for c in connections.values()] == [1, 1]
    one, two = facts["h1"].model_content, facts["h2"].model_content
    assert one is not None and two is not None and one.digest and one == two
    assert len(one.files) == 4 and one.errors == ()
    assert facts["h1"].model_weights is not None and facts["h2"].model_weights is None


def test_no_model_folder_gives_no_content(tmp_path):
    assert probe_script.model_content(str(tmp_path / "absent"), LIMIT, False)[
        "fingerprint"] is None
    assert parse_probe_output("h1", {"content": None}).model_content is None


# -- parity -------------------------------------------------------------------------------------

def test_equal_content_passes(tmp_path):
    facts = {"h1": facts_of("h1", write_model(tmp_path / "a")),
             "h2": facts_of("h2", write_model(tmp_path / "b"))}
    findings = model_findings(facts)
    assert not_ok(findings) == []
    [ok] = [f for f in findings if f.check == "parity.model_content"]
    assert ok.actual == facts["h1"].model_content.digest[:12]  # type: ignore[union-attr]


@pytest.mark.parametrize(("change", "first"), [
    ({"dtype": "F16"}, SHARDS[0]),             # another dtype of the same size: the headers
    ({"theta": "50000.0"}, "config.json"),     # another config of the same size
    ({"fill": 2}, SHARDS[0]),                  # same headers, other weights
])
def test_another_revision_of_equal_sizes_fails_naming_nodes_file_and_fix(tmp_path, change, first):
    facts = {"h1": facts_of("h1", write_model(tmp_path / "a")),
             "h2": facts_of("h2", write_model(tmp_path / "b", **change))}
    assert facts["h1"].model_files == facts["h2"].model_files  # names and sizes alone pass
    [finding] = not_ok(model_findings(facts))
    assert (finding.check, finding.severity, finding.host) == (
        "parity.model_content", Severity.ERROR, "h2")
    assert "(as on h1)" in finding.expected and "(on h2)" in finding.actual
    assert "first difference: " in finding.actual and first in finding.actual
    assert "copy the model folder /srv/models/m from h1 to h2" in finding.fix


def test_a_size_difference_is_the_manifest_finding_alone(tmp_path):
    facts = {"h1": facts_of("h1", write_model(tmp_path / "a")),
             "h2": facts_of("h2", write_model(tmp_path / "b", rows=32))}
    assert [f.check for f in not_ok(model_findings(facts))] == ["parity.model_manifest"]
    # with the manifest item off, the content finding says it
    policy = {**POLICY, "model_manifest": "off"}
    [finding] = not_ok(model_findings(facts, policy))
    assert finding.check == "parity.model_content"
    assert "model.safetensors.index.json" in finding.actual or SHARDS[0] in finding.actual


def test_an_unreadable_header_is_named_and_the_content_item_can_be_a_warning(tmp_path):
    good = write_model(tmp_path / "a")
    bad = write_model(tmp_path / "b")
    data = (bad / SHARDS[1]).read_bytes()
    (bad / SHARDS[1]).write_bytes(struct.pack("<Q", 200_000_000) + data[8:])
    facts = {"h1": facts_of("h1", good), "h2": facts_of("h2", bad)}
    [finding] = not_ok(model_findings(facts, {**POLICY, "model_content": "warning"}))
    assert finding.severity is Severity.WARNING
    assert f"{SHARDS[1]} is not fingerprinted on h2" in finding.actual
    assert "h2 could not read" in finding.actual
    assert not_ok(model_findings(facts, {**POLICY, "model_content": "off"})) == []


def test_the_lab_model_is_the_same_on_both_lab_hosts(tmp_path):
    from vllm_provision_lab.gpu import install

    for host in ("h1", "h2"):  # what write_host_root puts in each host's root
        for name, data in install.model_files().items():
            target = tmp_path / host / install.MODEL_DIR.lstrip("/") / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    folders = {h: tmp_path / h / install.MODEL_DIR.lstrip("/") for h in ("h1", "h2")}
    facts = {h: facts_of(h, folder) for h, folder in folders.items()}
    assert len(facts["h1"].model_content.files) == 3  # type: ignore[union-attr]
    assert not_ok(model_findings(facts)) == []


# -- drift --------------------------------------------------------------------------------------

def inventory() -> Inventory:
    members = replica().nodes
    hosts = {n.name: n.host for n in members}
    return Inventory(Path("/tmp/inv/lab.yml"), hosts, {}, (replica(),))


def test_the_record_keeps_the_fingerprint_and_drift_names_the_changed_file(tmp_path):
    first = {"h1": facts_of("h1", write_model(tmp_path / "a")),
             "h2": facts_of("h2", write_model(tmp_path / "b"))}
    record = json.loads(json.dumps(state.build_record(inventory(), first, {})))
    h2 = record["hosts"]["h2"]
    assert h2["facts"]["model content"] == first["h2"].model_content.digest  # type: ignore
    assert h2["model_content"] == dict(first["h2"].model_content.files)  # type: ignore
    assert drift.compare_facts(record, first) == []
    # another revision copied into h2: equal sizes, another config
    now = {**first, "h2": facts_of("h2", write_model(tmp_path / "c", theta="50000.0"))}
    [change] = drift.compare_facts(record, now)
    assert (change.host, change.item, change.kind) == ("h2", "model content (config.json)",
                                                       "facts")
    assert change.recorded == first["h2"].model_content.digest[:12]  # type: ignore[union-attr]
    assert change.current == now["h2"].model_content.digest[:12]  # type: ignore[union-attr]
    assert drift.exit_code([change], {}) == drift.EXIT_DRIFT


def test_a_record_without_per_file_hashes_still_reports_the_fingerprint(tmp_path):
    first = {"h1": facts_of("h1", write_model(tmp_path / "a"))}
    record = state.build_record(inventory(), first, {})
    del record["hosts"]["h1"]["model_content"]
    now = {"h1": facts_of("h1", write_model(tmp_path / "b", fill=3))}
    assert [c.item for c in drift.compare_facts(record, now)] == ["model content"]
    # a record written before the fingerprint existed: nothing to compare, no drift
    del record["hosts"]["h1"]["facts"]["model content"]
    assert drift.compare_facts(record, now) == []
