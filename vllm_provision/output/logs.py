"""``provision logs``: the journals of a replica's nodes as one stream, in time order.

Each node's journal is read with ``journalctl -o json`` over its SSH connection (one command per
node, every unit of ours at once: several ``-u`` match any of them, journalctl(1)); each entry's
``__REALTIME_TIMESTAMP`` (microseconds since the epoch, on the node's clock:
systemd.journal-fields(7)) orders the merged stream, as ``stern`` and ``kubectl logs`` tag each
line with its source. Following (``-f``) runs ``journalctl -f`` from the cursor of the last entry
shown on a second channel of the same connection; entries from several nodes arriving together
are held back :data:`HOLD_S` seconds and printed in time order.

Pure functions here (commands, parsing, merging, the line format); the command's I/O is in
``vllm_provision.cli.logs``.
"""

from __future__ import annotations

import datetime
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm_provision.core import hostjson
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.quoting import shell_join
from vllm_provision.output.progress import printable

FIELDS = ("MESSAGE", "_SYSTEMD_UNIT", "UNIT", "_PID", "SYSLOG_IDENTIFIER", "PRIORITY")
HOLD_S = 0.3
DEFAULT_LINES = 100
_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>s|m|min|h|d)$")
_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
# The instants a datetime can show: 0001-01-01 to 9999-12-31 (UTC), in microseconds from the epoch.
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
MIN_TIME_US = (datetime.datetime.min.replace(tzinfo=datetime.UTC) - _EPOCH) // datetime.timedelta(
    microseconds=1)
MAX_TIME_US = (datetime.datetime.max.replace(tzinfo=datetime.UTC) - _EPOCH) // datetime.timedelta(
    microseconds=1)


@dataclass(frozen=True, order=True)
class Entry:
    """One journal line of one node.

    Attributes:
        time_us: ``__REALTIME_TIMESTAMP``, microseconds since the epoch (the node's clock).
        order: the node's position in the inventory (ties of time keep host order).
        host: inventory host name. unit: the unit of ours it belongs to.
        message: the text, made printable (:func:`vllm_provision.output.progress.printable`).
        cursor: the journal cursor of the entry (follow from it).
    """

    time_us: int
    order: int
    host: str
    unit: str
    message: str
    cursor: str = ""


def parse_since(text: str, now: float | None = None) -> float:
    """``--since`` as seconds since the epoch.

    Accepts a duration back from now (``30s``, ``10m``, ``2h``, ``1d``, as ``kubectl logs
    --since``) or an ISO 8601 date/time (``2026-12-01T10:00``, ``2026-12-01 10:00:00+02:00``; no
    zone means the controller's local time). Converted here so that every node gets the same
    instant whatever its time zone (journalctl reads a bare date in the node's zone).

    Raises:
        ProvisionError: neither form.
    """
    value = text.strip()
    found = _DURATION.match(value)
    shown = printable(value, 60)
    if found:
        seconds = (time.time() if now is None else now) - float(found["n"]) * _SECONDS[
            found["unit"]]
    else:
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise ProvisionError([Problem(
                f"--since {shown}", "not a time",
                expected="a duration (30s, 10m, 2h, 1d) or an ISO 8601 date/time "
                         "(2026-12-01T10:00, 2026-12-01 10:00:00+02:00)",
                actual=shown, fix="give --since one of those forms")]) from None
        try:
            seconds = parsed.timestamp()
        except (ValueError, OverflowError, OSError):  # mktime(3) of a local time this far out
            seconds = -math.inf if parsed.year < 1970 else math.inf
    if seconds == math.inf:
        raise ProvisionError([Problem(
            f"--since {shown}", "the time is too far in the future for this machine's clock",
            expected="a time before 9999-12-31", actual=shown, fix="give an earlier time")])
    if not math.isfinite(seconds) or seconds < 0:
        raise ProvisionError([Problem(
            f"--since {shown}", "the time is before 1970-01-01, where every journal starts "
            "(systemd.journal-fields(7): __REALTIME_TIMESTAMP counts from the epoch)",
            expected="a time after 1970-01-01 00:00 UTC", actual=shown,
            fix="leave --since out to read the whole journal, or give a later time")])
    return seconds


def journal_command(units: Sequence[str], *, since: float | None = None,
                    lines: int | None = None, follow: bool = False, cursor: str = "") -> str:
    """The ``journalctl`` of one node: JSON, our fields, the units given.

    Args:
        units: unit names (each becomes one ``-u`` word).
        since: epoch seconds (``--since=@<seconds>``, systemd.time(7)); None: no bound.
        lines: the last N entries (``-n``); None: all (within ``since``).
        follow: ``-f``; from ``cursor`` (``--after-cursor``) when given, else from now.
        cursor: a cursor from an earlier entry.
    """
    words = ["journalctl", "-q", "--no-pager", "-o", "json",
             "--output-fields=" + ",".join(FIELDS)]
    for unit in units:
        words += ["-u", unit]
    if since is not None:
        words.append(f"--since=@{since:.6f}")
    if follow:
        words += ["-f", f"--after-cursor={cursor}"] if cursor else ["-f", "-n", "0"]
    elif lines is not None:
        words += ["-n", str(lines)]
    return shell_join(words)


def follow_command(units: Sequence[str], *, since: float | None = None, cursor: str = "") -> str:
    """:func:`journal_command` with ``follow``, ended when the channel closes: journalctl runs in
    the background and is killed as soon as its standard input (the SSH channel) ends, so no
    ``journalctl -f`` is left behind on the node after Ctrl-C."""
    follow = journal_command(units, since=since, follow=True, cursor=cursor)
    return f"{follow} </dev/null & pid=$!; cat >/dev/null; kill \"$pid\" 2>/dev/null; wait"


def parse_entry(line: str, host: str, order: int, units: Sequence[str]) -> Entry | None:
    """One ``-o json`` line as an :class:`Entry`; None for anything else.

    The unit is ``_SYSTEMD_UNIT`` (the process's unit) when it is one of ``units``, else
    ``UNIT`` (systemd's own messages about a unit: ``Started``, ``Main process exited``), else
    the first of ``units``. A binary ``MESSAGE`` (a list of bytes in journalctl's JSON) is
    decoded as UTF-8 with replacements.
    """
    try:
        data = hostjson.loads(line)
        time_us = int(data["__REALTIME_TIMESTAMP"])
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: [[[[...
        return None
    if not isinstance(data, dict):
        return None
    message = data.get("MESSAGE")
    if isinstance(message, list):
        message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode(
            "utf-8", "replace")
    unit = next((str(data[k]) for k in ("_SYSTEMD_UNIT", "UNIT")
                 if data.get(k) in units), units[0] if units else "")
    return Entry(time_us, order, host, unit, printable(str(message or ""), 4000),
                 str(data.get("__CURSOR") or ""))


def parse_entries(text: str, host: str, order: int, units: Sequence[str]) -> list[Entry]:
    """Every entry of a node's ``journalctl -o json`` output, in its order."""
    found = (parse_entry(line, host, order, units) for line in text.splitlines())
    return [entry for entry in found if entry is not None]


def merge(streams: Iterable[Sequence[Entry]]) -> list[Entry]:
    """Every node's entries in one list, by time (then inventory order, then as read)."""
    return sorted((e for stream in streams for e in stream),
                  key=lambda e: (e.time_us, e.order))


def format_time(time_us: int) -> str:
    """``2026-12-01T10:00:00.123456Z`` (UTC, microseconds: journalctl's short-iso-precise; the
    year always has four digits).

    A time no date can show (before year 1 or after 9999: a node's clock, or a journal, gone
    wrong) is shown as ``(time out of range: N us)`` instead, N the journal's raw
    ``__REALTIME_TIMESTAMP``; the entry is kept, never a crash.
    """
    if not MIN_TIME_US <= time_us <= MAX_TIME_US:
        return f"(time out of range: {time_us} us)"
    stamp = _EPOCH + datetime.timedelta(microseconds=time_us)
    return (f"{stamp.year:04d}-{stamp.month:02d}-{stamp.day:02d}T{stamp.hour:02d}:"
            f"{stamp.minute:02d}:{stamp.second:02d}.{stamp.microsecond:06d}Z")


def line_parts(entry: Entry, host_width: int, unit_width: int) -> tuple[str, str, str]:
    """``(time, "host unit", message)`` of a printed line, the middle padded to the widths."""
    return (format_time(entry.time_us), f"{entry.host:<{host_width}} {entry.unit:<{unit_width}}",
            entry.message)
