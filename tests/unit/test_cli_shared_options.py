"""Every command takes the shared options, declared once in cli/options.py with one set of
defaults (the connection's), checked through click's CliRunner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from inventory_support import replicas_yaml

from vllm_provision.cli import cli
from vllm_provision.cli.options import HOST_OPTIONS, OPTIONS, CommonOptions
from vllm_provision.transport.base import ConnectionOptions

INVENTORY = replicas_yaml("""\
        llama:
          vars: {vllm_backend: mp, vllm_model: /srv/models/m, vllm_tensor_parallel_size: 2}
          hosts:
            h1: {ansible_host: 10.0.0.11, vllm_node_rank: 0}
            h2: {ansible_host: 10.0.0.12, vllm_node_rank: 1}
""", all_vars="{ansible_user: root}")
HOST_FLAGS = ("-i, --inventory", "-l, --limit", "-e, --extra-vars", "-f, --forks",
              "-v, --verbose", "--json", "--host-key-policy", "--timeout")


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return path


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace the SSH probe: record what check/facts asked for, gather nothing."""
    seen: dict[str, Any] = {}

    def collect_facts(inventory: Any, hosts: Any, probe: Any = None,
                      connection: Any = None) -> tuple[dict, dict]:
        seen.update(inventory=inventory, hosts=[h.name for h in hosts], connection=connection)
        return {}, {}

    monkeypatch.setattr("vllm_provision.facts.collect.collect_facts", collect_facts)
    return seen


@pytest.mark.parametrize("command", ["up", "down", "restart", "status", "drift", "play",
                                     "check", "facts"])
def test_every_host_command_lists_the_shared_options(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0, result.output
    for flag in HOST_FLAGS:
        assert flag in result.output, f"{command} lacks {flag}"


def test_verify_takes_the_shared_options_that_apply_to_a_pytest_run() -> None:
    result = CliRunner().invoke(cli, ["verify", "--help"])
    for flag in ("-i, --inventory", "-e, --extra-vars", "-v, --verbose"):
        assert flag in result.output


def test_check_and_facts_have_no_dry_run_flags() -> None:
    assert "check" not in HOST_OPTIONS and "diff" not in HOST_OPTIONS
    result = CliRunner().invoke(cli, ["check", "--help"])
    assert "--diff" not in result.output


def test_check_timeout_reaches_the_connection(inventory: Path, probed: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["check", "-i", str(inventory), "--timeout", "5",
                                      "--host-key-policy", "accept-new", "-f", "3", "--json"])
    assert "No such option" not in result.output
    assert result.exit_code in (0, 1), result.output  # no facts: the checks run, errors or not
    connection = probed["connection"]
    assert (connection.connect_timeout_s, connection.command_timeout_s) == (5.0, 5.0)
    assert (connection.host_key_policy, connection.forks) == ("accept-new", 3)
    assert '"replicas"' in result.output


def test_facts_extra_vars_reach_the_inventory(inventory: Path, probed: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["facts", "-i", str(inventory), "-e", "x=y",
                                      "-e", "vllm_api_port=9000", "-l", "h2", "--json"])
    assert result.exit_code == 0, result.output
    loaded = probed["inventory"]
    assert loaded.extra_vars["x"] == "y"
    assert loaded.replicas[0].engine.api_port == 9000  # converted to the variable's type
    assert probed["hosts"] == ["h2"]
    assert probed["connection"] == ConnectionOptions()  # the defaults, unchanged


def test_a_bad_extra_var_is_refused_by_name(inventory: Path, probed: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["check", "-i", str(inventory), "-e", "no-equals"])
    assert result.exit_code != 0 and "invalid extra variable" in str(result.exception)
    assert probed == {}  # refused before any connection


def test_one_set_of_defaults() -> None:
    defaults = ConnectionOptions()
    assert defaults.connect_timeout_s == defaults.command_timeout_s == 30.0
    assert CommonOptions(inventory=Path("inv.yml")).connection_options() == defaults
    for name in ("up", "check", "facts", "status"):
        command = cli.get_command(None, name)  # type: ignore[arg-type]
        params = {p.name: p for p in command.params}
        assert params["timeout"].default == defaults.connect_timeout_s
        assert params["forks"].default == defaults.forks
        assert params["host_key_policy"].default == defaults.host_key_policy
    assert set(HOST_OPTIONS) < set(OPTIONS)
