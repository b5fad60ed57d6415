"""The run lock: one changing ``provision`` run per host at a time.

Every command that changes a host holds, on every host it may touch, an exclusive ``flock(2)``
on ``/var/lib/vllm-provision/run.lock`` for the whole command, the state record included:
``up``, ``restart``, ``down``, ``upgrade`` and ``play`` (and their ``--check``, as Terraform's
``plan`` takes the state lock by default: a dry run next to a real one would report a
half-changed host), ``stack sync``, ``stack rollback`` and ``fault``. Read-only commands
(``check``, ``facts``, ``status``, ``drift``, ``stack status``, ``stack lock``) take no lock.

How it is held: on each host, over the run's own SSH connection (a second channel: no extra
handshake), one ``bash`` process takes the lock with ``flock -n`` and keeps it while it waits
on its standard input. The controller sends a heartbeat line every :data:`HEARTBEAT_S` seconds
and ``release`` at the end. The lock goes away with its holder process, so it cannot outlive
the run:

- the run ends: ``release`` makes the holder remove its holder file and exit;
- the controller dies (kill -9, crash, Ctrl-C): the SSH connection closes, the holder reads
  end-of-file and exits; the kernel drops the ``flock`` with its last file descriptor;
- the connection hangs (a partition, a powered-off controller; sshd may not notice for hours
  without ``ClientAliveInterval``): the holder exits after :data:`GIVE_UP_S` seconds without a
  heartbeat (``read -t``).

The holder file ``run.lock.holder`` names the holder: controller host, user, PID, start time
and command. A run that finds the lock taken exits 1 at once and prints it. A holder file left
behind by a holder that did not release (the last two cases) marks a stale lock: the next run
takes the lock over and warns, naming the run that vanished.

A lost lock stops the run's changes on that host (docs/security.md, "Run lock"): the holder
answers each heartbeat line with ``beat``, and the controller notes when it sent the last line
that was answered. Before each change (a playbook task, a stack step, a fault) the run checks,
with no round trip (:meth:`RunLock.ensure_held`), that the host's holder process is still
running and that this answered line was sent less than :data:`LOST_AFTER_S` seconds ago; the
holder keeps the lock for :data:`GIVE_UP_S` seconds after the last line it read, so a change
starts with at least ``GIVE_UP_S - LOST_AFTER_S`` seconds of lock left. Otherwise
:class:`RunLockLost` names the host, when the lock was lost and what to do.

The holder carries the run's own short reads too, so they cost no channel of their own: a
first read (``up``'s fact probe) runs as soon as the lock is taken and its output ends the first
answer (``first_reads``, :attr:`RunLock.firsts`), and a ``run NONCE BASE64`` line runs one
command and answers between two markers (:meth:`RunLock.exchange`: the state record's hashes).

Cost: one command per host when the run starts (parallel, on connections the run opens
anyway) and one at the end, plus a heartbeat line every 10 s on an open channel and its
five-byte answer.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import re
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vllm_provision.core import hostjson
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.core.paths import STATE_DIR
from vllm_provision.core.quoting import shell_quote
from vllm_provision.core.text import printable
from vllm_provision.settings import instance
from vllm_provision.transport.base import CommandResult, ConnectionOptions, UnreachableError
from vllm_provision.transport.connection import HostConnection, close_all, open_connections
from vllm_provision.transport.stats import STATS

LOCK_FILE = f"{STATE_DIR}/run.lock"
HOLDER_FILE = f"{STATE_DIR}/run.lock.holder"
HEARTBEAT_S = 10.0
GIVE_UP_S = 60
# A run makes no further change on a host once the last heartbeat line the holder answered was
# sent this long ago (three heartbeats missed): half of GIVE_UP_S, so that a change that starts
# just inside the bound still has GIVE_UP_S - LOST_AFTER_S seconds of lock left.
LOST_AFTER_S = 30.0
STATE_MARK = "@@STATE\n"  # in the holder's first answer: the host's state record follows
FIRST_MARK = "\n@@FIRST\n"  # then, when one was asked, the first read's output
_POLL_S = 1.0  # how often the heartbeat thread reads the holders' answers (no network traffic)
_ANSWER_TIMEOUT_S = 30.0

# $1: the state folder, $2: this run's holder line (JSON), $3: seconds without a heartbeat
# before the holder gives the lock up. Exit 75 (EX_TEMPFAIL): held by another run.
_SCRIPT = "; ".join((  # one line: a quoted shell word holds no line break (quoting.py)
    "dir=$1 info=$2 wait=$3",
    "umask 077",
    "command -v flock >/dev/null 2>&1 || { printf 'NOFLOCK\\n'; exit 69; }",
    "{ mkdir -p -- \"$dir\" && exec 9>>\"$dir/run.lock\"; } || { printf 'NODIR\\n'; exit 73; }",
    "if ! flock -n 9; then printf 'BUSY\\n'; cat -- \"$dir/run.lock.holder\" 2>/dev/null; "
    "printf '\\nEND\\n'; exit 75; fi",
    "stale=$(cat -- \"$dir/run.lock.holder\" 2>/dev/null)",
    "printf '%s\\n%s\\n' \"$info\" \"$$\" > \"$dir/run.lock.holder.tmp\" && "
    "mv -f -- \"$dir/run.lock.holder.tmp\" \"$dir/run.lock.holder\"",
    # the host's state record rides in the answer: the ownership guard reads it from here
    "printf 'LOCKED\\n%s\\n@@STATE\\n' \"$stale\"",
    "cat -- \"$dir/state.json\" 2>/dev/null || printf '__ABSENT__'",
    # the first read (the fact probe) rides in the same answer: no channel of its own
    "if [ -n \"$4\" ]; then printf '\\n@@FIRST\\n'; bash -c \"$4\" </dev/null 2>/dev/null; fi",
    "printf '\\nEND\\n'",
    # each line read: `release`; `run NONCE BASE64` (a short read, answered between markers:
    # RunLock.exchange); anything else is a heartbeat
    "while IFS= read -r -t \"$wait\" line; do case $line in "
    "release) rm -f -- \"$dir/run.lock.holder\"; printf 'RELEASED\\n'; exit 0;; "
    "'run '*) r=${line#run }; n=${r%% *}; printf '@@RUN %s BEGIN\\n' \"$n\"; "
    "bash -c \"$(printf '%s' \"${r#* }\" | base64 -d)\" </dev/null 2>/dev/null; "
    "printf '\\n@@RUN %s END %s\\n' \"$n\" \"$?\";; "
    "*) printf 'beat\\n';; esac; done",
    "exit 0",
))


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a host's run lock, as its holder file says.

    Attributes:
        controller: the controller's host name. user: the user who ran provision there.
        pid: provision's PID on the controller. started: ISO 8601 UTC start time.
        command: the provision command (``up``, ``restart``, ...). remote_pid: the PID of the
        holder process on the host (0 when unknown).
    """

    controller: str
    user: str
    pid: int
    started: str
    command: str
    remote_pid: int = 0

    def describe(self) -> str:
        """``provision up by alice on ctl-1 (PID 4242), started 2025-01-01T12:00:00Z``; each
        word read from the host's holder file is made printable (at most 200 characters,
        :func:`vllm_provision.core.text.printable`): a holder file is the host's text."""
        command, user, controller, started = (printable(v, limit=200) for v in (
            self.command, self.user, self.controller, self.started))
        return (f"provision {command} by {user} on {controller} "
                f"(PID {self.pid}), started {started}")

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """Read a holder file (a JSON line, then the remote PID); None when unreadable."""
        lines = [line for line in text.strip().splitlines() if line.strip()]
        if not lines:
            return None
        try:
            data = hostjson.loads(lines[0])
            remote = int(lines[1]) if len(lines) > 1 and lines[1].strip().isdigit() else 0
            return cls(str(data["controller"]), str(data["user"]), int(data["pid"]),
                       str(data["started"]), str(data["command"]), remote)
        except (ValueError, KeyError, TypeError):
            return None


def this_run(command: str) -> Holder:
    """The holder line of this process: controller host name, user, PID, now (UTC)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Holder(socket.gethostname(), user, os.getpid(),
                  datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), command)


class RunLockError(ProvisionError):
    """Another run holds the lock of at least one host (exit status 1); nothing was changed."""


class RunLockLost(ProvisionError):
    """This run's lock on a host was lost while the run went on (:meth:`RunLock.ensure_held`):
    the run makes no further change on that host (exit status 1)."""


def _stamp(wall: float) -> str:
    """A wall-clock time as ISO 8601 UTC to the second (``2025-01-01T12:00:31Z``)."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Beat:
    """One host's heartbeat bookkeeping, shared by the heartbeat thread and the check points.

    Attributes:
        channel: the holder process's channel.
        confirmed / confirmed_wall: the monotonic and wall-clock time at which the controller
            sent the last line the holder answered (at first: when the holder was started).
        sent: the (monotonic, wall) send times of the lines not answered yet, oldest first.
        pending: answer bytes read but not yet a whole line.
        send_error: why the last heartbeat could not be sent ("" when it was).
        lost: why the lock counts as lost ("" while held; once set it stays).
        lost_wall: when it was lost (wall clock). other: the holder file's run when it names
            another run (read once, when the loss is reported), else None.
    """

    channel: Any
    confirmed: float
    confirmed_wall: float
    sent: deque[tuple[float, float]] = field(default_factory=deque)
    pending: bytes = b""
    send_error: str = ""
    lost: str = ""
    lost_wall: float = 0.0
    other: Holder | None = None
    other_read: bool = False
    # held while one thread reads the channel: the heartbeat thread, or an exchange
    io: threading.Lock = field(default_factory=threading.Lock)


class RunLock:
    """The run lock held on a set of hosts; see the module docstring.

    Args:
        channels: host name -> the paramiko channel of that host's holder process.
        connections: host name -> the connection each channel runs on (to name the run that
            holds a lost lock now; optional).
        started: host name -> the monotonic time its holder was started (default: now).
        me: this run's holder line (default: :func:`this_run` of ``"?"``).
        state_dir: the folder of the lock and holder files: one for every host, or host name
            -> its folder (``provision_state_dir``: a replica on a shared server has its own,
            docs/inventory.md "Shared servers"; hosts absent: :data:`STATE_DIR`).
        clock: the monotonic clock, seconds (tests move it).
    """

    def __init__(self, channels: Mapping[str, Any], *,
                 connections: Mapping[str, Any] | None = None,
                 started: Mapping[str, float] | None = None, me: Holder | None = None,
                 state_dir: str | Mapping[str, str] = STATE_DIR,
                 clock: Callable[[], float] = time.monotonic,
                 ) -> None:
        self.channels = dict(channels)
        # host name -> the text of its state record as the lock found it (None: no record);
        # hosts absent here were not read (the guard then reads them itself)
        self.records: dict[str, str | None] = {}
        # host name -> the output of the first read run with the lock (``acquire``'s
        # ``first_reads``); hosts absent here had none, or the holder did not get that far
        self.firsts: dict[str, str] = {}
        self._connections = dict(connections or {})
        self._me = me
        self._state_dir = state_dir
        self._clock = clock
        self._guard = threading.Lock()
        now, wall = clock(), time.time()
        self._beats = {name: _Beat(channel, (started or {}).get(name, now),
                                   wall - (now - (started or {}).get(name, now)))
                       for name, channel in self.channels.items()}
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="run-lock-heartbeat",
                                      daemon=True)
        if self.channels:
            self._beat.start()

    @classmethod
    def acquire(cls, connections: Mapping[str, Any], command: str,
                warn: Callable[[str], None], state_dir: str | Mapping[str, str] = STATE_DIR,
                clock: Callable[[], float] = time.monotonic,
                first_reads: Mapping[str, str] | None = None,
                first_timeout_s: float = _ANSWER_TIMEOUT_S) -> RunLock:
        """Take the lock on every host of ``connections`` at once (in parallel).

        Args:
            connections: open connections by host name (root, or ``become``, is needed to
                write ``/var/lib/vllm-provision``).
            command: the provision command, for the holder file (``up``, ``stack sync``).
            warn: called with one line per stale lock taken over.
            state_dir: the folder of the lock file, for every host or per host name (as the
                class's; tests use a temporary one).
            clock: the monotonic clock of the heartbeat bookkeeping (tests move it).
            first_reads: host name -> one shell command (built by the caller, values quoted)
                that the holder runs once the lock is taken, before its first answer ends, with
                no standard input and standard error discarded; its output is in
                :attr:`firsts`. ``up`` sends its fact probe this way: the probe costs no
                channel and no round trip of its own.
            first_timeout_s: seconds to wait for a first answer that carries a first read
                (30 s without one).

        Raises:
            RunLockError: a host's lock is held by another run (each such host is named with
                its holder); the locks taken meanwhile are released.
            ProvisionError: ``flock`` is missing or the state folder cannot be written.
        """
        me = this_run(command)
        line = json.dumps({"controller": me.controller, "user": me.user, "pid": me.pid,
                           "started": me.started, "command": me.command})
        def script(name: str) -> str:
            return (f"bash -c {shell_quote(_SCRIPT)} vllm-provision-lock "
                    f"{shell_quote(folder_of(state_dir, name))} {shell_quote(line)} {GIVE_UP_S}")

        firsts = dict(first_reads or {})
        started: dict[str, float] = {}

        def one(name: str) -> tuple[str, Any, str, str]:
            first = firsts.get(name)
            try:
                started[name] = clock()  # the holder's first read -t starts after this
                channel = connections[name].start(
                    script(name) + (f" {shell_quote(first)}" if first else ""),
                    timeout_s=_ANSWER_TIMEOUT_S)
                answer = _read_answer(channel, max(_ANSWER_TIMEOUT_S, first_timeout_s)
                                      if first else _ANSWER_TIMEOUT_S)
            except (UnreachableError, OSError, EOFError) as exc:
                return name, None, "UNREACHABLE", str(exc)
            first, _, rest = answer.partition("\n")
            return name, channel, first.strip(), rest.removesuffix("END\n").strip()

        names = list(connections)
        with ThreadPoolExecutor(max_workers=max(1, min(len(names), 32))) as pool:
            answers = list(pool.map(one, names)) if names else []
        held = {name: channel for name, channel, state, _ in answers if state == "LOCKED"}
        lock = cls(held, connections=connections, started=started, me=me,
                   state_dir=state_dir, clock=clock)
        problems = []
        for name, _channel, state, rest in answers:
            if state == "LOCKED":
                rest, marked, record = rest.partition(STATE_MARK)
                record, first_marked, first_output = record.partition(FIRST_MARK)
                if first_marked:
                    lock.firsts[name] = first_output
                if marked:
                    record = record.strip()
                    lock.records[name] = None if record in ("", "__ABSENT__") else record
                stale = Holder.parse(rest)
                if stale is not None:
                    warn(f"{name}: took over a stale run lock: its holder, {stale.describe()}, "
                         "is gone without releasing it (its connection dropped or it was "
                         "killed); that run may have left its work unfinished, which this run "
                         "completes")
                continue
            if state == "UNREACHABLE":
                continue  # the run reports the host unreachable at its first task
            problems.append(_problem(name, state, rest))
        if problems:
            lock.release()
            raise RunLockError(problems)
        return lock

    # -- the heartbeat thread --------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """Every :data:`_POLL_S`: read the holders' answers and notice a holder that ended;
        every :data:`HEARTBEAT_S`: send each holder a heartbeat line."""
        next_beat = self._clock() + HEARTBEAT_S
        while not self._stop.wait(_POLL_S):
            now = self._clock()
            send = now >= next_beat
            if send:
                next_beat = now + HEARTBEAT_S
            for name in list(self.channels):
                beat = self._beats.get(name)
                if beat is not None and not beat.lost:
                    self._tend(name, beat, send)

    def _tend(self, name: str, beat: _Beat, send: bool) -> None:
        channel = beat.channel
        if not beat.io.acquire(blocking=False):
            return  # an exchange is reading this channel: it confirms the holder itself
        try:
            while channel.recv_ready():
                data = channel.recv(4096)
                if not data:
                    break
                beat.pending += data
        except Exception:  # noqa: BLE001 - a lost channel shows as a holder that ended
            pass
        finally:
            self._confirm_beats(beat)
            beat.io.release()
        if _holder_ended(channel):
            self._mark_lost(beat, self._ended_reason(name))
            return
        if send:
            try:
                sent = (self._clock(), time.time())
                channel.sendall(b"\n")
                with self._guard:
                    beat.sent.append(sent)
                beat.send_error = ""
            except Exception as exc:  # noqa: BLE001 - the bound decides whether it matters
                beat.send_error = str(exc) or type(exc).__name__

    def _confirm_beats(self, beat: _Beat) -> None:
        """Count the whole ``beat`` answers in ``beat.pending``: each confirms the oldest line
        sent and not yet answered."""
        answered = beat.pending.count(b"beat\n")
        if answered:
            beat.pending = beat.pending.rpartition(b"beat\n")[2]
            with self._guard:
                for _ in range(min(answered, len(beat.sent))):
                    beat.confirmed, beat.confirmed_wall = beat.sent.popleft()

    def _mark_lost(self, beat: _Beat, reason: str, wall: float | None = None) -> None:
        with self._guard:
            if not beat.lost:
                beat.lost, beat.lost_wall = reason, time.time() if wall is None else wall

    def _ended_reason(self, name: str) -> str:
        """Why host ``name``'s holder ended: the connection this run gave up, when it did (its
        end takes the holder with it: an operation past its time limit, a silent host), else
        the holder's own rules."""
        broken = getattr(self._connections.get(name), "broken", None)
        if isinstance(broken, str) and broken:
            return (f"this run closed its connection to the host ({broken}), which ended the "
                    "lock's holder process there, so any other run may take the lock")
        return (f"its holder process on the host ended (it gives the lock up {GIVE_UP_S} s "
                "after the last heartbeat it received, and when the connection drops or the "
                "host restarts), so any other run may take the lock")

    # -- the check point -------------------------------------------------------------------------

    def lost_problem(self, name: str) -> Problem | None:
        """Why this run's lock on host ``name`` is lost, or None while it is held (or ``name``
        is not a host of this lock, or the lock was released). No round trip while the lock is
        held; when it is lost, one short read of the holder file names the run that holds it
        now (once per host).

        The rule (docs/security.md, "Run lock"): lost when the host's holder process ended, or
        when the last heartbeat line the holder answered was sent more than
        :data:`LOST_AFTER_S` seconds ago. Once lost, a host's lock stays lost for this run.
        """
        beat = self._beats.get(name)
        if beat is None or name not in self.channels:
            return None
        if not beat.lost:
            now = self._clock()
            if _holder_ended(beat.channel):
                self._mark_lost(beat, self._ended_reason(name))
            elif now - beat.confirmed > LOST_AFTER_S:
                failed = f"; sending it failed: {beat.send_error}" if beat.send_error else ""
                self._mark_lost(beat, (
                    f"no heartbeat was answered for {now - beat.confirmed:.0f} s (the bound is "
                    f"{LOST_AFTER_S:g} s; the last answered one was sent at "
                    f"{_stamp(beat.confirmed_wall)}{failed}); the host frees the lock "
                    f"{GIVE_UP_S} s after the last heartbeat it received"),
                    wall=beat.confirmed_wall + LOST_AFTER_S)
        if not beat.lost:
            return None
        if not beat.other_read:
            beat.other_read = True
            beat.other = self._other_holder(name)
        now_held = (f"; the host's lock now names another run: {beat.other.describe()}"
                    if beat.other is not None else "")
        return Problem(
            name, f"this run lost its run lock on this host at {_stamp(beat.lost_wall)}: "
                  f"{beat.lost}{now_held}; nothing more is changed on {name}",
            fix=f"{name} may be in the middle of a change: look at it (`provision status`, "
                "`provision drift`), wait until no other run holds its lock, then rerun this "
                "command; if the connection to it is unstable, fix that first")

    def ensure_held(self, *names: str) -> None:
        """The check point before a change on hosts ``names``: return when this run still
        holds each one's lock (:meth:`lost_problem`), else raise.

        Raises:
            RunLockLost: one problem per host whose lock was lost.
        """
        problems = [p for name in names if (p := self.lost_problem(name)) is not None]
        if problems:
            raise RunLockLost(problems)

    def _other_holder(self, name: str) -> Holder | None:
        """The run the host's holder file names when it is not this one (one short read;
        None when it cannot be read, names no run, or names this one)."""
        conn = self._connections.get(name)
        if conn is None:
            return None
        try:
            result = conn.run(f"cat -- {shell_quote(folder_of(self._state_dir, name))}"
                              "/run.lock.holder",
                              timeout_s=5)
            holder = Holder.parse(result.stdout or "")
        except Exception:  # noqa: BLE001 - only a detail of the message; the host may be down
            return None
        me = self._me
        if holder is None or (me is not None and (holder.controller, holder.pid,
                                                  holder.started) ==
                              (me.controller, me.pid, me.started)):
            return None
        return holder

    # -- short reads over the holder's channel ------------------------------------------------

    def exchange(self, commands: Mapping[str, str],
                 timeout_s: float = _ANSWER_TIMEOUT_S) -> dict[str, CommandResult]:
        """Run one short shell command per host through that host's holder process, on the
        lock's open channel: one round trip each, no channel of its own (hosts in parallel).
        The holder runs it with ``bash -c``, no standard input, standard error discarded, and
        answers between two markers; the command is sent base64-encoded, so nothing in it is
        read as the holder's own input.

        Meant for reads of a few seconds (the state record's hashes): the holder answers no
        heartbeat while a command runs, and a lock whose heartbeats go unanswered for
        :data:`LOST_AFTER_S` seconds is lost.

        Args:
            commands: host name -> the shell command (built by the caller, values quoted).
            timeout_s: seconds to wait for each answer.

        Returns:
            Host name -> its result (``stdout`` as the command printed it, ``stderr`` empty).
            A host is absent when this run does not hold its lock (or lost it), or its answer
            did not come in time: the caller runs the command its own way then.
        """
        names = [name for name in commands
                 if name in self.channels and self.lost_problem(name) is None]

        def one(name: str) -> tuple[str, CommandResult | None]:
            return name, self._exchange_one(name, commands[name], timeout_s)

        if not names:
            return {}
        with ThreadPoolExecutor(max_workers=min(len(names), 32)) as pool:
            answers = list(pool.map(one, names))
        return {name: result for name, result in answers if result is not None}

    def _exchange_one(self, name: str, command: str, timeout_s: float) -> CommandResult | None:
        beat = self._beats[name]
        channel = beat.channel
        nonce = secrets.token_hex(8)
        begin = f"@@RUN {nonce} BEGIN\n".encode()
        end = re.compile(rb"\n@@RUN " + nonce.encode() + rb" END (\d+)\n")
        payload = base64.b64encode(command.encode()).decode()
        with beat.io:
            data, beat.pending = beat.pending, b""
            start = time.monotonic()
            try:
                sent = (self._clock(), time.time())
                channel.sendall(f"run {nonce} {payload}\n".encode())
                STATS.add(name, round_trips=1, exchanges=1)
                found = end.search(data)
                while found is None:
                    left = timeout_s - (time.monotonic() - start)
                    if left <= 0:
                        beat.pending = data
                        return None
                    channel.settimeout(left)
                    chunk = channel.recv(65536)
                    if not chunk:
                        beat.pending = data
                        return None
                    data += chunk
                    found = end.search(data)
            except Exception:  # noqa: BLE001 - socket.timeout, a lost channel: caller's way
                beat.pending = data
                return None
            before, _, output = data[:found.start()].partition(begin)
            beat.pending = before + data[found.end():]  # heartbeat answers around the exchange
            self._confirm_beats(beat)
            with self._guard:
                # the holder read the line: it was alive when it was sent
                beat.confirmed, beat.confirmed_wall = max((beat.confirmed, beat.confirmed_wall),
                                                          sent)
        return CommandResult(int(found.group(1)), output.decode(errors="replace"), "",
                             time.monotonic() - start)

    def release(self) -> None:
        """Release every host's lock (idempotent): ``release``, then wait briefly for the
        holder's answer so that its holder file is gone before the connection closes."""
        self._stop.set()
        channels, self.channels = self.channels, {}

        def one(channel: Any) -> None:
            try:
                channel.sendall(b"release\n")
                channel.shutdown_write()
                channel.status_event.wait(5.0)
            except Exception:  # noqa: BLE001 - the holder exits with the connection anyway
                pass
            finally:
                channel.close()

        if channels:
            with ThreadPoolExecutor(max_workers=min(len(channels), 32)) as pool:
                list(pool.map(one, channels.values()))


def _holder_ended(channel: Any) -> bool:
    """Whether the holder process behind ``channel`` ended (its exit status came back, or the
    channel closed): local state of the channel, no round trip."""
    event = getattr(channel, "status_event", None)
    return bool((event is not None and event.is_set()) or getattr(channel, "closed", False))


def _read_answer(channel: Any, timeout_s: float = _ANSWER_TIMEOUT_S) -> str:
    """Read the holder script's first answer: up to ``END`` or until the channel ends (or
    ``timeout_s`` seconds pass)."""
    channel.settimeout(timeout_s)
    data = b""
    deadline = time.monotonic() + timeout_s
    while b"\nEND\n" not in data and time.monotonic() < deadline:
        try:
            chunk = channel.recv(4096)
        except TimeoutError:
            if data.startswith(b"LOCKED"):
                break  # the lock is taken; only its first read is late (not used then)
            raise
        if not chunk:
            break
        data += chunk
        if data.startswith((b"NOFLOCK", b"NODIR")):
            break
    return data.decode(errors="replace")


def folder_of(state_dir: str | Mapping[str, str], name: str) -> str:
    """The lock's folder on host ``name``: ``state_dir`` itself, or its entry for the host
    (:data:`STATE_DIR` when it has none)."""
    return state_dir if isinstance(state_dir, str) else state_dir.get(name, STATE_DIR)


def _problem(name: str, state: str, rest: str) -> Any:
    if state == "BUSY":
        holder = Holder.parse(rest)
        who = holder.describe() if holder else "another provision run (its holder file is " \
                                                "unreadable)"
        remote = f" (holder process PID {holder.remote_pid} on the host)" \
            if holder and holder.remote_pid else ""
        return Problem(name, f"another run holds this host's run lock: {who}{remote}",
                       fix="wait until that run finishes and rerun; a run whose connection "
                           f"dropped frees the lock within {GIVE_UP_S} s")
    if state == "NOFLOCK":
        return Problem(name, "flock is not installed, so the run lock cannot be taken",
                       fix="install util-linux (it provides flock(1))")
    if state == "NODIR":
        return Problem(name, f"cannot create or open {LOCK_FILE}",
                       fix="run as root or set ansible_become: true for this host")
    return Problem(name, f"the run lock could not be taken (answer {state!r})",
                   fix="rerun with -vvv and check the host's shell")


class _Shared:
    """A connection the run lock opened, lent to the runner: closing it is left to the lock's
    owner (the lock lives on it)."""

    def __init__(self, inner: HostConnection) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open(self) -> None:
        """Reconnect only when the lent connection was lost."""
        if not self._inner.is_open:
            self._inner.open()

    def close(self) -> None:
        """Keep the connection open: :func:`locked_run` closes it after releasing the lock."""


class _Unreachable:
    """The outcome of a connection the lock's set-up already failed to open (no second wait)."""

    def __init__(self, error: UnreachableError) -> None:
        self._error = error

    def open(self) -> None:
        """Raise the error of the first attempt."""
        raise self._error


class LendingFactory:
    """A connection factory for :class:`~vllm_provision.runner.engine.Runner` (and for any
    command that needs its hosts' connections) that lends the connections a command already
    opened, and carries the run lock's check point.

    Args:
        opened: host name -> an open connection, one per host for the whole command, closed by
            its owner, not by the borrower.
        errors: host name -> the first attempt's error: repeated without a second wait.
        options: the connection options of a host in neither (a new connection).
        lock: the run lock held on these hosts, or None (a read-only command).
    """

    def __init__(self, opened: Mapping[str, HostConnection],
                 errors: Mapping[str, UnreachableError], options: ConnectionOptions,
                 lock: RunLock | None = None) -> None:
        self.opened = opened
        self.errors = errors
        self.options = options
        self.lock = lock

    def __call__(self, host: Host) -> Any:
        """The connection object for ``host`` (its ``open()`` connects or raises)."""
        if host.name in self.opened:
            return _Shared(self.opened[host.name])
        if host.name in self.errors:
            return _Unreachable(self.errors[host.name])
        return HostConnection(host, self.options)

    @property
    def records(self) -> Mapping[str, str | None]:
        """Host name -> its state record's text as the run lock found it, taken under the lock
        (None: no record); hosts absent were not read. Empty without a lock."""
        return self.lock.records if self.lock is not None else {}

    @property
    def firsts(self) -> Mapping[str, str]:
        """Host name -> the output of the first read the run lock ran (``first_reads`` of
        :func:`locked_run`); empty without a lock."""
        return self.lock.firsts if self.lock is not None else {}

    def exchange(self, commands: Mapping[str, str],
                 timeout_s: float = _ANSWER_TIMEOUT_S) -> dict[str, CommandResult]:
        """Short reads over the run lock's channels (:meth:`RunLock.exchange`); ``{}``
        without a lock. Hosts absent from the answer need the caller's own way."""
        return self.lock.exchange(commands, timeout_s) if self.lock is not None else {}

    def ensure_held(self, *names: str) -> None:
        """The check point before a change on hosts ``names`` (:meth:`RunLock.ensure_held`;
        nothing without a lock).

        Raises:
            RunLockLost: this run's lock on one of them was lost.
        """
        if self.lock is not None:
            self.lock.ensure_held(*names)


def lending_factory(opened: Mapping[str, HostConnection], errors: Mapping[str, UnreachableError],
                    options: ConnectionOptions) -> LendingFactory:
    """A :class:`LendingFactory` without a run lock (read-only commands: ``drift``)."""
    return LendingFactory(opened, errors, options)


def hosts_of_plays(inventory: Any, plays: Sequence[Any], limit: str | None) -> list[Host]:
    """Every host that one of ``plays`` targets under ``limit``, in inventory order."""
    from vllm_provision.inventory.selection import select_play_hosts

    names = {host.name for play in plays
             for host in select_play_hosts(inventory, play.hosts, limit)}
    return [host for name, host in inventory.hosts.items() if name in names]


@contextmanager
def locked_run(hosts: Sequence[Host], options: ConnectionOptions, command: str,
               warn: Callable[[str], None],
               first_reads: Mapping[str, str] | None = None) -> Iterator[LendingFactory]:
    """Open the run's connections, take the run lock on ``hosts`` and yield a connection
    factory (:class:`LendingFactory`) that lends those connections and checks the lock before
    each change (``ensure_held``); release the lock and close them when the block ends. Every
    command that changes a host takes its lock here (``up``, ``down``, ``restart``,
    ``upgrade``, ``play``, ``stack sync``, ``stack rollback``, ``fault``).

    Args:
        hosts: every host the command may touch (the lock is per host, so two runs conflict
            exactly when their host sets overlap; a host named twice is locked once).
        options: the run's connection options.
        command: the provision command, for the holder file (``up``, ``stack sync``).
        warn: receives one line per stale lock taken over.
        first_reads: host name -> a read the holder runs as soon as it holds the lock, its
            output in the factory's ``firsts`` (:meth:`RunLock.acquire`); ``up`` sends its
            fact probe this way.

    Raises:
        RunLockError: a host's lock is held by another run (before anything was changed).
    """
    unique = list({host.name: host for host in hosts}.values())
    opened, errors = open_connections(unique, options)
    try:
        lock = RunLock.acquire(opened, command, warn, first_reads=first_reads,
                               first_timeout_s=options.command_timeout_s,
                               state_dir={h.name: instance.state_dir(h.vars) for h in unique})
    except BaseException:
        close_all(opened)
        raise

    try:
        yield LendingFactory(opened, errors, options, lock)
    finally:
        lock.release()
        close_all(opened)
