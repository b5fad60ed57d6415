"""``provision top --once`` and ``--json`` against the lab's serving replicas (mp and Ray).

The session's broker hands out each lab replica serving (``replicas.serving(kind)``: reused,
nothing changed); one completion gives its histograms an observation, then ``top --once``
must show it serving with numbers (requests, KV cache, TTFT, tokens/s, each node's units
active and GPU memory from the stand-in's nvidia-smi), and ``top --json`` must validate against
its schema with the same. Read only: the replica is left as it was handed out.

Cost: about 10 s (an estimate, not yet measured: two refreshes one second apart and one
completion per replica, when the broker already holds it serving; no deployment of its own). A
replica the broker does not hold serving is deployed by the broker first (its cold ``up``, tens
of seconds on the stand-in tier): the Ray case after the mp one (or the reverse) costs that
switch; docs/testing.md, "Per module".
"""

from __future__ import annotations

import json

import pytest
from lab_support import ReplicaBroker, complete

from vllm_provision.cli import json_schemas

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("kind", ["mp", "ray"])
def test_top_shows_the_serving_replica_with_numbers(replicas: ReplicaBroker, kind: str) -> None:
    replica = replicas.serving(kind)
    assert complete(replica.base_url, replica.model), "the handed-out replica did not answer"

    once = replica.provision("top", "-i", replica.inventory, "--once", timeout=120)
    assert once.returncode == 0, once.stdout + once.stderr
    assert "serving 1/1" in once.stdout and "not serving" not in once.stdout
    assert "latency (since start) TTFT p50 " in once.stdout
    assert "active (running)" in once.stdout and "GPU memory " in once.stdout
    assert "\x1b" not in once.stdout  # plain: not a terminal, no colour

    shown = replica.provision("top", "-i", replica.inventory, "--json", timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    document = json.loads(shown.stdout)
    json_schemas.validate("top", document)
    [info] = document["replicas"]
    assert info["serving"] and info["health"] == 200 and info["error"] is None
    assert info["requests"]["running"] is not None and info["kv_cache_perc"] is not None
    assert info["latency"]["ttft_s"]["count"] >= 1 and info["latency"]["ttft_s"]["p50"] > 0
    assert info["tokens_per_s"] is not None
    assert info["metric_names"]["kv_cache"] == "vllm:kv_cache_usage_perc"
    assert [n["host"] for n in info["nodes"]] == ["h1", "h2"]
    for node in info["nodes"]:
        assert node["error"] is None and node["gpus"], node
        assert all(g["memory_total_mib"] > 0 for g in node["gpus"])
        assert all(u["active_state"] == "active" for u in node["units"]), node
        assert all(u["restarts_1h"] is not None for u in node["units"]), node
