"""Batch the read-only commands of a play into one round trip per host (docs/runner-contract.md).

At the start of a play batch the runner asks each task's module for the exact read command its
``run`` would send first (``read_command(ctx, args)``), runs all of them on the host in ONE shell
script (each command in its own subshell, its exit code captured separately) and keeps the
answers in a per-host cache keyed by the exact command string. A module asking for the same
command then gets the stored answer without a round trip.

Safe by construction: the cache of a host is dropped as soon as any command that is not a cache
hit runs on it (a write can change what a later read would see), when a task on it reports
``changed`` or ``failed``, and when its entries are older than ``max_age_s``. So a changing run
behaves as without batching; only a no-change run gets the speed-up.

A command that is not a read may lead the batch (``ahead``: a module's ``lead_command``, the
first thing its task sends): it runs once, at the head, and its answer is kept apart from the
reads' cache: handed out once, to the first identical request, whatever its age and whatever
else ran meanwhile, so it never runs twice.

:class:`Prefetcher` decides what to batch for each host of a play batch (the read commands of
its tasks, in order, up to the first task that will send something else);
:class:`PrefetchingConnection` runs the batch and answers from it.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vllm_provision.core.models import Host
from vllm_provision.modules import find_module
from vllm_provision.runner import handlers_state
from vllm_provision.runner.context import TaskContext
from vllm_provision.runner.outcome import RunState
from vllm_provision.runner.playbook import Play, Task
from vllm_provision.runner.templating import Templar
from vllm_provision.transport.base import CommandResult, UnreachableError, command_failed

log = logging.getLogger(__name__)

# Answers older than this are not used (a unit's state may move on by itself), in seconds.
MAX_AGE_S = 10.0


def batch_script(commands: Sequence[str], nonce: str) -> str:
    """Return ONE shell line running ``commands`` in order, each in a subshell with stdin from
    /dev/null; their stdout and stderr are framed by marker lines holding ``nonce`` and the
    index, and the exit code follows each command's stdout. No newline is used, so the script
    survives ``sudo_wrap`` (which refuses control characters).
    """
    parts = []
    for index, command in enumerate(commands):
        mark = f"@@{nonce} {index}"
        parts.append(
            f"printf '%s\\n' '{mark} BEGIN'; printf '%s\\n' '{mark} BEGIN' >&2; "
            f"( {command} ) </dev/null; "
            f"printf '\\n{mark} END %s\\n' \"$?\"; printf '\\n%s\\n' '{mark} END' >&2")
    return "; ".join(parts)


def split_batch(stdout: str, stderr: str, count: int, nonce: str) -> list[CommandResult] | None:
    """Split the output of :func:`batch_script` back into one :class:`CommandResult` per
    command; None when it is not complete (the caller then reads live)."""
    results: list[CommandResult] = []
    for index in range(count):
        mark = f"@@{nonce} {index}"
        out = _between(stdout, f"{mark} BEGIN\n", f"\n{mark} END ")
        err = _between(stderr, f"{mark} BEGIN\n", f"\n{mark} END\n")
        if out is None or err is None:
            return None
        text, rest = out
        code_text = rest.split("\n", 1)[0].strip()
        if not code_text.isdigit():
            return None
        results.append(CommandResult(int(code_text), text, err[0]))
    return results


def _between(text: str, start: str, end: str) -> tuple[str, str] | None:
    begin = text.find(start)
    if begin < 0:
        return None
    begin += len(start)
    stop = text.find(end, begin)
    if stop < 0:
        return None
    return text[begin:stop], text[stop + len(end):]


class PrefetchingConnection:
    """Wraps a host's connection; answers prefetched read commands from a cache.

    Args:
        inner: the host's connection (``HostConnection`` or a test double) with ``run(...)``.
        max_age_s: answers older than this many seconds are not used.

    Every attribute other than ``run``/``with_become``/``prefetch``/``drop`` is the inner
    connection's (``name``, ``host``, ``open``, ``close``, ``options``...).
    """

    def __init__(self, inner: Any, max_age_s: float = MAX_AGE_S) -> None:
        self._inner = inner
        self._max_age_s = max_age_s
        self._cache: dict[str, CommandResult] = {}
        self._stored_at = 0.0
        self._ahead: dict[str, CommandResult] = {}  # commands run once ahead: answered once
        self._lock = threading.Lock()
        self.ran_live = False  # a command other than a cached read ran since the last prefetch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def inner(self) -> Any:
        """The wrapped connection."""
        return self._inner

    def drop(self) -> None:
        """Forget every prefetched answer (after a write, a change or a failure)."""
        with self._lock:
            self._cache.clear()

    def holds(self, commands: Sequence[str]) -> bool:
        """Whether every one of ``commands`` would be answered from the cache now: stored by
        one batch, fresh, and no live command has run since (a play's reads fetched by an
        earlier play's batch, :meth:`Prefetcher.start_batch`)."""
        with self._lock:
            return (not self.ran_live and bool(self._cache)
                    and time.monotonic() - self._stored_at <= self._max_age_s
                    and all(command in self._cache for command in commands))

    def prefetch(self, commands: Sequence[str], ahead: Sequence[str] = ()) -> int:
        """Run ``commands`` (read-only, but for those in ``ahead``) in one round trip and store
        their answers.

        Args:
            commands: exact command strings as modules will ask for them; duplicates are run once.
            ahead: those of ``commands`` that are not reads (each a module's ``lead_command``):
                their answers are handed out once, never expired, never dropped; when the
                batch's output cannot be split, each gets a failed answer saying so rather
                than running a second time.

        Returns:
            how many answers were stored (0 when the batch output could not be split).

        Raises:
            UnreachableError: the connection failed (the caller reports it as usual).
        """
        unique = list(dict.fromkeys(commands))
        once = set(ahead)
        self.drop()
        self.ran_live = False
        with self._lock:
            self._ahead.clear()
        if not unique:
            return 0
        if len(unique) == 1:  # nothing to batch: send it as it is
            results: list[CommandResult] | None = [self._inner.run(unique[0])]
        else:
            nonce = secrets.token_hex(8)
            log.debug("%s: batching %d commands in one round trip", self.name, len(unique))
            batch = self._inner.run(batch_script(unique, nonce))
            results = split_batch(batch.stdout, batch.stderr, len(unique), nonce)
        if results is None:
            log.debug("%s: batched read incomplete; reading live", self.name)
            lost = CommandResult(1, "", "the batched output of this command could not be read "
                                        "back (it ran once; it is not run again)")
            with self._lock:
                self._ahead = {command: lost for command in unique if command in once}
            return 0
        with self._lock:
            answers = dict(zip(unique, results, strict=True))
            self._ahead = {c: r for c, r in answers.items() if c in once}
            self._cache = {c: r for c, r in answers.items() if c not in once}
            self._stored_at = time.monotonic()
        return len(results)

    def run(self, command: str, *, sudo: bool | None = None, stdin: str | bytes | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        """Answer ``command`` from the cache when it was prefetched (same command, default
        ``sudo``, no stdin, fresh); otherwise drop the cache and run it live on the host.

        Raises:
            UnreachableError: the connection failed. ProvisionError: ``check`` and exit != 0.
        """
        hit = None
        with self._lock:
            if sudo is None and stdin is None and command in self._ahead:
                hit = self._ahead.pop(command)  # ran once, at the head of the batch
            elif sudo is None and stdin is None and command in self._cache:
                if time.monotonic() - self._stored_at <= self._max_age_s:
                    hit = self._cache[command]  # valid until a live command runs
                else:
                    self._cache.clear()
            else:
                self._cache.clear()
            if hit is None:
                self.ran_live = True
        if hit is None:
            return self._inner.run(command, sudo=sudo, stdin=stdin, timeout_s=timeout_s,
                                   check=check)
        log.debug("%s: rc=%s (prefetched): %s", self.name, hit.exit_code, command)
        if check and not hit.ok:
            raise command_failed(self.name, command, hit)
        return hit

    def with_become(self, become: bool | None) -> Any:
        """Return this connection when ``become`` is the host's default; else a view whose
        commands run live with ``sudo=become`` (never answered from the cache)."""
        if become is None or become == getattr(self._inner, "become", None):
            return self
        return _ExplicitSudo(self, become)


class _ExplicitSudo:
    """A :class:`PrefetchingConnection` seen with another default for ``sudo``."""

    def __init__(self, outer: PrefetchingConnection, become: bool) -> None:
        self._outer = outer
        self.become = become

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outer, name)

    def run(self, command: str, *, sudo: bool | None = None, stdin: str | bytes | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        return self._outer.run(command, sudo=self.become if sudo is None else sudo,
                               stdin=stdin, timeout_s=timeout_s, check=check)


# builds the TaskContext a module's read_command sees:
# (play, task, host, templar, connection, resolved variables) -> TaskContext
ContextFor = Callable[[Play, Task, Host, Templar, Any, Mapping[str, Any]], TaskContext]


class Prefetcher:
    """Batches, per host and play batch, the read commands its tasks will send
    (docs/engine.md "Round trips"). An optimisation only: whatever fails here is not reported;
    the live command that follows reports it as usual.

    Args:
        state: the run's shared state (its connections are :class:`PrefetchingConnection`).
        templar_for: ``(play, host) -> Templar`` (``variables.VariableResolver.templar_for``).
        context_for: builds a task's context (``executor.TaskExecutor.task_context``).
        lock_held: host name -> whether this run still holds its run lock
            (``executor.TaskExecutor.lock_held``): a lead command is a change, so a host whose
            lock was lost gets no batch (its task then runs live and fails at the executor's
            check point, docs/security.md "Run lock"). None: no lock.
    """

    def __init__(self, state: RunState, templar_for: Callable[[Play, Host], Templar],
                 context_for: ContextFor,
                 lock_held: Callable[[str], bool] | None = None) -> None:
        self.state = state
        self.templar_for = templar_for
        self.context_for = context_for
        self.lock_held = lock_held
        self._no_prefetch: set[str] = set()  # hosts that changed or failed in this play batch
        self._ahead: dict[str, list[str]] = {}  # host -> lead commands of its last batch
        self._plays: list[tuple[Play, frozenset[str]]] = []  # the run's plays and their hosts
        self._registers: re.Pattern[str] | None = None  # any name a task of the run registers
        # hosts that are one server with another host (docs/inventory.md "Shared servers") read
        # live, under the executor's server lock: an answer read ahead would be stale once the
        # other host's task changed the server (both read "no user vllm", the second useradd
        # then failed with "already exists")
        servers = Counter(h.server for h in state.inventory.hosts.values())
        self._live = {name for name, h in state.inventory.hosts.items() if servers[h.server] > 1}

    def plan(self, selections: Sequence[tuple[Play, Sequence[Host]]]) -> None:
        """Know the run's plays ahead (each with the hosts it runs on), so a play's batch also
        carries the reads of the plays after it (:meth:`_later_reads`)."""
        self._plays = [(play, frozenset(h.name for h in hosts)) for play, hosts in selections]
        names = sorted({t.register for play, _ in self._plays for t in play.tasks if t.register})
        self._registers = (re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
                           if names else None)

    def start_batch(self, play: Play, batch: list[Host]) -> None:
        """Run, per host and in parallel, the pending-notifications read and the read commands
        of the play's tasks in ONE round trip; modules asking for the same commands are then
        answered from the host's cache."""
        self._no_prefetch = set()

        def one(host: Host) -> None:
            conn = self.state.connections.get(host.name)
            if not isinstance(conn, PrefetchingConnection) or host.name in self._live:
                return
            commands = self._reads(play, host, conn, 0)
            if play.handlers:
                commands.insert(0, handlers_state.read_script(self.state.pending_dir(host.name)))
            if not self._ahead.get(host.name) and conn.holds(commands):
                log.debug("%s: play %r: its %d reads were fetched ahead", host.name, play.name,
                          len(commands))
                return  # an earlier play's batch fetched them: no round trip
            later = self._later_reads(play, host, conn, commands)
            log.debug("%s: play %r: %d reads (%d leading), %d of later plays", host.name,
                      play.name, len(commands), len(self._ahead.get(host.name, ())), len(later))
            self._send(host.name, conn, commands + later)

        list(self.state.threads().map(one, batch))

    def refill(self, play: Play, host: Host, index: int) -> None:
        """Before task ``index`` on ``host``: when a live command (e.g. an unchanged ``command``
        task) dropped the cache and nothing changed or failed on the host in this batch yet,
        batch the reads of the remaining tasks again (they run after that command, so they see
        its effects)."""
        conn = self.state.connections.get(host.name)
        if (not isinstance(conn, PrefetchingConnection) or not conn.ran_live
                or host.name in self._no_prefetch or host.name in self._live):
            return
        commands = self._reads(play, host, conn, index)
        if len(commands) < 2:
            conn.ran_live = False  # one read costs the same live; look again after the next
            return
        self._send(host.name, conn, commands)

    def _later_reads(self, play: Play, host: Host, conn: PrefetchingConnection,
                     have: Sequence[str]) -> list[str]:
        """The reads of the plays after ``play`` that ``host`` runs, in order, when ``play``'s
        own tasks send only reads (else they would be dropped unused): each later play's
        pending-notifications read and task reads (:meth:`_read_commands` with no lead
        command, stopping at the first task that sends anything else). A task that runs on the
        controller, once, or depends on a registered value is passed over: whatever it sends
        live drops the cache, so a read fetched ahead is never answered stale, only wasted.

        Keyed by the exact command: a later play whose variables change before it runs (facts,
        registered values) asks for other commands, which then run live."""
        if not self._plays or not self._reads_only(play, host, conn):
            return []
        found: list[str] = []
        seen = set(have)
        index = next((i for i, (p, _) in enumerate(self._plays) if p is play), None)
        if index is None:
            return []
        for later, hosts in self._plays[index + 1:]:
            if host.name not in hosts:
                peer = [c for c in self._peer_reads(later, hosts, host.name) if c not in seen]
                found.extend(peer)
                seen.update(peer)
                continue
            try:
                reads, complete = self._plain_reads(later, host, conn)
            except Exception:  # noqa: BLE001 - an optimisation only
                return found
            if later.handlers:
                reads.insert(0, handlers_state.read_script(self.state.pending_dir(host.name)))
            found.extend(c for c in reads if c not in seen)
            seen.update(reads)
            if not complete:
                break
        return found

    def _peer_reads(self, play: Play, hosts: frozenset[str], name: str) -> list[str]:
        """The first reads that ``play``'s tasks, running on other hosts, send to host ``name``
        (a module's ``peer_read_commands``, vllm_provision.modules): ``vllm_wait_ready`` on the
        master reads every node. A task that sends ``name`` anything live before them drops
        its cache, so such a read is never answered stale, only wasted."""
        found: list[str] = []
        for other in sorted(hosts):
            host = self.state.inventory.hosts.get(other)
            conn = self.state.connections.get(other)
            if host is None or not isinstance(conn, PrefetchingConnection):
                continue
            try:
                templar = self.templar_for(play, host)
                resolved: Mapping[str, Any] | None = None
                for task in play.tasks:
                    spec = find_module(task.module)
                    if spec is None or spec.peer_read_commands is None or task.delegate_to \
                            or spec.runs_on != "host":
                        continue
                    if task.when and not templar.test(list(task.when), f"{task.where}.when"):
                        continue
                    args = templar.render_value(task.args, f"{task.where}.{task.module}")
                    if resolved is None:
                        resolved = templar.lazy()
                    ctx = self.context_for(play, task, host, templar, conn, resolved)
                    command = spec.peer_read_commands(ctx, args).get(name)
                    if command and command not in found:
                        found.append(command)
            except Exception:  # noqa: BLE001 - an optimisation only
                log.debug("%s: no peer reads from %s", name, other, exc_info=True)
        return found

    def _reads_only(self, play: Play, host: Host, conn: PrefetchingConnection) -> bool:
        """Whether every task of ``play`` that ``host`` runs sends reads only (or nothing)."""
        try:
            return self._plain_reads(play, host, conn, self._ahead.get(host.name, ()))[1]
        except Exception:  # noqa: BLE001 - an optimisation only
            return False

    def _plain_reads(self, play: Play, host: Host, conn: PrefetchingConnection,
                     leading: Sequence[str] = ()) -> tuple[list[str], bool]:
        """The read commands of ``play``'s tasks on ``host`` and whether every task sends reads
        only: a task that may send anything else ends the list (``False``), but for one whose
        first command is in ``leading`` (it already leads this batch); tasks on the
        controller, run once or depending on a registered value are passed over."""
        commands: list[str] = []
        templar = self.templar_for(play, host)
        resolved: Mapping[str, Any] | None = None
        for task in play.tasks:
            spec = find_module(task.module)
            if spec is None:
                return commands, False
            if (self._registers is not None
                    and self._registers.search(repr((task.when, task.args)))):
                continue
            if spec.runs_on != "host" or task.run_once:
                continue
            try:
                if task.when and not templar.test(list(task.when), f"{task.where}.when"):
                    continue
            except Exception:  # noqa: BLE001 - cannot be known up front
                continue
            readable = (spec.read_command is not None and not task.delegate_to
                        and task.become in (None, getattr(conn.inner, "become", None)))
            command = None
            if readable:
                args = templar.render_value(task.args, f"{task.where}.{task.module}")
                if resolved is None:
                    resolved = templar.lazy()
                command = spec.read_command(self.context_for(play, task, host, templar, conn,
                                                             resolved), args)
            if command:
                commands.append(command)
            elif spec.lead_command is not None and (
                    self._lead_command(play, task, host, templar, conn, spec) in leading):
                continue  # the batch's head: it runs first, the reads after it
            elif not readable or spec.lead_command is not None:
                return commands, False  # it sends something else first
        return commands, True

    def _reads(self, play: Play, host: Host, conn: PrefetchingConnection,
               start: int) -> list[str]:
        """:meth:`_read_commands`, or no commands when working them out fails: batching is an
        optimisation only, and each task then reports the error live."""
        try:
            return self._read_commands(play, host, conn, start)
        except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
            return []

    def _send(self, name: str, conn: PrefetchingConnection, commands: list[str]) -> None:
        """Run ``commands`` as host ``name``'s batch when it may (:meth:`_may_lead`), with the
        lead commands :meth:`_read_commands` marked; an unreachable host keeps no answers (its
        tasks then meet the error live)."""
        if not self._may_lead(name):
            return
        try:
            conn.prefetch(commands, ahead=self._ahead.get(name, ()))
        except UnreachableError:
            conn.drop()

    def _may_lead(self, name: str) -> bool:
        """Whether host ``name``'s batch may run: always when it has no lead command (reads
        only), else only while this run holds the host's run lock."""
        return not self._ahead.get(name) or self.lock_held is None or self.lock_held(name)

    def drop(self, hosts: Sequence[Host] | Sequence[str]) -> None:
        """Forget the prefetched answers of ``hosts`` (host objects or names) and batch nothing
        more for them in this play batch (something changed or failed there)."""
        for host in hosts:
            name = host if isinstance(host, str) else host.name
            self._no_prefetch.add(name)
            conn = self.state.connections.get(name)
            if isinstance(conn, PrefetchingConnection):
                conn.drop()

    def _read_commands(self, play: Play, host: Host, conn: PrefetchingConnection,
                       start: int) -> list[str]:
        """Return the read commands ``host``'s tasks ``play.tasks[start:]`` will send first, in
        task order, up to the first task that will run something else (a later read would be
        dropped). When the first task to send anything has a module ``lead_command`` (a
        ``command`` task), that command leads the list, marked for the connection to run once
        (:meth:`PrefetchingConnection.prefetch` ``ahead``): the reads after it run after it, as
        they would live."""
        commands: list[str] = []
        registers = {t.register for t in play.tasks if t.register}
        pattern = (re.compile(r"\b(" + "|".join(re.escape(r) for r in sorted(registers)) + r")\b")
                   if registers else None)
        templar = self.templar_for(play, host)
        resolved: Mapping[str, Any] | None = None
        passed_over = False  # a task before this one may run live: nothing may run ahead of it
        self._ahead[host.name] = []
        for task in play.tasks[start:]:
            spec = find_module(task.module)
            if pattern is not None and pattern.search(repr((task.when, task.args))):
                passed_over = True
                continue  # depends on a value this play registers: cannot be known up front
            try:
                if task.when and not templar.test(list(task.when), f"{task.where}.when"):
                    continue  # skipped: sends nothing
            except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
                passed_over = True
                continue
            if (spec is not None and spec.lead_command is not None
                    and not self._reads_first(play, task, host, templar, conn, spec)
                    and not commands and not passed_over and spec.runs_on == "host"
                    and not task.run_once and not task.delegate_to and task.become is None
                    and not task.notify):
                lead = self._lead_command(play, task, host, templar, conn, spec)
                if lead is None:
                    break
                commands.append(lead)
                self._ahead[host.name].append(lead)
                if resolved is None:
                    resolved = templar.lazy()
                continue
            if (spec is None or spec.read_command is None or spec.runs_on != "host"
                    or task.run_once or task.delegate_to):
                break
            if task.become is not None and task.become != getattr(conn.inner, "become", None):
                passed_over = True
                continue
            try:
                args = templar.render_value(task.args, f"{task.where}.{task.module}")
                if resolved is None:
                    resolved = templar.lazy()
                ctx = self.context_for(play, task, host, templar, conn, resolved)
                command = spec.read_command(ctx, args)
            except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
                log.debug("%s: no prefetch for task %s", host.name, task.name, exc_info=True)
                passed_over = True
                continue
            if not command and spec.lead_command is not None:
                break  # a plain command: it sends something else first
            if command and command not in self._ahead[host.name]:
                commands.append(command)
        return commands

    def _reads_first(self, play: Play, task: Task, host: Host, templar: Templar,
                     conn: PrefetchingConnection, spec: Any) -> bool:
        """Whether ``task``'s module has a read-only first command for these arguments (a
        ``command`` with ``unless`` or ``read_only`` has one, a plain one leads instead)."""
        if spec.read_command is None:
            return False
        try:
            args = templar.render_value(task.args, f"{task.where}.{task.module}")
            ctx = self.context_for(play, task, host, templar, conn, templar.lazy())
            return bool(spec.read_command(ctx, args))
        except Exception:  # noqa: BLE001 - an optimisation only
            return False

    def _lead_command(self, play: Play, task: Task, host: Host, templar: Templar,
                      conn: PrefetchingConnection, spec: Any) -> str | None:
        """The first command of ``task``'s module (``lead_command``), rendered as ``run`` will
        get it; None when it cannot be known up front."""
        try:
            args = templar.render_value(task.args, f"{task.where}.{task.module}")
            if spec.arguments is not None:
                args = spec.arguments.validate(args, f"{task.where}.{task.module}")
            ctx = self.context_for(play, task, host, templar, conn, templar.lazy())
            command: str | None = spec.lead_command(ctx, args)
        except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
            log.debug("%s: no lead command for task %s", host.name, task.name, exc_info=True)
            return None
        return command or None
