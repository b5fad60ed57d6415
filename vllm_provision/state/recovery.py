"""``provision status`` on self-healing: each unit's last failure, and is the replica whole.

Read over each node's SSH in one round trip (:func:`node_command`), parsed by pure functions:

* the failures of each unit: the last journal lines, this boot, of systemd's own messages
  about the unit's main process ending or a restart being scheduled (systemd.service(5):
  ``Main process exited``, ``Failed with result``, ``Scheduled restart job``), and the watchdog's
  ``restarting`` lines (docs/recovery.md), each with its time, so that ``provision status`` can
  tell the current deployment's from older ones (:meth:`NodeRecovery.failures_since`);
* the peer watchdog's published state (``/run/vllm-provision/watchdog.json``), read ONLY while
  the watchdog unit is active (a stopped watchdog leaves its last file behind, which tells
  nothing about the present), with the host's clock, so each datum's age is known: ``whole`` is
  true when it is not held and has bound every rule to a running peer; on the node that runs the
  API server, its completion probe (``probe``: last result, age, consecutive failures,
  restarts).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vllm_provision.core import hostjson

WATCHDOG_STATE = "/run/vllm-provision/watchdog.json"
WATCHDOG_UNIT = "vllm-watchdog.service"
FAILURE_PATTERN = ("Main process exited|Failed with result|Scheduled restart job|"
                   "restarting |Killing process")
_MARK = "== vllm-provision "
FAILURE_LINES = 10  # per unit: the current deployment's last one, and older ones (--history)


@dataclass(frozen=True)
class NodeRecovery:
    """One node's recovery view.

    Attributes:
        last_failure: unit -> the last failure line of its journal (this boot), "" when none.
        watchdog: the watchdog's published state (JSON object), None when absent or when the
            watchdog unit does not run.
        failures: unit -> its failure lines of this boot, oldest first, as ``(epoch seconds or
            None, line)``; the line starts with the time in ISO 8601 (UTC).
        watchdog_running: the watchdog unit is active (None: not told, an old reader).
        host_now: the host's clock when read (epoch seconds), None when not told.
    """

    last_failure: dict[str, str] = field(default_factory=dict)
    watchdog: dict[str, Any] | None = None
    failures: dict[str, list[tuple[float | None, str]]] = field(default_factory=dict)
    watchdog_running: bool | None = None
    host_now: float | None = None

    def failures_since(self, unit: str, since: float | None) -> tuple[str, list[str]]:
        """``(the last failure line at or after since, older lines, newest first)``; with
        ``since`` None every line of this boot is current. A line without a time is current."""
        current, older = "", []
        for when, line in reversed(self.failures.get(unit, [])):
            if not current and (since is None or when is None or when >= since):
                current = line
            else:
                older.append(line)
        return current, older

    @property
    def watchdog_age_s(self) -> float | None:
        """Seconds since the watchdog wrote its state (host clock), None when unknown."""
        written = (self.watchdog or {}).get("time")
        if self.host_now is None or not isinstance(written, (int, float)):
            return None
        return max(0.0, self.host_now - float(written))

    @property
    def whole(self) -> bool | None:
        """The watchdog's verdict for this node; None without a watchdog."""
        if self.watchdog is None:
            return None
        return bool(self.watchdog.get("whole"))


def node_command(units: Sequence[str], state_file: str = WATCHDOG_STATE,
                 watchdog_unit: str = WATCHDOG_UNIT) -> str:
    """Shell printing, per unit, its last failure lines, then the watchdog's state.

    Output: ``== vllm-provision unit <name>`` then up to :data:`FAILURE_LINES` journal lines
    (``-o short-unix``: epoch seconds first), for each unit (the watchdog unit included), then
    ``== vllm-provision watchdog <is-active word> <host epoch seconds>`` and, only when the
    watchdog unit is ``active``, the state file's JSON.
    """
    parts = []
    for unit in (*units, watchdog_unit):
        parts.append(f"echo {shlex.quote(_MARK + 'unit ' + unit)}; journalctl -u "
                     f"{shlex.quote(unit)} -b --no-pager -o short-unix -n {FAILURE_LINES} "
                     f"--grep {shlex.quote(FAILURE_PATTERN)} 2>/dev/null")
    parts.append(f"wd=$(systemctl is-active -- {shlex.quote(watchdog_unit)} 2>/dev/null); "
                 f"echo {shlex.quote(_MARK + 'watchdog')} \"${{wd:-unknown}}\" \"$(date +%s)\"; "
                 f"if [ \"$wd\" = active ]; then cat -- {shlex.quote(state_file)} 2>/dev/null; "
                 "fi; true")
    return "; ".join(parts)


def _failure_line(line: str) -> tuple[float | None, str]:
    """``1764410000.123 h1 systemd[1]: ...`` -> (epoch, ``2025-...Z h1 systemd[1]: ...``)."""
    first, _, rest = line.partition(" ")
    try:
        when = float(first)
    except ValueError:
        return None, line
    stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return when, f"{stamp} {rest}"


def parse_node(text: str) -> NodeRecovery:
    """Parse the output of :func:`node_command`; unknown or broken parts are left empty."""
    failures: dict[str, str] = {}
    lines: dict[str, list[tuple[float | None, str]]] = {}
    watchdog_lines: list[str] = []
    section: tuple[str, str] | None = None
    running: bool | None = None
    host_now: float | None = None
    for line in text.splitlines():
        if line.startswith(_MARK):
            kind, _, name = line[len(_MARK):].partition(" ")
            section = (kind, name)
            if kind == "unit":
                failures[name] = ""
                lines[name] = []
            elif kind == "watchdog":
                words = name.split()
                running = bool(words) and words[0] == "active"
                try:
                    host_now = float(words[1]) if len(words) > 1 else None
                except ValueError:
                    host_now = None
            continue
        if section is None:
            continue
        if section[0] == "unit" and line.strip() and not line.startswith("-- "):
            parsed = _failure_line(line.strip())
            lines[section[1]].append(parsed)
            failures[section[1]] = parsed[1]
        elif section[0] == "watchdog":
            watchdog_lines.append(line)
    watchdog = None
    if running and "".join(watchdog_lines).strip():
        try:
            loaded = hostjson.loads("\n".join(watchdog_lines))
            watchdog = loaded if isinstance(loaded, dict) else None
        except ValueError:
            watchdog = None
    return NodeRecovery(failures, watchdog, lines, running, host_now)


def replica_whole(nodes: Mapping[str, NodeRecovery], ray_alive: int | None = None,
                  nnodes: int | None = None) -> bool | None:
    """Is the replica whole: every node's watchdog bound to its peers, and (Ray) every node
    alive in the cluster. None when nothing tells (no watchdog and no Ray answer)."""
    verdicts = [n.whole for n in nodes.values()]
    if ray_alive is not None and nnodes is not None:
        verdicts.append(ray_alive >= nnodes)
    known = [v for v in verdicts if v is not None]
    if not known:
        return None
    return all(known)


def describe_probe(probe: Mapping[str, Any] | None, since_written_s: float = 0.0) -> str | None:
    """One line on a watchdog's completion probe (its published ``probe`` object), None when the
    node runs none.

    Example: ``ok 12 s ago, 0/3 failures, 1 restart by the probe``. Keys read: ``enabled``,
    ``last_result``, ``last_detail``, ``age_s`` (seconds, when the state was written),
    ``consecutive_failures``, ``failures_to_restart``, ``restarts``, ``waiting``.
    ``since_written_s``: seconds since the watchdog wrote the state (added to ``age_s``, so the
    age is the present one).
    """
    if not isinstance(probe, Mapping):
        return None
    if not probe.get("enabled"):
        return "disabled"
    result = probe.get("last_result")
    if result is None:
        last = "no completion yet"
    else:
        age = probe.get("age_s")
        last = (f"{result} {age + since_written_s:.0f} s ago" if isinstance(age, (int, float))
                else str(result))
        if result != "ok" and probe.get("last_detail"):
            last += f" ({probe['last_detail']})"
    restarts = probe.get("restarts") or 0
    line = (f"{last}, {probe.get('consecutive_failures', 0)}/"
            f"{probe.get('failures_to_restart', '?')} failures, {restarts} "
            f"restart{'' if restarts == 1 else 's'} by the probe")
    if probe.get("waiting"):
        line += f"; not probing: {probe['waiting']}"
    return line
