"""`provision init`'s inventory, rendered from facts recorded on the two lab hosts (the probe's
raw JSON, tests/data/init/), and changed one fact at a time where the hosts disagree."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from vllm_provision.cli import cli
from vllm_provision.core.errors import ProvisionError
from vllm_provision.facts.gather import parse_probe_output
from vllm_provision.facts.model import HostFacts, Route, VenvFound
from vllm_provision.inventory import load_inventory
from vllm_provision.operations.scaffold import InitRequest, plan_inventory, render_inventory

DATA = Path(__file__).parent.parent / "data" / "init"
H1, H2 = "10.213.18.11", "10.213.18.12"
MODEL = "/srv/models/lab-model"
CONNECTION = {"ansible_user": "root", "ansible_ssh_private_key_file": "/keys/id_ed25519"}


def recorded(address: str) -> HostFacts:
    raw = json.loads((DATA / f"lab-{address}.json").read_text())
    return parse_probe_output(address, {**raw, "model_path": MODEL})


@pytest.fixture
def facts() -> dict[str, HostFacts]:
    return {H1: recorded(H1), H2: recorded(H2)}


def request(**changes: object) -> InitRequest:
    base = InitRequest(addresses=(H1, H2), model=MODEL, connection=CONNECTION)
    return replace(base, **changes)  # type: ignore[arg-type]


def written(tmp_path: Path, req: InitRequest, facts: dict[str, HostFacts]) -> tuple[str, object]:
    text = render_inventory(plan_inventory(req, facts))
    path = tmp_path / "inventory.yml"
    path.write_text(text)
    return text, load_inventory(path)


def test_lab_facts_give_the_lab_replica_with_every_choice_explained(tmp_path, facts):
    text, inventory = written(tmp_path, request(), facts)
    (replica,) = inventory.replicas
    assert [(n.name, n.rank, n.host_ip) for n in replica.nodes] == [("h1", 0, H1), ("h2", 1, H2)]
    assert (replica.backend, replica.engine.model) == ("mp", MODEL)
    assert (replica.engine.tensor_parallel_size, replica.engine.pipeline_parallel_size) == (4, 2)
    assert replica.vars["vllm_cluster_interface"] == "eth0"
    assert replica.vars["vllm_venv"] == "/opt/vllm"
    assert inventory.hosts["h1"].user == "root"
    lines = text.splitlines()
    for key in ("vllm_tensor_parallel_size:", "vllm_cluster_interface:", "vllm_venv:",
                "vllm_backend:", "h1:", "h2:"):
        index = next(i for i, line in enumerate(lines) if line.strip().startswith(key))
        assert lines[index - 1].strip().startswith("#"), f"no comment above {key}"
    assert "the 4 GPUs every node has" in text and "(vllm 0.33.0)" in text


def test_the_text_is_the_data_dumped_by_the_emitter(facts):
    plan = plan_inventory(request(), facts)
    assert yaml.safe_load(render_inventory(plan)) == plan.data


def test_sizes_told_win_over_the_facts(tmp_path, facts):
    _text, inventory = written(tmp_path, request(tensor_parallel_size=2,
                                                 pipeline_parallel_size=2), facts)
    engine = inventory.replicas[0].engine
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size) == (2, 2)


def test_sizes_that_do_not_fit_the_nodes_are_refused(facts):
    with pytest.raises(ProvisionError) as caught:
        plan_inventory(request(tensor_parallel_size=4, pipeline_parallel_size=4), facts)
    (problem,) = caught.value.problems
    assert "need 8 GPUs on each of the 2 nodes" in problem.message
    with pytest.raises(ProvisionError) as caught:
        plan_inventory(request(tensor_parallel_size=8), facts)
    assert [p.where for p in caught.value.problems] == [H1, H2]


def test_different_gpu_counts_name_the_host_and_the_option(facts):
    facts[H2] = replace(facts[H2], gpus=facts[H2].gpus[:2])
    with pytest.raises(ProvisionError) as caught:
        plan_inventory(request(), facts)
    (problem,) = caught.value.problems
    assert problem.where == H2
    assert "--tensor-parallel-size 2" in problem.fix and f"{H1}: 4" in problem.actual


def test_different_venv_paths_name_the_odd_host(facts):
    facts[H2] = replace(facts[H2], vllm_venvs=(VenvFound("/srv/vllm-env", "0.33.0"),))
    with pytest.raises(ProvisionError) as caught:
        plan_inventory(request(), facts)
    (problem,) = caught.value.problems
    assert problem.where == H2 and "different paths" in problem.message
    assert "/srv/vllm-env" in problem.actual and "--venv" in problem.fix


def test_one_common_venv_other_than_the_default_is_written(tmp_path, facts):
    found = (VenvFound("/srv/vllm-env", "0.33.0"),)
    facts = {a: replace(f, vllm_venvs=found) for a, f in facts.items()}
    _text, inventory = written(tmp_path, request(), facts)
    assert inventory.replicas[0].vars["vllm_venv"] == "/srv/vllm-env"


def test_a_host_without_vllm_or_model_is_named(facts):
    facts[H1] = replace(facts[H1], vllm_venvs=(), model_files=None)
    with pytest.raises(ProvisionError) as caught:
        plan_inventory(request(), facts)
    assert {(p.where, "model" in p.message) for p in caught.value.problems} == {
        (H1, True), (H1, False)}


def test_a_cluster_address_other_than_the_ssh_one_becomes_vllm_host_ip(tmp_path, facts):
    facts[H1] = replace(facts[H1], routes={H2: Route(H2, dev="eth0", src="192.168.7.1")})
    _text, inventory = written(tmp_path, request(), facts)
    assert inventory.replicas[0].nodes[0].host_ip == "192.168.7.1"
    assert inventory.replicas[0].nodes[1].host_ip == H2


def test_names_in_hosts_get_the_route_source_as_vllm_host_ip(tmp_path, facts):
    names = {"gpu-a.example": H1, "gpu-b.example": H2}
    by_name = {name: replace(facts[ip], host=name) for name, ip in names.items()}
    _text, inventory = written(tmp_path, request(addresses=tuple(names), ips=names), by_name)
    assert [(n.host.address, n.host_ip) for n in inventory.replicas[0].nodes] == [
        ("gpu-a.example", H1), ("gpu-b.example", H2)]


def test_interfaces_named_differently_are_written_per_host(tmp_path, facts):
    facts[H2] = replace(facts[H2], routes={H1: Route(H1, dev="ens1f0", src=H2)})
    _text, inventory = written(tmp_path, request(), facts)
    assert inventory.hosts["h1"].vars["vllm_cluster_interface"] == "eth0"
    assert inventory.hosts["h2"].vars["vllm_cluster_interface"] == "ens1f0"


def test_one_host_needs_no_cluster_interface(tmp_path, facts):
    _text, inventory = written(tmp_path, request(addresses=(H1,)), {H1: facts[H1]})
    (replica,) = inventory.replicas
    assert replica.engine.pipeline_parallel_size == 1
    assert "vllm_cluster_interface" not in replica.vars


def test_hostile_host_values_stay_comments_or_are_refused(tmp_path, facts):
    facts[H1] = replace(facts[H1], hostname="evil\nall:\n  vars: {x: 1}",
                        os_release="Debian\u2028vllm_model: /etc")
    facts[H2] = replace(facts[H2], routes={H1: Route(H1, dev="eth0\n- x", src=H2)})
    with pytest.raises(ProvisionError) as caught:
        plan_inventory(request(), facts)
    assert [p.where for p in caught.value.problems] == [H2]
    facts[H2] = recorded(H2)
    text, inventory = written(tmp_path, request(), facts)
    assert list(inventory.hosts) == [H1, "h2"]  # the bad host name is not a name: the address
    assert inventory.replicas[0].engine.model == MODEL
    assert all(line.lstrip().startswith("#") or "\u2028" not in line
               for line in text.splitlines())
    assert "\u2028" not in text and "x: 1" not in yaml.safe_dump(yaml.safe_load(text))


def test_the_command_checks_its_options_before_connecting():
    runner = CliRunner()
    twice = runner.invoke(cli, ["init", "--hosts", f"{H1},{H1}", "--model", MODEL])
    assert twice.exit_code == 2 and "given more than once" in twice.output
    bad = runner.invoke(cli, ["init", "--hosts", "-oProxyCommand=x", "--model", MODEL])
    assert bad.exit_code == 2 and "--hosts" in bad.output
    no_model = runner.invoke(cli, ["init", "--hosts", H1])
    assert no_model.exit_code == 2 and "--model" in no_model.output


@pytest.mark.parametrize("group", ["vllm_followers", "llm", "all", "vllm_replicas", "vllm_ray"])
def test_a_host_named_like_a_group_is_named_after_its_address(tmp_path, facts, group):
    """A host that reports a group's name (the replica's, one the loader adds) would make
    `-l NAME` and play patterns mean the group: the node gets its address, and the comment
    says why."""
    facts[H2] = replace(facts[H2], hostname=f"{group}.example.net")
    text, inventory = written(tmp_path, request(), facts)
    (replica,) = inventory.replicas
    assert [n.name for n in replica.nodes] == ["h1", H2]
    assert f"host name '{group}' is also a group's name" in text
