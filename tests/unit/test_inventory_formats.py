"""INI inventories, inventory directories, legacy ``ansible_ssh_*`` names and ``provision
inventory``: what only this tool does (validation, aliases resolved on the host, replicas,
masking); agreement with Ansible itself is test_inventory_ansible_diff.py."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from render_support import rendered_files, unit_words
from test_runner_support import rendered_error, write_file

from vllm_provision.cli import cli
from vllm_provision.core.errors import InventoryError, ProvisionError
from vllm_provision.inventory import load_inventory
from vllm_provision.inventory.ini import parse_value
from vllm_provision.inventory.view import node_argv

CORPUS = Path(__file__).resolve().parents[1] / "data" / "inventories" / "ansible"


def _error(path: Path) -> str:
    return rendered_error(InventoryError, load_inventory, path)


def test_ini_replica_is_typed_and_validated() -> None:
    inventory = load_inventory(CORPUS / "ini-replica-mp" / "hosts.ini")
    (replica,) = inventory.replicas
    assert replica.backend == "mp"
    assert replica.engine.tensor_parallel_size == 4 and replica.engine.api_port == 8000
    assert [(n.name, n.rank, n.host.address, n.host.user) for n in replica.nodes] == [
        ("gpu1", 0, "10.0.0.11", "root"), ("gpu2", 1, "10.0.0.12", "root")]


def test_directory_replica_reads_group_vars_folder_without_extensions() -> None:
    inventory = load_inventory(CORPUS / "dir-replica" / "inventory")
    (replica,) = inventory.replicas
    assert replica.engine.api_port == 8001  # from group_vars/llama/ports (no extension)
    assert replica.engine.model == "/srv/models/llama"
    assert inventory.hosts["n1"].user == "root"  # group_vars/all without extension


def test_legacy_names_set_the_connection_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="vllm_provision.inventory"):
        inventory = load_inventory(CORPUS / "aliases-ini" / "hosts.ini")
    host = inventory.hosts["o1"]
    assert (host.address, host.port, host.user) == ("10.0.0.51", 2201, "legacy")
    assert inventory.hosts["o2"].address == "10.0.0.52"
    lines = [r.getMessage() for r in caplog.records]
    for old, new in (("ansible_ssh_host", "ansible_host"), ("ansible_ssh_port", "ansible_port"),
                     ("ansible_ssh_user", "ansible_user")):
        assert any(f"{old} is deprecated; use {new} instead" in line for line in lines), lines
    assert all("\n" not in line for line in lines)


def test_legacy_name_wins_when_both_are_set_as_in_ansible() -> None:
    host = load_inventory(CORPUS / "aliases-both-set" / "hosts.yml").hosts["b1"]
    assert (host.address, host.port, host.user) == ("10.0.0.62", 2222, "old")
    assert host.key_file == Path("/keys/old")


def test_legacy_names_from_group_vars() -> None:
    host = load_inventory(CORPUS / "aliases-group-vars" / "hosts.ini").hosts["w1"]
    assert (host.port, host.user) == (2022, "deploy")


def test_legacy_name_is_validated_as_the_variable_it_sets(tmp_path: Path) -> None:
    text = _error(write_file(tmp_path / "hosts", "[web]\nw1 ansible_ssh_port=99999\n"))
    assert "hosts:2: ansible_ssh_port" in text and "99999" in text


def test_ansible_ssh_pass_is_a_secret(tmp_path: Path) -> None:
    path = write_file(tmp_path / "hosts.ini", "[web]\nw1 ansible_ssh_pass=hunter2secret\n")
    result = CliRunner().invoke(cli, ["inventory", "-i", str(path), "--list"])
    assert result.exit_code == 0, result.output
    assert "hunter2secret" not in result.output
    assert json.loads(result.stdout)["_meta"]["hostvars"]["w1"]["ansible_ssh_pass"] == "********"


@pytest.mark.parametrize(("text", "where", "message"), [
    ("[llama]\ng1 vllm_node_rank=zero\n", "hosts.ini:2: vllm_node_rank", "wrong type"),
    ("[llama]\ng1\n[llama:vars]\nvllm_backend=mpi\n", "hosts.ini:4: vllm_backend",
     "invalid value"),
    ("[llama]\ng1 vllm_api_port='{{ port }}'\n", "hosts.ini:2: vllm_api_port", "Jinja"),
    ("[bad group]\nh1\n", "hosts.ini:1", "invalid section header"),
    ("[web:hosts2]\nh1\n", "hosts.ini:1", "unknown type"),
    ("[web]\nh1 novalue\n", "hosts.ini:2", "expected key=value"),
    ('[web]\nh1 a="open\n', "hosts.ini:2", "cannot be split into words"),
    ("[web]\nh[3:1]\n", "hosts.ini:2", "invalid host range"),
    ("[web]\nh[0:99999999]\n", "hosts.ini:2", "more than 10000"),
    ("[web]\nh[0:999]-[0:999]\n", "hosts.ini:2", "more than 10000"),
    ("[web]\nbad$name\n", "hosts.ini:2", "invalid host name"),
    ("[web:vars]\nx=1\n", "hosts.ini:1", "never declared"),
    ("[web]\nh1\n[web:children]\nmissing\n", "hosts.ini:4", "never declared"),
])
def test_refused_ini_names_file_line_and_item(tmp_path: Path, text: str, where: str,
                                              message: str) -> None:
    rendered = _error(write_file(tmp_path / "hosts.ini", text))
    assert where in rendered and message in rendered, rendered
    assert "YAML" not in rendered and "Traceback" not in rendered


def test_ini_host_lines_without_section_never_get_a_yaml_error(tmp_path: Path) -> None:
    rendered = _error(write_file(tmp_path / "hosts", 'h1 ansible_host=10.0.0.1\nh2 a="x\n'))
    assert "hosts:2" in rendered and "YAML" not in rendered


def test_directory_refuses_scripts_and_plugin_configs(tmp_path: Path) -> None:
    folder = tmp_path / "inventory"
    write_file(folder / "a.ini", "[web]\nw1\n")
    script = write_file(folder / "ec2.py", "#!/usr/bin/env python3\nprint('{}')\n")
    os.chmod(script, 0o755)
    write_file(folder / "aws_ec2.yml", "plugin: amazon.aws.aws_ec2\nregions: [eu-west-1]\n")
    rendered = _error(folder)
    assert f"{script}" in rendered and "never runs inventory scripts" in rendered
    assert "aws_ec2.yml: plugin" in rendered and "inventory plugin configuration" in rendered


def test_empty_directory_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "inventory"
    write_file(folder / "README.md", "notes\n")
    assert "holds no inventory file" in _error(folder)


@pytest.mark.parametrize(("text", "value"), [
    ("8000", 8000), ("True", True), ("'a b'", "a b"), ("[1, 'x']", [1, "x"]),
    ("(1, 2)", [1, 2]), ("1+2", "1+2"), ("__import__('os')", "__import__('os')"),
    ("1j", "1j"), ("...", "..."), ("x" * 20000, "x" * 20000), ("[" * 200 + "]" * 200, None),
])
def test_ini_values_are_literals_or_text_never_code(text: str, value: object) -> None:
    parsed = parse_value(text)
    if value is None:  # deeply nested: a literal or text, never an exception
        assert isinstance(parsed, list | str)
    else:
        assert parsed == value


def _invoke(*args: str) -> tuple[int, str]:
    """Exit code and output; a ProvisionError (which ``main`` renders) as its rendered text."""
    result = CliRunner().invoke(cli, ["inventory", *args])
    if isinstance(result.exception, ProvisionError):
        return result.exception.exit_code, result.exception.render()
    return result.exit_code, result.output


def test_inventory_list_adds_replicas_with_roles_and_argv() -> None:
    code, output = _invoke("-i", str(CORPUS / "yaml-replica-ray" / "hosts.yml"), "--list")
    assert code == 0, output
    replica = json.loads(output)["_vllm_provision"]["replicas"]["qwen"]
    assert replica["backend"] == "ray"
    head, worker = replica["nodes"]
    assert (head["rank"], head["role"], worker["role"]) == (0, "ray-head", "ray-worker")
    assert head["argv"][:3] == ["vllm", "serve", "/srv/models/qwen"]
    assert "--distributed-executor-backend" in head["argv"] and worker["argv"] is None


def test_node_argv_is_what_the_unit_runs() -> None:
    for case in ("ini-replica-mp/hosts.ini", "yaml-replica-ray/hosts.yml"):
        inventory = load_inventory(CORPUS / case)
        units = {label.split(":")[0]: text for label, text in rendered_files(inventory)
                 if label.endswith(("vllm_mp/vllm.service.j2", "vllm_ray/vllm.service.j2"))}
        for replica in inventory.replicas:
            for node in replica.nodes:
                argv = node_argv(replica, node)
                if argv is None:
                    assert node.name not in units
                    continue
                # the Ray head's vLLM unit also has ExecStartPre (the start gate) and ExecStopPost
                [words] = [unit_words(line.removeprefix("ExecStart="))
                           for line in units[node.name].splitlines()
                           if line.startswith("ExecStart=")]
                assert words[1:] == ["serve", *argv], node.name


def test_inventory_graph_and_host(tmp_path: Path) -> None:
    path = write_file(tmp_path / "hosts.ini", "[web]\nw1 vllm_api_key=sk-verysecret1234 x=1\n"
                                          "[site:children]\nweb\n")
    code, graph = _invoke("-i", str(path), "--graph")
    assert code == 0 and graph.splitlines() == [
        "@all:", "  |--@ungrouped:", "  |--@site:", "  |  |--@web:", "  |  |  |--w1",
        "  |--@vllm_gateways:"], graph  # the front door's group, listed though undefined
    defined = write_file(tmp_path / "gw.ini", "[vllm_gateways]\n[web]\nw1\n")
    code, graph = _invoke("-i", str(defined), "--graph")
    assert code == 0 and graph.count("@vllm_gateways:") == 1, graph  # defined: once
    code, host = _invoke("-i", str(path), "--host", "w1")
    assert code == 0 and json.loads(host) == {"vllm_api_key": "********", "x": 1}
    code, output = _invoke("-i", str(path), "--host", "nope")
    assert code == 1 and "no host named 'nope'" in output


def test_inventory_wants_exactly_one_mode(tmp_path: Path) -> None:
    path = write_file(tmp_path / "hosts.ini", "[web]\nw1\n")
    code, output = _invoke("-i", str(path), "--list", "--graph")
    assert code == 1 and "exactly one of --list, --graph and --host" in output


@pytest.mark.parametrize("option,value", [
    ("ansible_ssh_private_key_file", "~nosuchuser0/.ssh/id"),
    ("provision_known_hosts_file", "~0"),
    ("ansible_ssh_common_args", "-o UserKnownHostsFile=~nosuchuser0/kh"),
])
def test_a_tilde_user_the_controller_lacks_is_a_located_inventory_error(
        tmp_path: Path, option: str, value: str) -> None:
    # Path.expanduser() raises a bare RuntimeError for ~user without a home folder
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"h1": {option: value}}}}))
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    text = info.value.render()
    assert option in text and "hosts.yml" in text, text
