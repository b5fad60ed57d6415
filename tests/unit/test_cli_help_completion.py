"""Every command's --help ends with examples, and shell completion (click's own) completes
commands, options and the inventory's host and group names after -l/--limit."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.shell_completion import BashComplete
from click.testing import CliRunner
from inventory_support import replicas_yaml

from vllm_provision.cli import cli
from vllm_provision.cli.completion import script
from vllm_provision.cli.help import EXAMPLES_HEADING

INVENTORY = replicas_yaml("""\
        llama:
          vars: {vllm_model: /m, vllm_tensor_parallel_size: 1}
          hosts:
            gpu-a: {ansible_host: 10.0.0.11, vllm_node_rank: 0}
            gpu-b: {ansible_host: 10.0.0.12, vllm_node_rank: 1}
""", others="""\
    spare:
      hosts:
        cpu-1: {ansible_host: 10.0.0.21}
""")


def command_paths(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under ``group``, as the words that name it."""
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
    return paths


@pytest.mark.parametrize("path", command_paths(), ids=" ".join)
def test_every_command_help_has_an_example_of_itself(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert EXAMPLES_HEADING in result.output, f"provision {' '.join(path)} --help has no example"
    examples = result.output.split(EXAMPLES_HEADING, 1)[1].splitlines()
    assert any(line.strip().startswith("provision " + " ".join(path)) for line in examples)


def completions(args: list[str], incomplete: str) -> list[str]:
    comp = BashComplete(cli, {}, "provision", "_PROVISION_COMPLETE")
    return [item.value for item in comp.get_completions(args, incomplete)]


@pytest.fixture
def inventory(tmp_path: Path) -> str:
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    return str(path)


def test_commands_and_options_complete() -> None:
    assert {"init", "inventory"} <= set(completions([], "in"))
    assert "--limit" in completions(["up"], "--li")


def test_limit_completes_hosts_then_groups_of_the_inventory(inventory: str) -> None:
    names = completions(["status", "-i", inventory, "-l"], "")
    assert names[:3] == ["gpu-a", "gpu-b", "cpu-1"]
    assert {"all", "llama", "spare", "vllm_replicas", "vllm_master"} <= set(names)
    assert completions(["up", "-i", inventory, "--limit"], "gpu") == ["gpu-a", "gpu-b"]


def test_limit_completes_the_last_term_of_a_pattern(inventory: str) -> None:
    assert completions(["up", "-i", inventory, "-l"], "llama:!gpu-") == [
        "llama:!gpu-a", "llama:!gpu-b"]
    assert completions(["up", "-i", inventory, "-l"], "spare,cp") == ["spare,cpu-1"]


def test_limit_without_a_loadable_inventory_completes_nothing_quietly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("all: [unclosed\n")
    assert completions(["up", "-l"], "") == []
    assert completions(["up", "-i", str(tmp_path / "missing.yml"), "-l"], "") == []
    assert completions(["up", "-i", str(broken), "-l"], "g") == []
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_clicks_script(shell: str) -> None:
    result = CliRunner().invoke(cli, ["completion", shell])
    assert result.exit_code == 0
    assert result.output.strip() == script(shell).strip()
    assert "_PROVISION_COMPLETE" in result.output


def test_the_summaries_of_provision_help_are_the_commands_own() -> None:
    """`provision --help` lists the commands with summaries read from their source (so that it
    imports none of them): each is the first paragraph of that command's own help, and every
    command has one."""
    from vllm_provision.cli import builtin_commands, summary_source

    ctx = click.Context(cli)
    for name, module_name in builtin_commands().items():
        command = cli.get_command(ctx, name)
        assert command is not None, name
        read = summary_source(module_name)
        assert read, f"{module_name}.py: no docstring on command"
        assert (click.utils.make_default_short_help(read, 10**6)
                == command.get_short_help_str(limit=10**6)), name


def test_a_command_is_its_module_file() -> None:
    """Every module of vllm_provision.cli that defines a click `command` is a command, named by
    its file (exec_.py is `exec`), and no other module is: nothing else lists them."""
    import importlib
    import pkgutil

    import vllm_provision.cli as package
    from vllm_provision.cli import builtin_commands

    defined = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"vllm_provision.cli.{info.name}")
        if isinstance(getattr(module, "command", None), click.Command):
            defined[info.name.rstrip("_")] = info.name
    assert builtin_commands() == defined
    assert {"up", "exec", "stack"} <= set(defined) and "options" not in defined
    ctx = click.Context(cli)
    assert cli.get_command(ctx, "options") is None
    assert cli.get_command(ctx, "exec_") is None


@click.command()
def _a_click_command() -> None:
    """Loaded."""


def _a_helper(words: str) -> str:
    """Join WORDS."""
    return words


@pytest.mark.parametrize(("source", "summary", "loaded", "is_command"), [
    ('"""How to add one:\n\ndef command(ctx):\n    ...\n"""\n\nimport click\n\n\n'
     '@click.command()\ndef command():\n    """Do the real thing.\n\n    More."""\n',
     "Do the real thing.\n\nMore.", None, True),
    ('"""A helper module; its docstring shows\n\ndef command(ctx):\n    """\n', None, None,
     False),
    ("import click\n\n\ndef commander():\n    pass\n", None, None, False),
    ('def helper():\n    return 1\n@click.group(\n    "x",\n)  # a group\n@shared_options(X)\n'
     'def command():\n    """A group."""\n', "A group.", None, True),
    # a plain helper of that name: read as none, and imported to be sure, still none
    ('"""Shell words."""\n\n\ndef command(words):\n    """Join WORDS."""\n', None,
     _a_helper, False),
    # decorators laid out so the source read cannot find them (a string at column 0, a blank
    # line): imported, it is a command; its summary then comes from the loaded command
    ('@click.command(epilog="""\nExamples:\n""")\n\n@click.option("-x")\n'
     'def command(x):\n    """Loaded."""\n', None, _a_click_command, True)])
def test_a_def_command_line_is_a_command_only_where_click_makes_it_one(
        monkeypatch, source, summary, loaded, is_command) -> None:
    """A top-level `def command(` that click decorates is a command: the same words at the
    start of a docstring's line neither hide the real one nor make a module a command, and
    neither does a plain helper function of that name. Where the source read is not sure,
    the module is imported and its `command` looked at."""
    import types

    import vllm_provision.cli as package

    name = f"fake_{abs(hash(source))}"  # _command_node caches by module name
    monkeypatch.setattr(package, "_source", lambda module_name: source)
    monkeypatch.setattr(package, "_import",
                        lambda module_name: types.SimpleNamespace(command=loaded))
    assert package.summary_source(name) == summary
    assert package._defines_command(name) is is_command


def test_running_one_command_reads_only_its_own_file(monkeypatch) -> None:
    """`provision exec ...` looks for exec.py and exec_.py alone: no other command's source is
    read or parsed (every start of the CLI would pay for it)."""
    import vllm_provision.cli as package

    read = []
    source = package._source
    monkeypatch.setattr(package, "_source", lambda name: read.append(name) or source(name))
    package._command_node.cache_clear()
    package.builtin_commands.cache_clear()
    try:
        command = cli.get_command(click.Context(cli), "exec")
        assert command is not None and command.name == "exec"
        assert set(read) <= {"exec", "exec_"} and read, read
    finally:
        package._command_node.cache_clear()
        package.builtin_commands.cache_clear()


def test_a_command_that_is_no_click_command_is_an_error_naming_its_file() -> None:
    from vllm_provision.cli import _loaded_command
    from vllm_provision.core.errors import ProvisionError

    with pytest.raises(ProvisionError) as caught:
        _loaded_command("options")  # a helper module: its `command` is missing
    text = caught.value.render()
    assert "vllm_provision/cli/options.py" in text and "@click.command" in text
