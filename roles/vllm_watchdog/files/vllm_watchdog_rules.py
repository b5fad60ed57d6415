"""vllm-watchdog's rules: what the peer watchdog decides, given what it observed (stdlib only).

The pure part of ``vllm_watchdog.py`` (the program: its loop, systemd calls, ``/proc`` reads,
HTTP endpoint and requests), kept in a file of its own so the rules are read and tested without
the program: the unit and binding state (:class:`UnitView`, :class:`Rule`, :class:`Binding`),
the timings (:class:`Settings`), the binding rules (:func:`decide`), the parser of ``systemctl
show`` (:func:`parse_show`), the Ray rules (:func:`node_table`, :func:`cluster_gaps`,
:func:`raylet_node_ids`, :func:`decide_ray_worker`) and the completion probe's judgement
(:func:`classify`, :class:`Prober`, which runs its requests through the callables it is given).
Nothing here runs a process, opens a socket or reads a file; :func:`log` prints one line.

Installed as it is by vllm-provision (role vllm_watchdog, the ``copy`` module, from the role's
``files/``) beside ``vllm_watchdog.py``, which imports it from its own folder. See
``vllm_watchdog.py`` and docs/recovery.md for the design.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
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
    ``master_addr``/``master_port``: set on a headless node's rule for rank 0 (mp): the
    rendezvous its workers connect to; port 0 with an address: any port of it (data parallel,
    whose engines keep connections to rank 0 on ports rank 0 chose); "" / 0 otherwise.
    ``grace_s``: seconds the peer's watchdog may stay silent before the local unit restarts;
    0 takes ``Settings.grace_s``. A Ray worker's rule uses the GCS health-check bound (Ray
    survives a shorter silence: see :func:`decide_ray_worker`).
    """

    unit: str
    peer: str
    peer_unit: str
    mutual: bool = True
    master_addr: str = ""
    master_port: int = 0
    grace_s: float = 0.0

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
    watchdog may ask again. Completion probe: seconds between probes, seconds one probe may
    take, and how many consecutive failures restart the unit (0: no probe)."""

    poll_s: float = 1.0
    grace_s: float = 5.0
    slack_s: float = 2.0
    restart_wait_s: float = 120.0
    probe_interval_s: float = 30.0
    probe_timeout_s: float = 60.0
    probe_failures: int = 3


def decide(rule: Rule, local: UnitView | None, peer: UnitView | None, peer_bound_me: bool,
           bound: Binding | None, missing_for_s: float, settings: Settings,
           joined: bool = True) -> Decision:
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
        joined: for a rule with ``master_addr``: the local unit holds an established
            connection to the rendezvous (see :func:`connected_to`); True otherwise.

    Returns:
        a :class:`Decision`; ``bind`` and ``keep`` carry the binding to keep.
    """
    if local is None or not local.running:
        return Decision("wait", f"{rule.unit} is not running")
    if bound is not None and bound.invocation != local.invocation:
        bound = None  # the local unit restarted: its old group is gone
    if bound is not None:
        if peer is None:
            grace = rule.grace_s or settings.grace_s
            if missing_for_s >= grace:
                return Decision("restart", f"{rule.peer} has not answered for "
                                f"{missing_for_s:.0f} s (grace {grace:g} s)")
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
        if not joined:
            where = (f"{rule.master_addr}:{rule.master_port}" if rule.master_port
                     else f"{rule.master_addr}, any port")
            return Decision("wait", f"{rule.unit} has not joined {rule.peer}'s rendezvous "
                            f"({where}) yet")
        if peer.age_s <= local.age_s + settings.slack_s or peer_bound_me:
            return Decision("bind", "peer is newer than this unit or already bound to it",
                            binding)
        return Decision("wait", f"{rule.peer}:{rule.peer_unit} is older than {rule.unit}: "
                        "waiting for it to restart or to bind this unit")
    if peer.age_s + settings.slack_s >= local.age_s:
        return Decision("bind", "the dependency started before this unit", binding)
    return Decision("restart", f"{rule.peer}:{rule.peer_unit} started after {rule.unit} "
                    f"({peer.age_s:.0f} s ago vs {local.age_s:.0f} s ago)")


def ray_auth_env(value: Any) -> dict[str, str]:
    """The config's ``ray_auth_env`` (``{"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH":
    path}`` or ``{"RAY_AUTH_MODE": "disabled"}``, rendered by the role from
    vllm_provision/settings/ray_auth.py) as the environment of the GCS reader; only names that
    start with ``RAY_AUTH_`` and string values are kept (the file is ours, 0600, but a config
    must not set anything else in the reader's environment). Ray's docs, "Ray token
    authentication": https://docs.ray.io/en/latest/ray-security/token-auth.html."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items()
            if str(k).startswith("RAY_AUTH_") and isinstance(v, str) and "\0" not in v}


def describe_probe(prober: Prober, probe: dict[str, Any]) -> str:
    """The log line of a node's completion probe: what it sends, how often, what restarts."""
    settings = prober.settings
    if not prober.enabled:
        return "disabled (probe_failures 0)"
    return (f"a completion to {probe['url']} (model {probe['model']}) every "
            f"{settings.probe_interval_s:g} s, timeout {settings.probe_timeout_s:g} s; "
            f"{settings.probe_failures} consecutive failures restart {prober.unit}")


def unit_view(state: dict[str, Any], unit: str) -> UnitView | None:
    """The view of ``unit`` in a watchdog's published ``state``, None when absent or malformed."""
    raw = state.get("units", {}).get(unit)
    if not isinstance(raw, dict):
        return None
    try:
        return UnitView(**raw)
    except TypeError:
        return None


def restore_bindings(suspended: dict[str, Binding], local: dict[str, UnitView],
                     states: dict[str, dict[str, Any] | None], node: str) -> dict[str, Binding]:
    """The bindings a hold set aside that hold again once it is released (pure).

    A hold (``provision up``/``restart`` at work) clears every binding, because the run may
    restart units. A binding whose local unit and peer unit are both still running as the
    same invocations as when it was made binds the same two processes as before: it is kept,
    so a run that changed nothing leaves the watchdog whole at once instead of binding anew.
    Any other is dropped, and the rule binds anew as after any start.

    Args:
        suspended: rule key -> the binding set aside. local: this node's units now.
        states: peer node -> its published state (None: it did not answer). node: this node.
    """
    kept = {}
    for key, bound in suspended.items():
        mine = local.get(bound.unit)
        if bound.peer == node:
            peer = local.get(bound.peer_unit)
        else:
            state = states.get(bound.peer)
            peer = unit_view(state, bound.peer_unit) if state else None
        if (mine is not None and mine.running and mine.invocation == bound.invocation
                and peer is not None and peer.running
                and peer.invocation == bound.peer_invocation):
            kept[key] = bound
    return kept


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


# --- Ray: what the GCS knows ---------------------------------------------------------------------
#
# Ray's GCS marks a node DEAD once its raylet missed ``health_check_failure_threshold``
# consecutive health checks, one every ``health_check_period_ms``, each failing after
# ``health_check_timeout_ms`` (src/ray/common/ray_config_def.h: 3, 5 and 10 s by default; env
# ``RAY_health_check_*`` of the head's GCS; src/ray/gcs/gcs_health_check_manager.cc). A DEAD node
# id never comes back: a frozen or cut-off raylet must be restarted, and a new raylet registers a
# new node id. The head's watchdog reads the node table with Ray's own GCS client in a child
# process (``--ray-nodes``, the venv's ray) and publishes it; each worker's watchdog restarts its
# Ray unit when the table says one of its raylets is DEAD, or when it cannot reach the GCS port for
# longer than the bound the GCS itself needs to declare it dead. vLLM's unit waits in
# ``ExecStartPre`` (``--wait-ray-cluster``) until every node of the replica is alive with enough
# GPUs, so vLLM (re)starts only after the workers rejoined, whoever restarted it.
#
# A raylet killed on a worker stays ALIVE in the table until the GCS has missed its health checks
# (about 15 s with Ray's defaults) while the worker's unit has already started a new raylet, which
# registers under a new id from the same IP. A placement group created in that window can stay
# PENDING with every GPU free (seen with Ray 2.60 under load: its bundles were offered to the new
# raylet the moment it registered, the lease failed, and the GCS never offered them again; vLLM
# then waits its 1800 s). So the gate also waits while a worker's raylet is restarting: each Ray
# worker unit records when it starts (``--mark-ray-start``, ExecStartPre, in the GCS's key-value
# store, namespace :data:`RAY_KV_NAMESPACE`), and an IP whose only alive node started before
# that mark is the old raylet; while an IP has two alive nodes the old one is not yet declared
# dead; and a node that registered less than :data:`RAY_SETTLE_S` ago is let settle first.

RAY_KV_NAMESPACE = b"vllm_provision"
RAY_SETTLE_S = 3.0  # seconds a newly registered raylet is given before vLLM places its group


# Once the node table shows the cluster whole, the gate places one trial placement group of
# vLLM's own shape (:func:`trial_specs`) and removes it: the table says each node is alive, only
# a placement says its raylet can reserve its GPUs. A trial that stays pending while the GPUs are
# free is removed and made again (Ray 2.60 on a loaded CI host: a restarted worker's raylet
# registered, the gate's 3 s settle passed, and vLLM's group stayed pending past 150 s with
# every GPU free; a new group is a new scheduling attempt). With fewer GPUs free than vLLM
# needs (another job holds them) no trial is made: vLLM waits for them itself and ``up`` names
# what is free.
RAY_TRIAL_WAIT_S = 15.0  # seconds one trial placement group may stay pending before a new one

# When RAY_TRIAL_TRIES trials in a row stay pending while the node table shows the GPUs free,
# Ray's own books are wrong, and they stay wrong: in the lab's CI (Ray 2.60, a restarted
# worker), every trial for 180 s stayed pending with 8 of 12 GPUs free, the restarted node's 4
# GPUs held by no placement group or actor Ray could name (a bundle the GCS prepared on the new
# raylet and never committed nor returned; ray #64693, #64696). Only a new GCS forgets them. So
# the gate writes RAY_STUCK_MARKER in its working directory (vLLM's state folder) and fails;
# vLLM's unit then restarts the Ray head as root (``ExecStopPost=+``, roles/vllm_ray), each
# worker's watchdog restarts its worker for the new head, and the next start gates again.
RAY_TRIAL_TRIES = 3
RAY_STUCK_MARKER = "ray-scheduler-stuck"


def trial_specs(gpus_needed: float, head_ip: str) -> list[dict[str, float]]:
    """vLLM's placement-group bundles for a world of ``gpus_needed`` GPUs (pure): one
    ``{"GPU": 1.0}`` per worker, bundle 0 pinned to the driver's node with
    ``{"node:<ip>": 0.001}`` (vllm/v1/executor/ray_utils.py ``initialize_ray_cluster``).

    Raises:
        ValueError: ``gpus_needed`` is not a whole number of at least 1.
    """
    if gpus_needed < 1 or int(gpus_needed) != gpus_needed:
        raise ValueError(f"a trial placement needs a whole number of GPUs, got {gpus_needed:g}")
    specs = [{"GPU": 1.0} for _ in range(int(gpus_needed))]
    specs[0][f"node:{head_ip}"] = 0.001
    return specs


def ray_start_key(ip: str) -> bytes:
    """The GCS key-value key under which a Ray worker unit records its start (``ip``: its
    ``--node-ip-address``)."""
    return f"raylet-start/{ip}".encode()

RAY_ALIVE = 0  # GcsNodeInfo.GcsNodeState (src/ray/protobuf/gcs.proto): ALIVE 0, DEAD 1


def node_table(infos: Any) -> list[dict[str, Any]]:
    """Ray's ``GcsClient.get_all_node_info()`` result (node id -> ``GcsNodeInfo``) as JSON-ready
    rows: ``id`` (hex), ``ip`` (``node_manager_address``: the raylet's ``--node-ip-address``),
    ``alive`` (state ALIVE), ``gpus`` (``resources_total["GPU"]``), ``reason`` (why it died)."""
    rows = []
    for info in infos.values():
        death = getattr(info, "death_info", None)
        rows.append({"id": bytes(info.node_id).hex(), "ip": str(info.node_manager_address),
                     "alive": int(info.state) == RAY_ALIVE,
                     "gpus": float(dict(info.resources_total).get("GPU", 0)),
                     "reason": str(getattr(death, "reason_message", "") or ""),
                     "started_s": int(getattr(info, "start_time_ms", 0) or 0) / 1000.0})
    return rows


def cluster_gaps(nodes: list[dict[str, Any]], expected_ips: list[str],
                 gpus_needed: float, *, starts: dict[str, float] | None = None,
                 now_s: float | None = None, settle_s: float = RAY_SETTLE_S) -> list[str]:
    """What keeps vLLM from placing its workers, in words; empty when every expected node is
    alive once (no old raylet of a restarted worker still listed alive), the alive expected
    nodes hold at least ``gpus_needed`` GPUs, and none registered less than ``settle_s`` ago
    (pure).

    Args:
        nodes: :func:`node_table` rows. expected_ips: every node of the replica (its
            ``--node-ip-address``). gpus_needed: tensor x pipeline parallel size.
        starts: IP -> epoch seconds at which that node's Ray worker unit last started
            (``--mark-ray-start``); an alive node that registered before it is the old raylet.
            Both times come from the worker's own clock.
        now_s: this host's epoch seconds, for the settle time (``None``: no settle). A worker
            clock ahead of this one by more than ``settle_s`` skips the settle, never blocks.
    """
    gaps: list[str] = []
    by_ip: dict[str, list[dict[str, Any]]] = {}
    for node in nodes:
        if node["alive"]:
            by_ip.setdefault(str(node["ip"]), []).append(node)
    alive = {}
    for ip in expected_ips:
        found = by_ip.get(ip, [])
        if not found:
            gaps.append(f"node {ip} is not alive in Ray")
        elif len(found) > 1:
            gaps.append(f"node {ip} has {len(found)} alive Ray nodes: its raylet restarted and "
                        "Ray has not yet declared the old one dead")
        else:
            alive[ip] = found[0]
    gpus = sum(max(float(n["gpus"]) for n in by_ip[ip]) for ip in expected_ips if by_ip.get(ip))
    if gpus < gpus_needed:
        gaps.append(f"{gpus:g} GPUs alive in Ray, vLLM needs {gpus_needed:g}")
    for ip, node in alive.items():
        started = float(node.get("started_s") or 0.0)
        mark = (starts or {}).get(ip)
        if mark is not None and started and started < mark:
            gaps.append(f"node {ip}'s Ray worker is restarting: the alive node is its old "
                        "raylet, which Ray has not yet declared dead")
        elif now_s is not None and started and 0 <= now_s - started < settle_s:
            gaps.append(f"node {ip} joined Ray {now_s - started:.1f} s ago; letting it settle "
                        f"{settle_s:g} s")
    return gaps


def raylet_node_ids(cmdlines: list[list[str]]) -> set[str]:
    """Node ids (hex) of the raylets among ``cmdlines`` (argv lists): ``ray start`` passes each
    raylet ``--node_id=<hex>`` (ray/_private/services.py ``start_raylet``)."""
    ids = set()
    for argv in cmdlines:
        if argv and os.path.basename(argv[0]) == "raylet":
            ids.update(word.split("=", 1)[1] for word in argv[1:]
                       if word.startswith("--node_id=") and len(word) > len("--node_id="))
    return ids


def decide_ray_worker(local: UnitView | None, node_ids: set[str],
                      head_nodes: list[dict[str, Any]] | None, gcs_unreachable_s: float,
                      bound_s: float) -> Decision:
    """Decide whether a Ray worker's unit must restart (pure).

    Args:
        local: the worker unit now. node_ids: its raylets' node ids (:func:`raylet_node_ids`).
        head_nodes: the GCS node table the head's watchdog published, None when unknown.
        gcs_unreachable_s: seconds the GCS port has refused or timed out (0 when it answers).
        bound_s: the GCS's own time to declare a silent node dead (health-check bound).

    Returns:
        ``restart`` when the GCS reports one of this unit's raylets DEAD (a DEAD id never comes
        back, so how old the table is does not matter) or the GCS has not been reachable for
        ``bound_s``; ``wait`` when the unit is not running; ``keep`` otherwise.
    """
    if local is None or not local.running:
        return Decision("wait", f"{local.unit if local else 'the Ray unit'} is not running")
    for row in head_nodes or []:
        if row.get("id") in node_ids and not row.get("alive"):
            why = f": {row['reason']}" if row.get("reason") else ""
            return Decision("restart", f"Ray's GCS reports this node's raylet "
                            f"{str(row['id'])[:8]} ({row.get('ip')}) dead{why}")
    if gcs_unreachable_s >= bound_s:
        return Decision("restart", f"the GCS has not been reachable for {gcs_unreachable_s:.0f} s"
                        f" (the GCS declares a silent node dead within {bound_s:g} s)")
    return Decision("keep")


# --- completion probe ---------------------------------------------------------------------------

PROBE_OK, PROBE_FAILURE, PROBE_IGNORED = "ok", "failure", "ignored"
# 408 Request Timeout and 429 Too Many Requests say "not served in time", not "wrong request"
# (RFC 9110 15.5.9, RFC 6585 4): counted like a timeout. Any other 4xx is our misconfiguration.
RETRY_LATER_STATUSES = (408, 429)


@dataclass(frozen=True)
class ProbeResult:
    """One answer of the local API server.

    Attributes:
        outcome: ``ok`` (served), ``failure`` (counts toward a restart: no answer within the
            timeout, refused or reset connection, HTTP 5xx, 408 or 429) or ``ignored`` (any other
            HTTP 4xx: the probe is misconfigured, e.g. a wrong API key or model name; logged, never
            restarts anything).
        detail: one line for the journal and the published state.
        status: the HTTP status, None when there was none.
    """

    outcome: str
    detail: str
    status: int | None = None


def classify(status: int | None, detail: str = "") -> ProbeResult:
    """Judge one probe answer (pure).

    Args:
        status: the HTTP status, None when the request got no HTTP answer at all.
        detail: what happened (the error, or the start of the answer's body).
    """
    if status is None:
        return ProbeResult(PROBE_FAILURE, detail or "no answer", None)
    if 200 <= status < 300:
        return ProbeResult(PROBE_OK, f"HTTP {status}", status)
    if status >= 500 or status in RETRY_LATER_STATUSES:
        return ProbeResult(PROBE_FAILURE, f"HTTP {status} {detail}".strip(), status)
    return ProbeResult(PROBE_IGNORED, f"HTTP {status} {detail}".strip(), status)


def run_in_thread(work: Callable[[], None]) -> None:
    """Run ``work`` in a daemon thread (a hung request never blocks the peer rules)."""
    threading.Thread(target=work, name="probe", daemon=True).start()


@dataclass
class ProbeJob:
    """One request in flight: ``kind`` (``health`` or ``completion``), the unit invocation it
    judges, when it started (monotonic seconds), and its result once ``done``."""

    kind: str
    invocation: str
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    result: ProbeResult | None = None
    health: int | None = None


@dataclass
class Prober:
    """The completion probe of the node that runs the API server; driven by :meth:`tick`.

    Args:
        unit: the vLLM unit the API server runs in (restarted after ``probe_failures``).
        settings: ``probe_interval_s``, ``probe_timeout_s``, ``probe_failures`` (0: disabled).
        complete: sends one completion, returns its :class:`ProbeResult` (may block up to the
            timeout); health: ``GET /health``, the status or None.
        start: runs a request in the background (a thread; tests run it inline).

    State: ``armed`` is the invocation that answered once (``/health`` 200 or a completion);
    only an armed invocation is judged. ``failures`` counts consecutive failures, ``restarts``
    the restarts this probe asked for since the watchdog started.
    """

    unit: str
    settings: Settings
    complete: Callable[[], ProbeResult]
    health: Callable[[], int | None]
    start: Callable[[Callable[[], None]], None] = run_in_thread
    armed: str = ""
    failures: int = 0
    restarts: int = 0
    waiting: str = ""
    last: ProbeResult | None = None
    last_at: float | None = None
    last_start: float | None = None
    job: ProbeJob | None = None

    @property
    def enabled(self) -> bool:
        """False when ``probe_failures`` is 0."""
        return self.settings.probe_failures > 0

    def tick(self, mono: float, local: dict[str, UnitView], held: bool,
             restarting: bool = False) -> str | None:
        """One watchdog poll: collect a finished request, start the next one when due.

        Args:
            mono: monotonic seconds now.
            local: every local unit of the watchdog (all must be ``active (running)``).
            held: the hold file is in force (a planned restart: judge nothing).
            restarting: a restart of ``unit`` was already requested and is awaited.

        Returns:
            the reason to restart ``unit`` now (``probe_failures`` consecutive failures of an
            armed invocation), else None.
        """
        if not self.enabled:
            return None
        mine = local.get(self.unit)
        why = ("the watchdog is held" if held else
               "a restart is under way" if restarting else
               next((f"{name} is not running" for name, view in sorted(local.items())
                     if not view.running), "") or
               ("" if mine is not None else f"{self.unit} is unknown"))
        if why or mine is None:
            self._pause(why)
            return None
        if self.armed and self.armed != mine.invocation:
            self._pause(f"{self.unit} restarted")
        self.waiting = "" if self.armed else f"{self.unit} has not answered /health 200 yet"
        reason = self._collect(mono, mine)
        for _ in range(2):  # a /health 200 answered at once is followed by the first completion
            if reason is not None or self.job is not None or (
                    self.last_start is not None
                    and mono - self.last_start < self.settings.probe_interval_s):
                break
            self._launch(mono, mine)
            reason = self._collect(mono, mine)
        return reason

    def _pause(self, why: str) -> None:
        """Forget the invocation and any request in flight: nothing is judged meanwhile."""
        if self.armed or self.failures:
            log(f"probe: paused ({why}); {self.failures} failure(s) forgotten")
        self.armed, self.failures, self.job, self.last_start = "", 0, None, None
        self.waiting = why

    def _launch(self, mono: float, mine: UnitView) -> None:
        job = ProbeJob("completion" if self.armed == mine.invocation else "health",
                       mine.invocation, mono)
        self.job, self.last_start = job, mono

        def work() -> None:
            try:
                if job.kind == "completion":
                    job.result = self.complete()
                else:
                    job.health = self.health()
            finally:
                job.done.set()

        self.start(work)

    def _collect(self, mono: float, mine: UnitView) -> str | None:
        job = self.job
        if job is None:
            return None
        if job.invocation != mine.invocation:
            self.job = None  # it judged an earlier invocation
            return None
        if not job.done.is_set():
            # urllib's timeout bounds each socket operation, not the whole answer: give up here
            if mono - job.started <= self.settings.probe_timeout_s + self.settings.poll_s + 1:
                return None
            job.result = classify(None, f"no answer within {self.settings.probe_timeout_s:g} s")
            job.health = None
        self.job = None
        if job.kind == "health":
            if job.health == 200:
                self.armed, self.waiting = mine.invocation, ""
                self.last_start = None  # the first completion right away
                log(f"probe: {self.unit} (invocation {mine.invocation[:8]}) answers /health 200:"
                    f" judging it from now on")
            return None
        result = job.result or classify(None, "the probe ended without a result")
        self.last, self.last_at = result, mono
        if result.outcome == PROBE_OK:
            if self.failures:
                log(f"probe: {self.unit} serves again after {self.failures} failure(s)")
            self.failures = 0
            return None
        if result.outcome == PROBE_IGNORED:
            log(f"probe: {result.detail}: the probe is misconfigured (API key, model name?); "
                "not restarting anything")
            return None
        self.failures += 1
        needed = self.settings.probe_failures
        log(f"probe: failure {self.failures}/{needed} of {self.unit} (invocation "
            f"{mine.invocation[:8]}): {result.detail}")
        if self.failures < needed:
            return None
        reason = (f"{needed} consecutive completion probes failed, last: {result.detail} "
                  "(every unit running: a hung group)")
        self.restarts += 1
        self.armed, self.failures, self.last_start = "", 0, None
        return reason

    def state(self, mono: float) -> dict[str, Any]:
        """What ``/state`` and the state file publish under ``probe``."""
        if not self.enabled:
            return {"enabled": False, "unit": self.unit}
        return {"enabled": True, "unit": self.unit, "armed": bool(self.armed),
                "waiting": self.waiting, "in_flight": self.job is not None,
                "last_result": self.last.outcome if self.last else None,
                "last_detail": self.last.detail if self.last else "",
                "age_s": round(mono - self.last_at, 1) if self.last_at is not None else None,
                "consecutive_failures": self.failures,
                "failures_to_restart": self.settings.probe_failures,
                "restarts": self.restarts}


def log(message: str) -> None:
    """One line to stdout (the journal)."""
    print(message, flush=True)
