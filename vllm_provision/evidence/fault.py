"""``provision fault``: one bounded fault experiment on a serving replica.

1. Start K streamed completions and wait until each has produced a token.
2. Apply the fault through the same SSH connections ``provision`` uses: a signal to one
   unit (``systemctl kill``, systemd.kill(5)), a reboot (``systemctl reboot``), or a network
   partition for a number of seconds (the lab's cut and heal, or the user's own commands).
3. Poll with new streamed completions until one succeeds after the service was seen failing
   (or after the fault, when it never failed), or until the bound.
4. Join the K streams (each ends, fails, or hangs until the read timeout) and read what systemd
   and the peer watchdog did from each node's journal since the fault.

The result (JSON-ready): ``kind`` (``fault``), ``time``, ``target`` (host, unit, signal, reboot,
partition_s), ``conditions`` (as ``bench``'s, without placement), ``streams`` (:func:`fate` of
each), ``recovery`` (``first_failure_s``, ``recovered_s``: fault to the end of the first new
successful completion, ``polls``, ``failures`` by kind, ``bound_s``, ``served_throughout``),
``start_limit_hit`` (units that hit their start limit), ``events`` (systemd and watchdog journal
lines with seconds since the fault; when the replica did not serve again, also the last
:data:`UNIT_TAIL_LINES` lines each node's units wrote, source ``unit``). docs/evidence.md.

The fault changes the replica's nodes: ``provision fault`` holds the run lock on every node of
the replica for the whole experiment, and checks that this run still holds the target node's
lock just before applying the fault (``held``; docs/security.md, "Run lock").
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from vllm_provision import settings
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import quote

SIGNALS = ("KILL", "TERM", "STOP")
# the last lines of each node's units kept when the replica did not serve again
UNIT_TAIL_LINES = 8
WATCHDOG_UNIT = "vllm-watchdog.service"
# systemd's messages worth recording (systemd/src/core/unit.c, service.c wording)
SYSTEMD_WORDS = ("Main process exited", "Failed with result", "Scheduled restart job",
                 "Stopping", "Stopped", "Started", "Starting", "Deactivated",
                 "start request repeated too quickly", "Start request repeated too quickly",
                 "State 'stop-sigterm' timed out", "Sent signal")


def kill_command(unit: str, signal: str) -> str:
    """``systemctl kill`` of ``unit``: KILL and TERM go to the main process only (a crash of
    the process systemd watches; its children stay, as with ``kill -9 <MainPID>``), STOP to
    every process of the unit (a frozen node: alive, silent)."""
    if signal not in SIGNALS:
        raise ValueError(signal)
    whom = "all" if signal == "STOP" else "main"
    return f"systemctl kill --kill-whom={whom} --signal=SIG{signal} -- {quote(unit)}"


def fate(stream: Any, fault_offset: float, max_tokens: int) -> dict[str, Any]:
    """What became of one in-flight stream (``stream``: a
    :class:`~vllm_provision.evidence.load.StreamResult`; ``fault_offset``: seconds from its
    sending to the fault).

    Keys: ``fate`` (``completed``, ``error`` or ``hung``: no byte until the client's read
    timeout), ``tokens`` (received), ``finish_reason`` (the server's; a completed stream may
    have fewer than ``max_tokens`` when vLLM capped them at the model length),
    ``tokens_before_fault``, ``max_tokens``, ``error`` (kind),
    ``detail``, ``end_s`` (seconds after the fault when it ended; negative: before it),
    ``last_token_s`` (seconds after the fault of its last token, None without tokens).
    """
    if stream.ok:
        word = "completed"
    elif stream.error == "read_timeout":
        word = "hung"
    else:
        word = "error"
    last = stream.token_times[-1] - fault_offset if stream.token_times else None
    return {"fate": word, "tokens": stream.tokens, "max_tokens": max_tokens,
            "finish_reason": stream.finish_reason,
            "tokens_before_fault": sum(1 for t in stream.token_times if t <= fault_offset),
            "error": stream.error, "detail": stream.detail,
            "end_s": round(stream.end - fault_offset, 3),
            "last_token_s": None if last is None else round(last, 3)}


def describe_fate(item: Mapping[str, Any]) -> str:
    """One line: ``completed (N tokens)``, ``error after N tokens: KIND``, ``hung after N
    tokens until the read timeout``."""
    if item["fate"] == "completed":
        return f"completed ({item['tokens']} tokens)"
    if item["fate"] == "hung":
        return f"hung after {item['tokens']} tokens until the read timeout"
    return f"error after {item['tokens']} tokens: {item['error']} ({item['detail'][:80]})"


def journal_command(units: Sequence[str], since_epoch: float,
                    watchdog_unit: str = WATCHDOG_UNIT) -> str:
    """The journal of ``units`` and the watchdog (``watchdog_unit``: the node's
    ``vllm_watchdog_unit_name``) since ``since_epoch`` (``@<seconds>``), one
    ``<epoch.micro> <host> <ident>[pid]: <message>`` line each (``-o short-unix``), then
    ``@@result <unit> <Result>`` per unit (``systemctl show -p Result``)."""
    names = [*units, watchdog_unit]
    selectors = " ".join(f"-u {quote(u)}" for u in names)
    results = " ".join(quote(u) for u in units)
    return (f"journalctl -o short-unix --no-pager --since @{since_epoch:.0f} {selectors} "
            f"2>/dev/null; for u in {results}; do echo \"@@result $u "
            f"$(systemctl show -p Result --value -- \"$u\")\"; done; true")


def parse_journal(host: str, stdout: str, fault_epoch: float, *, unit_lines: int = 0
                  ) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`journal_command` output -> (events ``{"host", "t_s", "source", "message"}``:
    systemd lines of :data:`SYSTEMD_WORDS` and every watchdog line, ``t_s`` seconds after the
    fault; units whose ``Result`` is ``start-limit-hit`` or whose journal says the start
    request was repeated too quickly).

    ``unit_lines``: also keep the last that many lines the units themselves wrote (vLLM's and
    Ray's own words, source ``unit``); :func:`run` asks for them when the replica did not serve
    again within the bound, so the operator sees where each node's start stopped (waiting for
    a placement group, a worker's error) beside what systemd did."""
    events, limited = [], []
    own: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        if line.startswith("@@result "):
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "start-limit-hit" \
                    and f"{host}:{parts[1]}" not in limited:
                limited.append(f"{host}:{parts[1]}")
            continue
        stamp, _, rest = line.partition(" ")
        try:
            when = float(stamp)
        except ValueError:
            continue
        _host, _, rest = rest.partition(" ")
        ident, _, message = rest.partition(": ")
        if ident.startswith("systemd["):
            if not any(word in message for word in SYSTEMD_WORDS):
                continue
            source = "systemd"
            if "repeated too quickly" in message:
                unit = message.split(":")[0].strip()
                if f"{host}:{unit}" not in limited:
                    limited.append(f"{host}:{unit}")
        elif "watchdog" in ident:
            source = "watchdog"
        else:
            if unit_lines > 0 and message.strip():
                own.append({"host": host, "t_s": round(when - fault_epoch, 3),
                            "source": "unit", "message": message.strip()[:240]})
            continue
        events.append({"host": host, "t_s": round(when - fault_epoch, 3), "source": source,
                       "message": message.strip()[:240]})
    if unit_lines > 0:
        events += own[-unit_lines:]
    return events, limited


def partition_commands(host: Any, cut: str | None, heal: str | None
                       ) -> tuple[list[str], list[str]]:
    """The controller-side argv that cuts and heals ``host``'s network: the operator's commands
    (the hook of docs/evidence.md, "Faults": split like a shell line, ``shlex.split``, with the
    host's address appended as the last word), for example a switch port's or a firewall's.

    Raises:
        ProvisionError: a command is missing: the product cannot cut a host's network itself.
    """
    if cut and heal:
        return [*shlex.split(cut), host.host_ip], [*shlex.split(heal), host.host_ip]
    raise ProvisionError.single(host.name, "--partition needs the commands that cut and "
                                "heal this host's network",
                                expected="--partition-command CMD and --heal-command CMD "
                                "(the host's address is appended)",
                                fix="give both, e.g. a firewall rule on a switch you run")


def apply(conn: Any, node: Any, unit: str, signal: str, *, reboot: bool = False,
          partition_s: float | None = None,
          partition_argv: tuple[list[str], list[str]] | None = None,
          held: Callable[[str], None] | None = None,
          ) -> tuple[str, float, float, threading.Thread | None]:
    """Apply the fault to ``node`` over ``conn`` (its connection): signal ``unit``, reboot, or
    cut its network for ``partition_s`` seconds (healed by a thread, returned to be joined).

    Args:
        conn: the node's connection. node: the :class:`~vllm_provision.core.models.Node`.
        unit / signal / reboot / partition_s / partition_argv: as :func:`run`.
        held: the run lock's check point, called with the node's name before the fault
            (raises when this run's lock on it was lost: no fault is applied).

    Returns:
        ``(the command applied, the fault's wall-clock epoch, its perf_counter time, the
        healing thread or None)``.

    Raises:
        ProvisionError: the fault command failed; RunLockLost (from ``held``): the run's lock
            on the node was lost (nothing was applied).
    """
    from vllm_provision.transport.base import UnreachableError

    if held is not None:
        held(node.name)
    fault_epoch, fault_clock = time.time(), time.perf_counter()
    healer: threading.Thread | None = None
    if reboot:
        try:
            conn.run("systemctl reboot", timeout_s=10)
        except UnreachableError:
            pass  # the connection drops as the host goes down
        return "systemctl reboot", fault_epoch, fault_clock, None
    if partition_s is not None:
        cut, heal = partition_argv or partition_commands(node.host, None, None)
        done = subprocess.run(cut, capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise ProvisionError.single(node.name, f"the partition command failed: "
                                        f"{(done.stderr or done.stdout).strip()[:200]}",
                                        fix="check --partition-command")

        def heal_later() -> None:
            time.sleep(max(0.0, fault_clock + partition_s - time.perf_counter()))  # the plan
            subprocess.run(heal, capture_output=True, text=True, check=False, timeout=60)

        healer = threading.Thread(target=heal_later, daemon=True)
        healer.start()
        return (f"{shlex.join(cut)}; after {partition_s:g} s: {shlex.join(heal)}", fault_epoch,
                fault_clock, healer)
    command = kill_command(unit, signal)
    result = conn.run(command, timeout_s=30)
    if result.exit_code != 0:
        raise ProvisionError.single(node.name, f"`{command}` failed: "
                                    f"{(result.stderr or result.stdout).strip()[:200]}",
                                    fix="name a unit of this node (provision status)")
    return command, fault_epoch, fault_clock, None


def run(replica: Any, connections: Mapping[str, Any], vars_: Mapping[str, Any], *,
        node: Any, unit: str, signal: str = "KILL", streams: int = 3, max_tokens: int = 512,
        reboot: bool = False, partition_s: float | None = None,
        partition_argv: tuple[list[str], list[str]] | None = None,
        bound_s: float = 300.0, read_timeout_s: float = 60.0,
        poll_interval_s: float = 0.5,
        held: Callable[[str], None] | None = None,
        front_door: tuple[str, str] | None = None) -> dict[str, Any]:
    """Run the experiment (module doc) and return its result.

    Args:
        replica, connections (host name -> open connection), vars_ (rank 0's variables).
        node: the :class:`~vllm_provision.core.models.Node` to hit. unit: its unit to signal.
        signal: one of :data:`SIGNALS`. streams: in-flight streams (K). max_tokens: each
            stream's length (long enough to outlast the fault's effect).
        reboot: reboot the node instead of signalling. partition_s: cut its network this many
            seconds instead (``partition_argv``: cut and heal argv, :func:`partition_commands`).
        bound_s: give up polling after this many seconds. read_timeout_s: a stream silent this
            long is ``hung``. poll_interval_s: pause between two polls.
        held: the run lock's check point (:func:`apply`), or None.
        front_door: ``(host, base URL)`` of a front door in front of the replica: a steady load
            goes through it from before the fault until the router takes the replica back
            (or :data:`~vllm_provision.evidence.front_door.TAKE_BACK_BOUND_S` after it serves
            again), and the result gains ``front_door``
            (:class:`~vllm_provision.evidence.front_door.FrontDoorWatch`).

    Raises:
        ProvisionError: the streams did not start generating within 60 s (the replica does not
            serve), or the fault command failed; RunLockLost: the run's lock on the node was
            lost before the fault (nothing was applied).
    """
    from vllm_provision.evidence import load
    from vllm_provision.evidence.bench import served_model
    from vllm_provision.transport.base import UnreachableError
    from vllm_provision.transport.tunnel import route_for

    model = served_model(replica)
    url = replica.api_url + "/v1/completions"
    headers = ({"Authorization": f"Bearer {replica.engine.api_key}"}
               if replica.engine.api_key else {})
    prompts = load.seeded_prompts(streams, 16, 0)
    first_token = threading.Semaphore(0)
    seen: set[int] = set()
    results: list[Any] = [None] * streams

    def on_token(res: Any) -> None:
        if res.index not in seen:
            seen.add(res.index)
            first_token.release()

    # through SSH (vllm_api_via) every stream and poll is a channel of rank 0's connection
    route = route_for(replica, connections.get(replica.master.name))
    client = load.make_client(streams + 1, read_timeout_s, route=route)

    def one(i: int) -> None:
        body = {"model": model, "prompt": prompts[i], "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        results[i] = load.stream_one(client, url, body, i, headers, on_token=on_token)
        if i not in seen:  # failed before its first token: do not wait for it
            seen.add(i)
            first_token.release()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for _ in range(streams):
        if not first_token.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ProvisionError.single(replica.api_url, "the streams did not start "
                                        "generating within 60 s", fix="check `provision status`")
    if any(r is not None and not r.token_times for r in results):
        failed = [r for r in results if r is not None and not r.token_times]
        raise ProvisionError.single(replica.api_url, "a stream failed before the fault: "
                                    f"{failed[0].error} {failed[0].detail[:120]}",
                                    fix="run the fault on a serving replica")
    watch = None
    if front_door is not None:
        from vllm_provision.evidence.front_door import FrontDoorWatch

        watch = FrontDoorWatch(front_door[0], front_door[1], replica.api_url, model,
                               headers=headers, read_timeout_s=read_timeout_s)
        watch.start()
    try:
        applied, fault_epoch, fault_clock, healer = apply(
            connections[node.name], node, unit, signal, reboot=reboot, partition_s=partition_s,
            partition_argv=partition_argv, held=held)
    except BaseException:
        client.close()  # the streams end with an error; the run reports why it stopped
        if watch is not None:
            watch.stop()
        raise
    recovery = poll(client, url, model, headers, fault_clock, bound_s, poll_interval_s)
    seen_by_front_door = None
    if watch is not None:
        if recovery["recovered_s"] is not None:
            watch.wait_taken_back(fault_clock + recovery["recovered_s"])
        watch.stop()
        seen_by_front_door = watch.result(fault_clock, recovery["recovered_s"])
    for thread in threads:
        thread.join(timeout=read_timeout_s + max_tokens * 1.0)
    if healer is not None:
        healer.join(timeout=(partition_s or 0) + 60)
    client.close()
    fates = [fate(r, fault_clock - r.sent, max_tokens) if r is not None else
             {"fate": "hung", "tokens": 0, "max_tokens": max_tokens, "tokens_before_fault": 0,
              "error": "no result", "detail": "the stream did not end", "end_s": None,
              "last_token_s": None}
             for r in results]
    events: list[dict[str, Any]] = []
    limited: list[str] = []
    for other in replica.nodes:
        units = replica.backend_type.node_units(replica, other, other.host.vars)
        try:
            watchdog = settings.node_settings(replica, other)["vllm_watchdog_unit_name"]
            out = connections[other.name].run(
                journal_command(units, fault_epoch - 1, str(watchdog)), timeout_s=60)
        except UnreachableError as exc:
            events.append({"host": other.name, "t_s": None, "source": "provision",
                           "message": f"journal not read: {exc.problems[0].message}"})
            continue
        found, hit = parse_journal(other.name, out.stdout, fault_epoch,
                                   unit_lines=0 if recovery["recovered_s"] is not None
                                   else UNIT_TAIL_LINES)
        events += found
        limited += hit
    events.sort(key=lambda e: (e["t_s"] is None, e["t_s"] or 0.0))
    return {"kind": "fault",
            "time": datetime.fromtimestamp(fault_epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "target": {"host": node.name, "rank": node.rank, "unit": unit,
                       "signal": None if reboot or partition_s is not None else signal,
                       "reboot": reboot, "partition_s": partition_s, "applied": applied},
            "streams": fates, "recovery": recovery, "start_limit_hit": sorted(set(limited)),
            "events": events,
            **({"front_door": seen_by_front_door} if seen_by_front_door is not None else {})}


def poll(client: Any, url: str, model: str, headers: Mapping[str, str], fault_clock: float,
         bound_s: float, interval_s: float) -> dict[str, Any]:
    """New streamed completions (8 tokens) one after another until one succeeds after a failed
    one, or until ``bound_s`` after the fault; the first success counts at once when
    ``bound_s`` passes without any failure (``served_throughout``).

    Returns ``{"first_failure_s", "recovered_s", "polls", "failures": {kind: n}, "bound_s",
    "served_throughout", "timed_out"}``; times in seconds after the fault (``recovered_s``: the
    end of the first successful completion after a failure).
    """
    from vllm_provision.evidence import load

    failures: dict[str, int] = {}
    first_failure = recovered = None
    first_success_any = None
    polls = 0
    body = {"model": model, "prompt": "fault probe", "max_tokens": 8, "temperature": 0,
            "ignore_eos": True}
    while time.perf_counter() - fault_clock < bound_s:
        polls += 1
        res = load.stream_one(client, url, body, -polls, dict(headers))
        now = time.perf_counter() - fault_clock
        if res.ok:
            if first_failure is not None:
                recovered = now
                break
            if first_success_any is None:
                first_success_any = now
        else:
            kind = res.error or "unknown"
            failures[kind] = failures.get(kind, 0) + 1
            if first_failure is None:
                first_failure = now
        time.sleep(interval_s)  # the polling interval
    throughout = first_failure is None and first_success_any is not None
    return {"first_failure_s": None if first_failure is None else round(first_failure, 3),
            "recovered_s": round(recovered, 3) if recovered is not None else (
                round(first_success_any, 3) if throughout and first_success_any is not None
                else None),
            "polls": polls, "failures": dict(sorted(failures.items())), "bound_s": bound_s,
            "served_throughout": throughout, "timed_out": recovered is None and not throughout}
