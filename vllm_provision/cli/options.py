"""Command-line options every command that touches hosts shares, and what they turn into.

Every shared option is declared once, in :data:`OPTIONS`, with its one default (the connection
defaults come from :mod:`vllm_provision.transport.base`). Usage in a command module::

    @click.command()
    @common_options                      # every shared option
    def command(**kwargs): opts = CommonOptions.from_kwargs(kwargs); ...

    @click.command()
    @shared_options(HOST_OPTIONS)        # without -C/--check and -D/--diff
    def command(**kwargs): ...
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

from vllm_provision.cli.completion import complete_limit
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.text import printable
from vllm_provision.inventory import yaml_limits
from vllm_provision.inventory.source import load_yaml_data
from vllm_provision.transport.base import (
    DEFAULT_FORKS,
    DEFAULT_HOST_KEY_POLICY,
    DEFAULT_TIMEOUT_S,
    ConnectionOptions,
)

F = TypeVar("F", bound=Callable[..., Any])


def echo(text: object = "", *, err: bool = False, nl: bool = True) -> None:
    """Print one human line (or several) with :func:`click.echo`, made printable first
    (:func:`vllm_provision.core.text.printable`, newlines and tabs kept): the lines of the
    commands that print what hosts answered (a unit state, a journal line, a holder file, a
    package version), so no host text becomes a terminal escape. ``err``: on stderr; ``nl``:
    end with a newline. A ``json.dumps`` line (ASCII, every control character a ``\\u``
    escape) passes through unchanged."""
    click.echo(printable(text, newlines=True), err=err, nl=nl)


def parse_extra_vars(values: Sequence[str]) -> dict[str, Any]:
    """Merge ``-e`` values, later ones winning.

    Each value is ``key=value`` (the value stays a string; the inventory loader converts it to
    the variable's type, as Ansible does), a YAML/JSON mapping (``'{"a": 1}'``), or ``@file.yml``
    (a YAML mapping read from the file).

    Raises:
        ProvisionError: unreadable file, YAML error, not a mapping, or no ``=``.
    """
    merged: dict[str, Any] = {}
    for raw in values:
        where = f"-e {raw[:60]}"
        if raw.startswith("@"):
            path = Path(raw[1:]).expanduser()
            try:
                data = load_yaml_data(yaml_limits.read_regular_file(path, "-e @file"))
            except yaml_limits.LimitError as exc:
                raise ProvisionError.single(exc.where(path) if exc.line else where,
                                            exc.message if exc.line else f"{exc.message} ({path})",
                                            fix=exc.fix) from None
            except UnicodeDecodeError:
                raise ProvisionError.single(where, f"{path} is not UTF-8 text",
                                            fix="give a YAML file of variables") from None
            except OSError as exc:
                raise ProvisionError.single(where, f"cannot read {path}: {exc.strerror}",
                                            fix="check the path after @") from None
            except yaml.YAMLError as exc:
                raise ProvisionError.single(where, f"YAML error in {path}: {_one_line(exc)}",
                                            fix="correct the YAML at that line") from None
            if not isinstance(data, dict):
                raise ProvisionError.single(where, f"{path} must hold a mapping",
                                            actual=type(data).__name__,
                                            fix="write 'name: value' lines") from None
            merged.update(data)
        elif raw.lstrip().startswith("{"):
            try:
                data = load_yaml_data(raw)
            except yaml_limits.LimitError as exc:
                raise ProvisionError.single(where, exc.message, fix=exc.fix) from None
            except yaml.YAMLError as exc:
                raise ProvisionError.single(where, f"invalid YAML/JSON mapping: {_one_line(exc)}",
                                            fix="write a mapping such as '{\"name\": 1}'") \
                    from None
            if not isinstance(data, dict):
                raise ProvisionError.single(where, "must be a mapping")
            merged.update(data)
        else:
            key, sep, value = raw.partition("=")
            if not sep or not key.strip().isidentifier():
                raise ProvisionError.single(where, "invalid extra variable",
                                            expected="key=value, a {...} mapping or @file.yml",
                                            actual=raw)
            merged[key.strip()] = value
    return merged


def _one_line(error: yaml.YAMLError) -> str:
    """A PyYAML error on one line (its text spans several, with a quoted excerpt)."""
    return " ".join(str(error).split())


@dataclass(frozen=True)
class CommonOptions:
    """The shared options, parsed.

    Attributes:
        inventory: the inventory file. limit: ``--limit`` host pattern or None.
        check / diff: dry run / show diffs. extra_vars: merged ``-e`` values.
        forks: connections opened and tasks run at once. verbosity: count of ``-v``.
        json: print one JSON object on stdout. host_key_policy: ``strict`` or ``accept-new``.
        timeout_s: SSH connect timeout and default per-command timeout, in seconds.
    """

    inventory: Path
    limit: str | None = None
    check: bool = False
    diff: bool = False
    extra_vars: dict[str, Any] | None = None
    forks: int = DEFAULT_FORKS
    verbosity: int = 0
    json: bool = False
    host_key_policy: str = DEFAULT_HOST_KEY_POLICY
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> CommonOptions:
        """Take the shared options out of a click command's ``kwargs`` (they are removed)."""
        opts = cls(
            inventory=Path(kwargs.pop("inventory")),
            limit=kwargs.pop("limit", None),
            check=kwargs.pop("check", False),
            diff=kwargs.pop("diff", False),
            extra_vars=parse_extra_vars(kwargs.pop("extra_vars", ()) or ()),
            forks=kwargs.pop("forks", DEFAULT_FORKS),
            verbosity=kwargs.pop("verbose", 0),
            json=kwargs.pop("json_output", False),
            host_key_policy=kwargs.pop("host_key_policy", DEFAULT_HOST_KEY_POLICY),
            timeout_s=kwargs.pop("timeout", DEFAULT_TIMEOUT_S),
        )
        opts.apply_globals()
        return opts

    def apply_globals(self) -> None:
        """Set logging from ``-v`` (warning / info / debug), the JSON error mode and where waits
        show their progress (live on a terminal, else plain lines on stderr:
        :mod:`vllm_provision.output.progress`)."""
        from vllm_provision.output import progress, report

        report.set_json_mode(self.json)
        progress.configure(progress.choose_mode(json_mode=self.json))
        level = {0: logging.WARNING, 1: logging.INFO}.get(self.verbosity, logging.DEBUG)
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        # paramiko logs a transport thread's failure (a host that closes before its banner, a
        # reset) at ERROR with a traceback; the user gets it as an `unreachable` result, so its
        # log shows from -vv (WARNING) and its debug lines from -vvv only.
        paramiko_level = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.WARNING}
        logging.getLogger("paramiko").setLevel(paramiko_level.get(self.verbosity, level))

    def connection_options(self) -> ConnectionOptions:
        """Return :class:`vllm_provision.transport.base.ConnectionOptions` for these
        options."""
        return ConnectionOptions(connect_timeout_s=self.timeout_s,
                                 command_timeout_s=self.timeout_s,
                                 host_key_policy=self.host_key_policy,  # type: ignore[arg-type]
                                 forks=self.forks)

    def load_inventory(self, *, require_replica: bool = False) -> Any:
        """Load and validate the inventory (and ``--limit``) before any connection is opened.

        Args:
            require_replica: refuse an inventory without a replica (commands that act on one).

        Raises:
            InventoryError: invalid inventory, extra vars or limit pattern; no replica.
        """
        from vllm_provision.inventory import load_inventory, require_replicas, select_hosts

        inventory = load_inventory(self.inventory, self.extra_vars or None)
        if require_replica:
            require_replicas(inventory)
        if self.limit:
            select_hosts(inventory, self.limit)
        return inventory


# Every shared option, declared once: name -> click decorator. Commands take them all
# (:func:`common_options`) or a named subset (:func:`shared_options`).
OPTIONS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "inventory": click.option("-i", "--inventory", required=True,
                              type=click.Path(path_type=Path),
                              help="Inventory: a YAML or INI file, or a directory of them."),
    "limit": click.option("-l", "--limit", metavar="PATTERN",
                          shell_complete=complete_limit,
                          help="Only hosts matching this pattern (e.g. 'h1', 'llama:!h2')."),
    "check": click.option("-C", "--check", is_flag=True,
                          help="Dry run: change nothing; exit 2 if changes are pending."),
    "diff": click.option("-D", "--diff", is_flag=True, help="Show what changes in files."),
    "extra_vars": click.option("-e", "--extra-vars", "extra_vars", multiple=True,
                               metavar="K=V|@FILE",
                               help="Extra variable (highest precedence); repeatable."),
    "forks": click.option("-f", "--forks", type=click.IntRange(1, 1000), default=DEFAULT_FORKS,
                          show_default=True, help="Hosts handled in parallel."),
    "verbose": click.option("-v", "--verbose", count=True, help="More output (-v, -vv)."),
    "json": click.option("--json", "json_output", is_flag=True,
                         help="Print exactly one JSON object on stdout (progress on stderr); its "
                              "schema: provision schema COMMAND."),
    "host_key_policy": click.option(
        "--host-key-policy", type=click.Choice(["strict", "accept-new"]),
        default=DEFAULT_HOST_KEY_POLICY, show_default=True,
        help="Unknown SSH host keys: refuse, or accept and remember them."),
    "timeout": click.option("--timeout", type=click.FloatRange(1, 86400),
                            default=DEFAULT_TIMEOUT_S, show_default=True,
                            help="SSH connect and per-command timeout (seconds)."),
}
# The options of a command that reads hosts but runs no playbook (no dry run, no diff).
HOST_OPTIONS: tuple[str, ...] = ("inventory", "limit", "extra_vars", "forks", "verbose", "json",
                                 "host_key_policy", "timeout")
RUN_OPTIONS: tuple[str, ...] = tuple(OPTIONS)


def shared_options(names: Sequence[str] = RUN_OPTIONS) -> Callable[[F], F]:
    """Return a decorator adding the shared options ``names`` (keys of :data:`OPTIONS`), in
    the table's order, to a click command; :meth:`CommonOptions.from_kwargs` reads them.

    Raises:
        KeyError: a name that is not in :data:`OPTIONS` (a programming error).
    """
    chosen = [OPTIONS[name] for name in OPTIONS if name in names]
    unknown = set(names) - set(OPTIONS)
    if unknown:
        raise KeyError(f"unknown shared options: {sorted(unknown)}")

    def decorate(function: F) -> F:
        decorated: Callable[..., Any] = function
        for option in reversed(chosen):
            decorated = option(decorated)
        return decorated  # type: ignore[return-value]  # click returns the same function

    return decorate


def replica_option(what: str = "The replica") -> Callable[[F], F]:
    """Return the ``--replica NAME`` option (into ``replica_name``) of a command that acts on
    one replica: ``what`` starts its help (``"The replica to benchmark"``); unset, the command
    takes the inventory's only replica (the operation resolves it and refuses when there are
    several)."""
    return click.option("--replica", "replica_name", metavar="NAME",
                        help=f"{what} (default: the inventory's only one).")


def common_options(function: F) -> F:
    """Decorate a click command with every shared option (see :class:`CommonOptions`)."""
    return shared_options(RUN_OPTIONS)(function)
