#!/usr/bin/python3
# {% raw %}  (the role installs this file through Jinja2; the raw block keeps it verbatim)
"""vllm-watchdog: peer-aware restarts for one node of a multi-node vLLM replica (stdlib only).

Installed by vllm-provision (role vllm_watchdog) as ``vllm-watchdog.service`` on every node;
configured by ``/etc/vllm-provision/watchdog.json``. See docs/recovery.md for the design.

Why: a torch.distributed group cannot be rejoined. Measured with vLLM 0.32.0 (lab-probe.md part 4,
B.5): after a follower dies, rank 0 keeps answering ``/health`` 200 until its next request fails,
and after rank 0 dies a headless follower stays up forever. Ray workers do not rejoin a
restarted head (ray-project/ray#1345). So every node watches the units it depends on, on its
peers, and restarts its own unit when one of them restarted or vanished.

How: every ``poll_s`` seconds the watchdog reads its local units (``systemctl show``: InvocationID,
ActiveState, SubState, ExecMainStartTimestampMonotonic) and each peer's published state
(``GET http://<peer>:<port>/state``, served by the peer's watchdog). Each *rule* says "local unit
U depends on unit V of node P". The watchdog *binds* U's current invocation to V's current
invocation, then restarts U (``systemctl --no-block --job-mode=fail try-restart``) when V's
invocation changes, V is no longer running, or P's watchdog stays unreachable ``grace_s``
seconds. Binding rules (no clocks compared across hosts; ages are durations on each host):

* mutual (mp: every node needs every other node): bind when V is younger than U (started after
  it, within ``slack_s``), or when P already bound V to U's current invocation. A node that
  restarted is younger than its peers, so they bind it and it binds them back: one fault gives
  one restart of each other node, never a ping-pong.
* one-way (Ray: the head's vLLM and each worker depend on the head's ``ray start``): bind when V
  is older than U; when V is younger (it restarted after U started), restart U.

A hold file (``hold_file``, one line: a deadline in seconds since the epoch) written by
``provision up/restart`` makes the watchdog forget its bindings and act on nothing until the
deadline, so planned restarts are not doubled. An operator's ``systemctl stop`` is respected:
only running units are restarted (try-restart), never started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SHOW_PROPERTIES = ("Id", "InvocationID", "ActiveState", "SubState", "MainPID",
                   "ExecMainStartTimestampMonotonic")


@dataclass(frozen=True)
class UnitView:
    """One unit as seen by its node's watchdog.

    Attributes:
        unit: unit name (``vllm.service``).
        invocation: systemd's InvocationID (new on every start, automatic restarts included;
            systemd.exec(5) ``$INVOCATION_ID``), "" when never started.
        active: ActiveState; sub: SubState.
        age_s: seconds since the main process started (ExecMainStartTimestampMonotonic), on the
            unit's own host; -1 when unknown.
        main_pid: MainPID, 0 when none.
    """

    unit: str
    invocation: str = ""
    active: str = "inactive"
    sub: str = "dead"
    age_s: float = -1.0
    main_pid: int = 0

    @property
    def running(self) -> bool:
        """True when ``active (running)`` with a known invocation."""
        return self.active == "active" and self.sub == "running" and bool(self.invocation)


@dataclass(frozen=True)
class Rule:
    """Local ``unit`` depends on ``peer_unit`` of node ``peer`` (the local node allowed).

    ``mutual``: the dependency goes both ways (mp replicas); otherwise one-way (Ray).
    """

    unit: str
    peer: str
    peer_unit: str
    mutual: bool = True

    @property
    def key(self) -> str:
        """``unit->peer:peer_unit``, the rule's name in logs and the published state."""
        return f"{self.unit}->{self.peer}:{self.peer_unit}"


@dataclass(frozen=True)
class Binding:
    """Local ``unit`` invocation ``invocation`` runs with the peer's ``peer_invocation``."""

    unit: str
    invocation: str
    peer: str
    peer_unit: str
    peer_invocation: str


@dataclass(frozen=True)
class Decision:
    """What to do for one rule: ``wait``, ``keep``, ``bind`` or ``restart``, and why."""

    action: str
    reason: str = ""
    binding: Binding | None = None


@dataclass
class Settings:
    """Timings, seconds: poll period, how long an unreachable peer is tolerated, the age
    tolerance used when comparing two units' ages, and how long a restart may take before the
    watchdog may ask again."""

    poll_s: float = 1.0
    grace_s: float = 5.0
    slack_s: float = 2.0
    restart_wait_s: float = 120.0


def decide(rule: Rule, local: UnitView | None, peer: UnitView | None, peer_bound_me: bool,
           bound: Binding | None, missing_for_s: float, settings: Settings) -> Decision:
    """Decide one rule for one poll (pure).

    Args:
        rule: the dependency.
        local: the local unit now, None when unknown.
        peer: the peer unit now, None when the peer's watchdog did not answer.
        peer_bound_me: the peer published a binding of ``peer`` to ``local``'s invocation
            (mutual rules only).
        bound: the current binding of this rule, if any.
        missing_for_s: seconds the peer's watchdog has not answered (0 when it answers).
        settings: timings.

    Returns:
        a :class:`Decision`; ``bind`` and ``keep`` carry the binding to keep.
    """
    if local is None or not local.running:
        return Decision("wait", f"{rule.unit} is not running")
    if bound is not None and bound.invocation != local.invocation:
        bound = None  # the local unit restarted: its old group is gone
    if bound is not None:
        if peer is None:
            if missing_for_s >= settings.grace_s:
                return Decision("restart", f"{rule.peer} has not answered for "
                                f"{missing_for_s:.0f} s (grace {settings.grace_s:g} s)")
            return Decision("keep", binding=bound)
        if peer.invocation != bound.peer_invocation:
            return Decision("restart", f"{rule.peer}:{rule.peer_unit} restarted "
                            f"(invocation {bound.peer_invocation[:8]} -> "
                            f"{(peer.invocation or 'none')[:8]})")
        if not peer.running:
            return Decision("restart", f"{rule.peer}:{rule.peer_unit} is "
                            f"{peer.active} ({peer.sub})")
        return Decision("keep", binding=bound)
    if peer is None or not peer.running:
        return Decision("wait", f"{rule.peer}:{rule.peer_unit} is not running")
    binding = Binding(rule.unit, local.invocation, rule.peer, rule.peer_unit, peer.invocation)
    if rule.mutual:
        if peer.age_s <= local.age_s + settings.slack_s or peer_bound_me:
            return Decision("bind", "peer is newer than this unit or already bound to it",
                            binding)
        return Decision("wait", f"{rule.peer}:{rule.peer_unit} is older than {rule.unit}: "
                        "waiting for it to restart or to bind this unit")
    if peer.age_s + settings.slack_s >= local.age_s:
        return Decision("bind", "the dependency started before this unit", binding)
    return Decision("restart", f"{rule.peer}:{rule.peer_unit} started after {rule.unit} "
                    f"({peer.age_s:.0f} s ago vs {local.age_s:.0f} s ago)")


def parse_show(text: str, now_monotonic_s: float) -> dict[str, UnitView]:
    """Parse ``systemctl show -p <SHOW_PROPERTIES> UNIT...`` into views by unit name.

    Args:
        text: ``KEY=value`` blocks separated by blank lines.
        now_monotonic_s: CLOCK_MONOTONIC now, seconds (ages are computed against it).
    """
    views: dict[str, UnitView] = {}
    for block in text.strip().split("\n\n"):
        values = dict(line.split("=", 1) for line in block.strip().splitlines() if "=" in line)
        if "Id" not in values:
            continue
        start_us = _int(values.get("ExecMainStartTimestampMonotonic"))
        views[values["Id"]] = UnitView(
            unit=values["Id"], invocation=values.get("InvocationID", ""),
            active=values.get("ActiveState", ""), sub=values.get("SubState", ""),
            age_s=round(now_monotonic_s - start_us / 1e6, 3) if start_us else -1.0,
            main_pid=_int(values.get("MainPID")))
    return views


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def held_until(path: str, now_s: float) -> float | None:
    """The hold deadline (seconds since the epoch) when ``path`` holds a future one, else None."""
    try:
        with open(path, encoding="utf-8") as handle:
            deadline = float(handle.read().strip() or 0)
    except (OSError, ValueError):
        return None
    return deadline if deadline > now_s else None


@dataclass
class Watchdog:
    """The watchdog of one node: its config, bindings and last published state."""

    config: dict[str, Any]
    settings: Settings = field(default_factory=Settings)
    bindings: dict[str, Binding] = field(default_factory=dict)
    missing_since: dict[str, float] = field(default_factory=dict)
    restarting: dict[str, tuple[str, float]] = field(default_factory=dict)
    published: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def rules(self) -> list[Rule]:
        """The configured rules."""
        return [Rule(**r) for r in self.config["rules"]]

    def read_local(self) -> dict[str, UnitView]:
        """Read the local units with one ``systemctl show``."""
        units = list(self.config["units"])
        result = subprocess.run(
            ["systemctl", "show", "-p", ",".join(SHOW_PROPERTIES), *units],
            capture_output=True, text=True, timeout=20, check=False)
        return parse_show(result.stdout, time.monotonic())

    def fetch_peer(self, node: str) -> dict[str, Any] | None:
        """The peer's published state, or None when it does not answer within ``poll_s``."""
        address = self.config["peers"][node]
        try:
            with urllib.request.urlopen(f"http://{address}/state",
                                        timeout=max(0.5, self.settings.poll_s)) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def poll(self) -> None:
        """One round: read, decide every rule, act, publish."""
        now = time.time()
        mono = time.monotonic()
        local = self.read_local()
        node = self.config["node"]
        hold = held_until(self.config["hold_file"], now)
        states: dict[str, dict[str, Any] | None] = {}
        for peer in sorted({r.peer for r in self.rules} - {node}):
            states[peer] = self.fetch_peer(peer)
            if states[peer] is None:
                self.missing_since.setdefault(peer, mono)
            else:
                self.missing_since.pop(peer, None)
        decisions: dict[str, Decision] = {}
        if hold is not None:
            self.bindings.clear()
            self.restarting.clear()
        else:
            for rule in self.rules:
                decisions[rule.key] = self.apply(rule, local, states, mono)
        with self.lock:
            self.published = {
                "node": node, "time": now, "held_until": hold,
                "units": {name: asdict(view) for name, view in local.items()},
                "bindings": [asdict(b) for b in self.bindings.values()],
                "rules": {key: {"action": d.action, "reason": d.reason}
                          for key, d in decisions.items()},
                "whole": hold is None and len(self.bindings) == len(self.rules)}
            text = json.dumps(self.published)
        _write_atomic(self.config["state_file"], text)

    def apply(self, rule: Rule, local: dict[str, UnitView],
              states: dict[str, dict[str, Any] | None], mono: float) -> Decision:
        """Decide ``rule`` and act on the decision (bind, forget, restart the local unit)."""
        mine = local.get(rule.unit)
        pending = self.restarting.get(rule.unit)
        if pending and mine and mine.invocation == pending[0] and mono - pending[1] < \
                self.settings.restart_wait_s:
            return Decision("wait", "restart requested, waiting for it")
        self.restarting.pop(rule.unit, None)
        if rule.peer == self.config["node"]:
            peer_view, bound_me, missing = local.get(rule.peer_unit), False, 0.0
        else:
            state = states.get(rule.peer)
            peer_view = _view(state, rule.peer_unit) if state else None
            bound_me = bool(state and mine and any(
                b.get("unit") == rule.peer_unit and b.get("peer") == self.config["node"]
                and b.get("peer_unit") == rule.unit and b.get("peer_invocation") == mine.invocation
                and peer_view is not None and b.get("invocation") == peer_view.invocation
                for b in state.get("bindings", [])))
            missing = mono - self.missing_since.get(rule.peer, mono)
        decision = decide(rule, mine, peer_view, bound_me, self.bindings.get(rule.key), missing,
                          self.settings)
        if decision.binding is not None:
            if self.bindings.get(rule.key) != decision.binding:
                log(f"{rule.key}: bound {decision.binding.invocation[:8]} to "
                    f"{decision.binding.peer_invocation[:8]} ({decision.reason})")
            self.bindings[rule.key] = decision.binding
        else:
            self.bindings.pop(rule.key, None)
        if decision.action == "restart" and mine is not None:
            self.restart(rule, mine, decision.reason, mono)
        return decision

    def restart(self, rule: Rule, mine: UnitView, reason: str, mono: float) -> None:
        """``systemctl --no-block --job-mode=fail try-restart`` the local unit, once per
        invocation: try-restart never starts a stopped unit, job-mode fail never replaces a
        queued stop (``provision down``)."""
        log(f"{rule.key}: restarting {rule.unit} (invocation {mine.invocation[:8]}): {reason}")
        for key in [k for k, b in self.bindings.items() if b.unit == rule.unit]:
            del self.bindings[key]
        self.restarting[rule.unit] = (mine.invocation, mono)
        result = subprocess.run(["systemctl", "--no-block", "--job-mode=fail", "try-restart",
                                 rule.unit], capture_output=True, text=True, timeout=20,
                                check=False)
        if result.returncode != 0:
            log(f"{rule.key}: systemctl try-restart {rule.unit} failed: "
                f"{(result.stderr or result.stdout).strip()}")

    def state_json(self) -> bytes:
        """The last published state, JSON bytes."""
        with self.lock:
            return json.dumps(self.published).encode()


def _view(state: dict[str, Any], unit: str) -> UnitView | None:
    raw = state.get("units", {}).get(unit)
    if not isinstance(raw, dict):
        return None
    try:
        return UnitView(**raw)
    except TypeError:
        return None


def _write_atomic(path: str, text: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.tmp"
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, path)
    except OSError as exc:
        log(f"cannot write {path}: {exc}")


def log(message: str) -> None:
    """One line to stdout (the journal)."""
    print(message, flush=True)


def serve(watchdog: Watchdog) -> ThreadingHTTPServer:
    """Start the HTTP endpoint (``GET /state``) on ``listen_host:listen_port`` in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/state":
                self.send_error(404)
                return
            body = watchdog.state_json()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = ThreadingHTTPServer((watchdog.config["listen_host"],
                                  int(watchdog.config["listen_port"])), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> int:
    """``vllm_watchdog.py CONFIG.json``: run until killed; exit 2 on a bad config."""
    if len(argv) != 2:
        print("usage: vllm_watchdog.py /etc/vllm-provision/watchdog.json", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as handle:
            config = json.load(handle)
        settings = Settings(**config.get("settings", {}))
        watchdog = Watchdog(config, settings)
        _ = watchdog.rules
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"vllm-watchdog: bad config {argv[1]}: {exc}", file=sys.stderr)
        return 2
    serve(watchdog)
    log(f"vllm-watchdog on {config['node']}: {len(watchdog.rules)} rule(s), "
        f"listening on {config['listen_host']}:{config['listen_port']}")
    while True:
        started = time.monotonic()
        try:
            watchdog.poll()
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"poll failed: {exc}")
        time.sleep(max(0.05, settings.poll_s - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
# {% endraw %}
