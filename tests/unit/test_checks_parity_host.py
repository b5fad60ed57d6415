"""Parity policy, pins, driver minimum, network and host checks on synthetic facts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_provision.checks import host, network, parity
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import check_replica, is_skipped, load_defaults, settings_for
from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.facts.model import (
    Gpu,
    GpuProcess,
    HostFacts,
    Interface,
    ListeningSocket,
    ModelFile,
    Reachability,
    ServiceUser,
)

POLICY = load_defaults()["preflight_parity"]


def make_replica(backend: str = "mp", vars: dict | None = None) -> Replica:
    nodes = tuple(Node(Host(f"h{i + 1}", f"10.0.0.{11 + i}"), i, f"10.0.0.{11 + i}")
                  for i in range(2))
    return Replica("llama", backend, nodes,  # type: ignore[arg-type]
                   EngineArgs(model="/srv/models/m", tensor_parallel_size=4,
                              pipeline_parallel_size=2), vars=vars or {})


def make_facts(name: str, ip: str, **changes) -> HostFacts:
    base = HostFacts(
        host=name, python_path="/opt/vllm/bin/python", venv_found=True,
        python_version="3.11.2 (main) [GCC 12.2.0]", python_micro="3.11.2",
        packages={"vllm": "0.33.0", "torch": "2.14.0+cu130", "ray": "2.60.0",
                  "transformers": "5.19.0", "nvidia-nccl-cu13": "2.28.9",
                  "nvidia-nccl-cu12": None},
        torch_cuda="cu130", driver_version="580.95.05", cuda_driver_version="13.0",
        gpus=tuple(Gpu(i, "NVIDIA H200", 143771, f"GPU-{name}-{i}") for i in range(4)),
        hostname=name, hostname_addresses=(ip,),
        interfaces={"eth0": Interface("eth0", "UP", ("UP", "LOWER_UP"), (ip,))},
        shm_bytes=8 * 1024**3, mem_available_bytes=64 * 1024**3, cpu_count=32,
        model_path="/srv/models/m",
        model_files=(ModelFile("config.json", 700), ModelFile("model.safetensors", 1000)),
        service_user=ServiceUser("vllm", True, 998, 999), systemd_version=252,
        openssh_version="9.2",
    )
    return replace(base, **changes)


def clean_facts() -> dict[str, HostFacts]:
    return {"h1": make_facts("h1", "10.0.0.11"), "h2": make_facts("h2", "10.0.0.12")}


def errors_of(findings):
    return [f for f in findings if f.severity is Severity.ERROR]


def test_clean_replica_has_no_error_and_no_warning(monkeypatch):
    from vllm_table_support import clear, text_with, use_table

    use_table(monkeypatch, text_with("0.33.0"))  # the vllm serve table knows the facts' vLLM
    findings = check_replica(make_replica(), clean_facts(), settings_for(make_replica()))
    assert [f for f in findings if f.severity is not Severity.OK] == []
    assert {f.check for f in findings} >= {"vllm_serve.options", "vllm_serve.rules"}
    clear()


def test_nccl_difference_names_host_both_values_and_the_fix():
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], packages={**facts["h2"].packages,
                                                 "nvidia-nccl-cu13": "2.27.3"})
    [finding] = errors_of(parity.check_parity(make_replica(), facts, POLICY))
    assert (finding.check, finding.host) == ("parity.nccl", "h2")
    assert finding.expected == "2.28.9 (as on h1)" and finding.actual == "2.27.3 (on h2)"
    assert finding.fix == ("install nvidia-nccl-cu13==2.28.9 in /opt/vllm on h2, or pin every "
                           "node to the same version")


def test_policy_override_turns_an_item_into_a_warning_or_off():
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], packages={**facts["h2"].packages, "transformers": "5.0"})
    warn = parity.check_parity(make_replica(), facts, {**POLICY, "transformers": "warning"})
    assert [f.severity for f in warn if f.check == "parity.transformers"] == [Severity.WARNING]
    off = parity.check_parity(make_replica(), facts, {**POLICY, "transformers": "off"})
    assert not [f for f in off if f.check == "parity.transformers"]


def test_inventory_override_of_the_policy_merges_with_the_defaults():
    settings = settings_for(make_replica(vars={"preflight_parity": {"transformers": "warning"}}))
    assert settings.parity["transformers"] == "warning"
    assert settings.parity["nccl"] == "error"


def test_ray_version_is_compared_only_for_ray_replicas():
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], packages={**facts["h2"].packages, "ray": "2.59.0"})
    assert not errors_of(parity.check_parity(make_replica("mp"), facts, POLICY))
    assert [f.check for f in errors_of(parity.check_parity(make_replica("ray"), facts, POLICY))
            ] == ["parity.ray"]


def test_driver_patch_difference_is_a_warning_and_branch_difference_an_error():
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], driver_version="580.82.07")
    findings = parity.check_parity(make_replica(), facts, POLICY)
    assert [(f.check, f.severity) for f in findings if f.severity is not Severity.OK] == [
        ("parity.driver_patch", Severity.WARNING)]
    facts["h2"] = replace(facts["h2"], driver_version="570.86.15")
    findings = parity.check_parity(make_replica(), facts, POLICY)
    assert [(f.check, f.severity) for f in findings if f.severity is not Severity.OK] == [
        ("parity.driver_branch", Severity.ERROR)]


def test_missing_model_file_is_named():
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], model_files=(ModelFile("model.safetensors", 1000),))
    [finding] = errors_of(parity.check_parity(make_replica(), facts, POLICY))
    assert finding.check == "parity.model_manifest" and "missing config.json" in finding.actual


def test_pins_are_checked_on_every_node():
    findings = parity.check_pins(make_replica(), clean_facts(), {"vllm_version": "0.34.0"})
    assert [(f.host, f.severity) for f in findings] == [("h1", Severity.ERROR),
                                                       ("h2", Severity.ERROR)]
    assert findings[0].fix.startswith("install vllm==0.34.0 in /opt/vllm on h1")


def test_cuda13_torch_needs_a_580_driver():
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], driver_version="570.86.15")
    [finding] = errors_of(parity.check_driver_minimum(make_replica(), facts))
    assert finding.host == "h2" and finding.expected.startswith(">= 580")


def test_interface_down_and_host_ip_not_on_it():
    replica = make_replica()
    f = replace(clean_facts()["h2"],
                interfaces={"eth0": Interface("eth0", "DOWN", ("BROADCAST",), ("10.9.9.9",))})
    checks = {x.check for x in errors_of(network.check_interface(replica.nodes[1], f, "eth0"))}
    assert checks == {"network.interface", "network.host_ip"}
    missing = network.check_interface(replica.nodes[1], f, "ib0")
    assert errors_of(missing)[0].actual.startswith("absent")


def test_unreachable_master_port_is_an_error_for_the_follower():
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], reachability=(
        Reachability("10.0.0.11", 29501, False, "[Errno 111] Connection refused", 8.0),))
    [finding] = network.check_reachability(make_replica(), facts, 29501, "master port")
    assert finding.severity is Severity.ERROR and finding.host == "h2"


def test_port_held_by_a_foreign_process_is_an_error_ours_is_ok():
    node = make_replica().nodes[0]
    f = replace(clean_facts()["h1"], listening=(
        ListeningSocket("0.0.0.0", 29501, "python3", 4242, "stray.service"),
        ListeningSocket("0.0.0.0", 8000, "python3", 812, "vllm.service")))
    findings = network.check_ports(node, f, [(8000, "API port"), (29501, "master port")],
                                   ("vllm.service",))
    assert [(x.item, x.severity) for x in findings] == [("API port 8000", Severity.OK),
                                                        ("master port 29501", Severity.ERROR)]
    assert "pid 4242" in findings[1].actual


def watchdog_port_findings(listening: dict[str, tuple[ListeningSocket, ...]],
                           backend: str = "mp", vars: dict | None = None,
                           host_vars: dict[str, dict] | None = None):
    """``network.ports`` findings about the watchdog port of the two-node replica."""
    replica = make_replica(backend, vars)
    if host_vars:
        replica = replace(replica, nodes=tuple(
            replace(node, host=replace(node.host, vars=host_vars.get(node.name, {})))
            for node in replica.nodes))
    facts = {name: replace(f, listening=listening.get(name, ()))
             for name, f in clean_facts().items()}
    return [f for f in check_replica(replica, facts, settings_for(replica))
            if f.check == "network.ports" and f.item.startswith("watchdog port")]


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_watchdog_port_is_checked_on_every_node_free_or_ours_is_ok(backend):
    findings = watchdog_port_findings({"h1": (ListeningSocket(
        "10.0.0.11", 29510, "python3", 77, "vllm-watchdog.service"),)}, backend)
    assert [(f.host, f.item, f.severity, f.actual) for f in findings] == [
        ("h1", "watchdog port 29510", Severity.OK, "held by vllm-watchdog.service"),
        ("h2", "watchdog port 29510", Severity.OK, "free")]


def test_watchdog_port_held_by_a_foreign_process_names_host_port_process_and_fix():
    [error] = [f for f in watchdog_port_findings({"h2": (ListeningSocket(
        "0.0.0.0", 29510, "node", 4242, "grafana-agent.service"),)})
        if f.severity is Severity.ERROR]
    assert (error.host, error.item) == ("h2", "watchdog port 29510")
    assert error.actual == "in use by node (pid 4242, grafana-agent.service) on 0.0.0.0"
    assert error.expected == "free or held by vllm-watchdog.service"
    assert error.fix.startswith("stop node (pid 4242, grafana-agent.service) on h2, or set "
                                "vllm_watchdog_port")
    assert "docs/recovery.md" in error.source


def test_watchdog_port_held_by_our_vllm_unit_is_an_error():
    # Only the watchdog may hold its port: vLLM there means two of our ports are the same.
    [finding] = [f for f in watchdog_port_findings({"h1": (ListeningSocket(
        "0.0.0.0", 29510, "python3", 812, "vllm.service"),)}) if f.host == "h1"]
    assert finding.severity is Severity.ERROR and "vllm.service" in finding.actual


def test_watchdog_port_held_by_a_process_ss_could_not_name_is_an_error():
    [finding] = [f for f in watchdog_port_findings(
        {"h2": (ListeningSocket("*", 29510),)}) if f.host == "h2"]
    assert finding.severity is Severity.ERROR
    assert finding.actual == "in use by a process on *"


def test_watchdog_port_and_unit_come_from_group_vars_and_a_nodes_host_vars_win():
    stray = ListeningSocket("0.0.0.0", 29510, "nc", 5, "stray.service")
    findings = watchdog_port_findings(
        {"h1": (stray, ListeningSocket("10.0.0.11", 29600, "python3", 6, "wd.service")),
         "h2": (stray, ListeningSocket("0.0.0.0", 29700, "nc", 7, "other.service"))},
        vars={"vllm_watchdog_port": 29600, "vllm_watchdog_unit_name": "wd.service"},
        host_vars={"h2": {"vllm_watchdog_port": 29700}})
    assert [(f.host, f.item, f.severity) for f in findings] == [
        ("h1", "watchdog port 29600", Severity.OK),
        ("h2", "watchdog port 29700", Severity.ERROR)]


def test_watchdog_port_error_is_skipped_with_network_ports():
    replica = make_replica()
    facts = {**clean_facts()}
    facts["h2"] = replace(facts["h2"], listening=(ListeningSocket("0.0.0.0", 29510),))
    assert errors_of(check_replica(replica, facts, settings_for(replica)))
    findings = [f for f in check_replica(replica, facts, settings_for(replica))
                if not is_skipped(f.check, ["network.ports"])]
    assert errors_of(findings) == []


def test_shm_too_small_is_an_error():
    f = replace(clean_facts()["h1"], shm_bytes=64 * 1024 * 1024)
    [finding] = host.check_shm(make_replica().nodes[0], f, 1024)
    assert finding.severity is Severity.ERROR and finding.actual == "64 MiB"


def test_remove_ipc_with_a_login_user_is_an_error_system_user_ok():
    node = make_replica().nodes[0]
    login = replace(clean_facts()["h1"], service_user=ServiceUser("vllm", True, 1001, 999))
    assert host.check_remove_ipc(node, login)[0].severity is Severity.ERROR
    assert host.check_remove_ipc(node, replace(login, remove_ipc=False))[0].severity is \
        Severity.OK
    assert host.check_remove_ipc(node, clean_facts()["h1"])[0].severity is Severity.OK


def test_foreign_gpu_process_is_an_error_our_unit_is_not():
    node = make_replica().nodes[1]
    theirs = replace(clean_facts()["h2"], gpu_processes=(
        GpuProcess(777, "python3", 40000, "GPU-h2-1", "batch.service"),))
    [finding] = host.check_foreign_gpu_processes(node, theirs, ("vllm.service",))
    assert finding.severity is Severity.ERROR and "pid 777" in finding.actual
    ours = replace(theirs, gpu_processes=(GpuProcess(9, "python3", 1, "GPU-h2-1",
                                                     "vllm.service"),))
    assert host.check_foreign_gpu_processes(node, ours, ("vllm.service",))[0].severity is \
        Severity.OK


def test_missing_venv_is_an_error():
    f = replace(clean_facts()["h1"], venv_found=False, python_path="/usr/bin/python3")
    [finding] = host.check_venv(make_replica().nodes[0], f, "/opt/vllm", "mp")
    assert finding.severity is Severity.ERROR and "/usr/bin/python3" in finding.actual


def test_skip_names_match_exactly_or_as_prefix():
    assert is_skipped("parity.nccl", ["parity"])
    assert is_skipped("host.shm", ["host.shm"])
    assert not is_skipped("host.shm_extra", ["host.shm"])


def test_a_gpu_node_that_also_runs_the_front_door_needs_a_core_for_the_router() -> None:
    """vLLM's 2 + N processes on rank 0 (N on a follower) and the router: fewer logical CPUs
    is a warning naming the fix; enough is ok; a node outside vllm_gateways is not asked."""
    nodes = tuple(Node(Host(f"h{i + 1}", f"10.0.0.{11 + i}",
                            groups=("all", "vllm_replicas", "llama", "vllm_gateways")),
                       i, f"10.0.0.{11 + i}") for i in range(2))
    replica = Replica("llama", "mp", nodes,  # type: ignore[arg-type]
                      EngineArgs(model="/srv/models/m", tensor_parallel_size=4,
                                 pipeline_parallel_size=2))
    facts = {"h1": make_facts("h1", "10.0.0.11", cpu_count=6),
             "h2": make_facts("h2", "10.0.0.12", cpu_count=5)}
    found = {f.host: f for f in check_replica(replica, facts, settings_for(replica))
             if f.check == "host.front_door_cpus"}
    assert found["h1"].severity is Severity.WARNING  # 2 + 4 + 1 = 7 > 6
    assert found["h1"].expected == ">= 7 cores (vLLM's 6 processes and the router)"
    assert "front door on a host that runs no replica" in found["h1"].fix
    assert found["h2"].severity is Severity.OK  # a follower: 4 + 1 = 5
    plain = check_replica(make_replica(), clean_facts(), settings_for(make_replica()))
    assert not [f for f in plain if f.check == "host.front_door_cpus"]
