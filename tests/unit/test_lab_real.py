"""The real-vLLM lab (docs/real-vllm.md): inventory, per-node env, CPU preflight, base recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_templates import _replica, env_values, render
from vllm_provision_lab import base, real
from vllm_provision_lab.config import LabConfig
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.inventories import real_inventory_text

from vllm_provision.checks import run as checks_run
from vllm_provision.checks.finding import Severity
from vllm_provision.facts.model import HostFacts
from vllm_provision.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]


def test_committed_real_inventory_equals_generated_for_default_instance() -> None:
    committed = (REPO / "inventory" / "lab-real.yml").read_text()
    assert committed == real_inventory_text(LabConfig())


def _real_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(real_inventory_text(LabConfig(state_dir=Path("/srv/lab-x"), name="x1",
                                                  net="10.9.8")))
    return path


def test_real_inventory_is_a_cpu_mp_replica_with_one_rank_per_host(tmp_path: Path) -> None:
    (replica,) = load_inventory(_real_inventory(tmp_path)).replicas
    assert replica.backend == "mp"
    assert replica.vars["vllm_device"] == "cpu"
    assert [(n.host.name, n.rank, n.host.address) for n in replica.nodes] == [
        ("h1", 0, "10.9.8.11"), ("h2", 1, "10.9.8.12")]
    assert replica.engine.tensor_parallel_size * replica.engine.pipeline_parallel_size == 2
    assert replica.engine.model == real.MODEL_DIR
    assert "--enforce-eager" in replica.engine.extra_args
    binds = [n.host.vars["vllm_node_env"]["VLLM_CPU_OMP_THREADS_BIND"] for n in replica.nodes]
    assert binds == ["0", "1"]


def test_node_env_is_added_after_vllm_env_and_differs_per_node() -> None:
    replica = _replica()
    shared = {"TORCHDYNAMO_DISABLE": "1", "VLLM_CPU_OMP_THREADS_BIND": "all"}
    values = [env_values(render("vllm_mp/templates/vllm.env.j2", replica, rank, vllm_env=shared,
                                vllm_node_env={"VLLM_CPU_OMP_THREADS_BIND": str(rank)}))
              for rank in (0, 1)]
    assert [v["VLLM_CPU_OMP_THREADS_BIND"] for v in values] == ["0", "1"]
    assert all(v["TORCHDYNAMO_DISABLE"] == "1" for v in values)
    assert all(v["GLOO_SOCKET_IFNAME"] == "eth0" for v in values)
    assert values[0]["VLLM_CACHE_ROOT"] != values[0]["TMPDIR"]


def _cpu_facts(host: str, cpus: int) -> HostFacts:
    return HostFacts(host=host, nvidia_smi_error="nvidia-smi: command not found", cpu_count=cpus)


@pytest.mark.parametrize(("cpus", "severity"), [(2, Severity.OK), (0, Severity.ERROR)])
def test_cpu_device_replaces_the_gpu_checks(tmp_path: Path, cpus: int,
                                            severity: Severity) -> None:
    (replica,) = load_inventory(_real_inventory(tmp_path)).replicas
    facts = {n.name: _cpu_facts(n.name, cpus) for n in replica.nodes}
    findings = checks_run.check_replica(replica, facts, checks_run.settings_for(replica))
    checks = {f.check for f in findings}
    assert "host.gpus" not in checks and "host.gpu_processes" not in checks
    device = [f for f in findings if f.check == "host.device"]
    assert [f.severity for f in device] == [severity, severity]
    per_node = [f for f in findings if f.check == "topology.gpus"]
    assert {f.severity for f in per_node} == {severity}


def test_gpu_inventory_without_nvidia_smi_still_fails_host_gpus(tmp_path: Path) -> None:
    path = _real_inventory(tmp_path)
    path.write_text(path.read_text().replace("vllm_device: cpu", "vllm_device: cuda"))
    (replica,) = load_inventory(path).replicas
    facts = {n.name: _cpu_facts(n.name, 2) for n in replica.nodes}
    findings = checks_run.check_replica(replica, facts, checks_run.settings_for(replica))
    assert {f.severity for f in findings if f.check == "host.gpus"} == {Severity.ERROR}


def test_real_base_has_its_own_cache_key_and_the_standin_key_is_unchanged() -> None:
    assert base.base_key("real") != base.base_key("standin")
    assert base.base_key("real").startswith("bookworm-real-")
    assert base.base_key() == base.base_key("standin")


def test_local_wheel_folder_is_found_only_with_the_torch_cpu_wheel(tmp_path: Path) -> None:
    empty, wheels = tmp_path / "empty", tmp_path / "wheels"
    empty.mkdir()
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert real.find_local_wheel_dir([str(empty), str(wheels)]) == str(wheels)
    assert real.find_local_wheel_dir([str(empty), str(tmp_path / "missing")]) is None


def test_no_torch_source_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real, "find_local_wheel_dir", lambda: None)
    monkeypatch.setattr(real, "index_reachable", lambda: False)
    with pytest.raises(LabError) as caught:
        real.torch_source()
    problem = caught.value.problems[0]
    assert real.WHEELS_ENV in (problem.fix or "")
    assert real.TORCH_CPU_INDEX in (problem.expected or "")


def test_index_is_used_when_no_local_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real, "find_local_wheel_dir", lambda: None)
    monkeypatch.setattr(real, "index_reachable", lambda: True)
    source = real.torch_source()
    assert source.kind == "PyTorch CPU index"
    assert source.pip_args == ("--extra-index-url", real.TORCH_CPU_INDEX) and not source.binds


def test_shim_names_the_distribution_vllm_with_cpu_in_its_version(tmp_path: Path) -> None:
    from importlib.metadata import distributions

    real.write_shim(tmp_path)
    (dist,) = [d for d in distributions(path=[str(tmp_path)])]
    assert dist.metadata["Name"] == "vllm"
    assert "cpu" in dist.version


@pytest.mark.parametrize(("running", "wanted", "same"), [
    ("0.32.0", "0.32.0+cpu", True), ("0.32.0+cpu", "0.32.0", True),
    ("0.32.0", "0.32.0", True), ("0.32.0", "0.33.0+cpu", False),
    ("0.32.0+cu129", "0.32.0+cpu", False), ("0.32.1", "0.32.0", False)])
def test_verify_ignores_a_local_label_on_one_side_only(running: str, wanted: str,
                                                        same: bool) -> None:
    from vllm_provision.modules.vllm_verify import same_version

    assert same_version(running, wanted) is same
