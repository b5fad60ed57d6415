"""The ``provision`` command line: one module per command, loaded only when that command runs.

A command is one module of this package, ``vllm_provision/cli/<name>.py``, that defines one
``click`` command (or group) named ``command`` at the top level, its help the function's
docstring (plus its schema in ``vllm_provision/schemas/`` when it has ``--json``): the file's
name is the command's (:func:`builtin_commands`), and ``provision --help`` reads the summaries
from the sources (:func:`summary_source`). Keeping imports lazy keeps ``provision --help`` and
every command fast (heavy modules such as paramiko load only when needed).

Other distributions add commands through entry points of the group ``vllm_provision.commands``
(name: the command, value: ``module:attribute`` of a click command), loaded only when that command
runs: this repository's lab (lab/pyproject.toml) adds ``provision lab`` so. Without it,
``provision lab`` says how to install it (:data:`SEPARATE`).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import logging
import os
import pkgutil
import re
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ENTRY_POINT_GROUP = "vllm_provision.commands"

# commands of this repository's other distributions: name -> (distribution, what it is, how to
# install it); listed in --help also when not installed, so `provision lab` can say what to do
SEPARATE: dict[str, tuple[str, str, str]] = {
    "lab": ("vllm-provision-lab", "the local test lab (nspawn hosts, simulated GPUs)",
            "in a checkout: `bash scripts/setup.sh` (installs both into .venv) or "
            "`pip install -e ./lab`; elsewhere: `pip wheel --no-deps -w dist ./lab` in a "
            "checkout, then `pip install dist/vllm_provision_lab-*.whl`"),
}


# A command is one file: the module vllm_provision/cli/<name>.py (a trailing underscore kept
# off the command's name: exec_.py is `provision exec`) that defines ``command`` at the top
# level, decorated by @click.command or @click.group; its help is that function's
# docstring. Running a command reads its own file alone (`exec`: exec.py, exec_.py);
# `provision --help` reads the names from the file names and the summaries from the source
# (ast), so it imports no command (click's default imports them all). Completing a command's
# name still imports every command, as click's `shell_complete` loads each to read its short
# help and `hidden`. A unit test holds what is read against each loaded command
# (tests/unit/test_cli_help_completion.py).
_DEFINES_COMMAND = re.compile(r"^def command\(", re.MULTILINE)


@functools.cache
def builtin_commands() -> dict[str, str]:
    """The commands of this package: command name -> module name (``"exec"`` -> ``"exec_"``),
    every module of ``vllm_provision.cli`` whose source defines ``command`` at the top level
    (read as text, nothing imported; a module whose source is not installed is imported to
    look).

    Raises:
        ProvisionError: two modules give one name (``exec.py`` beside ``exec_.py``), naming
            both.
    """
    from vllm_provision.core.errors import ProvisionError

    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.ispkg:
            continue
        if not _defines_command(info.name):
            continue
        name = info.name.rstrip("_")
        if name in found:
            raise ProvisionError.single(
                f"vllm_provision/cli/{info.name}.py", f"the command {name} is defined twice",
                expected="one module per command",
                actual=f"{found[name]}.py and {info.name}.py",
                fix="remove or rename one of them (a reinstall leaves no stale module)")
        found[name] = info.name
    return found


def _source(module_name: str) -> str | None:
    """The source text of ``vllm_provision.cli.<module_name>``, or None where only compiled
    code is installed."""
    spec = importlib.util.find_spec(f"{__name__}.{module_name}")
    origin = spec.origin if spec is not None else None
    if origin is None or not origin.endswith(".py"):
        return None
    try:
        return Path(origin).read_text(encoding="utf-8")
    except OSError:
        return None


def _defines_command(module_name: str) -> bool:
    """Whether the module defines a command: read from its source where a decorated
    ``def command(`` parses (:func:`_command_node`); imported and looked at where its source
    is not installed, or where a ``def command(`` line is there but its decorators are laid
    out so that the source read does not find them (a string or bracket at column 0, a blank
    line between decorators, click imported under another name)."""
    if _command_node(module_name) is not None:  # the usual case: the source read once
        return True
    text = _source(module_name)
    if text is not None and _DEFINES_COMMAND.search(text) is None:
        return False
    return isinstance(getattr(_import(module_name), "command", None), click.Command)


def _import(module_name: str) -> types.ModuleType:
    """Import ``vllm_provision.cli.<module_name>``."""
    return importlib.import_module(f"{__name__}.{module_name}")


@functools.cache
def _command_node(module_name: str) -> ast.FunctionDef | None:
    """The top-level ``def command(`` of the module's source that click makes a command (a
    decorator named ``command`` or ``group``: ``@click.command(...)``), parsed with its
    decorators; None where there is none. Each line that starts ``def command(`` is tried,
    from its decorators to the end of the file (parsing the whole file would double the cost
    of ``provision --help``): one inside a docstring does not parse from there, or not as a
    decorated function named ``command``, and is passed over, as is a plain helper."""
    text = _source(module_name) or ""
    for found in _DEFINES_COMMAND.finditer(text):
        try:
            body = ast.parse(text[_decorators_start(text, found.start()):]).body
        except SyntaxError:
            continue
        if (body and isinstance(body[0], ast.FunctionDef) and body[0].name == "command"
                and any(_decorator_name(d) in ("command", "group")
                        for d in body[0].decorator_list)):
            return body[0]
    return None


def _decorators_start(text: str, at: int) -> int:
    """Where the decorators of the ``def`` at offset ``at`` start: back over the lines just
    above it that open (``@``) or continue (indented, ``)``, a comment) a decorator."""
    start = at
    while start > 0:
        line_start = text.rfind("\n", 0, start - 1) + 1
        line = text[line_start:start - 1]
        if not line or not (line[0] in "@)#" or line[0].isspace()):
            break
        start = line_start
    while start < at and not text.startswith("@", start):  # the block opens with `@`
        start = text.find("\n", start, at) + 1 or at
    return start


def _decorator_name(node: ast.expr) -> str:
    """``click.command(...)`` -> ``command``; ``group`` -> ``group``; else ``""``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def summary_source(module_name: str) -> str | None:
    """The help of the command that ``vllm_provision.cli.<module_name>`` defines, read from
    its source without importing it: the docstring of the top-level ``command`` function,
    cleaned as click cleans it (:func:`inspect.cleandoc`, cut at ``\\f``); None where the
    source or the docstring cannot be read (the caller then imports the command)."""
    node = _command_node(module_name)
    doc = None if node is None else ast.get_docstring(node, clean=True)
    return None if doc is None else doc.split("\f", 1)[0]


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use: the modules of
    :func:`builtin_commands`, then the entry points of :data:`ENTRY_POINT_GROUP`."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with summaries read from their source (:func:`summary_source`;
        click's own layout and truncation), so ``provision --help`` imports none of them
        (click's default loads every command)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            module_name = builtin_commands().get(name)
            text = summary_source(module_name) if module_name is not None else None
            rows.append((name, click.utils.make_default_short_help(text, limit)
                         if text is not None else self._loaded_summary(ctx, name, limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _loaded_summary(self, ctx: click.Context, name: str, limit: int) -> str:
        command = self.get_command(ctx, name)
        return "" if command is None else command.get_short_help_str(limit)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(builtin_commands()) | set(_entry_points()) | set(SEPARATE))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = _builtin_module(cmd_name)
        if module_name is not None:
            return _loaded_command(module_name)
        entry = _entry_points().get(cmd_name)
        if entry is not None:
            return _load_entry_point(entry)
        if cmd_name in SEPARATE:
            return _not_installed(cmd_name)
        return None


def _builtin_module(cmd_name: str) -> str | None:
    """The module of the built-in command ``cmd_name`` (``exec`` -> ``exec_``), or None:
    looked up by its file name alone (at most two files read), so running one command does
    not read every command's source.

    Raises:
        ProvisionError: both ``<name>.py`` and ``<name>_.py`` define it (as
            :func:`builtin_commands`).
    """
    if not cmd_name.isidentifier() or cmd_name.startswith("_") or cmd_name.endswith("_"):
        return None
    found = [name for name in (cmd_name, f"{cmd_name}_")
             if importlib.util.find_spec(f"{__name__}.{name}") is not None
             and _defines_command(name)]
    if len(found) > 1:
        return builtin_commands().get(cmd_name)  # raises, naming both files
    return found[0] if found else None


def _loaded_command(module_name: str) -> click.Command:
    """Import ``vllm_provision.cli.<module_name>`` and return its ``command``.

    Raises:
        ProvisionError: its ``command`` is no click command (a function without
            ``@click.command``), naming the file.
    """
    from vllm_provision.core.errors import ProvisionError

    command = getattr(_import(module_name), "command", None)
    if not isinstance(command, click.Command):
        raise ProvisionError.single(
            f"vllm_provision/cli/{module_name}.py", "its command is no click command",
            expected="a top-level `command` decorated with @click.command(...) or "
                     "@click.group(...)", actual=type(command).__name__,
            fix="decorate it, or rename the function (a helper module defines no `command`)")
    return command


@functools.cache
def _entry_points() -> dict[str, EntryPoint]:
    """The commands other installed distributions add (name -> entry point); a built-in name
    is looked up first, so a plug-in cannot take it over. Read once from the installed
    metadata (about 20 ms), nothing imported."""
    from importlib.metadata import entry_points

    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(entry: EntryPoint) -> click.Command:
    """Import the click command an entry point names.

    Raises:
        ProvisionError: it cannot be imported, or it is no click command; naming the entry point
            and its distribution (a broken plug-in is an error of its own, not a traceback).
    """
    from vllm_provision.core.errors import ProvisionError

    where = f"entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP})"
    owner = entry.dist.name if entry.dist is not None else "the distribution that declares it"
    try:
        loaded = entry.load()
    except Exception as exc:  # a plug-in's import error, reported with its name
        raise ProvisionError.single(where, f"the command cannot be loaded: "
                                    f"{type(exc).__name__}: {exc}",
                                    fix=f"reinstall {owner} with the same version as "
                                        "vllm-provision, or uninstall it") from None
    if not isinstance(loaded, click.Command):
        raise ProvisionError.single(where, "it names no click command",
                                    expected="a click.Command or click.Group",
                                    actual=type(loaded).__name__,
                                    fix=f"reinstall or uninstall {owner}")
    return loaded


def _not_installed(cmd_name: str) -> click.Command:
    """A placeholder for a command of :data:`SEPARATE` whose distribution is not installed: its
    help and every use say which distribution it is and how to install it (exit status 1)."""
    from vllm_provision.cli.help import examples

    distribution, what, how = SEPARATE[cmd_name]

    def refuse(args: tuple[str, ...]) -> None:
        from vllm_provision.core.errors import ProvisionError

        raise ProvisionError.single(
            f"provision {cmd_name}", f"{what} is not installed: it is the separate "
            f"distribution {distribution}", expected=f"{distribution} installed beside "
            "vllm-provision (same version)", fix=how)

    return click.Command(
        cmd_name, callback=refuse,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        short_help=f"Not installed: {what} ({distribution}).",
        help=f"Not installed: {what}, the distribution {distribution}.\n\nInstall it "
             f"{how}.",
        epilog=examples("bash scripts/setup.sh    # in a checkout: both distributions, into .venv",
                        f"provision {cmd_name} --help"))


def version_text() -> str:
    """What ``provision --version`` prints: the installed version and where the playbooks, roles
    and verify suite come from (:func:`vllm_provision.resources.describe`), one per line."""
    from importlib.metadata import PackageNotFoundError, version

    from vllm_provision import resources

    try:
        installed = version("vllm-provision")
    except PackageNotFoundError:
        installed = "unknown (not installed as a package; run `pip install -e .` in the checkout)"
    lines = [f"provision (vllm-provision) {installed}"]
    lines += [f"{kind}: {where}" for kind, where in resources.describe().items()]
    return "\n".join(lines)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(version_text())
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version,
              help="Show the version and where the playbooks and roles come from, and exit.")
def cli() -> None:
    """Provision one vLLM replica over several bare-metal GPU servers, idempotently, over SSH."""


def main() -> None:
    """Console entry point: run the CLI and turn every known error into a message and exit code."""
    from vllm_provision.core.errors import ProvisionError

    # paramiko logs transport-thread failures (with tracebacks) through logging's last-resort
    # handler; connection errors reach the user as `unreachable` results instead.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(1 if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except ProvisionError as exc:
        from vllm_provision.output.report import render_error

        render_error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug of ours: say so in one block, the traceback only on request
        if os.environ.get("VLLM_PROVISION_TRACEBACK"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc}\n"
                   "  this is a bug in vllm-provision; rerun with VLLM_PROVISION_TRACEBACK=1 "
                   "to see where, and report it", err=True)
        sys.exit(1)
