"""Data-parallel replicas (docs/serving.md, "Data parallel"): the load's rules, the units of both
layouts, the ports, GPUs per node, the front door's workers and the watchdog's rendezvous."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_templates import exec_start, render

from vllm_provision.backends.mp import MpBackend
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.inventory.gateways import workers
from vllm_provision.inventory.loader import load_inventory

UNIT = "vllm_mp/templates/vllm.service.j2"


def _replica(layout: str = "internal", nodes: int = 2, **engine: Any) -> Replica:
    hosts = [Host(name=f"h{i}", address=f"10.213.6.{10 + i}") for i in range(1, nodes + 1)]
    args = {"model": "/srv/models/m", "tensor_parallel_size": 2, "data_parallel_size": 4,
            "data_parallel_size_local": 2, "data_parallel_layout": layout} | engine
    return Replica(name="dp", backend="mp",
                   nodes=tuple(Node(host=h, rank=i, host_ip=h.address)
                               for i, h in enumerate(hosts)),
                   engine=EngineArgs(**args))


def _flags(words: list[str]) -> dict[str, str]:
    return dict(zip(words, words[1:], strict=False))


@pytest.mark.parametrize("rank", [0, 1])
def test_internal_layout_renders_vllm_data_parallel_options_and_headless_followers(
        rank: int) -> None:
    replica = _replica()
    words = exec_start(render(UNIT, replica, rank))
    flags = _flags(words)
    assert (flags["--data-parallel-size"], flags["--data-parallel-size-local"],
            flags["--data-parallel-start-rank"], flags["--data-parallel-address"],
            flags["--data-parallel-rpc-port"]) == ("4", "2", str(2 * rank), "10.213.6.11",
                                                   "29550")
    assert "--nnodes" not in words and "--master-addr" not in words
    assert "--data-parallel-hybrid-lb" not in words
    assert ("--headless" in words) is (rank == 1)
    assert ("--port" in words) is (rank == 0)
    # the unit and the backend's own account of it (preflight checks the latter) agree
    argv = MpBackend().serve_argv(replica, replica.nodes[rank], [])
    assert argv == words[words.index("--data-parallel-size"):]


@pytest.mark.parametrize("rank", [0, 1])
def test_hybrid_layout_serves_an_api_on_every_node(rank: int) -> None:
    replica = _replica("hybrid")
    words = exec_start(render(UNIT, replica, rank))
    assert "--data-parallel-hybrid-lb" in words and "--headless" not in words
    assert _flags(words)["--port"] == "8000"
    assert MpBackend().serve_argv(replica, replica.nodes[rank], []) == \
        words[words.index("--data-parallel-size"):]
    assert MpBackend().listen_ports(replica, rank)[0] == (8000, "API port")


def test_hybrid_api_key_reaches_every_api_server_but_internal_only_rank_0() -> None:
    key = "s3cr3t-k3y-0f-32-chars"
    for layout, wanted in (("hybrid", [True, True]), ("internal", [True, False])):
        replica = _replica(layout, api_key=key)
        seen = ["VLLM_API_KEY" in render("vllm_mp/templates/vllm.env.j2", replica, rank)
                for rank in (0, 1)]
        assert seen == wanted, layout


def test_gpus_per_node_are_tp_x_pp_x_local_engines() -> None:
    assert _replica().gpus_per_node == 4
    assert _replica(tensor_parallel_size=4, data_parallel_size=2,
                    data_parallel_size_local=None).gpus_per_node == 4
    plain = _replica(data_parallel_size=1, data_parallel_size_local=None,
                     tensor_parallel_size=4, pipeline_parallel_size=2)
    assert (plain.gpus_per_node, plain.data_parallel) == (4, False)


def test_front_door_workers_are_every_api_server_of_a_hybrid_replica() -> None:
    assert workers([_replica("hybrid")]) == ("http://10.213.6.11:8000", "http://10.213.6.12:8000")
    assert workers([_replica("internal")]) == ("http://10.213.6.11:8000",)


def test_the_rendezvous_is_the_rpc_port_and_any_connection_to_rank_0_joins() -> None:
    replica = _replica()
    backend = MpBackend()
    assert backend.rendezvous(replica) == (29550, "data parallel RPC port")
    assert backend.peer_ports(replica) == [("data parallel RPC port", 29550, 29550)]
    rule = backend.plan(replica, replica.nodes[1])["rules"][0]
    assert (rule["master_addr"], rule["master_port"]) == ("10.213.6.11", 0)


def _inventory(tmp_path: Path, group_vars: str, nodes: int = 2) -> Path:
    hosts = "".join(f"            h{i}: {{ansible_host: 10.0.0.{i}, vllm_node_rank: {i - 1}}}\n"
                    for i in range(1, nodes + 1))
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  children:\n    vllm_replicas:\n      children:\n        dp:\n"
                    "          vars:\n            vllm_model: /srv/models/m\n"
                    + "".join(f"            {line}\n" for line in group_vars.splitlines())
                    + "          hosts:\n" + hosts)
    return path


def _refused(tmp_path: Path, group_vars: str, nodes: int = 2) -> str:
    with pytest.raises(ProvisionError) as caught:
        load_inventory(_inventory(tmp_path, group_vars, nodes))
    return caught.value.render()


def test_a_valid_layout_loads_with_the_default_local_size(tmp_path: Path) -> None:
    inventory = load_inventory(_inventory(
        tmp_path, "vllm_tensor_parallel_size: 2\nvllm_data_parallel_size: 4"))
    replica = inventory.replicas[0]
    assert (replica.backend, replica.dp_size_local, replica.hybrid) == ("mp", 2, False)


@pytest.mark.parametrize("group_vars, nodes, words", [
    ("vllm_data_parallel_size: 3", 2, ["does not divide over its 2 nodes", "4"]),
    ("vllm_data_parallel_size: 4\nvllm_data_parallel_size_local: 1", 2,
     ["is not vllm_data_parallel_size_local 1 x 2 nodes", "wait for engines no node starts"]),
    ("vllm_data_parallel_size: 4\nvllm_data_parallel_size_local: 4", 2,
     ["start ranks would be past the size"]),
    ("vllm_data_parallel_layout: hybrid", 2, ["hybrid without data parallel"]),
    ("vllm_data_parallel_size: 4\nvllm_backend: ray", 2, ["on the ray backend",
                                                          "vllm_backend: mp"]),
    ("vllm_data_parallel_layout: external", 2, ["one of internal, hybrid"]),
    ("vllm_data_parallel_size: 2\nvllm_data_parallel_rpc_port: 8000", 2,
     ["vllm_api_port and vllm_data_parallel_rpc_port", "are both 8000"]),
    ("vllm_extra_args: [--data-parallel-size, '2']", 2, ["vllm_data_parallel_size"]),
    ("vllm_extra_args: [--data-parallel-start-rank, '2']", 2,
     ["node rank x vllm_data_parallel_size_local"]),
    ("vllm_extra_args: [-dpb, ray]", 2, ["Ray data parallel is not a layout"]),
    ("vllm_data_parallel_size: 3", 4, ["set vllm_data_parallel_size to 4, or change"]),
    ("vllm_data_parallel_size: 4\nvllm_data_parallel_layout: hybrid\n"
     "vllm_api_host: 10.0.0.1", 2, ["the other nodes cannot bind it", "vllm_api_host 0.0.0.0"]),
])
def test_bad_layouts_are_refused_at_load_with_a_fix(tmp_path: Path, group_vars: str, nodes: int,
                                                    words: list[str]) -> None:
    text = _refused(tmp_path, group_vars, nodes)
    for word in words:
        assert word in text, text
    assert "inv.yml" in text


def test_preflight_counts_every_local_engine_against_the_node_gpus() -> None:
    from vllm_provision.checks.finding import Severity
    from vllm_provision.checks.topology import check_gpus_per_node, check_parallel_sizes

    findings = check_gpus_per_node(_replica(), {"h1": 4, "h2": 3})
    assert [(f.host, f.severity) for f in findings] == [("h1", Severity.OK),
                                                         ("h2", Severity.ERROR)]
    assert "2 data-parallel engines x TP x PP 2" in findings[1].expected
    assert "vllm_data_parallel_size_local" in findings[1].fix
    sizes = check_parallel_sizes(_replica(nodes=2, tensor_parallel_size=4))
    assert sizes[0].severity == Severity.OK and "4 engines of 4 x 1" in sizes[0].actual


def test_with_data_parallel_the_unused_master_port_may_equal_the_rpc_port(tmp_path: Path) -> None:
    inventory = load_inventory(_inventory(
        tmp_path, "vllm_data_parallel_size: 2\nvllm_data_parallel_rpc_port: 29501"))
    assert inventory.replicas[0].engine.data_parallel_rpc_port == 29501


def test_one_hybrid_replica_gives_the_front_door_two_workers_for_power_of_two(
        tmp_path: Path) -> None:
    path = _inventory(tmp_path, "vllm_data_parallel_size: 2\nvllm_data_parallel_layout: hybrid")
    text = path.read_text() + ("    vllm_gateways:\n      vars:\n        vllm_gateway_policy: "
                               "power_of_two\n        vllm_gateway_wheelhouse: /srv/wheels\n"
                               "      hosts:\n        h1: {}\n")
    path.write_text(text)
    inventory = load_inventory(path)
    assert workers(inventory.replicas) == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
