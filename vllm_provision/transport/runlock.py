"""The run lock: one changing ``provision`` run per host at a time.

``up``, ``restart``, ``down`` and ``play`` (and their ``--check``, as Terraform's ``plan`` takes
the state lock by default: a dry run next to a real one would report a half-changed host) hold,
on every host they may touch, an exclusive ``flock(2)`` on ``/var/lib/vllm-provision/run.lock``
for the whole command, the state record included. Read-only commands (``check``, ``facts``,
``status``, ``drift``) take no lock.

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

Cost: one command per host when the run starts (parallel, on connections the run opens
anyway) and one at the end, plus a heartbeat line every 10 s on an open channel.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.core.paths import STATE_DIR
from vllm_provision.core.quoting import shell_quote
from vllm_provision.core.text import printable
from vllm_provision.transport.base import ConnectionOptions, UnreachableError
from vllm_provision.transport.connection import HostConnection, close_all, open_connections

LOCK_FILE = f"{STATE_DIR}/run.lock"
HOLDER_FILE = f"{STATE_DIR}/run.lock.holder"
HEARTBEAT_S = 10.0
GIVE_UP_S = 60
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
    "printf 'LOCKED\\n%s\\nEND\\n' \"$stale\"",
    "while IFS= read -r -t \"$wait\" line; do if [ \"$line\" = release ]; then "
    "rm -f -- \"$dir/run.lock.holder\"; printf 'RELEASED\\n'; exit 0; fi; done",
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
            data = json.loads(lines[0])
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


class RunLock:
    """The run lock held on a set of hosts; see the module docstring.

    Args:
        channels: host name -> the paramiko channel of that host's holder process.
    """

    def __init__(self, channels: Mapping[str, Any]) -> None:
        self.channels = dict(channels)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="run-lock-heartbeat",
                                      daemon=True)
        if self.channels:
            self._beat.start()

    @classmethod
    def acquire(cls, connections: Mapping[str, Any], command: str,
                warn: Callable[[str], None], state_dir: str = STATE_DIR) -> RunLock:
        """Take the lock on every host of ``connections`` at once (in parallel).

        Args:
            connections: open connections by host name (root, or ``become``, is needed to
                write ``/var/lib/vllm-provision``).
            command: the provision command, for the holder file (``up``).
            warn: called with one line per stale lock taken over.
            state_dir: the folder of the lock file (tests use a temporary one).

        Raises:
            RunLockError: a host's lock is held by another run (each such host is named with
                its holder); the locks taken meanwhile are released.
            ProvisionError: ``flock`` is missing or the state folder cannot be written.
        """
        me = this_run(command)
        line = json.dumps({"controller": me.controller, "user": me.user, "pid": me.pid,
                           "started": me.started, "command": me.command})
        script = (f"bash -c {shell_quote(_SCRIPT)} vllm-provision-lock "
                  f"{shell_quote(state_dir)} {shell_quote(line)} {GIVE_UP_S}")

        def one(name: str) -> tuple[str, Any, str, str]:
            try:
                channel = connections[name].start(script, timeout_s=_ANSWER_TIMEOUT_S)
                answer = _read_answer(channel)
            except (UnreachableError, OSError, EOFError) as exc:
                return name, None, "UNREACHABLE", str(exc)
            first, _, rest = answer.partition("\n")
            return name, channel, first.strip(), rest.removesuffix("END\n").strip()

        names = list(connections)
        with ThreadPoolExecutor(max_workers=max(1, min(len(names), 32))) as pool:
            answers = list(pool.map(one, names)) if names else []
        held = {name: channel for name, channel, state, _ in answers if state == "LOCKED"}
        lock = cls(held)
        problems = []
        for name, _channel, state, rest in answers:
            if state == "LOCKED":
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

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for channel in list(self.channels.values()):
                try:
                    channel.sendall(b"\n")
                except Exception:  # noqa: BLE001 - a lost host shows in the run's own results
                    continue

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


def _read_answer(channel: Any) -> str:
    """Read the holder script's first answer: up to ``END`` or until the channel ends."""
    channel.settimeout(_ANSWER_TIMEOUT_S)
    data = b""
    deadline = time.monotonic() + _ANSWER_TIMEOUT_S
    while b"\nEND\n" not in data and time.monotonic() < deadline:
        chunk = channel.recv(4096)
        if not chunk:
            break
        data += chunk
        if data.startswith((b"NOFLOCK", b"NODIR")):
            break
    return data.decode(errors="replace")


def _problem(name: str, state: str, rest: str) -> Any:
    from vllm_provision.core.errors import Problem

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


def lending_factory(opened: Mapping[str, HostConnection], errors: Mapping[str, UnreachableError],
                    options: ConnectionOptions) -> Callable[[Host], Any]:
    """A connection factory for :class:`~vllm_provision.runner.engine.Runner` that lends the
    connections a command already opened (``opened``: one per host for the whole command,
    closed by their owner, not by the runner), repeats the first attempt's error for a host in
    ``errors`` without a second wait, and opens a new connection for any other host."""

    def factory(host: Host) -> Any:
        if host.name in opened:
            return _Shared(opened[host.name])
        if host.name in errors:
            return _Unreachable(errors[host.name])
        return HostConnection(host, options)

    return factory


def hosts_of_plays(inventory: Any, plays: Sequence[Any], limit: str | None) -> list[Host]:
    """Every host that one of ``plays`` targets under ``limit``, in inventory order."""
    from vllm_provision.inventory.selection import select_play_hosts

    names = {host.name for play in plays
             for host in select_play_hosts(inventory, play.hosts, limit)}
    return [host for name, host in inventory.hosts.items() if name in names]


@contextmanager
def locked_run(hosts: Sequence[Host], options: ConnectionOptions, command: str,
               warn: Callable[[str], None]) -> Iterator[Callable[[Host], Any]]:
    """Open the run's connections, take the run lock on ``hosts`` and yield a connection
    factory for :class:`~vllm_provision.runner.engine.Runner` (and the state record) that lends
    those connections; release the lock and close them when the block ends.

    Args:
        hosts: every host the command may touch (the lock is per host, so two runs conflict
            exactly when their host sets overlap).
        options: the run's connection options.
        command: the provision command, for the holder file.
        warn: receives one line per stale lock taken over.

    Raises:
        RunLockError: a host's lock is held by another run (before anything was changed).
    """
    opened, errors = open_connections(list(hosts), options)
    try:
        lock = RunLock.acquire(opened, command, warn)
    except BaseException:
        close_all(opened)
        raise

    try:
        yield lending_factory(opened, errors, options)
    finally:
        lock.release()
        close_all(opened)
