"""The vllm_preflight controller module: facts stored, every node failed on an error finding."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from test_facts_probe import make_inventory

from vllm_provision.checks.options import probe_for, replicas_on
from vllm_provision.core.results import Status
from vllm_provision.modules import vllm_preflight
from vllm_provision.transport.local import LocalConnection


def make_ctx(tmp_path, vars=None):
    inventory = make_inventory(tmp_path)
    return SimpleNamespace(inventory=inventory, vars=vars or {}, facts={}, run_state={},
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


def test_facts_the_same_run_gathered_are_checked_without_probing_again(tmp_path, monkeypatch):
    first = make_ctx(tmp_path)
    expected = vllm_preflight.run(first, {})

    def no_probe(*args, **kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr(vllm_preflight, "gather_facts", no_probe)
    again = SimpleNamespace(**{**vars(first), "facts": {}})
    again.run_state = {name: {vllm_preflight.GATHERED: facts}
                       for name, facts in first.facts.items()}
    result = vllm_preflight.run(again, {})
    assert again.facts == first.facts
    assert result.status is expected.status
    assert result.data["findings"] == expected.data["findings"]


def probed_once_counted(tmp_path, monkeypatch):
    """A context whose preflight ran once, and the list each later probe appends its hosts to."""
    first = make_ctx(tmp_path)
    vllm_preflight.run(first, {})
    probed = []
    real = vllm_preflight.gather_facts

    def counting(inventory, connections, probe, hosts):
        probed.append(sorted(hosts))
        return real(inventory, connections, probe, hosts=hosts)

    monkeypatch.setattr(vllm_preflight, "gather_facts", counting)
    return first, probed


def test_a_host_without_facts_of_this_run_makes_the_task_probe_every_host(tmp_path, monkeypatch):
    first, probed = probed_once_counted(tmp_path, monkeypatch)
    again = SimpleNamespace(**{**vars(first), "facts": {}})
    again.run_state = {"h1": {vllm_preflight.GATHERED: first.facts["h1"]}}
    vllm_preflight.run(again, {})
    assert probed == [["h1", "h2"]]


def test_facts_gathered_with_other_probe_options_are_probed_again(tmp_path, monkeypatch):
    first, probed = probed_once_counted(tmp_path, monkeypatch)
    own = probe_for(replicas_on(first.inventory, first.connections))
    other = replace(own, sha256=not own.sha256)
    for options, expected in ((own, []), (other, [["h1", "h2"]])):
        probed.clear()
        again = SimpleNamespace(**{**vars(first), "facts": {}})
        again.run_state = {name: {vllm_preflight.GATHERED: facts,
                                  vllm_preflight.GATHERED_WITH: options}
                           for name, facts in first.facts.items()}
        vllm_preflight.run(again, {})
        assert probed == expected


def test_one_probe_serves_every_replica_it_probes_what_any_of_them_asks_for(tmp_path):
    from test_replicas_independent import two_replicas

    inventory = two_replicas(tmp_path, {"a": ("h1",), "b": ("h2",)})
    a, b = inventory.replicas
    b = replace(b, vars={"preflight_model_sha256": True, "preflight_nccl_loaded": True,
                         "preflight_reach_timeout_s": 3})
    a = replace(a, vars={"preflight_reach_timeout_s": 5})
    assert replicas_on(inventory, ["h2", "elsewhere"]) == [inventory.replicas[1]]
    both = probe_for([a, b])
    assert (both.sha256, both.nccl_loaded, both.reach_timeout_s) == (True, True, 5.0), \
        "the second replica's asks are not dropped; the first replica's timeout is used"
    alone = probe_for([a])
    assert (alone.sha256, alone.nccl_loaded) == (False, False)
    none = probe_for([])
    assert (none.sha256, none.nccl_loaded, none.reach_timeout_s) == (False, False, 8.0), \
        "no replica: the preflight role's defaults"
