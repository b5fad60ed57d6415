"""The vllm_preflight controller module: facts stored, every node failed on an error finding."""

from __future__ import annotations

from types import SimpleNamespace

from test_facts_probe import make_inventory

from vllm_provision.core.results import Status
from vllm_provision.modules import vllm_preflight
from vllm_provision.transport.local import LocalConnection


def make_ctx(tmp_path, vars=None):
    inventory = make_inventory(tmp_path)
    return SimpleNamespace(inventory=inventory, vars=vars or {}, facts={},
                           connections={"h1": LocalConnection("h1"), "h2": LocalConnection("h2")})


def test_errors_fail_every_node_and_facts_are_stored(tmp_path):
    ctx = make_ctx(tmp_path)
    result = vllm_preflight.run(ctx, {})
    # The controller has no GPU and no vLLM: host.gpus and host.venv are errors on both nodes.
    assert result.status is Status.FAILED
    assert {name: r.status for name, r in result.host_results.items()} == {
        "h1": Status.FAILED, "h2": Status.FAILED}
    assert "nothing was changed" in result.host_results["h2"].message
    assert set(ctx.facts) == {"h1", "h2"}
    assert any(f["check"] == "host.gpus" for f in result.data["findings"])


def test_skip_checks_leave_those_findings_out(tmp_path):
    ctx = make_ctx(tmp_path)
    result = vllm_preflight.run(ctx, {"skip_checks": ["host", "topology", "parity", "network"]})
    assert not any(f["check"].startswith(("host.", "topology.", "parity.", "network."))
                   for f in result.data["findings"])
