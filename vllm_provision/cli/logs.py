"""``provision logs``: every node's journal of the replica, merged in time order, tagged with host
and unit (``stern`` / ``kubectl logs`` for a replica); ``-f`` follows."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import click

from vllm_provision.backends import UNIT_KINDS
from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, echo, shared_options
from vllm_provision.core.errors import ProvisionError

# Colours of the host prefix on a terminal, one per host in inventory order.
HOST_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
               "bright_magenta", "bright_green", "bright_yellow")
LOG_OPTIONS = ("inventory", "limit", "extra_vars", "verbose", "host_key_policy", "timeout")


def node_units(inventory: Any, limit: str | None, kinds: Sequence[str],
               ) -> list[tuple[Any, list[str]]]:
    """``(host, units)`` of every node of every replica (``limit``: those the pattern selects),
    in inventory order; the units are the backend's ``journal_units`` of ``kinds``.

    Raises:
        ProvisionError: no node matched, or none runs a unit of ``kinds``.
    """
    from vllm_provision.inventory import select_hosts

    chosen = {h.name for h in select_hosts(inventory, limit)} if limit else None
    found: list[tuple[Any, list[str]]] = []
    for replica in inventory.replicas:
        for node in replica.nodes:
            if chosen is not None and node.name not in chosen:
                continue
            if any(host.name == node.name for host, _ in found):
                continue
            by_kind = replica.backend_type.journal_units(replica, node, node.host.vars)
            units = list(dict.fromkeys(u for kind in kinds for u in by_kind.get(kind, [])))
            if units:
                found.append((node.host, units))
    if not found:
        raise ProvisionError.single(
            f"provision logs -i {inventory.path}", "no node of a replica runs such a unit",
            expected=f"a node of a replica{' matching ' + repr(limit) if limit else ''} with "
                     f"a unit of kind {', '.join(kinds)}",
            fix="check --limit and --unit (a Ray worker has no vllm unit; an mp node no ray "
                "unit)")
    return found


class _Printer:
    """Prints entries as ``TIME HOST UNIT: MESSAGE``; on a terminal each host has its colour."""

    def __init__(self, hosts: Sequence[str], units: Sequence[str]) -> None:
        from vllm_provision.output.report import shared_console

        self.console = shared_console(sys.stdout)
        self.colour = sys.stdout.isatty()
        self.styles = {host: HOST_STYLES[i % len(HOST_STYLES)] for i, host in enumerate(hosts)}
        self.host_width = max((len(h) for h in hosts), default=1)
        self.unit_width = max((len(u) for u in units), default=1)

    def print(self, entries: Sequence[Any]) -> None:
        from rich.text import Text

        from vllm_provision.output.logs import line_parts

        for entry in entries:
            stamp, source, message = line_parts(entry, self.host_width, self.unit_width)
            if not self.colour:
                sys.stdout.write(f"{stamp} {source}: {message}\n")
                continue
            text = Text(stamp + " ", style="dim")
            text.append(source, style=self.styles.get(entry.host, ""))
            text.append(": " + message)
            self.console.print(text, soft_wrap=True)
        sys.stdout.flush()


@click.command("logs", epilog=examples(
    "provision logs -i inventory.yml --since 10m",
    "provision logs -i inventory.yml -l h2 --unit vllm --since 10m -f"))
@shared_options(LOG_OPTIONS)
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing new lines as they come; Ctrl-C stops (exit 0).")
@click.option("--since", metavar="T",
              help="Only lines since T: a duration back from now (30s, 10m, 2h, 1d) or an ISO "
                   "8601 date/time (2026-12-01T10:00; no zone: this machine's).")
@click.option("-n", "--lines", type=click.IntRange(0, 1_000_000), default=None,
              help="The last N lines of each node (default 100, or all since T with --since).")
@click.option("--unit", "kinds", type=click.Choice(UNIT_KINDS), multiple=True,
              help="Only these units (repeatable): vllm, ray (Ray's head and workers) or "
                   "watchdog. Default: all three.")
def command(follow: bool, since: str | None, lines: int | None, kinds: tuple[str, ...],
            **kwargs: Any) -> None:
    """Print the journals of every node of the replica, merged in time order.

    Each line is ``TIME HOST UNIT: MESSAGE`` (TIME in UTC with microseconds, from each node's
    clock), the host coloured on a terminal. The unit names come from the inventory (each
    replica's backend): ``--unit vllm`` is ``vllm_unit_name`` on mp nodes and the Ray head.


    Exit code: 0, also when -f is stopped with Ctrl-C; 1 on an invalid inventory or --since, or
    when a node could not be read (the others are printed).
    """
    from vllm_provision.output import logs
    from vllm_provision.transport.connection import close_all, open_connections

    opts = CommonOptions.from_kwargs(kwargs)
    inventory = opts.load_inventory(require_replica=True)
    since_s = logs.parse_since(since) if since else None
    count = lines if lines is not None else (None if since_s is not None else logs.DEFAULT_LINES)
    nodes = node_units(inventory, opts.limit, kinds or UNIT_KINDS)
    connections, errors = open_connections([host for host, _ in nodes],
                                           opts.connection_options())
    failed = {name: str(err.problems[0].message) for name, err in errors.items()}
    printer = _Printer([h.name for h, _ in nodes], [u for _, units in nodes for u in units])
    order = {host.name: i for i, (host, _) in enumerate(nodes)}
    units_of = {host.name: units for host, units in nodes}
    try:
        streams, cursors = _read_all(connections, units_of, order, since_s, count, failed)
        printer.print(logs.merge(streams))
        for name, reason in failed.items():
            echo(f"error: {name}: {reason}", err=True)
        if follow:
            _follow(connections, units_of, order, cursors, since_s, printer)
    except KeyboardInterrupt:
        if not follow:
            raise
    except BrokenPipeError:  # `provision logs | head`: the reader has what it wanted
        sys.stderr.close()
    finally:
        close_all(connections)
    sys.exit(1 if failed else 0)


def _read_all(connections: dict[str, Any], units_of: dict[str, list[str]],
              order: dict[str, int], since_s: float | None, count: int | None,
              failed: dict[str, str]) -> tuple[list[list[Any]], dict[str, str]]:
    """Read every node's journal at once (a thread per node); a node that fails joins
    ``failed``. Returns the entries per node and each node's last cursor."""
    from concurrent.futures import ThreadPoolExecutor

    from vllm_provision.output import logs
    from vllm_provision.transport.base import UnreachableError

    def one(name: str) -> list[Any]:
        command = logs.journal_command(units_of[name], since=since_s, lines=count)
        try:
            result = connections[name].run(command, timeout_s=120)
        except UnreachableError as exc:
            failed[name] = str(exc.problems[0].message)
            return []
        if result.exit_code != 0 and not result.stdout:
            failed[name] = (f"journalctl exited with status {result.exit_code}: "
                            f"{result.stderr.strip()[-300:]}")
        return logs.parse_entries(result.stdout, name, order[name], units_of[name])

    names = list(connections)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        streams = list(pool.map(one, names))
    cursors = {name: (stream[-1].cursor if stream else "")
               for name, stream in zip(names, streams, strict=True)}
    return streams, cursors


def _follow(connections: dict[str, Any], units_of: dict[str, list[str]], order: dict[str, int],
            cursors: dict[str, str], since_s: float | None, printer: _Printer) -> None:
    """Follow every node (``journalctl -f`` on a second channel of each connection) until
    Ctrl-C, printing entries in time order within a :data:`~vllm_provision.output.logs.HOLD_S`
    window. Returns on Ctrl-C (SIGINT) after closing the channels."""
    from vllm_provision.output import logs
    from vllm_provision.transport.base import UnreachableError

    arrived: queue.Queue[tuple[float, Any] | tuple[float, str]] = queue.Queue()
    channels = []
    stop = threading.Event()
    held: list[Any] = []

    def reader(name: str, channel: Any) -> None:
        buffer = b""
        try:
            while not stop.is_set():
                data = channel.recv(65536)
                if not data:
                    break
                buffer += data
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    entry = logs.parse_entry(raw.decode("utf-8", "replace"), name, order[name],
                                             units_of[name])
                    if entry is not None:
                        arrived.put((time.monotonic(), entry))
        except OSError:
            pass
        if not stop.is_set():
            arrived.put((time.monotonic(), f"{name}: the journal stream ended"))

    try:
        for name, conn in connections.items():
            command = logs.follow_command(units_of[name], since=since_s, cursor=cursors[name])
            try:
                channel = conn.start(command, timeout_s=30)
            except UnreachableError as exc:
                echo(f"error: {name}: {exc.problems[0].message}", err=True)
                continue
            channels.append(channel)
            threading.Thread(target=reader, args=(name, channel), daemon=True).start()
        while True:
            try:
                seen, item = arrived.get(timeout=0.1)
                if isinstance(item, str):
                    echo(f"warning: {item}", err=True)
                else:
                    held.append((seen, item))
            except queue.Empty:
                pass
            now = time.monotonic()
            ready = [entry for seen, entry in held if now - seen >= logs.HOLD_S]
            if ready:
                held = [(seen, entry) for seen, entry in held if now - seen < logs.HOLD_S]
                printer.print(logs.merge([ready]))
    except KeyboardInterrupt:
        printer.print(logs.merge([[entry for _, entry in held]]))  # what had arrived
    finally:
        stop.set()
        for channel in channels:
            try:
                channel.shutdown_write()  # EOF on the remote `cat`: journalctl is killed
                channel.close()
            except Exception:  # noqa: BLE001 - a channel already gone is fine
                pass
