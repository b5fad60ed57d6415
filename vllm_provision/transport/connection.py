"""One persistent SSH connection per host (:class:`HostConnection`) and the pool that opens them.

Built on Fabric (config, ``~/.ssh/config``, ProxyJump gateways) and Paramiko (the transport).
Commands run on one exec channel each over the host's single transport, so a run opens exactly
one TCP/SSH connection per host (paramiko has no ControlMaster: fabric/fabric#2103). Here: the
connect with bounded retries, sudo, command timeouts, the liveness of a silent host (OpenSSH's
ServerAlive, :data:`ALIVE_COUNT_MAX`), and :func:`open_connections`/:func:`close_all`.

Host keys are checked on the target and on every ProxyJump hop Fabric builds from
``~/.ssh/config`` (its gateway ``Connection`` objects otherwise keep Fabric's ``AutoAddPolicy``):
the files and the policy are :mod:`vllm_provision.transport.hostkeys`'. A ProxyCommand runs the
system ``ssh``, which checks the jump host's key itself (its own ssh_config); the target's key is
still ours to check. The shared types (:class:`~vllm_provision.transport.base.Connection`, the
result, the options, the errors) are in :mod:`vllm_provision.transport.base`, the counters in
:mod:`vllm_provision.transport.stats`, the controller's own connection in
:mod:`vllm_provision.transport.local`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any, cast

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.core.parallel import split_map
from vllm_provision.transport.base import (
    CommandResult,
    Connection,
    ConnectionOptions,
    HostKeyError,
    UnreachableError,
    command_failed,
    sudo_wrap,
)
from vllm_provision.transport.hostkeys import (
    JumpHost,
    KnownHostsPolicy,
    fingerprint_sha256,
    first_writable,
    known_hosts_files,
    known_hosts_name,
)
from vllm_provision.transport.stats import COMMAND_ROUND_TRIPS, START_ROUND_TRIPS, STATS

if TYPE_CHECKING:  # paramiko/fabric load lazily: `provision --help` must stay fast
    import paramiko

log = logging.getLogger(__name__)

# Seconds between drains of a running command's output (the exit status wakes the wait at once).
POLL_S = 0.05
# After the exit status: seconds between drains while the output's end (EOF) is still in flight,
# and how long to wait for it at most (a background process the command left behind may hold
# its stdout open; OpenSSH's sshd closes the channel only when every copy of the fds is closed).
TAIL_POLL_S = 0.002
EOF_GRACE_S = 5.0
# Bytes read at a time from a file given as a command's stdin (a wheel of several GB).
STDIN_CHUNK = 1 << 20
# A host that sends nothing while a command runs is asked for an answer, as OpenSSH's
# ServerAliveInterval/ServerAliveCountMax do (ssh_config(5)): a ``keepalive@openssh.com`` global
# request with want-reply, which sshd answers with SSH_MSG_REQUEST_FAILURE (serverloop.c). After
# ALIVE_COUNT_MAX intervals without any answer the connection is lost: a cut cable is found in
# about the connect timeout (``--timeout``), not when a long command's own limit (an hour for a
# venv build) or TCP's retransmissions (about 15 min, tcp_retries2) run out.
ALIVE_COUNT_MAX = 3


class HostConnection:
    """One persistent SSH connection to one inventory host, for the whole run.

    Thread-safe: one command at a time per host (paramiko transports are shared, channels are not,
    paramiko/paramiko#709). After an operation times out the connection is marked broken and every
    later call raises :class:`UnreachableError` at once.
    """

    def __init__(self, host: Host, options: ConnectionOptions | None = None,
                 *, become: bool | None = None) -> None:
        """Prepare (do not open) a connection to ``host``; ``become`` overrides the host's."""
        self.host = host
        self.name = host.name
        self.options = options or ConnectionOptions()
        self.become = host.become if become is None else become
        self._fabric: Any = None
        self._lock = threading.Lock()
        self._broken: str | None = None
        self.accepted_key: str | None = None
        #: the ProxyJump hops of the last open attempt, outermost gateway first: the last one is
        #: dialled directly (for `ProxyJump a,b` Fabric 3.2.3 gives [a, b]: b first, unlike ssh)
        self.jump_hosts: list[JumpHost] = []
        self._output_limit: int | None = None

    @property
    def output_limit(self) -> int:
        """Bytes of stdout and stderr together one command may send back: the host's
        ``vllm_command_output_limit_mib`` (settings resolver; default 64 MiB)."""
        if self._output_limit is None:
            from vllm_provision.settings import layered

            self._output_limit = int(layered(self.host.vars)["vllm_command_output_limit_mib"]
                                     ) << 20
        return self._output_limit

    # -- opening ------------------------------------------------------------------------------

    def open(self) -> None:
        """Connect (retrying transient errors with backoff, logged at -v).

        Raises:
            HostKeyError: unknown key under ``strict``, or a changed key.
            UnreachableError: refused, timed out, auth failed, after the bounded retries.
        """
        import paramiko
        from tenacity import (
            before_sleep_log,
            retry,
            retry_if_exception,
            stop_after_attempt,
            wait_exponential,
        )

        def transient(exc: BaseException) -> bool:
            if isinstance(exc, (paramiko.AuthenticationException, paramiko.BadHostKeyException,
                                ProvisionError)):
                return False
            return isinstance(exc, (OSError, EOFError, paramiko.SSHException))

        attempt = retry(
            retry=retry_if_exception(transient),
            stop=stop_after_attempt(max(1, self.options.connect_attempts)),
            wait=wait_exponential(multiplier=0.5, max=4),
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )(self._open_once)
        try:
            attempt()
        except ProvisionError:
            raise
        except paramiko.BadHostKeyException as exc:
            jump = next((hop for hop in self.jump_hosts if hop.address == exc.hostname), None)
            where = (self._address_label() if jump is None else
                     f"{jump.label}, the jump host (ProxyJump) for {self.name},")
            entry = (known_hosts_name(self.host.address, self.host.port) if jump is None else
                     known_hosts_name(jump.address, jump.port))
            raise HostKeyError.single(
                self.name,
                f"the SSH host key of {where} CHANGED: known "
                f"{exc.expected_key.get_name()} {fingerprint_sha256(exc.expected_key.asbytes())}, "
                f"offered {exc.key.get_name()} {fingerprint_sha256(exc.key.asbytes())}",
                fix="if the server was reinstalled, remove the old entry (ssh-keygen -R "
                    f"'{entry}') after checking "
                    "the new fingerprint; otherwise suspect an attack",
            ) from None
        except paramiko.AuthenticationException as exc:
            raise UnreachableError.single(
                self.name, f"SSH authentication failed for user {self._user_label()} at "
                           f"{self._address_label()}: {exc}",
                fix="check ansible_user and ansible_ssh_private_key_file (or your ssh-agent)",
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise UnreachableError.single(
                self.name, f"cannot connect to {self._address_label()}: "
                           f"{exc or type(exc).__name__}",
                fix="check that the host is up, sshd listens on that port and no firewall "
                    "drops it (--timeout sets the connect timeout)",
            ) from None

    def _open_once(self) -> None:
        fabric_conn, policy = self._prepare()
        try:
            fabric_conn.open()
        except BaseException:
            fabric_conn.close()
            raise
        transport = fabric_conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        self.accepted_key = policy.accepted
        self._fabric = fabric_conn
        STATS.add(self.name, connects=1)

    def _prepare(self) -> tuple[Any, KnownHostsPolicy]:
        """Build the Fabric connection (not opened) with our host-key checking on every hop.

        Returns:
            ``(fabric.Connection, the target's policy)``; ``jump_hosts`` lists its ProxyJump hops.
        """
        from fabric import Config
        from fabric import Connection as FabricConnection

        connect_kwargs: dict[str, Any] = {
            "banner_timeout": self.options.connect_timeout_s,
            "auth_timeout": self.options.connect_timeout_s,
        }
        if self.host.key_file is not None:
            connect_kwargs["key_filename"] = [str(self.host.key_file)]
            # an explicit key: do not also offer every key of the agent and ~/.ssh (MaxAuthTries)
            connect_kwargs["look_for_keys"] = False
            connect_kwargs["allow_agent"] = False
        fabric_conn = FabricConnection(
            host=self.host.address, user=self.host.user, port=self.host.port, config=Config(),
            connect_timeout=max(1, int(self.options.connect_timeout_s)),
            connect_kwargs=connect_kwargs,
        )
        policy = self._check_host_keys(fabric_conn.client, None)
        # Fabric builds ProxyJump hops as nested gateway Connections with AutoAddPolicy; a
        # ProxyCommand gateway is a string (the system ssh checks that hop): the walk stops there.
        self.jump_hosts = []
        gateway = fabric_conn.gateway
        while isinstance(gateway, FabricConnection):
            jump = JumpHost(gateway.host, int(gateway.port))
            self._check_host_keys(gateway.client, jump)
            # Fabric leaves a hop without ConnectTimeout unbounded (an unreachable jump host
            # hung for the kernel's SYN retries): --timeout bounds every hop like the target
            if gateway.connect_timeout is None:
                gateway.connect_timeout = max(1, int(self.options.connect_timeout_s))
            gateway.connect_kwargs = {"banner_timeout": self.options.connect_timeout_s,
                                      "auth_timeout": self.options.connect_timeout_s,
                                      **gateway.connect_kwargs}
            self.jump_hosts.append(jump)
            gateway = gateway.gateway
        return fabric_conn, policy

    def _check_host_keys(self, client: paramiko.SSHClient,
                         jump_host: JumpHost | None) -> KnownHostsPolicy:
        """Load our known_hosts files into ``client`` and set our policy on it."""
        for path in known_hosts_files(self.host):
            if path.is_file():
                try:
                    client.load_system_host_keys(str(path))
                except OSError as exc:  # unreadable: say so, but other files may still know it
                    log.warning("%s: cannot read known_hosts %s: %s", self.name, path, exc)
        policy = KnownHostsPolicy(self.host, self.options.host_key_policy,
                                   first_writable(self.host), jump_host)
        # paramiko duck-types the policy; subclassing would import paramiko at module load
        client.set_missing_host_key_policy(cast("paramiko.MissingHostKeyPolicy", policy))
        return policy

    @property
    def broken(self) -> str | None:
        """Why this connection was given up (an operation past its time limit, a silent host,
        a lost transport), or None while it is usable; the run lock names it when the
        connection's end took its holder with it."""
        return self._broken

    @property
    def is_open(self) -> bool:
        """True when the SSH transport is up and no operation timed out."""
        return (self._fabric is not None and self._broken is None
                and bool(self._fabric.is_connected))

    def close(self) -> None:
        """Close the transport (idempotent)."""
        if self._fabric is not None:
            self._fabric.close()

    def with_become(self, become: bool | None) -> Connection:
        """Return a view of this connection whose default ``sudo`` is ``become`` (task key)."""
        if become is None or become == self.become:
            return self
        return _BecomeView(self, become)

    def _address_label(self) -> str:
        return f"{self.host.address}:{self.host.port}"

    def _user_label(self) -> str:
        return self.host.user or os.environ.get("USER", "?")

    # -- running ------------------------------------------------------------------------------

    def run(self, command: str, *, sudo: bool | None = None,
            stdin: str | bytes | IO[bytes] | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        """Run ``command`` through the remote user's shell; return its result.

        Args:
            command: a shell command line; every interpolated value must already be quoted.
            sudo: run through ``sudo -n -u <become_user>``; None means the host's ``become``.
            stdin: bytes or text fed to the command's standard input, then EOF; or a binary
                file, streamed in :data:`STDIN_CHUNK` pieces (never read whole into memory).
            timeout_s: limit for the whole round trip in seconds (default: the run's
                ``command_timeout_s``).
            check: raise :class:`ProvisionError` when the exit status is not 0.

        Output is read until the exit status AND the end of the channel's output (EOF or
        close), so bytes that sshd sends after the exit status are kept; a command that leaves
        a background process holding its stdout returns :data:`EOF_GRACE_S` after its exit.

        Raises:
            UnreachableError: the connection is down or the command ran past ``timeout_s``.
            ProvisionError: ``check`` and a non-zero exit status.
        """
        use_sudo = self.become if sudo is None else sudo
        line = sudo_wrap(command, self.host.become_user) if use_sudo else command
        limit = self.options.command_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            if self._broken is not None:
                raise UnreachableError.single(self.name, self._broken)
            if self._fabric is None:
                self.open()
            result = self._exec(line, stdin, limit)
        log.debug("%s: rc=%s %.3fs: %s", self.name, result.exit_code, result.duration_s, command)
        if check and not result.ok:
            raise command_failed(self.name, command, result)
        return result

    def start(self, command: str, *, sudo: bool | None = None, timeout_s: float = 30.0) -> Any:
        """Start ``command`` on a new channel of this connection and return the paramiko
        channel without waiting for it: for a process that must live as long as the run (the
        run lock's holder, ``vllm_provision.transport.runlock``). The caller reads, writes and
        closes it.

        Raises:
            UnreachableError: the connection is down.
        """
        use_sudo = self.become if sudo is None else sudo
        line = sudo_wrap(command, self.host.become_user) if use_sudo else command
        with self._lock:
            if self._broken is not None:
                raise UnreachableError.single(self.name, self._broken)
            if self._fabric is None:
                self.open()
            try:
                transport = self._fabric.client.get_transport()
                if transport is None or not transport.is_active():
                    raise EOFError("SSH transport closed")
                channel = transport.open_session(timeout=timeout_s)
                exec_bounded(channel, line, timeout_s)
                STATS.add(self.name, commands=1, round_trips=START_ROUND_TRIPS)
            except Exception as exc:  # paramiko.SSHException, OSError, EOFError
                raise UnreachableError.single(
                    self.name, f"connection to {self._address_label()} lost: {exc}") from None
        return channel

    def open_forward(self, address: str, port: int, timeout_s: float | None = 10.0) -> Any:
        """Open one forwarded TCP channel (RFC 4254 section 7.2, ``direct-tcpip``) from this host
        to ``address:port`` over the host's SSH connection: no process, no listening port on the
        controller (the API path ``ssh``, :mod:`vllm_provision.transport.tunnel`). The caller
        reads, writes and closes the paramiko channel. sshd must allow it
        (``AllowTcpForwarding``, sshd_config(5), default yes).

        Args:
            address: the destination as the host sees it (``127.0.0.1``: its own loopback).
            port: TCP port. timeout_s: seconds to wait for the channel (None: 10 s).

        Raises:
            ConnectionRefusedError: the host could not connect (sshd answers "connect failed":
                nothing listens there yet).
            TimeoutError: no answer within ``timeout_s``.
            ConnectionError: the SSH connection is lost or forwarding is refused.
        """
        import paramiko

        if self._broken is not None:
            raise ConnectionError(self._broken)
        if self._fabric is None:
            with self._lock:
                if self._fabric is None:
                    try:
                        self.open()
                    except ProvisionError as exc:  # unreachable: an OSError for httpcore
                        raise ConnectionError(" ".join(exc.render().split())[:300]) from None
        transport = self._fabric.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionError(f"connection to {self._address_label()} lost")
        wait = 10.0 if timeout_s is None else max(0.1, float(timeout_s))
        try:
            channel = transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0),
                                             timeout=wait)
        except paramiko.ChannelException as exc:
            reason = exc.text or str(exc)
            if exc.code == paramiko.common.OPEN_FAILED_CONNECT_FAILED:
                raise ConnectionRefusedError(f"{self.name}: {address}:{port}: {reason}") from None
            raise ConnectionError(f"{self.name}: forwarding to {address}:{port} refused: "
                                  f"{reason} (sshd's AllowTcpForwarding?)") from None
        except paramiko.SSHException as exc:
            if "Timeout" in str(exc):
                raise TimeoutError(f"{self.name}: no channel to {address}:{port} within "
                                   f"{wait:g} s") from None
            raise ConnectionError(f"{self.name}: {exc}") from None
        except EOFError as exc:
            raise ConnectionError(f"{self.name}: connection lost: {exc}") from None
        STATS.add(self.name, round_trips=1)  # the channel open and its confirmation
        return channel

    def _exec(self, line: str, stdin: str | bytes | IO[bytes] | None,
              limit: float) -> CommandResult:
        started = time.monotonic()
        deadline = started + limit
        try:
            transport = self._fabric.client.get_transport()
            if transport is None or not transport.is_active():
                raise EOFError("SSH transport closed")
            # paramiko waits at most clear_to_send_timeout (30 s) for a re-key to finish before
            # it sends, then fails the transport ("Key-exchange timed out waiting for key
            # negotiation"); a re-key comes every 512 MiB (paramiko.packet REKEY_BYTES), and on
            # a host whose CPUs are busy it can take longer: this command's limit bounds it too
            transport.clear_to_send_timeout = max(30.0, limit)
            channel = transport.open_session(timeout=max(1.0, min(limit, 30.0)))
            STATS.add(self.name, commands=1, round_trips=COMMAND_ROUND_TRIPS)
            exec_bounded(channel, line, max(0.1, deadline - time.monotonic()))
            if isinstance(stdin, (str, bytes)):
                data = stdin.encode() if isinstance(stdin, str) else stdin
                channel.settimeout(max(0.1, deadline - time.monotonic()))
                channel.sendall(data)
            elif stdin is not None:  # a binary file: streamed, never whole in memory
                while chunk := stdin.read(STDIN_CHUNK):
                    channel.settimeout(max(0.1, deadline - time.monotonic()))
                    channel.sendall(chunk)
            channel.shutdown_write()
            out, err = bytearray(), bytearray()
            exited_at: float | None = None
            alive = _AliveProbe(transport, self.options.connect_timeout_s / ALIVE_COUNT_MAX)
            cap = self.output_limit
            while True:
                while channel.recv_ready() and len(out) + len(err) <= cap:
                    out += channel.recv(65536)
                    alive.heard()
                while channel.recv_stderr_ready() and len(out) + len(err) <= cap:
                    err += channel.recv_stderr(65536)
                    alive.heard()
                if len(out) + len(err) > cap:
                    channel.close()  # nothing more is read; the connection itself is fine
                    raise _TooMuch(cap)
                if alive.lost():
                    channel.close()
                    raise _Silent(alive.silent_s())
                # Done at the exit status AND the end of both streams (EOF or close: paramiko
                # closes the stdout and stderr buffers together), with nothing left buffered.
                # The exit status alone is not the end: OpenSSH's sshd sends it when the child
                # exits (session.c session_exit_message), while output still waiting in the
                # pipe follows, then EOF ("there could be some more data waiting in the pipe").
                ended = channel.eof_received or channel.closed
                if (channel.exit_status_ready() and ended and not channel.recv_ready()
                        and not channel.recv_stderr_ready()):
                    break
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0:
                    channel.close()
                    raise TimeoutError
                if channel.exit_status_ready():
                    exited_at = now if exited_at is None else exited_at
                    if now - exited_at >= EOF_GRACE_S:
                        log.debug("%s: no end of output %g s after the exit status (a "
                                  "background process holds its stdout?)", self.name,
                                  EOF_GRACE_S)
                        break
                    # The status event stays set from here on: wait in short sleeps.
                    time.sleep(min(remaining, TAIL_POLL_S))
                    continue
                # Not select() on the channel: its fileno() makes a pipe that paramiko's
                # transport thread may write to after close() (unsynchronised, paramiko#2271,
                # #692): EBADF there kills the whole transport of a healthy host. The status
                # event is set when the exit status (or a close) arrives; output is drained
                # every POLL_S meanwhile.
                channel.status_event.wait(min(remaining, POLL_S))
            code = channel.recv_exit_status()
            channel.close()
        except _TooMuch as exc:
            raise ProvisionError.single(
                self.name, f"a command sent back more than {exc.args[0] >> 20} MiB of output; "
                "it was stopped reading there",
                fix="raise vllm_command_output_limit_mib for this host if that much output is "
                    "expected, else find what floods the output") from None
        except _Silent as exc:
            self._broken = (f"{self._address_label()} answered nothing for {exc.args[0]:.0f} s "
                            f"(not even an SSH keepalive) while a command ran; the connection "
                            f"is considered lost")
            self.close()
            raise UnreachableError.single(
                self.name, self._broken,
                fix="check the network path to the host and that it is up (--timeout sets how "
                    "long a silent host is waited for)") from None
        except TimeoutError:
            self._broken = (f"an operation on {self._address_label()} timed out after "
                            f"{limit:g} s; the connection is considered lost")
            self.close()
            raise UnreachableError.single(
                self.name, self._broken,
                fix="check the network path to the host (or raise --timeout)") from None
        except (OSError, EOFError) as exc:
            self._broken = f"connection to {self._address_label()} lost: {exc or 'closed'}"
            raise UnreachableError.single(self.name, self._broken) from None
        except Exception as exc:  # paramiko.SSHException and kin: the transport is gone
            self._broken = f"connection to {self._address_label()} lost: {exc}"
            raise UnreachableError.single(self.name, self._broken) from None
        return CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"),
                             time.monotonic() - started)


def exec_bounded(channel: Any, line: str, timeout_s: float) -> None:
    """``channel.exec_command(line)`` that gives up after ``timeout_s`` seconds.

    paramiko's ``Channel.exec_command`` waits for the server's reply to the exec request with
    no timeout (paramiko/channel.py, ``_wait_for_event``): a host cut off after the channel
    opened, whose transport has not failed yet, leaves the caller waiting forever, and with it
    the host's task and the whole run. Here a timer closes the channel at the deadline, which
    wakes the wait.

    Args:
        channel: an open paramiko ``Channel``. line: the command line. timeout_s: seconds.

    Raises:
        TimeoutError: no reply within ``timeout_s`` (the channel is closed).
        paramiko.SSHException, EOFError, OSError: as ``exec_command`` raises them.
    """
    fired = threading.Event()

    def give_up() -> None:
        fired.set()
        channel.close()

    timer = threading.Timer(max(0.1, timeout_s), give_up)
    timer.daemon = True
    timer.start()
    try:
        channel.exec_command(line)
    except Exception:
        if fired.is_set():
            raise TimeoutError(f"no reply to the exec request within {timeout_s:g} s") from None
        raise
    finally:
        timer.cancel()
    if fired.is_set():
        raise TimeoutError(f"no reply to the exec request within {timeout_s:g} s")


class _TooMuch(Exception):
    """A command's output passed ``args[0]`` bytes (``HostConnection.output_limit``)."""


class _Silent(Exception):
    """The host answered nothing, not even a keepalive, for ``args[0]`` seconds."""


class _AliveProbe:
    """OpenSSH's ServerAlive for one running command (see :data:`ALIVE_COUNT_MAX`).

    Args:
        transport: the paramiko transport the command's channel runs on.
        interval_s: seconds of silence before a keepalive request is sent; the host is lost
            when no answer came :data:`ALIVE_COUNT_MAX` intervals after the last thing heard.

    ``global_request(wait=True)`` has no timeout of its own, so it runs on a daemon thread; it
    returns when the answer arrives or the transport closes (the caller closes it when lost).
    """

    def __init__(self, transport: Any, interval_s: float) -> None:
        self.transport = transport
        self.interval_s = max(1.0, interval_s)
        self.last = time.monotonic()
        self.probe: threading.Thread | None = None
        self.answered = False

    def heard(self) -> None:
        """Output arrived: the host is alive."""
        self.last = time.monotonic()

    def silent_s(self) -> float:
        """Seconds since anything was heard."""
        return time.monotonic() - self.last

    def lost(self) -> bool:
        """Send a keepalive after an interval of silence; True once none was answered in time."""
        if self.probe is not None and not self.probe.is_alive():
            self.probe = None
            if self.answered:
                self.last = time.monotonic()
        silent = self.silent_s()
        if silent >= self.interval_s * ALIVE_COUNT_MAX:
            return True
        if silent >= self.interval_s and self.probe is None:
            self.probe = threading.Thread(target=self._ask, name="ssh-alive", daemon=True)
            self.probe.start()
        return False

    def _ask(self) -> None:
        self.answered = False
        try:
            # None for SSH_MSG_REQUEST_FAILURE (an answer) and for a closed transport (none)
            self.transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:  # the transport went away: lost() sees the silence
            return
        self.answered = bool(self.transport.is_active())


class _BecomeView:
    """A ``HostConnection`` seen with another default for ``sudo`` (a task's ``become:``)."""

    def __init__(self, inner: HostConnection, become: bool) -> None:
        self._inner = inner
        self.name = inner.name
        self.host = inner.host
        self.become = become

    def run(self, command: str, *, sudo: bool | None = None,
            stdin: str | bytes | IO[bytes] | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        return self._inner.run(command, sudo=self.become if sudo is None else sudo, stdin=stdin,
                               timeout_s=timeout_s, check=check)

    def open_forward(self, address: str, port: int, timeout_s: float | None = 10.0) -> Any:
        """:meth:`HostConnection.open_forward` of the connection (``become`` plays no part)."""
        return self._inner.open_forward(address, port, timeout_s)


def open_connections(hosts: Iterable[Host], options: ConnectionOptions,
                     factory: Callable[[Host], HostConnection] | None = None,
                     ) -> tuple[dict[str, HostConnection], dict[str, UnreachableError]]:
    """Open one connection per host, at most ``options.forks`` at once.

    Returns:
        ``(open connections by host name, errors by host name)``; every host is in exactly one.
    """
    make = factory or (lambda host: HostConnection(host, options))
    hosts = list(hosts)

    def one(host: Host) -> tuple[str, HostConnection | UnreachableError]:
        conn = make(host)
        try:
            conn.open()
        except UnreachableError as exc:
            return host.name, exc
        except ProvisionError as exc:
            return host.name, UnreachableError(exc.problems)
        return host.name, conn

    return split_map(one, hosts, workers=min(options.forks, len(hosts)),
                     failure=UnreachableError)


def open_all(hosts: Iterable[Host], options: ConnectionOptions,
             factory: Callable[[Host], HostConnection] | None = None,
             ) -> dict[str, HostConnection]:
    """Open one connection per host, or none: the commands that need every node of a replica
    (bench, fault, stack) use it; ``factory`` as :func:`open_connections` (the run lock's, for a
    command that changes the hosts).

    Returns:
        The open connections by host name.

    Raises:
        ProvisionError: a host cannot be reached (every host's reason, one problem each); the
            connections that did open are closed.
    """
    connections, errors = open_connections(hosts, options, factory)
    if errors:
        close_all(connections)
        raise ProvisionError([p for e in errors.values() for p in e.problems])
    return connections


def close_all(connections: Mapping[str, Any]) -> None:
    """Close every connection that has a ``close`` method."""
    for conn in connections.values():
        close = getattr(conn, "close", None)
        if close is not None:
            close()


def probe_tcp(address: str, port: int, timeout_s: float) -> bool:
    """Return True when a TCP connection to ``address:port`` succeeds within ``timeout_s``."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


__all__ = [
    "ALIVE_COUNT_MAX", "EOF_GRACE_S", "HostConnection", "close_all", "open_connections",
    "probe_tcp",
]
