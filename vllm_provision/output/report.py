"""What the user sees: a line per host and task as results arrive, a PLAY RECAP, ``--json``.

Human output looks like ansible-playbook's (``ok: [h1]``, ``changed: [h2]``, coloured, diffs in
diff mode, then a recap table and the total time). With ``--json`` exactly ONE JSON object is
printed on stdout at the end (progress lines go to stderr); its schema is in docs/engine.md.
Errors (:class:`ProvisionError`) are printed once by :func:`render_error`, never as a traceback.
Text from hosts (task messages, diffs, errors) is printed literally: control characters shown
escaped (:func:`vllm_provision.core.text.printable`) and rich markup escaped; ``--json`` is
``json.dumps`` (every control character a ``\\u00XX`` escape, non-ASCII too), exact.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.core.text import printable

STATUS_STYLE = {
    Status.OK: "green", Status.CHANGED: "yellow", Status.FAILED: "bold red",
    Status.SKIPPED: "cyan", Status.UNREACHABLE: "bold magenta",
}
COUNT_KEYS = ("ok", "changed", "failed", "skipped", "unreachable")

_json_mode = False


def set_json_mode(enabled: bool) -> None:
    """Make :func:`render_error` print its JSON object on stdout too (``--json``)."""
    global _json_mode
    _json_mode = enabled


def _console(stream: TextIO) -> Any:
    from rich.console import Console

    return Console(file=stream, highlight=False, soft_wrap=True)


_shared: dict[int, tuple[TextIO, Any]] = {}


def shared_console(stream: TextIO) -> Any:
    """The one ``rich`` console of ``stream`` for this process: the human reporter and the live
    progress display (:mod:`vllm_provision.output.progress`) print through it, so results printed
    during a wait appear above the live rows instead of through them."""
    found = _shared.get(id(stream))
    if found is None or found[0] is not stream:
        found = (stream, _console(stream))
        _shared[id(stream)] = found
    return found[1]


class HumanReporter:
    """Prints results as they arrive.

    Args:
        stream: where to print (stdout normally, stderr with ``--json``).
        diff_mode: print diffs.
        verbosity: 0 shows messages of changed/failed results; 1+ shows every message.
    """

    def __init__(self, stream: TextIO | None = None, *, diff_mode: bool = False,
                 verbosity: int = 0) -> None:
        self.console = shared_console(stream or sys.stdout)
        self.diff_mode = diff_mode
        self.verbosity = verbosity

    def play_started(self, name: str, hosts: Sequence[str]) -> None:
        """Print ``PLAY [name]``."""
        self.console.print()
        self.console.rule(f"[bold]PLAY [{_esc(name)}][/bold]", align="left", style="dim")
        if not hosts:
            self.console.print("[dim]skipping: no hosts matched[/dim]")

    def task_started(self, name: str, *, handler: bool = False) -> None:
        """Print ``TASK [name]`` or ``RUNNING HANDLER [name]``."""
        kind = "RUNNING HANDLER" if handler else "TASK"
        self.console.print()
        self.console.print(f"[bold]{kind} [{_esc(name)}][/bold]")

    def task_result(self, result: TaskResult) -> None:
        """Print one host's result line, its message and (diff mode) its diff."""
        style = STATUS_STYLE[result.status]
        line = f"[{style}]{result.status.value}: {_esc('[' + result.host + ']')}[/{style}]"
        show_message = result.message and (
            self.verbosity > 0 or result.status in (Status.CHANGED, Status.FAILED,
                                                    Status.UNREACHABLE))
        if show_message:
            # printable first: a host's \r or U+2028 is shown escaped, not taken as a line end
            first, *rest = printable(result.message, newlines=True).rstrip("\n").split("\n")
            line += f" {_esc(first)}"
            if rest:
                line += "\n" + _esc("\n".join("    " + r for r in rest))
        self.console.print(line)
        if self.diff_mode and result.diff:
            from rich.syntax import Syntax

            self.console.print(Syntax(printable(result.diff, newlines=True), "diff",
                                      theme="ansi_dark", background_color="default"))

    def recap(self, summary: Mapping[str, Any]) -> None:
        """Print the PLAY RECAP table and the total time."""
        from rich.table import Table

        self.console.print()
        table = Table(title="PLAY RECAP", title_justify="left", box=None, pad_edge=False)
        table.add_column("host", style="bold")
        for key in COUNT_KEYS:
            table.add_column(key, justify="right")
        for host, counts in summary["hosts"].items():
            cells = []
            for key in COUNT_KEYS:
                value = counts[key]
                style = {"changed": "yellow", "failed": "red", "unreachable": "magenta",
                         "ok": "green", "skipped": "cyan"}[key] if value else "dim"
                cells.append(f"[{style}]{value}[/{style}]")
            table.add_row(_esc(host), *cells)
        self.console.print(table)
        mode = " (check mode: nothing was changed)" if summary["check_mode"] else ""
        totals = " ".join(f"{key}={summary[key]}" for key in
                          ("changed", "ok", "failed", "unreachable", "skipped"))
        self.console.print(f"{totals}; total time {summary['duration_s']:.1f} s{mode}",
                           highlight=False)
        if self.verbosity >= 2:
            for line in stats_lines(summary.get("stats") or {}):
                self.console.print(_esc(line), highlight=False)


def stats_lines(stats: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The ``-vv`` lines of the connection counters (``summary["stats"]``), one per host."""
    return [f"ssh {host}: {c['connects']} connection(s), {c['commands']} remote command(s), "
            + (f"{c['exchanges']} read(s) over the run lock's channel, "
               if c.get("exchanges") else "")
            + f"{c['round_trips']} round trip(s) after connecting" for host, c in stats.items()]


def connection_stats() -> dict[str, dict[str, int]]:
    """The connection layer's counters so far (:data:`vllm_provision.transport.stats.STATS`):
    host
    -> ``{"connects", "commands", "round_trips", "exchanges"}``; the ``stats`` key of
    ``--json``."""
    from vllm_provision.transport.stats import STATS

    return STATS.snapshot()


class QuietReporter:
    """Collects nothing and prints nothing (for callers that only want the summary)."""

    def play_started(self, name: str, hosts: Sequence[str]) -> None:
        """Ignore."""

    def task_started(self, name: str, *, handler: bool = False) -> None:
        """Ignore."""

    def task_result(self, result: TaskResult) -> None:
        """Ignore."""


def summarize(results: Sequence[TaskResult], hosts: Sequence[str], *, check_mode: bool,
              duration_s: float, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Build the ``--json`` object (also what the recap prints).

    Returns:
        ``{"ok", "changed", "failed", "skipped", "unreachable"}`` totals (ints), ``"hosts"``:
        name -> the same counts plus ``"failures"`` (list of ``{"task", "status", "message"}``),
        ``"tasks"``: every result as a dict, ``"check_mode"``, ``"duration_s"``, and ``extra``'s
        keys (command-specific, e.g. ``completion``) on top.
    """
    per_host: dict[str, dict[str, Any]] = {}
    for name in hosts:
        per_host[name] = {key: 0 for key in COUNT_KEYS} | {"failures": []}
    for result in results:
        counts = per_host.setdefault(result.host, {key: 0 for key in COUNT_KEYS}
                                     | {"failures": []})
        counts[result.status.value] += 1
        if result.status in (Status.FAILED, Status.UNREACHABLE):
            counts["failures"].append({"task": result.task, "status": result.status.value,
                                       "message": result.message})
    totals = {key: sum(c[key] for c in per_host.values()) for key in COUNT_KEYS}
    summary: dict[str, Any] = {
        **totals,
        "hosts": per_host,
        "tasks": [task_result_dict(r) for r in results],
        "check_mode": check_mode,
        "duration_s": round(duration_s, 3),
    }
    if extra:
        summary.update(extra)
    return summary


def task_result_dict(result: TaskResult) -> dict[str, Any]:
    """Return one result as a JSON-ready dict."""
    return {"host": result.host, "task": result.task, "status": result.status.value,
            "message": result.message, "diff": result.diff,
            "duration_s": round(result.duration_s, 3), "data": result.data}


def exit_code(summary: Mapping[str, Any], *, check_mode: bool) -> int:
    """Return the process exit code.

    0: success (and, with ``--check``, nothing would change); 1: a task failed or a host was
    unreachable; 2: ``--check`` and changes are pending (Terraform's ``-detailed-exitcode``,
    which Ansible declined: ansible/ansible#32672).
    """
    if summary["failed"] or summary["unreachable"]:
        return 1
    if check_mode and summary["changed"]:
        return 2
    return 0


def print_json(summary: Mapping[str, Any], stream: TextIO | None = None) -> None:
    """Print ``summary`` as exactly one JSON object (one line) on stdout."""
    out = stream or sys.stdout
    out.write(json.dumps(summary, default=str, sort_keys=False) + "\n")
    out.flush()


def render_error(error: ProvisionError, stream: TextIO | None = None) -> None:
    """Print every problem of ``error`` once, in red, without a traceback, on stderr.

    With ``--json`` (see :func:`set_json_mode`) also print ``{"error": true, "problems": [...]}``
    on stdout, so that stdout always holds exactly one JSON object.
    """
    console = _console(stream or sys.stderr)
    for problem in error.problems or []:
        first, *rest = printable(problem.render(), newlines=True).rstrip("\n").split("\n")
        console.print(f"[bold red]error:[/bold red] {_esc(first)}")
        for line in rest:
            console.print(_esc(line))
    if not error.problems:
        console.print(f"[bold red]error:[/bold red] {_esc(str(error))}")
    if _json_mode:
        print_json({"error": True, "exit_code": error.exit_code, "problems": [
            {"where": p.where, "message": p.message, "expected": p.expected,
             "actual": p.actual, "fix": p.fix} for p in error.problems]})


def _esc(text: str) -> str:
    """``text`` (a task's message, a host's answer, an error) as literal rich text: printable
    (:func:`vllm_provision.core.text.printable`, newlines kept: no terminal escape from a
    host) and markup-escaped (``[bold]`` in a host's text is shown, not applied)."""
    from rich.markup import escape

    return escape(printable(text, newlines=True))
