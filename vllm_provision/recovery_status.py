"""``provision status`` on self-healing: each unit's last failure, and is the replica whole.

Read over each node's SSH in one round trip (:func:`node_command`), parsed by pure functions:

* the last failure of each unit: the last journal line, this boot, of systemd's own messages
  about the unit's main process ending or a restart being scheduled (systemd.service(5):
  ``Main process exited``, ``Failed with result``, ``Scheduled restart job``), and the watchdog's
  ``restarting`` lines (docs/recovery.md);
* the peer watchdog's published state (``/run/vllm-provision/watchdog.json``): ``whole`` is true
  when it is not held and has bound every rule to a running peer; on the node that runs the API
  server, its completion probe (``probe``: last result, age, consecutive failures, restarts).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WATCHDOG_STATE = "/run/vllm-provision/watchdog.json"
WATCHDOG_UNIT = "vllm-watchdog.service"
FAILURE_PATTERN = ("Main process exited|Failed with result|Scheduled restart job|"
                   "restarting |Killing process")
_MARK = "== vllm-provision "


@dataclass(frozen=True)
class NodeRecovery:
    """One node's recovery view.

    Attributes:
        last_failure: unit -> the last failure line of its journal (this boot), "" when none.
        watchdog: the watchdog's published state (JSON object), None when absent.
    """

    last_failure: dict[str, str] = field(default_factory=dict)
    watchdog: dict[str, Any] | None = None

    @property
    def whole(self) -> bool | None:
        """The watchdog's verdict for this node; None without a watchdog."""
        if self.watchdog is None:
            return None
        return bool(self.watchdog.get("whole"))


def node_command(units: Sequence[str], state_file: str = WATCHDOG_STATE) -> str:
    """Shell printing, per unit, its last failure line, then the watchdog's state file.

    Output: ``== vllm-provision unit <name>`` then 0-1 journal line, for each unit (the watchdog
    unit included), then ``== vllm-provision watchdog`` and the file's JSON (or nothing).
    """
    parts = []
    for unit in (*units, WATCHDOG_UNIT):
        parts.append(f"echo {shlex.quote(_MARK + 'unit ' + unit)}; journalctl -u "
                     f"{shlex.quote(unit)} -b --no-pager -o short-iso -n 1 "
                     f"--grep {shlex.quote(FAILURE_PATTERN)} 2>/dev/null")
    parts.append(f"echo {shlex.quote(_MARK + 'watchdog')}; cat {shlex.quote(state_file)} "
                 "2>/dev/null; true")
    return "; ".join(parts)


def parse_node(text: str) -> NodeRecovery:
    """Parse the output of :func:`node_command`; unknown or broken parts are left empty."""
    failures: dict[str, str] = {}
    watchdog_lines: list[str] = []
    section: tuple[str, str] | None = None
    for line in text.splitlines():
        if line.startswith(_MARK):
            kind, _, name = line[len(_MARK):].partition(" ")
            section = (kind, name)
            if kind == "unit":
                failures[name] = ""
            continue
        if section is None:
            continue
        if section[0] == "unit" and line.strip() and not line.startswith("-- "):
            failures[section[1]] = line.strip()
        elif section[0] == "watchdog":
            watchdog_lines.append(line)
    watchdog = None
    if "".join(watchdog_lines).strip():
        try:
            loaded = json.loads("\n".join(watchdog_lines))
            watchdog = loaded if isinstance(loaded, dict) else None
        except ValueError:
            watchdog = None
    return NodeRecovery(failures, watchdog)


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


def describe_probe(probe: Mapping[str, Any] | None) -> str | None:
    """One line on a watchdog's completion probe (its published ``probe`` object), None when the
    node runs none.

    Example: ``ok 12 s ago, 0/3 failures, 1 restart by the probe``. Keys read: ``enabled``,
    ``last_result``, ``last_detail``, ``age_s`` (seconds, when the state was written),
    ``consecutive_failures``, ``failures_to_restart``, ``restarts``, ``waiting``.
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
        last = f"{result} {age:.0f} s ago" if isinstance(age, (int, float)) else str(result)
        if result != "ok" and probe.get("last_detail"):
            last += f" ({probe['last_detail']})"
    restarts = probe.get("restarts") or 0
    line = (f"{last}, {probe.get('consecutive_failures', 0)}/"
            f"{probe.get('failures_to_restart', '?')} failures, {restarts} "
            f"restart{'' if restarts == 1 else 's'} by the probe")
    if probe.get("waiting"):
        line += f"; not probing: {probe['waiting']}"
    return line
