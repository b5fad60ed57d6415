"""What a long wait is doing, while it waits: one line per node, live on a terminal.

Any code that waits on hosts (the readiness wait, the Ray cluster wait, ...) opens a
:func:`wait` and updates each node's row as it polls::

    from vllm_provision.output import progress

    with progress.wait("replica llm: until rank 0 serves", ["h1", "h2"]) as view:
        while not done():
            view.update("h1", state="vllm.service active (running)", phase="loading weights 50%")
            ...
        view.finish("serving")

A row shows the seconds since the wait began, the unit state and the phase (for vLLM, read from
its own log lines: :mod:`vllm_provision.output.phases`). Where it goes is set once per command by
:func:`configure` (the shared options call it):

* ``live``: a ``rich`` live display on the terminal the human output goes to (stdout), redrawn
  in place 4 times a second; several waits at once (several replicas) share one display, and
  lines printed meanwhile through :func:`report.shared_console` appear above it;
* ``plain``: on a non-terminal or with ``--json``: plain lines on stderr, one when a row's
  state or phase changes and otherwise one per row every :data:`PLAIN_EVERY_S` seconds, never
  an escape code;
* ``off``: nothing (library use, unit tests).

Text that came from a host (a log line) is made printable first (:func:`printable`), so a host
cannot move the cursor or change colours on the operator's terminal.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from vllm_provision.core.text import printable as _printable

Mode = Literal["live", "plain", "off"]
PLAIN_EVERY_S = 10.0
REFRESH_PER_SECOND = 4

_lock = threading.RLock()
# held around opening and closing a wait (which start and stop the live display); never taken
# by the display's refresh thread, so it cannot deadlock with it
_display_lock = threading.Lock()
_settings: dict[str, Any] = {"mode": "off", "stream": None}
_board: _Board | None = None


def printable(text: str, limit: int = 300) -> str:
    """``text`` on one line, safe to print on a terminal, cut to ``limit`` characters:
    :func:`vllm_provision.core.text.printable` with newlines escaped and tabs kept."""
    return _printable(text, limit=limit)


def choose_mode(*, json_mode: bool, stream: TextIO | None = None) -> Mode:
    """``live`` when the human output (``stream``, default stdout) is a terminal and not
    ``--json``, else ``plain``."""
    target = stream if stream is not None else sys.stdout
    isatty = getattr(target, "isatty", None)
    return "live" if not json_mode and callable(isatty) and isatty() else "plain"


def configure(mode: Mode, stream: TextIO | None = None) -> None:
    """Set where waits report: ``live`` (on ``stream``, default stdout), ``plain`` (on
    ``stream``, default stderr) or ``off``."""
    with _lock:
        _settings["mode"] = mode
        _settings["stream"] = stream


def mode() -> Mode:
    """The configured mode (:func:`configure`)."""
    result: Mode = _settings["mode"]
    return result


@dataclass
class Row:
    """One node of a wait: ``host``, its unit ``state`` words and the current ``phase``."""

    host: str
    state: str = ""
    phase: str = ""
    printed: tuple[str, str] | None = None
    printed_at: float = 0.0


@dataclass
class Wait:
    """One wait's rows (open it with :func:`wait`); update them with :meth:`update`.

    Attributes:
        title: what is awaited, e.g. ``replica llm: until rank 0 serves``.
        rows: host name -> :class:`Row`, in the order given.
        started: :func:`time.monotonic` when the wait began.
    """

    title: str
    rows: dict[str, Row]
    started: float = field(default_factory=time.monotonic)
    outcome: str = ""
    _emit: Callable[[Wait, Row], None] | None = None
    clock: Callable[[], float] = time.monotonic

    def elapsed(self) -> float:
        """Seconds since the wait began."""
        return self.clock() - self.started

    def update(self, host: str, *, state: str | None = None, phase: str | None = None) -> None:
        """Set ``host``'s unit state and/or phase (host text is made printable); a host not
        given to :func:`wait` gets a row."""
        with _lock:
            row = self.rows.setdefault(host, Row(host))
            if state is not None:
                row.state = printable(state, 120)
            if phase is not None:
                row.phase = printable(phase, 160)
            if self._emit is not None:
                self._emit(self, row)

    def finish(self, outcome: str) -> None:
        """Record how the wait ended (``serving``); shown in place of the phases' title."""
        self.outcome = printable(outcome, 80)

    def line(self, row: Row) -> str:
        """The plain text of one row: ``[title] h1 12 s vllm.service active (running): phase``."""
        words = f"[{self.title}] {row.host} {self.elapsed():.0f} s"
        if row.state:
            words += f" {row.state}"
        return words + (f": {row.phase}" if row.phase else "")


class _Board:
    """Every open wait of the process, drawn as one live display or as plain lines.

    Lock order: the live display's own lock (its refresh thread) is taken before ``_lock``
    (:class:`_Renderable`), so the display is started, refreshed and stopped only while
    ``_lock`` is NOT held.
    """

    def __init__(self, live_mode: bool, stream: TextIO | None) -> None:
        self.waits: list[Wait] = []
        self.live_mode = live_mode
        self.stream = stream
        self.live: Any = None

    def open(self, item: Wait) -> Any:
        """Add ``item`` (under ``_lock``); return a live display to start, or None."""
        self.waits.append(item)
        if not self.live_mode:
            item._emit = self.emit_plain
            for row in item.rows.values():
                self.emit_plain(item, row)
            return None
        if self.live is not None:
            return None
        from rich.live import Live

        from vllm_provision.output.report import shared_console

        console = shared_console(self.stream or sys.stdout)
        self.live = Live(_Renderable(self), console=console, auto_refresh=True,
                         refresh_per_second=REFRESH_PER_SECOND, transient=False,
                         redirect_stdout=False, redirect_stderr=False)
        return self.live

    def close(self, item: Wait) -> None:
        """Remove ``item`` (under ``_lock``); in plain mode print its rows a last time."""
        if item in self.waits:
            self.waits.remove(item)
        if not self.waits:
            self.live = None
        if not self.live_mode:
            for row in item.rows.values():
                row.printed = None
                self.emit_plain(item, row, final=True)

    def emit_plain(self, item: Wait, row: Row, final: bool = False) -> None:
        now = item.clock()
        key = (row.state, row.phase)
        if not final and row.printed == key and now - row.printed_at < PLAIN_EVERY_S:
            return
        row.printed, row.printed_at = key, now
        line = item.line(row)
        if final and item.outcome:
            line += f" ({item.outcome})"
        stream = self.stream or sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed pipe must not end the wait
            pass


class _Renderable:
    """The live display's content, rebuilt at every refresh (so the seconds tick)."""

    def __init__(self, board: _Board) -> None:
        self.board = board

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        parts: list[Any] = []
        with _lock:
            for item in list(self.board.waits):
                title = item.title + (f" ({item.outcome})" if item.outcome else "")
                parts.append(Text(title, style="bold"))
                table = Table.grid(padding=(0, 1))
                table.add_column(style="bold cyan")
                table.add_column(justify="right", style="dim")
                table.add_column()
                table.add_column(style="yellow")
                for row in item.rows.values():
                    table.add_row(Text(f"  {row.host}"), Text(f"{item.elapsed():.0f} s"),
                                  Text(row.state), Text(row.phase))
                parts.append(table)
        return Group(*parts)


@contextmanager
def wait(title: str, hosts: Sequence[str], *,
         clock: Callable[[], float] = time.monotonic) -> Iterator[Wait]:
    """Show a wait of ``hosts`` (one row each) while the block runs; see the module text.

    Args:
        title: what is awaited (one short phrase naming the replica).
        hosts: the rows, in order.
        clock: monotonic seconds (tests).

    Yields:
        the :class:`Wait`; with mode ``off`` it records updates and prints nothing.
    """
    global _board
    item = Wait(title, {host: Row(host) for host in hosts}, started=clock(), clock=clock)
    current = mode()
    if current == "off":
        yield item
        return
    with _display_lock:
        with _lock:
            if _board is None:
                _board = _Board(current == "live", _settings["stream"])
            board = _board
            to_start = board.open(item)
        if to_start is not None:
            to_start.start(refresh=True)
    try:
        yield item
    finally:
        with _display_lock:
            _close(board, item)


def _close(board: _Board, item: Wait) -> None:
    """End ``item``'s rows (``_display_lock`` held): the last wait stops the live display
    with its rows drawn a last time; another prints its rows above the display."""
    global _board
    with _lock:
        live = board.live
        last = board.waits == [item]
        closed = live is None or not last
        if closed:
            board.close(item)
    if live is not None and last:
        live.stop()
    elif live is not None:
        from rich.text import Text

        live.console.print(Text("\n".join(item.line(row) for row in item.rows.values())))
    with _lock:
        if not closed:
            board.close(item)
        if not board.waits and _board is board:
            _board = None
