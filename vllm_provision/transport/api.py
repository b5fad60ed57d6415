"""Readiness and the served completion: is the replica up, and does it answer a real request?

Readiness is three signals together (vLLM's OpenAI-compatible server; docs/deploy.md): every
unit of the replica is active, rank 0's ``/health`` is 200, and ``/v1/models`` lists the model. The
HTTP port refuses connections until every node has loaded, so a refused connection means "still
loading" -- unless a unit failed or is restarting, which ends the wait at once with that unit's
journal. Verification is one real completion, streamed so the time to first token is measured,
and ``/version`` compared with the version preflight found.

The HTTP calls (httpx) go from the controller to rank 0's API address (``vllm_api_port`` on the
master's cluster IP), directly or through rank 0's SSH connection (``vllm_api_via``,
:mod:`vllm_provision.transport.tunnel`); the unit states come from ``systemctl show`` over each
node's SSH connection.
Pure parsers and the wait loop take their I/O as callables, so they are unit-tested without hosts.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_provision.core import hostjson
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Replica
from vllm_provision.core.text import printable

if TYPE_CHECKING:
    from vllm_provision.transport.tunnel import ApiRoute

# Properties read from `systemctl show` (systemd.unit(5), org.freedesktop.systemd1(5)).
# Start times come as ExecMainStartTimestampMonotonic (an integer of microseconds on
# CLOCK_MONOTONIC, printed the same way by every systemd) and ExecMainStartTimestamp in the
# default format, never with `--timestamp=unix`: systemctl's --timestamp= first appeared in 247
# with styles for local time, UTC and microseconds only (systemd NEWS, "CHANGES WITH 247"); the
# 248 entries add no "unix" either, and Debian 11's 247.3 answers "Invalid value: unix" (measured
# in the lab). Older systemd (RHEL 8's 239) has no --timestamp= at all.
SHOW_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "MainPID", "NRestarts",
                   "ExecMainStartTimestamp", "ExecMainStartTimestampMonotonic", "ExecMainStatus",
                   "ActiveEnterTimestamp")
# The host's wall clock and CLOCK_MONOTONIC read in one instant (Python's time module, the
# Python every supported host has), so a monotonic start time becomes seconds since the epoch.
_CLOCK_SCRIPT = 'import time; print("clock", repr(time.time()), repr(time.monotonic()))'
_PRETTY_FORMAT = "%a %Y-%m-%d %H:%M:%S UTC"
JOURNAL_LINES = 25


@dataclass(frozen=True)
class UnitState:
    """One systemd unit on one host, as ``systemctl show`` reported it.

    Attributes:
        host: inventory host name.
        unit: unit name (``vllm.service``).
        load_state: ``loaded`` / ``not-found`` / ...
        active_state: ``active`` / ``activating`` / ``deactivating`` / ``inactive`` / ``failed``.
        sub_state: ``running`` / ``auto-restart`` / ``dead`` / ...
        result: ``success`` or the reason of the last failure (``exit-code``, ``timeout``...).
        main_pid: the main process id, 0 when none.
        restarts: ``NRestarts``: automatic restarts since the unit was last started by hand.
        started_at: the main process's start (``ExecMainStartTimestampMonotonic`` on the host's
            wall clock) in seconds since the epoch, None when never.
        exit_status: ``ExecMainStatus`` of the last main process.
    """

    host: str
    unit: str
    load_state: str = "loaded"
    active_state: str = "inactive"
    sub_state: str = "dead"
    result: str = "success"
    main_pid: int = 0
    restarts: int = 0
    started_at: float | None = None
    exit_status: int = 0

    @property
    def label(self) -> str:
        """``host:unit``, for messages."""
        return f"{self.host}:{self.unit}"

    @property
    def describe(self) -> str:
        """``active (running)``, as systemctl prints it."""
        return f"{self.active_state} ({self.sub_state})"


def show_command(units: Sequence[str]) -> str:
    """The shell command that prints the unit states and the host's clock, for :func:`parse_show`.

    ``TZ=UTC`` makes systemctl print ``ExecMainStartTimestamp`` as ``Tue 2026-12-01 10:23:09
    UTC`` (systemd.time(7), "Displaying Timestamps"); the clock line is ``clock <epoch s>
    <monotonic s>`` from python3, or ``date +%s.%N`` where python3 cannot run. Works on every
    systemd the product supports (README, "Supported hosts").
    """
    props = ",".join(SHOW_PROPERTIES)
    return (f"TZ=UTC systemctl show -p {props} {' '.join(units)}; echo; "
            f"python3 -c '{_CLOCK_SCRIPT}' 2>/dev/null || date +%s.%N")


def parse_show(host: str, text: str) -> tuple[list[UnitState], float | None]:
    """Parse the output of :func:`show_command` into unit states and the host's clock.

    A unit's ``started_at`` is its monotonic start time moved onto the host's wall clock (exact
    to the microsecond); without the monotonic clock line it falls back to
    ``ExecMainStartTimestamp`` (``@<seconds>`` or the UTC default format, whole seconds).

    Args:
        host: the inventory host name the output came from.
        text: ``KEY=value`` blocks separated by blank lines, one per unit, then the clock line
            (``clock <epoch> <monotonic>``, or ``date +%s.%N``).

    Returns:
        (states in output order, host time in seconds since the epoch or None if absent).
        Lines it does not understand are skipped.
    """
    blocks: list[dict[str, str]] = []
    now: float | None = None
    monotonic_now: float | None = None
    for block in text.strip().split("\n\n"):
        values: dict[str, str] = {}
        for line in block.strip().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key] = value
                continue
            words = line.split()
            try:
                if len(words) == 3 and words[0] == "clock":
                    now, monotonic_now = float(words[1]), float(words[2])
                elif len(words) == 1:
                    now = float(words[0])
            except ValueError:
                continue
        if "Id" in values:
            blocks.append(values)
    states = [UnitState(
        host=host, unit=values["Id"], load_state=values.get("LoadState", ""),
        active_state=values.get("ActiveState", ""), sub_state=values.get("SubState", ""),
        result=values.get("Result", ""), main_pid=_int(values.get("MainPID")),
        restarts=_int(values.get("NRestarts")),
        started_at=_start_time(values, now, monotonic_now),
        exit_status=_int(values.get("ExecMainStatus"))) for values in blocks]
    return states, now


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _start_time(values: dict[str, str], now: float | None,
                monotonic_now: float | None) -> float | None:
    """A unit's main-process start in seconds since the epoch, None when it never started."""
    monotonic_us = _int(values.get("ExecMainStartTimestampMonotonic"))
    if monotonic_us > 0 and now is not None and monotonic_now is not None:
        return round(now - (monotonic_now - monotonic_us / 1e6), 6)
    return parse_timestamp(values.get("ExecMainStartTimestamp", ""))


def parse_timestamp(value: str) -> float | None:
    """Parse a ``systemctl show`` timestamp into seconds since the epoch; None when empty/unknown.

    Accepts ``@1796120590`` (``--timestamp=unix``, newer systemd) and the default format under
    ``TZ=UTC``: ``Tue 2026-12-01 10:23:09 UTC`` (systemd.time(7)); ``n/a`` and other zones
    give None rather than a guess.
    """
    value = value.strip()
    if value.startswith("@"):
        try:
            return float(value[1:])
        except ValueError:
            return None
    try:
        parsed = datetime.datetime.strptime(value, _PRETTY_FORMAT)
    except ValueError:
        return None
    return parsed.replace(tzinfo=datetime.UTC).timestamp()


def unit_problem(state: UnitState, baseline_restarts: int | None = None) -> str | None:
    """Why ``state`` means the start failed, or None while the unit looks healthy.

    A unit has failed when it is not installed, ``failed``, restarting (``activating
    (auto-restart)``: Restart= fired after an exit), inactive/deactivating (its process ended), or
    when its ``NRestarts`` grew since ``baseline_restarts`` (it crashed and came back between two
    polls). Rule source: systemd.service(5) ``Restart=``; a rank 0 that lost a peer exits 0 and
    is restarted (measured on vLLM 0.32.0: the table at the top of docs/recovery.md).
    """
    if state.load_state and state.load_state != "loaded":
        return f"is {state.load_state} (not installed)"
    if state.active_state == "failed":
        return f"failed (result {state.result}, exit status {state.exit_status})"
    if state.sub_state == "auto-restart":
        return (f"exited (result {state.result}, exit status {state.exit_status}) and is "
                "waiting to be restarted")
    if state.active_state in ("inactive", "deactivating"):
        return f"is {state.describe}: its process ended"
    if baseline_restarts is not None and state.restarts > baseline_restarts:
        return (f"restarted {state.restarts - baseline_restarts} time(s) while we waited "
                "(it crashed and systemd started it again)")
    return None


# the process's shared direct client (Endpoint.client), once made
_SHARED: list[Any] = []
_SHARED_LOCK = threading.Lock()


class _Timed:
    """The shared ``httpx.Client`` with this endpoint's timeout on every request."""

    def __init__(self, client: Any, timeout: Any) -> None:
        self._client, self._timeout = client, timeout

    def get(self, url: str, **kwargs: Any) -> Any:
        """``GET`` with the endpoint's timeout unless ``timeout`` is given."""
        return self._client.get(url, **{"timeout": self._timeout, **kwargs})

    def post(self, url: str, **kwargs: Any) -> Any:
        """``POST`` with the endpoint's timeout unless ``timeout`` is given."""
        return self._client.post(url, **{"timeout": self._timeout, **kwargs})

    def stream(self, method: str, url: str, **kwargs: Any) -> Any:
        """A streamed request with the endpoint's timeout unless ``timeout`` is given."""
        return self._client.stream(method, url, **{"timeout": self._timeout, **kwargs})


def _get(client: Any, url: str, **kwargs: Any) -> Any:
    """``client.get``, sent again once when a kept-alive connection turns out closed by the
    server (httpx ``RemoteProtocolError`` before any answer: the server's idle timeout fell
    between two requests; a GET is safe to repeat, RFC 9110 section 9.2.2)."""
    import httpx

    try:
        return client.get(url, **kwargs)
    except httpx.RemoteProtocolError:
        return client.get(url, **kwargs)


def _close_shared() -> None:
    with _SHARED_LOCK:
        for shared in _SHARED:
            shared.close()
        _SHARED.clear()


@dataclass(frozen=True)
class Endpoint:
    """Rank 0's OpenAI-compatible HTTP API.

    Attributes:
        base_url: ``http://<master cluster ip>:<api port>``.
        api_key: sent as ``Authorization: Bearer`` to ``/v1`` routes when set (vLLM ``--api-key``
            / ``VLLM_API_KEY`` protects only ``/v1``, ``/v2``, ``/inference``: cli_args.py).
        timeout_s: per request, seconds.
        route: how the controller reaches it (:class:`~vllm_provision.transport.tunnel.ApiRoute`:
            direct, or through rank 0's SSH connection); None: direct.
    """

    base_url: str
    api_key: str | None = None
    timeout_s: float = 10.0
    route: ApiRoute | None = None

    @classmethod
    def for_replica(cls, replica: Replica, timeout_s: float = 10.0,
                    route: ApiRoute | None = None) -> Endpoint:
        """The endpoint of ``replica``'s rank 0 (:attr:`Replica.api_url`), reached on ``route``
        (:func:`~vllm_provision.transport.tunnel.route_for`; None: direct)."""
        return cls(route.base_url if route else replica.api_url, replica.engine.api_key,
                   timeout_s, route)

    @property
    def path(self) -> str:
        """``direct`` or ``ssh via <rank 0 host>``, for messages."""
        return self.route.describe if self.route is not None else "direct"

    def client(self, timeout: Any = None) -> Any:
        """An ``httpx.Client`` on this endpoint's route (``timeout``: default ``timeout_s``),
        as a context manager. Direct: one client per timeout for the whole process, kept
        open, so the readiness wait, verify and status reuse one keep-alive TCP connection to
        rank 0 (a connection costs a round trip: 25 ms each from a laptop on another
        continent, bench/README.md); through SSH: a client of the route's own."""
        from vllm_provision.transport.tunnel import http_client

        timeout = self.timeout_s if timeout is None else timeout
        if self.route is not None and self.route.via != "direct":
            return self.route.client(timeout)
        with _SHARED_LOCK:
            if not _SHARED:
                _SHARED.append(http_client(10.0))
                atexit.register(_close_shared)
            return contextlib.nullcontext(_Timed(_SHARED[0], timeout))

    def _headers(self, path: str, body: bool = False) -> dict[str, str]:
        headers = {"Content-Type": "application/json"} if body else {}
        if self.api_key and path.startswith("/v1"):
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def health(self) -> int | None:
        """``GET /health``: the status code, or None when the port refuses or times out."""
        import httpx

        try:
            with self.client() as client:
                return int(_get(client, self.base_url + "/health").status_code)
        except (httpx.HTTPError, OSError):
            return None

    def get_json(self, path: str) -> Any:
        """``GET path`` and decode JSON.

        Raises:
            ProvisionError: the request failed or the answer is not JSON.
        """
        import httpx

        try:
            with self.client() as client:
                answer = _get(client, self.base_url + path, headers=self._headers(path))
                if answer.status_code >= 400:
                    raise _http_error(self.base_url + path, answer.status_code,
                                      answer.reason_phrase, answer.text)
                return answer.json()
        except (httpx.HTTPError, OSError, ValueError) as exc:
            raise ProvisionError.single(self.base_url + path, f"the request failed ({self.path})"
                                        f": {exc}",
                                        fix="check that rank 0's vLLM unit is active") from None

    def served_models(self) -> list[str]:
        """``GET /v1/models``: the served model ids."""
        answer = self.get_json("/v1/models")
        return [str(item.get("id")) for item in answer.get("data", []) if isinstance(item, dict)]

    def version(self) -> str:
        """``GET /version``: the running vLLM version, made printable (at most 200 characters,
        :func:`vllm_provision.core.text.printable`): the server's text reaches the terminal,
        the stored bench result and the decision record."""
        return printable(self.get_json("/version").get("version", ""), limit=200)

    def complete(self, model: str, prompt: str = "Hello", max_tokens: int = 8,
                 clock: Callable[[], float] = time.monotonic) -> Completion:
        """One streamed ``POST /v1/completions`` (temperature 0), timing its first token.

        Args:
            model: the served model id.
            prompt: the prompt text.
            max_tokens: tokens to generate (small: this proves service, it is no benchmark).
            clock: monotonic seconds.

        Raises:
            ProvisionError: non-200 answer, a broken stream, or no text at all.
        """
        import httpx

        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True}
        where = self.base_url + "/v1/completions"
        started = clock()
        first: float | None = None
        pieces: list[str] = []
        finish_reason = None
        try:
            with self.client() as client, client.stream(
                    "POST", where, content=json.dumps(body).encode(),
                    headers=self._headers("/v1/completions", body=True)) as response:
                if response.status_code >= 400:
                    raise _http_error(where, response.status_code, response.reason_phrase,
                                      response.read().decode("utf-8", "replace"))
                done = False
                for raw in response.iter_lines():
                    line = raw.strip()
                    if done or not line.startswith("data:"):
                        continue  # read to the end: the kept-alive connection is reused
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        continue
                    chunk = hostjson.loads(payload)
                    if not isinstance(chunk, dict):
                        raise ValueError(f"a stream event that is not a JSON object: "
                                         f"{payload[:80]!r}")
                    for choice in chunk.get("choices", []):
                        text = choice.get("text") or ""
                        if text and first is None:
                            first = clock()
                        pieces.append(text)
                        finish_reason = choice.get("finish_reason") or finish_reason
        except (httpx.HTTPError, OSError, ValueError) as exc:
            raise ProvisionError.single(where, f"the completion request failed ({self.path}): "
                                        f"{exc}",
                                        fix="read rank 0's journal: journalctl -u vllm") from None
        total = clock() - started
        if first is None:
            raise ProvisionError.single(where, "the completion returned no text",
                                        expected=f"up to {max_tokens} generated tokens",
                                        actual=f"finish_reason {finish_reason!r}",
                                        fix="read rank 0's journal for engine errors")
        return Completion(text="".join(pieces), model=model, ttft_s=round(first - started, 4),
                          total_s=round(total, 4), finish_reason=finish_reason)


def _http_error(where: str, code: int, reason: str, body: str) -> ProvisionError:
    detail = body[:300]
    fix = ("set vllm_api_key in the inventory to the key the server was started with"
           if code == 401 else "read rank 0's journal: journalctl -u vllm")
    return ProvisionError.single(where, f"HTTP {code} {reason}", expected="HTTP 200",
                                 actual=detail or str(code), fix=fix)


@dataclass(frozen=True)
class Completion:
    """A served completion: ``text``, ``model``, time to first token and total time (seconds)."""

    text: str
    model: str
    ttft_s: float
    total_s: float
    finish_reason: str | None = None


@dataclass(frozen=True)
class Readiness:
    """The replica serves: when and how long it took.

    Attributes:
        waited_s: seconds this wait took.
        start_to_serving_s: seconds from the earliest vLLM unit start (``ExecMainStartTimestamp``)
            to the poll that found it serving, on the master's clock; None when it could not
            be measured, and then ``start_to_serving_reason`` says why.
        already_serving: True when it was serving at the first poll (nothing was restarted).
        models: ids listed by ``/v1/models``.
        start_to_serving_reason: why ``start_to_serving_s`` is None (one sentence naming the
            unit, host or clock that was missing); None when it was measured.
    """

    waited_s: float
    start_to_serving_s: float | None
    already_serving: bool
    models: list[str] = field(default_factory=list)
    start_to_serving_reason: str | None = None


class Stalled(ProvisionError):
    """The replica's start stopped moving (the stall rule, ``vllm_stall_timeout_s``): raised by
    :func:`wait_ready` with the problem its ``stall_check`` returned, so the caller can stop the
    half-started replica before it reports the error (modules/vllm_wait_ready.py)."""


@dataclass(frozen=True)
class Observation:
    """One poll of the units: their states and the master's clock (seconds since the epoch)."""

    states: list[UnitState]
    master_now: float | None = None


def wait_ready(*, observe: Callable[[], Observation], journal: Callable[[UnitState], str],
               endpoint: Endpoint, model: str, timeout_s: float,
               vllm_units: Iterable[str] = ("vllm.service",), poll_s: float = 1.0,
               extra_check: Callable[[], Problem | None] | None = None,
               extra_check_every_s: float = 5.0,
               stall_check: Callable[[float], Problem | None] | None = None,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Readiness:
    """Poll until the replica serves ``model``; fail at once when a unit fails or restarts.

    Args:
        observe: reads every unit of the replica (one ``systemctl show`` per host).
        journal: the last journal lines of one unit (secrets already masked).
        endpoint: rank 0's API.
        model: the served model id ``/v1/models`` must list.
        timeout_s: total seconds (``vllm_ready_timeout_s``: large models take long).
        vllm_units: unit names whose start time counts for ``start_to_serving_s``.
        poll_s: seconds between polls.
        extra_check: an additional diagnosis run every ``extra_check_every_s`` seconds while not
            ready (Ray: a pending placement group); a returned Problem ends the wait.
        stall_check: called after every poll whose units are healthy, with ``clock()``; a
            returned Problem (no progress for ``vllm_stall_timeout_s``,
            :mod:`vllm_provision.output.stall`) ends the wait at once as :class:`Stalled`.
        clock, sleep: injectable time.

    Returns:
        :class:`Readiness`.

    Raises:
        ProvisionError: a unit failed/restarted (with its journal), ``/health`` answered 503
            (engine dead), the extra check found a problem, or ``timeout_s`` passed.
        Stalled: the stall check found the start stuck (a ProvisionError too).
    """
    started = clock()
    deadline = started + timeout_s
    baseline: dict[str, int] = {}
    last_check = started
    last_seen = "no poll yet"
    first_poll = True
    vllm_names = set(vllm_units)
    while True:
        observation = observe()
        for state in observation.states:
            baseline.setdefault(state.label, state.restarts)
            problem = unit_problem(state, baseline[state.label])
            if problem is not None:
                raise ProvisionError([Problem(
                    state.label, f"the unit {problem}", expected="active (running)",
                    actual=state.describe,
                    fix=f"read the journal lines below (journalctl -u {state.unit} on "
                        f"{state.host})\n" + _indent(journal(state)))])
        if stall_check is not None:
            stalled = stall_check(clock())
            if stalled is not None:
                raise Stalled([stalled])
        status = endpoint.health()
        if status == 503:
            master_state = next((s for s in observation.states if s.unit in vllm_names), None)
            lines = journal(master_state) if master_state else ""
            raise ProvisionError.single(
                endpoint.base_url + "/health", "the engine is dead (HTTP 503)",
                expected="HTTP 200", actual="503",
                fix="read rank 0's journal:\n" + _indent(lines))
        if status == 200:
            models = endpoint.served_models()
            if model in models:
                seconds, reason = start_to_serving(observation, vllm_names)
                return Readiness(
                    waited_s=round(clock() - started, 3), start_to_serving_s=seconds,
                    already_serving=first_poll, models=models,
                    start_to_serving_reason=reason)
            last_seen = f"/health 200 but /v1/models lists {models}, not {model!r}"
        else:
            last_seen = (f"rank 0's API port refuses connections (still loading; API path "
                         f"{endpoint.path})" if status is None
                         else f"/health answered HTTP {status}")
        first_poll = False
        now = clock()
        if extra_check is not None and now - last_check >= extra_check_every_s:
            last_check = now
            found = extra_check()
            if found is not None:
                raise ProvisionError([found])
        if now >= deadline:
            found = extra_check() if extra_check is not None else None
            problems = [found] if found is not None else []
            problems.append(Problem(
                endpoint.base_url, f"the replica did not serve within {timeout_s:g} s",
                expected=f"/health 200 and {model!r} in /v1/models", actual=last_seen,
                fix="read the units' journals (provision status; journalctl -u vllm); raise "
                    "vllm_ready_timeout_s if the model needs longer to load"))
            raise ProvisionError(problems)
        sleep(min(poll_s, max(0.0, deadline - now)))


def start_to_serving(observation: Observation, vllm_units: set[str],
                     ) -> tuple[float | None, str | None]:
    """Seconds from the earliest vLLM unit start to this observation, on the master's clock.

    Args:
        observation: the poll that found the replica serving.
        vllm_units: unit names whose ``ExecMainStartTimestamp`` counts.

    Returns:
        ``(seconds, None)``, or ``(None, reason)`` when it cannot be measured: no vLLM unit was
        read, systemd reported no start time (``ExecMainStartTimestamp`` without an ``@``
        timestamp), or the master's clock line was missing from the poll's output.
    """
    units = [s for s in observation.states if s.unit in vllm_units]
    if not units:
        return None, (f"no vLLM unit ({', '.join(sorted(vllm_units))}) was read from the "
                      "hosts")
    starts = [s.started_at for s in units if s.started_at is not None]
    if not starts:
        labels = ", ".join(s.label for s in units)
        return None, (f"systemd reported no start time (ExecMainStartTimestamp) for {labels}")
    if observation.master_now is None:
        return None, "the master's clock was not read (no clock line in the unit poll)"
    return round(observation.master_now - min(starts), 3), None


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines()) or "    (no lines)"


def journal_command(unit: str, lines: int = JOURNAL_LINES) -> str:
    """The shell command printing the last ``lines`` lines of ``unit``'s journal, this boot
    (``-o short-iso``: systemd's own lines show as ``systemd[1]:``, which
    :func:`vllm_provision.output.phases.first_failure` reads). ``unit`` is one quoted word."""
    return f"journalctl -u {shlex.quote(unit)} -b -n {int(lines)} --no-pager -o short-iso"


def mask(text: str, secrets: Iterable[str | None]) -> str:
    """Replace every non-empty secret in ``text`` with ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def verdict(states: Sequence[UnitState], health: int | None, expected_units: int,
            whole: bool | None = None) -> str:
    """One word for the replica: ``serving``, ``degraded`` or ``down``.

    ``serving``: every expected unit active, ``/health`` 200, and the replica not known to be
    broken (``whole`` is not False: the peer watchdogs bound every node to running peers, and for
    Ray every node is alive; docs/recovery.md). ``down``: no unit active and no answer. Anything
    between is ``degraded``.
    """
    active = [s for s in states if s.active_state == "active"]
    if (len(active) == expected_units and expected_units > 0 and health == 200
            and whole is not False):
        return "serving"
    if not active and health is None:
        return "down"
    return "degraded"
