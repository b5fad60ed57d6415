"""``provision top``: a live terminal view of every replica, refreshed each ``--interval``.

A thin caller of :mod:`vllm_provision.operations.top` (reads) and
:mod:`vllm_provision.operations.top_view` (shows); docs/monitoring.md, "provision top".
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, echo, shared_options


@click.command("top", epilog=examples(
    'provision top -i inventory.yml',
    'provision top -i inventory.yml -l llama --once',
    'provision top -i inventory.yml --json | jq ".replicas[] | {replica, serving}"'))
@shared_options(HOST_OPTIONS)
@click.option("--once", is_flag=True,
              help="Print one plain snapshot and exit (two /metrics scrapes --interval apart: "
                   "tokens/s over that interval, latencies since start).")
@click.option("--interval", type=click.FloatRange(min=0.2, max=3600), default=1.0,
              show_default=True, metavar="S",
              help="Seconds between refreshes (with --once/--json: between the two scrapes).")
def command(once: bool, interval: float, **kwargs: Any) -> None:
    """Show every replica live: serving, units, requests, KV cache, TTFT/ITL, tokens/s, GPUs.

    Per refresh: one SSH command per node (units, restarts, nvidia-smi) and one connection to
    each replica's rank 0 (/health, /metrics), all in parallel. A replica that does not answer
    is shown not serving; the others are shown as usual. Latencies are p50/p99 over the last
    minute (since start on the first refresh and with --once). --json implies --once.

    Exit code: 0 on Ctrl-C; with --once or --json, 0 when every replica serves, 3 otherwise;
    1 on an invalid inventory or pattern.
    """
    from vllm_provision.operations import top as operation

    opts = CommonOptions.from_kwargs(kwargs)
    inventory = opts.load_inventory(require_replica=True)
    replicas = operation.chosen_replicas(inventory, opts.limit)
    viewer, close = operation.open_top(replicas, opts.connection_options())
    try:
        if once or opts.json:
            sys.exit(_once(viewer, interval, opts.json))
        _live(viewer, interval)
    finally:
        close()
    sys.exit(0)


def _once(viewer: Any, interval_s: float, as_json: bool) -> int:
    """Two refreshes ``interval_s`` apart, start to start (as the live view's, so the first
    one's reads count in the interval); print the second (plain text or JSON)."""
    from vllm_provision.operations.top_view import plain

    started = time.monotonic()
    viewer.refresh()
    time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    view = viewer.refresh(cumulative=True)
    echo(json.dumps(view) if as_json else plain(view))
    return 0 if all(r["serving"] for r in view["replicas"]) else 3


def _live(viewer: Any, interval_s: float) -> None:
    """Refresh until Ctrl-C: on a terminal, rich's live display on the alternate screen (the
    terminal is as before on exit); otherwise a plain snapshot per refresh."""
    from rich.live import Live

    from vllm_provision.operations.top_view import plain, rich_view
    from vllm_provision.output.report import shared_console

    console = shared_console(sys.stdout)
    try:
        if not console.is_terminal:
            while True:
                started = time.monotonic()
                echo(plain(viewer.refresh()) + "\n")
                time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
        with Live(console=console, screen=True, auto_refresh=False, transient=True,
                  redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                started = time.monotonic()
                live.update(rich_view(viewer.refresh()), refresh=True)
                time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
