"""GPU sets per node (``vllm_gpus``, docs/inventory.md "GPU sets"): what the loader refuses and
in which words, what the env files render with and without it, and that every check that looks
at GPUs reads only the chosen ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from inventory_support import replicas_yaml, write_inventory
from test_templates import _replica, env_values, exec_start, render

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.inventory import load_inventory


def gpu_inventory(tmp_path: Path, *, h1: str = "[2, 3]", h2: str = "[2, 3]",
                  backend: str = "mp", tp: int = 2, pp: int = 2, group: str = "",
                  host_more: str = "", name: str = "inventory.yml") -> Path:
    """A replica ``llama`` of h1 (rank 0) and h2, TP x PP over both, each host's ``vllm_gpus``
    as YAML text (``""``: unset); ``group``: more group vars, one ``key: value`` per line;
    ``host_more``: more flow-mapping entries of h1 (``", ray_num_gpus: 4"``)."""
    def host(name: str, rank: int, gpus: str, more: str = "") -> str:
        value = f", vllm_gpus: {gpus}" if gpus else ""
        return (f"            {name}: {{ansible_host: 10.0.0.{11 + rank}, "
                f"vllm_node_rank: {rank}{value}{more}}}\n")

    extra = "".join(f"            {line.strip()}\n" for line in group.splitlines() if line.strip())
    text = replicas_yaml(
        "        llama:\n          vars:\n"
        f"            vllm_backend: {backend}\n"
        "            vllm_model: /srv/models/tiny\n"
        f"            vllm_tensor_parallel_size: {tp}\n"
        f"            vllm_pipeline_parallel_size: {pp}\n"
        + extra + "          hosts:\n" + host("h1", 0, h1, host_more) + host("h2", 1, h2),
        all_vars="{ansible_user: root}")
    return write_inventory(tmp_path, text, name)


def load(tmp_path: Path, **kwargs: object) -> Inventory:
    return load_inventory(gpu_inventory(tmp_path, **kwargs))  # type: ignore[arg-type]


def refusal(tmp_path: Path, **kwargs: object) -> list:
    """The problems of loading :func:`gpu_inventory` (which must be refused)."""
    with pytest.raises(ProvisionError) as caught:
        load(tmp_path, **kwargs)
    return caught.value.problems


# -- the loader -----------------------------------------------------------------------------

def test_unset_nodes_have_no_gpu_set_and_use_the_first_gpus(tmp_path: Path) -> None:
    [replica] = load(tmp_path, h1="", h2="", tp=4, pp=2).replicas
    assert [node.gpus for node in replica.nodes] == [None, None]
    assert replica.node_gpus(replica.master) == (0, 1, 2, 3)


def test_a_gpu_set_per_host_or_per_group_reaches_each_node_in_its_order(tmp_path: Path) -> None:
    [replica] = load(tmp_path, h1="[3, 1]", h2="", group="vllm_gpus: [4, 5, 6]").replicas
    assert [node.gpus for node in replica.nodes] == [(3, 1), (4, 5, 6)]
    assert replica.node_gpus(replica.nodes[1]) == (4, 5, 6)  # more than needed: all listed


@pytest.mark.parametrize(("value", "expected"), [
    ("[2, 2]", "distinct GPU indexes (listed more than once: 2)"),
    ("[-1, 3]", "GPU indexes >= 0, nvidia-smi's index column (bad item -1)"),
    ("[]", "at least one GPU index, such as [2, 3] (remove vllm_gpus to use GPUs 0..N-1)"),
])
def test_a_value_that_is_no_set_of_gpu_indexes_is_refused_naming_file_host_and_item(
        tmp_path: Path, value: str, expected: str) -> None:
    [problem] = refusal(tmp_path, h2=value)
    assert problem.where.startswith(f"{tmp_path / 'inventory.yml'}:")
    assert problem.where.endswith("llama.hosts.h2.vllm_gpus")
    assert problem.message == "vllm_gpus has an invalid value"
    assert problem.expected == expected
    assert problem.fix == "write e.g. vllm_gpus: [2, 3]"


@pytest.mark.parametrize("value", ["'2,3'", "[true, 3]", "['2', '3']", "[2.0, 3]", "2"])
def test_anything_but_a_list_of_integers_is_the_wrong_type(tmp_path: Path, value: str) -> None:
    [problem] = refusal(tmp_path, h1=value)
    assert problem.where.endswith("llama.hosts.h1.vllm_gpus")
    assert (problem.message, problem.expected) == ("vllm_gpus has the wrong type",
                                                  "a list of integers")
    assert problem.fix == "write a list of integers (no quotes), e.g. vllm_gpus: [2, 3]"


def test_extra_vars_give_a_list_of_integers(tmp_path: Path) -> None:
    inventory = load_inventory(gpu_inventory(tmp_path, h1="", h2=""),
                               extra_vars={"vllm_gpus": "[6, 7]"})
    assert [n.gpus for n in inventory.replicas[0].nodes] == [(6, 7), (6, 7)]
    with pytest.raises(ProvisionError, match="vllm_gpus has the wrong type"):
        load_inventory(gpu_inventory(tmp_path, h1="", h2=""), extra_vars={"vllm_gpus": "6,7"})


def test_fewer_gpus_than_the_node_runs_names_replica_node_count_and_variable(
        tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, tp=4, pp=2, h1="[0, 1, 2, 3]", h2="[2, 3]")
    assert problem.where.endswith("llama.hosts.h2.vllm_gpus")
    assert problem.message == ("vllm_gpus of h2 lists 2 GPUs, but replica 'llama' needs 4 on "
                               "each node (TP x PP 8 over 2 nodes)")
    assert (problem.expected, problem.actual) == ("at least 4 GPU indexes in vllm_gpus", "[2, 3]")
    assert problem.fix == "list 4 of h2's GPUs in vllm_gpus, or lower the replica's TP x PP"


def test_data_parallel_needs_every_local_engine_in_the_set(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, tp=2, pp=1, h1="[0, 1, 2]", h2="[0, 1, 2, 3]",
                        group="vllm_data_parallel_size: 4\nvllm_data_parallel_size_local: 2")
    assert problem.message == ("vllm_gpus of h1 lists 3 GPUs, but replica 'llama' needs 4 on "
                               "each node (2 data-parallel engines x TP x PP 2)")
    assert problem.fix.endswith("or lower the replica's TP x PP or "
                                "vllm_data_parallel_size_local")


def test_a_gpu_set_on_a_cpu_replica_is_refused(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, h2="", group="vllm_device: cpu")
    assert problem.message == ("vllm_gpus is set on h1, but replica 'llama' runs on CPUs "
                               "(vllm_device: cpu)")


def test_ray_num_gpus_above_the_set_is_refused_in_rays_words(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, backend="ray", host_more=", ray_num_gpus: 4")
    assert problem.where.endswith("llama.hosts.h1.ray_num_gpus")
    assert problem.message == ("ray_num_gpus 4 of h1 is more than the 2 GPUs of its vllm_gpus "
                               "[2, 3]; Ray would not start: Attempting to start raylet with 4 "
                               "GPU, but CUDA_VISIBLE_DEVICES contains ['2', '3'].")
    # as many or fewer is Ray's own business (it uses that many of the visible GPUs)
    load(tmp_path, backend="ray", host_more=", ray_num_gpus: 2")


def test_cuda_visible_devices_in_an_env_mapping_is_refused_once(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, group="vllm_env: {CUDA_VISIBLE_DEVICES: '0,1'}")
    assert problem.where.endswith("llama.vars.vllm_env.CUDA_VISIBLE_DEVICES")
    assert problem.message == ("vllm_env sets CUDA_VISIBLE_DEVICES, which follows from "
                               "vllm_gpus ([2, 3]) on host h1")
    # without vllm_gpus the operator's own CUDA_VISIBLE_DEVICES stays as before
    load(tmp_path, h1="", h2="", group="vllm_env: {CUDA_VISIBLE_DEVICES: '0,1'}")
    [order] = refusal(tmp_path, host_more=", vllm_node_env: {CUDA_DEVICE_ORDER: FASTEST_FIRST}")
    assert order.where.endswith("llama.hosts.h1.vllm_node_env.CUDA_DEVICE_ORDER")
    assert order.fix == "remove CUDA_DEVICE_ORDER from vllm_node_env and list the GPUs in vllm_gpus"


# -- what the nodes get ---------------------------------------------------------------------

def gpu_replica(backend: str = "mp", gpus: tuple[int, ...] | None = (2, 3)) -> Replica:
    """The templates' two-node replica (TP=4 x PP=2: 4 GPUs per node) with ``gpus`` on both."""
    replica = _replica(backend)
    return replace(replica, nodes=tuple(replace(n, gpus=gpus) for n in replica.nodes))


ENV_FILES = [("mp", "vllm_mp/templates/vllm.env.j2", 1), ("ray", "ray/templates/ray.env.j2", 1),
             ("ray", "ray/templates/ray.env.j2", 0), ("ray", "vllm_ray/templates/vllm.env.j2", 0)]


@pytest.mark.parametrize(("backend", "template", "rank"), ENV_FILES)
def test_a_gpu_set_is_rendered_into_every_env_file_of_the_node(backend: str, template: str,
                                                              rank: int) -> None:
    values = env_values(render(template, gpu_replica(backend, (6, 2, 3, 5)), rank))
    assert values["CUDA_VISIBLE_DEVICES"] == "6,2,3,5"  # the list's order: CUDA's numbering
    assert values["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # so the numbers are nvidia-smi's


@pytest.mark.parametrize(("backend", "template", "rank"), ENV_FILES)
def test_without_a_gpu_set_no_env_file_names_gpus(backend: str, template: str,
                                                  rank: int) -> None:
    text = render(template, gpu_replica(backend, None), rank)
    assert "CUDA_VISIBLE_DEVICES" not in text and "CUDA_DEVICE_ORDER" not in text


def test_rays_gpus_are_the_sets_unless_ray_num_gpus_says_fewer() -> None:
    replica = gpu_replica("ray", (2, 3, 5))
    facts = SimpleNamespace(gpus=[0, 1, 2, 3, 4, 5, 6, 7])

    def num_gpus(unit: str, rank: int, **extra: object) -> list[str]:
        words = exec_start(render(f"ray/templates/{unit}", replica, rank, **extra))
        return [w for w in words if w.startswith("--num-gpus")]

    assert num_gpus("ray-worker.service.j2", 1, ray_num_gpus=None, facts=facts) == [
        "--num-gpus=3"]
    assert num_gpus("ray-head.service.j2", 0, ray_num_gpus=None, facts=facts) == [
        "--num-gpus=3"]
    assert num_gpus("ray-worker.service.j2", 1, ray_num_gpus=2) == ["--num-gpus=2"]
    unset = replace(replica, nodes=tuple(replace(n, gpus=None) for n in replica.nodes))
    words = exec_start(render("ray/templates/ray-worker.service.j2", unset, 1,
                              ray_num_gpus=None, facts=facts))
    assert "--num-gpus=8" in words  # as before: the GPUs facts found


def test_ray_waits_for_the_sets_gpus_not_the_hosts() -> None:
    from vllm_provision.modules.ray_wait_cluster import expected_gpus

    replica = gpu_replica("ray", (2, 3, 5))
    ctx = SimpleNamespace(facts={n.name: SimpleNamespace(gpus=[0] * 8) for n in replica.nodes},
                          vars={})
    assert set(expected_gpus(ctx, replica, None).values()) == {3.0}  # type: ignore[arg-type]
