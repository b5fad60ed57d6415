"""A replica without vllm_backend gets vLLM's own default (ParallelConfig.__post_init__ in
vllm/config/parallel.py), and `provision check` says which backend it chose and why."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vllm_provision.checks import topology
from vllm_provision.checks.finding import Severity
from vllm_provision.cli.check import backend_lines, findings_json
from vllm_provision.core.models import Replica
from vllm_provision.inventory import load_inventory

TEMPLATE = """\
all:
  vars: {{ansible_user: root}}
  children:
    vllm_replicas:
      children:
        llama:
          vars: {{vllm_model: /srv/models/m, vllm_tensor_parallel_size: {tp}{backend}}}
          hosts:
{hosts}"""


def load(tmp_path: Path, nodes: int, tp: int, backend: str = "") -> Replica:
    hosts = "".join(f"            h{i + 1}: {{ansible_host: 10.0.0.{11 + i}, "
                    f"vllm_node_rank: {i}}}\n" for i in range(nodes))
    path = tmp_path / "inventory.yml"
    path.write_text(TEMPLATE.format(tp=tp, hosts=hosts,
                                    backend=f", vllm_backend: {backend}" if backend else ""))
    [replica] = load_inventory(path).replicas
    return replica


def test_two_nodes_without_a_backend_get_mp_with_the_reason(tmp_path: Path) -> None:
    replica = load(tmp_path, nodes=2, tp=8)
    assert replica.backend == "mp"
    assert "nnodes > 1 on CUDA" in replica.backend_reason
    assert "vllm/config/parallel.py" in replica.backend_reason
    assert topology.default_backend(8, 2, 4) == ("mp", "")  # the rule it applies


def test_a_set_backend_has_no_reason_and_is_kept(tmp_path: Path) -> None:
    replica = load(tmp_path, nodes=2, tp=8, backend="ray")
    assert (replica.backend, replica.backend_reason) == ("ray", "")
    assert topology.check_default_backend(replica, {"h1": 4, "h2": 4}) == []


def test_one_node_that_holds_the_world_size_gets_mp(tmp_path: Path) -> None:
    replica = load(tmp_path, nodes=1, tp=4)
    assert replica.backend == "mp" and "fits on the node" in replica.backend_reason
    [finding] = topology.check_default_backend(replica, {"h1": 4})
    assert finding.severity is Severity.OK and finding.actual.startswith("mp: vllm_backend is")
    assert "vllm/config/parallel.py" in finding.source


def test_one_node_without_the_gpus_is_the_error_vllm_raises(tmp_path: Path) -> None:
    replica = load(tmp_path, nodes=1, tp=8)
    [finding] = topology.check_default_backend(replica, {"h1": 4})
    assert finding.severity is Severity.ERROR and finding.host == "h1"
    assert finding.actual.startswith("World size (8) is larger than the number of available "
                                     "GPUs (4) in this node.")
    assert "vllm_backend: ray" in finding.fix


def test_world_size_one_says_vllm_would_run_uni(tmp_path: Path) -> None:
    replica = load(tmp_path, nodes=1, tp=1)
    assert replica.backend == "mp" and "uni for world size 1" in replica.backend_reason


def test_check_output_and_json_say_which_backend_and_why(tmp_path: Path) -> None:
    defaulted = load(tmp_path, nodes=2, tp=8)
    explicit = replace(defaulted, name="other", backend_reason="")
    [line, other] = backend_lines([defaulted, explicit])
    assert line.startswith("replica llama: backend mp (chosen: vllm_backend is not set")
    assert "ParallelConfig.__post_init__" in line
    assert other == "replica other: backend mp (vllm_backend)"
    data = findings_json([], [defaulted, explicit])
    assert data["replicas"][0]["backend_source"] == "default"
    assert data["replicas"][0]["backend_reason"] == defaulted.backend_reason
    assert data["replicas"][1] == {"name": "other", "backend": "mp",
                                   "backend_source": "inventory", "backend_reason": ""}
