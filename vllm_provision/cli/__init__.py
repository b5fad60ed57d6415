"""The ``provision`` command line: one module per command, loaded only when that command runs.

Each module in this package defines one ``click`` command (or group) named ``command``; one
table below (:data:`TABLE`) maps the command-line name to its module and one-line summary. A new
command is its module and one row (plus its schema in ``vllm_provision/schemas/`` when it has
``--json``). Keeping imports lazy keeps ``provision --help`` and every command fast (heavy
modules such as paramiko load only when needed).

Other distributions add commands through entry points of the group ``vllm_provision.commands``
(name: the command, value: ``module:attribute`` of a click command), loaded only when that command
runs: this repository's lab (lab/pyproject.toml) adds ``provision lab`` so. Without it,
``provision lab`` says how to install it (:data:`SEPARATE`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import sys
from typing import TYPE_CHECKING

import click

from vllm_provision.core.registry import Registry

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


# The commands, one row each: (name on the command line, module in vllm_provision.cli that
# defines ``command``, its one-line summary for `provision --help`). One table rather than a
# declaration in each module: `provision --help` lists the summaries without importing any
# command (click's default imports them all). The summary is the first paragraph of the
# command's own help; a unit test keeps the two equal (tests/unit/test_cli_help_completion.py).
_TABLE: tuple[tuple[str, str, str], ...] = (
    ("up", "up",
     "Deploy the replica: preflight, install, start in order, wait until it serves, verify."),
    ("down", "down",
     "Stop the replica in reverse start order and disable its units (--purge: remove them)."),
    ("restart", "restart",
     "Restart the whole replica in order, then wait until it serves and verify."),
    ("upgrade", "upgrade",
     "Upgrade the replicas N at a time: drain, apply, restart in order, verify, undrain."),
    ("status", "status",
     "Show each replica's units, rank 0's health, Ray's nodes and GPUs, and a verdict."),
    ("check", "check", "Gather facts from every node and run all preflight checks."),
    ("facts", "facts",
     "Probe every host in one SSH round trip each and print the facts, hosts as columns."),
    ("inventory", "inventory",
     "Show what each host gets after group_vars, host_vars and precedence (no host "
     "contacted)."),
    ("drift", "drift",
     "Show what changed since the last good `provision up`: facts and configuration."),
    ("logs", "logs", "Print the journals of every node of the replica, merged in time order."),
    ("exec", "exec_",
     "Run COMMAND on every host of the inventory (or of -l PATTERN), in parallel."),
    ("play", "play", "Run PLAYBOOK against the inventory's hosts."),
    ("verify", "verify",
     "Check a deployed replica with the packaged verify suite (pytest-testinfra over SSH)."),
    ("init", "init", "Probe the servers and print a first, working inventory."),
    ("completion", "completion",
     "Print the shell completion script for SHELL (commands, options, and the inventory's "
     "host and group names after -l/--limit)."),
    ("schema", "schema",
     "Print the JSON Schema (draft 2020-12) of COMMAND's --json output, or list them."),
    ("bench", "bench",
     "Benchmark the replica with streamed completions and record the conditions."),
    ("fault", "fault", "Hit one node of a serving replica and measure how traffic returns."),
    ("fabric", "fabric",
     "Measure the link between every pair of a replica's nodes: TCP throughput and RTT."),
    ("record", "record",
     "Write the decision record: GPU pool, who reserves GPUs and starts workers, what Ray "
     "adds and does not, how traffic returned after faults, the evidence, refusals where "
     "conditions differ, and one checkable closing sentence."),
    ("stack", "stack", "Install and upgrade the replica's Python stack from one reviewed lock."),
    ("monitor", "monitor",
     "Write Prometheus scrape targets for every replica (and a prometheus.yml); no host "
     "contacted."),
    ("top", "top",
     "Show every replica live: serving, units, requests, KV cache, TTFT/ITL, tokens/s, GPUs."),
)

# the command registry (vllm_provision.core.registry): a name twice is an error naming it;
# entry.obj is the module, entry.meta["summary"] the summary, in the table's order
TABLE: Registry[str] = Registry("command")
for _order, (_name, _module, _summary) in enumerate(_TABLE):
    TABLE.add(_name, _module, order=_order, module=__name__, summary=_summary)

# views of TABLE: command name -> module, command name -> summary
COMMANDS: dict[str, str] = {entry.name: entry.obj for entry in TABLE}
SUMMARIES: dict[str, str] = {entry.name: entry.meta["summary"] for entry in TABLE}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use: the modules of
    :data:`COMMANDS`, then the entry points of :data:`ENTRY_POINT_GROUP`."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands from :data:`SUMMARIES` (click's own layout and truncation), so
        ``provision --help`` imports none of them (click's default loads every command)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, click.utils.make_default_short_help(SUMMARIES[name], limit))
                if name in SUMMARIES else (name, self._loaded_summary(ctx, name, limit))
                for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _loaded_summary(self, ctx: click.Context, name: str, limit: int) -> str:
        command = self.get_command(ctx, name)
        return "" if command is None else command.get_short_help_str(limit)

    def list_commands(self, ctx: click.Context) -> list[str]:
        builtin = {name for name in COMMANDS if _module_exists(COMMANDS[name])}
        return sorted(builtin | set(_entry_points()) | set(SEPARATE))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMANDS.get(cmd_name)
        if module_name is not None and _module_exists(module_name):
            module = importlib.import_module(f"vllm_provision.cli.{module_name}")
            return module.command
        entry = _entry_points().get(cmd_name)
        if entry is not None:
            return _load_entry_point(entry)
        if cmd_name in SEPARATE:
            return _not_installed(cmd_name)
        return None


def _module_exists(module_name: str) -> bool:
    return importlib.util.find_spec(f"vllm_provision.cli.{module_name}") is not None


@functools.cache
def _entry_points() -> dict[str, EntryPoint]:
    """The commands other installed distributions add (name -> entry point); a name of
    :data:`COMMANDS` cannot be taken over. Read once from the installed metadata (about 20 ms),
    nothing imported."""
    from importlib.metadata import entry_points

    found = entry_points(group=ENTRY_POINT_GROUP)
    return {entry.name: entry for entry in found if entry.name not in COMMANDS}


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
