"""Command-line options every command that touches hosts shares, and what they turn into.

Usage in a command module::

    @click.command()
    @common_options
    def command(**kwargs): opts = CommonOptions.from_kwargs(kwargs); ...
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

from vllm_provision.errors import ProvisionError
from vllm_provision.inventory import yaml_limits
from vllm_provision.inventory.source import load_yaml_data

F = TypeVar("F", bound=Callable[..., Any])


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
    forks: int = 10
    verbosity: int = 0
    json: bool = False
    host_key_policy: str = "strict"
    timeout_s: float = 30.0

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> CommonOptions:
        """Take the shared options out of a click command's ``kwargs`` (they are removed)."""
        opts = cls(
            inventory=Path(kwargs.pop("inventory")),
            limit=kwargs.pop("limit", None),
            check=kwargs.pop("check", False),
            diff=kwargs.pop("diff", False),
            extra_vars=parse_extra_vars(kwargs.pop("extra_vars", ()) or ()),
            forks=kwargs.pop("forks", 10),
            verbosity=kwargs.pop("verbose", 0),
            json=kwargs.pop("json_output", False),
            host_key_policy=kwargs.pop("host_key_policy", "strict"),
            timeout_s=kwargs.pop("timeout", 30.0),
        )
        opts.apply_globals()
        return opts

    def apply_globals(self) -> None:
        """Set logging from ``-v`` (warning / info / debug) and the JSON error mode."""
        from vllm_provision import report

        report.set_json_mode(self.json)
        level = {0: logging.WARNING, 1: logging.INFO}.get(self.verbosity, logging.DEBUG)
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        if self.verbosity < 3:
            logging.getLogger("paramiko").setLevel(max(level, logging.WARNING))

    def connection_options(self) -> Any:
        """Return :class:`vllm_provision.connection.ConnectionOptions` for these options."""
        from vllm_provision.connection import ConnectionOptions

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


def common_options(function: F) -> F:
    """Decorate a click command with the shared options (see :class:`CommonOptions`)."""
    options = [
        click.option("-i", "--inventory", required=True,
                     type=click.Path(path_type=Path),
                     help="Inventory: a YAML or INI file, or a directory of them."),
        click.option("-l", "--limit", metavar="PATTERN",
                     help="Only hosts matching this pattern (e.g. 'h1', 'llama:!h2')."),
        click.option("-C", "--check", is_flag=True,
                     help="Dry run: change nothing; exit 2 if changes are pending."),
        click.option("-D", "--diff", is_flag=True, help="Show what changes in files."),
        click.option("-e", "--extra-vars", "extra_vars", multiple=True, metavar="K=V|@FILE",
                     help="Extra variable (highest precedence); repeatable."),
        click.option("-f", "--forks", type=click.IntRange(1, 1000), default=10,
                     show_default=True, help="Hosts handled in parallel."),
        click.option("-v", "--verbose", count=True, help="More output (-v, -vv)."),
        click.option("--json", "json_output", is_flag=True,
                     help="Print exactly one JSON object on stdout (progress on stderr)."),
        click.option("--host-key-policy", type=click.Choice(["strict", "accept-new"]),
                     default="strict", show_default=True,
                     help="Unknown SSH host keys: refuse, or accept and remember them."),
        click.option("--timeout", type=click.FloatRange(1, 86400), default=30.0,
                     show_default=True, help="SSH connect and per-command timeout (seconds)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function
