"""Fabric, GPU-health and clock checks, the host.memory expectation, and the findings table."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from test_checks_parity_host import clean_facts, make_facts, make_replica

from vllm_provision.checks import fabric, gpu_health, host
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.checks.run import check_replica, load_defaults, settings_for
from vllm_provision.cli.facts import gpu_processes_text
from vllm_provision.facts.model import (
    ClockSync,
    Gpu,
    GpuProcess,
    Interface,
    RdmaPort,
    XidEvent,
)

H200 = "NVIDIA H200"


def gpus(**faults) -> tuple[Gpu, ...]:
    """Four healthy GPUs; ``faults`` maps a field to {index: value}."""
    result = []
    for i, bus in enumerate(["18", "2A", "3A", "5D"]):
        values = {"memory_used_mib": 0, "ecc_uncorrected": 0, "persistence_mode": True,
                  "mig_mode": False}
        for name, per_gpu in faults.items():
            if i in per_gpu:
                values[name] = per_gpu[i]
        result.append(Gpu(i, H200, 143771, f"GPU-{i}", f"00000000:{bus}:00.0", **values))
    return tuple(result)


def node(name: str = "h1"):
    return next(n for n in make_replica().nodes if n.name == name)


def severities(findings: list[Finding], check: str) -> list[Severity]:
    return [f.severity for f in findings if f.check == check]


def with_mtu(facts, name, ip, mtu):
    return replace(facts[name], interfaces={
        "eth0": Interface("eth0", "UP", ("UP", "LOWER_UP"), (ip,), mtu=mtu)})


def test_mtu_mismatch_is_an_error_naming_both_nodes_and_values():
    facts = clean_facts()
    facts["h1"] = with_mtu(facts, "h1", "10.0.0.11", 9000)
    facts["h2"] = with_mtu(facts, "h2", "10.0.0.12", 1500)
    [finding] = fabric.check_mtu(make_replica(), facts, None)
    assert finding.severity is Severity.ERROR and finding.host == "*"
    assert "h1 eth0 mtu 9000" in finding.actual and "h2 eth0 mtu 1500" in finding.actual
    assert "mtu 1500" in finding.fix and "NCCL" in finding.source


def test_equal_mtus_pass_and_unknown_ones_are_left_out():
    facts = clean_facts()
    facts["h1"] = with_mtu(facts, "h1", "10.0.0.11", 1500)
    facts["h2"] = with_mtu(facts, "h2", "10.0.0.12", 1500)
    assert severities(fabric.check_mtu(make_replica(), facts, None), "network.mtu") == [
        Severity.OK]
    assert fabric.check_mtu(make_replica(), clean_facts(), None) == []


def test_rdma_on_some_nodes_only_is_a_warning():
    facts = clean_facts()
    active = RdmaPort("mlx5_0", 1, "ACTIVE", "InfiniBand", "28.39.1002")
    facts["h1"] = replace(facts["h1"], rdma_ports=(active,))
    facts["h2"] = replace(facts["h2"], rdma_ports=(replace(active, state="DOWN"),))
    [finding] = fabric.check_rdma(make_replica(), facts)
    assert finding.severity is Severity.WARNING
    assert "active on h1" in finding.actual and "h2: mlx5_0/1 DOWN" in finding.actual
    facts["h2"] = replace(facts["h2"], rdma_ports=(active,))
    assert severities(fabric.check_rdma(make_replica(), facts), "network.rdma") == [Severity.OK]
    assert severities(fabric.check_rdma(make_replica(), clean_facts()), "network.rdma") == [
        Severity.OK]


def test_ecc_and_xid_errors_name_the_gpu():
    facts = replace(clean_facts()["h1"], gpus=gpus(ecc_uncorrected={1: 2}), xid_events=(
        XidEvent("0000:3a:00", 79, "NVRM: Xid (PCI:0000:3a:00): 79, GPU has fallen off"),))
    findings = gpu_health.check_gpu_errors(node(), facts, range(4))
    errors = {f.item: f.actual for f in findings if f.severity is Severity.ERROR}
    assert errors == {"GPU 1 (00000000:2A:00.0)": "2 uncorrectable ECC errors",
                      "GPU 2 (00000000:3A:00.0)": "Xid 79 in the last 24 h"}
    # a fault on a GPU the replica does not use is not an error
    assert severities(gpu_health.check_gpu_errors(node(), facts, range(1)), "gpu.errors") == [
        Severity.OK]


def test_mig_on_a_used_gpu_is_an_error():
    facts = replace(clean_facts()["h1"], gpus=gpus(mig_mode={3: True}))
    [finding] = gpu_health.check_mig(node(), facts, range(4))
    assert finding.severity is Severity.ERROR and finding.actual == "Enabled on GPU 3"
    assert gpu_health.check_mig(node(), facts, range(2))[0].severity is Severity.OK


def test_persistence_off_is_a_warning():
    facts = replace(clean_facts()["h1"], gpus=gpus(persistence_mode={0: False, 2: False}))
    [finding] = gpu_health.check_persistence(node(), facts, range(4))
    assert finding.severity is Severity.WARNING and finding.actual == "Disabled on GPU 0, 2"
    healthy = replace(clean_facts()["h1"], gpus=gpus())
    assert gpu_health.check_persistence(node(), healthy, range(4))[0].severity is Severity.OK


def test_nvswitch_without_fabric_manager_is_an_error():
    base = clean_facts()["h1"]
    assert gpu_health.check_fabric_manager(node(), base) == []
    for state in ("not-found", "failed", "inactive"):
        [finding] = gpu_health.check_fabric_manager(
            node(), replace(base, nvswitch_count=4, fabric_manager=state))
        assert finding.severity is Severity.ERROR and finding.actual == state
    ok = replace(base, nvswitch_count=4, fabric_manager="active")
    assert gpu_health.check_fabric_manager(node(), ok)[0].severity is Severity.OK


def test_clock_offset_and_sync():
    base = clean_facts()["h1"]
    far = replace(base, clock=ClockSync(True, True, 2.413, "chrony"))
    [finding] = gpu_health.check_clock(node(), far)
    assert finding.severity is Severity.WARNING and finding.actual == "+2.413 s (chrony)"
    near = replace(base, clock=ClockSync(True, True, -0.0000015, "chrony"))
    assert gpu_health.check_clock(node(), near)[0].severity is Severity.OK
    unsynced = replace(base, clock=ClockSync(False, False, None, "timedatectl"))
    assert gpu_health.check_clock(node(), unsynced)[0].severity is Severity.WARNING
    contained = replace(unsynced, clock=replace(unsynced.clock, container="systemd-nspawn"))
    assert gpu_health.check_clock(node(), contained)[0].severity is Severity.OK
    assert gpu_health.check_clock(node(), base) == []


def test_check_replica_runs_the_new_checks():
    facts = clean_facts()
    facts["h2"] = replace(with_mtu(facts, "h2", "10.0.0.12", 9000), gpus=gpus(mig_mode={0: True}))
    findings = check_replica(make_replica(), facts, settings_for(make_replica(), load_defaults()))
    checks = {f.check for f in findings if f.severity is Severity.ERROR}
    assert "gpu.mig" in checks
    facts["h1"] = with_mtu(facts, "h1", "10.0.0.11", 1500)
    findings = check_replica(make_replica(), facts, settings_for(make_replica(), load_defaults()))
    assert "network.mtu" in {f.check for f in findings if f.severity is Severity.ERROR}


def test_memory_never_expects_zero_mib():
    facts = clean_facts()["h1"]
    [unknown] = host.check_memory(node(), facts, 0)
    assert unknown.expected.startswith("skipped: the model's size is unknown")
    [small] = host.check_memory(node(), facts, 850)
    assert small.expected == ">= 1 MiB"
    low = replace(facts, mem_available_bytes=10 * 1024 * 1024)
    assert host.check_memory(node(), low, 64 * 1024**3)[0].severity is Severity.WARNING


def test_gpu_processes_once_per_gpu_with_the_index():
    facts = replace(make_facts("h1", "10.0.0.11"), gpu_processes=tuple(
        GpuProcess(4711, "VLLM::Worker", 70000, f"GPU-h1-{i}", "vllm.service")
        for i in (3, 1)))
    assert gpu_processes_text(facts) == ("GPU 1: 4711 VLLM::Worker [vllm.service], "
                                         "GPU 3: 4711 VLLM::Worker [vllm.service]")


def test_check_names_do_not_break_at_80_columns(capsys, monkeypatch):
    from vllm_provision.cli.check import render_findings

    monkeypatch.setenv("COLUMNS", "80")
    names = ["network.watchdog_port", "gpu.fabric_manager", "parity.nccl_net_plugin"]
    render_findings([Finding(name, Severity.ERROR, "h1", "an item with several words",
                             expected="a long expectation " * 3, actual="a long value " * 3,
                             fix="a long fix " * 4) for name in names])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for name in names:
        assert re.search(rf"\b{re.escape(name)}\b", out), name
    # no word of the other fields is broken either
    for word in ("expectation", "several", "value"):
        assert out.count(word) == {"expectation": 9, "several": 3, "value": 9}[word], word


@pytest.mark.parametrize("columns", ["200", "60"])
def test_bracketed_values_are_printed_as_data_not_markup(capsys, monkeypatch, columns):
    # gpu_processes_text() names the unit in brackets; rich would read "[vllm.service]" as a tag
    from vllm_provision.cli.check import render_findings

    monkeypatch.setenv("COLUMNS", columns)
    render_findings([Finding("gpu.foreign_processes", Severity.ERROR, "h1", "GPU processes",
                             expected="none [bold]", actual="GPU 1: 4711 x [vllm.service]",
                             fix="stop [/] it")])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("none [bold]", "[vllm.service]", "stop [/] it"):
        assert text in out, (text, out)


def test_a_dropped_peer_port_is_an_error_naming_the_port_and_both_nodes():
    from vllm_provision.facts.gather import peer_ports
    from vllm_provision.facts.model import Reachability

    replica = make_replica()
    served = peer_ports(replica)
    assert served == {"h1": [(8000, "API port"), (29510, "watchdog port")],
                      "h2": [(29510, "watchdog port")]}
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], reachability=(
        Reachability("10.0.0.11", 8000, True, "", 0.01),
        Reachability("10.0.0.11", 29510, False, "timed out", 8.0)))
    facts["h1"] = replace(facts["h1"], reachability=(
        Reachability("10.0.0.12", 29510, True, "", 0.01),))
    findings = fabric.check_peer_reach(replica, facts)
    [error] = [f for f in findings if f.severity is Severity.ERROR]
    assert error.host == "h2" and error.item == "TCP to h1's watchdog port 10.0.0.11:29510"
    assert error.actual == "timed out" and "29510 from h2 to h1" in error.fix
    [ok] = [f for f in findings if f.severity is Severity.OK]
    assert ok.host == "h1" and ok.actual == "h2:29510"
    assert fabric.check_peer_reach(replica, clean_facts()) == []
