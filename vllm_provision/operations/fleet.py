"""A fleet of replicas: batches of a rolling upgrade, drains, rollback snapshots, the recap and
the capacity probe (docs/upgrade.md).

The pure parts (:func:`batches`, :func:`parse_running`, :func:`recap`, :func:`recap_lines`,
:func:`capacity_summary`, :func:`hook_argv`) take plain data and are unit tested; the parts that
reach hosts or endpoints (:class:`CapacityProbe`, :func:`wait_idle`, :func:`run_hook`,
:func:`snapshot_script`, :func:`restore_script`) are exercised by the lab.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import quote
from vllm_provision.evidence.stats import metric_sum
from vllm_provision.settings import instance

if TYPE_CHECKING:
    from vllm_provision.transport.tunnel import ApiRoute

# Where an upgrade keeps, on each node, the files it is about to replace (a tar of the unit and
# environment files as they were, plus the list of those that did not exist yet), so that a
# replica whose new version fails is put back exactly as it was.
SNAPSHOT_DIR = "/var/lib/vllm-provision/upgrade"

# The recap's outcome of each replica.
UPGRADED = "upgraded"
ROLLED_BACK = "rolled back"
ROLLBACK_FAILED = "rollback failed"
NOT_UPGRADED = "not upgraded"  # its drain or snapshot failed: nothing was changed
UNTOUCHED = "untouched"
OUTCOMES = (UPGRADED, ROLLED_BACK, ROLLBACK_FAILED, NOT_UPGRADED, UNTOUCHED)

# vLLM's Prometheus gauge of requests in model execution batches (vllm/v1/metrics/loggers.py).
RUNNING_METRIC = "vllm:num_requests_running"


def batches(names: Sequence[str], size: int) -> list[list[str]]:
    """Split replica names, in inventory order, into consecutive batches of ``size``.

    ``--serial N`` and ``--max-unavailable N`` both mean: at most N replicas are out of service
    at once, so both give batches of N (Ansible's ``serial``, which also counts from the start).

    Args:
        names: the replicas' names, in the order to upgrade them.
        size: replicas per batch, at least 1.

    Raises:
        ValueError: ``size`` is below 1.
    """
    if size < 1:
        raise ValueError(f"a batch holds at least 1 replica, got {size}")
    return [list(names[i:i + size]) for i in range(0, len(names), size)]


def parse_running(text: str) -> float | None:
    """The sum of every ``vllm:num_requests_running`` sample in a Prometheus text exposition
    (one per model/engine label set), or None when the metric is absent
    (:func:`vllm_provision.evidence.stats.metric_sum`).

    Args:
        text: the body of ``GET /metrics`` (Prometheus text format 0.0.4: ``name{labels} value``).
    """
    return metric_sum(text, RUNNING_METRIC)


def hook_argv(command: str, phase: str, name: str, endpoint: str) -> list[str]:
    """The argv of a drain hook call: the operator's command split as a POSIX shell would split
    its words (no expansion, no shell runs it), then ``phase``, the replica's name and its
    endpoint as three more words.

    Args:
        command: ``--drain-hook`` as typed (``./lb.sh`` or ``lbctl --pool api``).
        phase: ``drain`` or ``undrain``.
        name: the replica's group name. endpoint: its API base URL (``http://ip:port``).

    Raises:
        ProvisionError: the command is empty or its quoting is unbalanced.
    """
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ProvisionError.single("--drain-hook", f"cannot split the command: {exc}",
                                    actual=command, fix="balance the quotes") from None
    if not words:
        raise ProvisionError.single("--drain-hook", "the command is empty",
                                    fix="give a program, e.g. --drain-hook ./lb-drain.sh")
    return [*words, phase, name, endpoint]


@dataclass
class HookResult:
    """One drain hook call. ``ok``: exit 0 within the timeout; ``output``: its last lines."""

    phase: str
    argv: list[str]
    ok: bool
    exit_code: int | None
    duration_s: float
    output: str

    def to_json(self) -> dict[str, Any]:
        """The ``drain``/``undrain`` entry of a replica's recap."""
        return {"phase": self.phase, "argv": self.argv, "ok": self.ok,
                "exit_code": self.exit_code, "duration_s": round(self.duration_s, 3),
                "output": self.output}


def run_hook(command: str, phase: str, name: str, endpoint: str, timeout_s: float,
             environ: Mapping[str, str] | None = None) -> HookResult:
    """Run the drain hook on the controller, without a shell: argv from :func:`hook_argv`, and
    the same values in the environment (``VLLM_PROVISION_PHASE``, ``VLLM_PROVISION_REPLICA``,
    ``VLLM_PROVISION_ENDPOINT``). Never raises for the hook's own failure (exit status, timeout,
    missing program): the result says so.

    Args:
        timeout_s: the hook is killed after this many seconds.
        environ: the base environment (default ``os.environ``).
    """
    argv = hook_argv(command, phase, name, endpoint)
    env = {**(environ if environ is not None else os.environ),
           "VLLM_PROVISION_PHASE": phase, "VLLM_PROVISION_REPLICA": name,
           "VLLM_PROVISION_ENDPOINT": endpoint}
    started = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return HookResult(phase, argv, False, None, time.monotonic() - started,
                          f"killed after {timeout_s:g} s")
    except OSError as exc:
        return HookResult(phase, argv, False, None, time.monotonic() - started,
                          f"cannot run {argv[0]}: {exc.strerror}")
    output = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
    return HookResult(phase, argv, done.returncode == 0, done.returncode,
                      time.monotonic() - started, output)


def _get(url: str, timeout_s: float, route: ApiRoute | None = None) -> tuple[int | None, str]:
    """``GET url`` on ``route`` (None: direct): ``(status, body)``; ``(None, "")`` when it did
    not answer."""
    import httpx

    from vllm_provision.transport.tunnel import http_client

    try:
        with (route.client(timeout_s) if route is not None
              else http_client(timeout_s)) as client:
            response = client.get(url)
            if response.status_code >= 400:
                return int(response.status_code), ""
            return int(response.status_code), response.content[:1 << 20].decode("utf-8",
                                                                                "replace")
    except (httpx.HTTPError, OSError, ValueError):
        return None, ""


def wait_idle(endpoint: str, timeout_s: float, poll_s: float = 0.5,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep,
              route: ApiRoute | None = None) -> dict[str, Any]:
    """Wait until the replica's ``/metrics`` shows no request running
    (``vllm:num_requests_running`` summed to 0), polling every ``poll_s`` seconds.

    Returns ``{"idle": bool, "waited_s": float, "running": last value or None}``; a replica
    whose ``/metrics`` does not answer (not serving) counts as idle: nothing runs there.

    Args:
        endpoint: the API base URL. timeout_s: give up after this many seconds (0: no wait).
        route: how the controller reaches it (``vllm_api_via``; None: direct).
    """
    started = clock()
    running: float | None = None
    while True:
        status, body = _get(endpoint + "/metrics", timeout_s=min(5.0, max(timeout_s, 1.0)),
                            route=route)
        if status != 200:
            return {"idle": True, "waited_s": round(clock() - started, 3), "running": None}
        running = parse_running(body)
        if not running:
            return {"idle": True, "waited_s": round(clock() - started, 3), "running": running}
        if clock() - started >= timeout_s:
            return {"idle": False, "waited_s": round(clock() - started, 3), "running": running}
        sleep(poll_s)


def snapshot_dir(replica: Any) -> str:
    """The replica's snapshot folder on its nodes: ``upgrade`` in its ``provision_state_dir``
    (:data:`SNAPSHOT_DIR` unless the replica has a ``vllm_instance``: docs/inventory.md,
    "Shared servers")."""
    return f"{instance.state_dir(replica.vars)}/upgrade"


def snapshot_script(present: Sequence[str], absent: Sequence[str],
                    folder: str = SNAPSHOT_DIR) -> str:
    """The shell command that keeps a node's current unit and env files before an upgrade
    applies new ones: a tar of ``present`` (paths as they are, owner and mode kept) and the list
    of ``absent`` paths, written to temporary names and renamed into :data:`SNAPSHOT_DIR`
    (0700), so a cut connection never leaves half a snapshot.

    Args:
        present: absolute paths of the managed files that exist now.
        absent: absolute paths that the new version would create.
        folder: the snapshot folder (:func:`snapshot_dir`).
    """
    folder = quote(folder)
    steps = ["set -e", f"mkdir -p -m 0700 {folder}", f"cd {folder}",
             "rm -f prev.tar.tmp absent.tmp"]
    if present:
        words = " ".join(quote(p.lstrip("/")) for p in present)
        steps.append(f"tar -cpf prev.tar.tmp -C / -- {words}")
    else:
        steps.append("tar -cpf prev.tar.tmp -T /dev/null")
    steps.append("printf '%s\\n' " + " ".join(quote(p) for p in absent) + " > absent.tmp"
                 if absent else ": > absent.tmp")
    steps += ["mv -f prev.tar.tmp prev.tar", "mv -f absent.tmp absent", "sync ."]
    return "{ " + "; ".join(steps) + "; }"


def restore_script(folder: str = SNAPSHOT_DIR) -> str:
    """The shell command that puts a node's snapshot back (:func:`snapshot_script`, kept in
    ``folder``): files that did not exist are removed, the others extracted with their owner
    and mode, then systemd reloads its units. The snapshot stays until the next upgrade
    replaces it."""
    tar, absent = quote(f"{folder}/prev.tar"), quote(f"{folder}/absent")
    return ("{ set -e; "
            f"while IFS= read -r p; do [ -n \"$p\" ] && rm -f -- \"$p\"; done < {absent}; "
            f"tar -xpf {tar} -C /; systemctl daemon-reload; }}")


def existing_script(paths: Sequence[str]) -> str:
    """The shell command that prints, one a line, which of ``paths`` exist on the node."""
    return ("for p in " + " ".join(quote(p) for p in paths)
            + "; do if [ -e \"$p\" ]; then printf '%s\\n' \"$p\"; fi; done")


@dataclass
class ReplicaOutcome:
    """What the upgrade did to one replica, for the recap.

    Attributes:
        name: the replica. batch: its batch number (1-based). endpoint: its API base URL.
        outcome: one of :data:`OUTCOMES`. reason: why, when it is not ``upgraded``/``untouched``.
        changed: tasks that changed on its nodes (``host: task``) while applying.
        restarted: whether applying restarted it (a handler ran).
        vllm_version: ``/version`` after the upgrade (or after the rollback).
        serving: it answered a completion at the end of its step.
        timings: seconds of each step (``drain``, ``apply``, ``rollback``, ``undrain``).
        hooks: the drain hook calls. drain: the ``/metrics`` wait, when it ran.
        front_door: each gateway's drain and undrain
            (:mod:`vllm_provision.operations.front_door`): ``gateway``, ``phase``, ``ok``,
            ``action``, ``detail``, ``duration_s``.
    """

    name: str
    batch: int
    endpoint: str
    outcome: str = UNTOUCHED
    reason: str = ""
    changed: list[str] = field(default_factory=list)
    restarted: bool = False
    vllm_version: str | None = None
    serving: bool | None = None
    timings: dict[str, float] = field(default_factory=dict)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    drain: dict[str, Any] | None = None
    front_door: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The replica's entry of ``upgrade --json`` (``replicas``)."""
        return {"name": self.name, "batch": self.batch, "endpoint": self.endpoint,
                "outcome": self.outcome, "reason": self.reason, "changed": self.changed,
                "restarted": self.restarted, "vllm_version": self.vllm_version,
                "serving": self.serving,
                "timings": {k: round(v, 3) for k, v in self.timings.items()},
                "hooks": self.hooks, "drain": self.drain, "front_door": self.front_door}


def recap(outcomes: Sequence[ReplicaOutcome]) -> dict[str, list[str]]:
    """The replicas by outcome, each list in upgrade order, every outcome present (pure)."""
    out: dict[str, list[str]] = {key: [] for key in OUTCOMES}
    for entry in outcomes:
        out[entry.outcome].append(entry.name)
    return out


def should_stop(failed: int, max_fail: int) -> bool:
    """Whether the upgrade stops after a batch: ``failed`` replicas failed so far (their new
    version did not serve, or their drain failed) and at most ``max_fail`` may (Ansible's
    ``max_fail_percentage`` in replicas: ``--max-fail 0`` stops at the first failure)."""
    return failed > max_fail


def recap_lines(outcomes: Sequence[ReplicaOutcome],
                capacity: Mapping[str, Any] | None = None) -> list[str]:
    """The human recap: one line per replica (outcome, batch, reason), the counts, and the
    capacity's minimum when it was probed."""
    lines = []
    for entry in outcomes:
        why = f": {entry.reason}" if entry.reason else ""
        took = entry.timings.get("apply")
        timing = f" ({took:.1f} s)" if took is not None else ""
        lines.append(f"replica {entry.name} (batch {entry.batch}): {entry.outcome}{timing}{why}")
    counts = recap(outcomes)
    lines.append("upgrade recap: " + " ".join(f"{key.replace(' ', '_')}={len(names)}"
                                              for key, names in counts.items()))
    if capacity and capacity.get("samples"):
        lines.append(f"capacity: at least {capacity['min_serving']} of {capacity['replicas']} "
                     f"replicas served at every second ({len(capacity['samples'])} samples)")
    return lines


def capacity_summary(samples: Sequence[Mapping[str, Any]], replicas: int,
                     interval_s: float) -> dict[str, Any]:
    """The capacity record: every sample (``t_s`` since the start, ``serving`` count, ``down``
    names), the minimum and when it happened (pure).

    Args:
        samples: :class:`CapacityProbe` samples. replicas: the fleet's size.
        interval_s: the seconds between samples.
    """
    counts = [s["serving"] for s in samples]
    low = min(counts) if counts else None
    return {"replicas": replicas, "interval_s": interval_s, "min_serving": low,
            "min_at_s": next((s["t_s"] for s in samples if s["serving"] == low), None),
            "samples": list(samples)}


class CapacityProbe:
    """Polls every replica's ``GET /health`` each ``interval_s`` seconds in a thread and keeps,
    per tick, how many answered 200 (vLLM's health route: 200 once the engine serves,
    vllm/entrypoints/openai/api_server.py). The requests of one tick run at once, each with
    ``health_timeout_s``; a tick that takes longer than the interval delays the next one.

    A replica counts as down when it refuses, answers other than 200, or gives no answer
    within ``health_timeout_s``. vLLM answers /health at once while it serves, but a busy
    controller (or a loaded host) can take over a second to make and read the request, and a
    timeout just under a one-second interval then counted serving replicas as down.

    Args:
        endpoints: replica name -> API base URL. interval_s: seconds between ticks.
        health_timeout_s: seconds one /health request may take (default 3).
        on_sample: called with each sample (a live line for ``status --watch``).
        routes: replica name -> how the controller reaches it (``vllm_api_via``); a replica
            without one is reached directly.
    """

    def __init__(self, endpoints: Mapping[str, str], interval_s: float = 1.0,
                 on_sample: Callable[[dict[str, Any]], None] | None = None,
                 routes: Mapping[str, ApiRoute] | None = None,
                 health_timeout_s: float = 3.0) -> None:
        self.endpoints = dict(endpoints)
        self.health_timeout_s = health_timeout_s
        self.routes = dict(routes or {})
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def tick(self, pool: ThreadPoolExecutor) -> dict[str, Any]:
        """Poll every endpoint once; return (and keep) the sample."""
        t = time.monotonic() - self._started
        timeout = max(0.2, self.health_timeout_s)
        names = list(self.endpoints)
        codes = list(pool.map(lambda n: _get(self.endpoints[n] + "/health", timeout,
                                             self.routes.get(n))[0], names))
        down = [n for n, code in zip(names, codes, strict=True) if code != 200]
        sample = {"t_s": round(t, 3), "serving": len(names) - len(down), "down": down}
        self.samples.append(sample)
        if self.on_sample:
            self.on_sample(sample)
        return sample

    def run(self, duration_s: float | None = None) -> None:
        """Tick until :meth:`stop` (or ``duration_s`` seconds), in the calling thread."""
        import httpx  # noqa: F401 - loaded once, before the first tick is timed

        from vllm_provision.transport.tunnel import ssl_context

        ssl_context()  # the CA bundle too
        self._started = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, len(self.endpoints))) as pool:
            next_at = self._started
            while not self._stop.is_set():
                self.tick(pool)
                if duration_s is not None and time.monotonic() - self._started >= duration_s:
                    return
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> None:
        """Tick in a background thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self.run, name="capacity-probe", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop ticking; return :func:`capacity_summary` of the samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return capacity_summary(self.samples, len(self.endpoints), self.interval_s)
