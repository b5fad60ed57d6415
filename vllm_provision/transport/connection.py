"""One persistent SSH connection per host: host keys, sudo, timeouts and bounded retries.

Built on Fabric (config, ``~/.ssh/config``, ProxyJump gateways) and Paramiko (the transport).
Commands run on one exec channel each over the host's single transport, so a run opens exactly
one TCP/SSH connection per host (paramiko has no ControlMaster: fabric/fabric#2103).

Host keys (fabric/fabric#1804, #2071: Fabric auto-accepts unknown keys; we do not): the system
file ``/etc/ssh/ssh_known_hosts``, the user file ``~/.ssh/known_hosts`` and the host's own
``known_hosts_files`` are loaded; an unknown key is refused unless the policy is ``accept-new``
(OpenSSH ``StrictHostKeyChecking=accept-new``, ssh_config(5)); a changed key is always refused.
The same files and policy apply to every ProxyJump hop Fabric builds from ``~/.ssh/config`` (its
gateway ``Connection`` objects otherwise keep Fabric's ``AutoAddPolicy``). A ProxyCommand runs the
system ``ssh``, which checks the jump host's key itself (its own ssh_config); the target's key is
still ours to check.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol, cast

from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.core.quoting import quote

if TYPE_CHECKING:  # paramiko/fabric load lazily: `provision --help` must stay fast
    import paramiko

log = logging.getLogger(__name__)

HostKeyPolicyName = Literal["strict", "accept-new"]

# The one set of defaults of the shared command-line options (``vllm_provision.cli.options``
# reads them from here): seconds for the SSH connect and for one command, parallel hosts.
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_FORKS = 10
DEFAULT_HOST_KEY_POLICY: HostKeyPolicyName = "strict"

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
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


class UnreachableError(ProvisionError):
    """The host cannot be reached: connect refused or timed out, authentication failed, host key
    refused, or an operation on an open connection timed out. The runner reports ``unreachable``.
    """


class HostKeyError(UnreachableError):
    """The host's SSH key is unknown (policy ``strict``) or differs from the known one."""


# Round trips of one remote command after the connection is open, as :meth:`HostConnection._exec`
# waits for them: the channel open confirmation, the reply to the exec request (paramiko sends it
# with want-reply and waits, ``Channel.exec_command``), and the end of the output (exit status,
# EOF). Standard input is sent without waiting. RFC 4254 sections 5.1, 6.5, 6.10.
COMMAND_ROUND_TRIPS = 3
# A channel started and left open (:meth:`HostConnection.start`): open confirmation + exec reply.
START_ROUND_TRIPS = 2


class ConnectionStats:
    """Counters of what the connection layer sent, per host, for the whole process.

    Kept by :class:`HostConnection` itself (not by its callers), so every command counts, a
    module's, the runner's, the run lock's or a fact probe's. Per host name:

    - ``connects``: SSH connections opened (handshake and authentication done);
    - ``commands``: remote commands sent (one exec channel each);
    - ``round_trips``: the waits on the host those commands cost after connecting
      (:data:`COMMAND_ROUND_TRIPS` per command, :data:`START_ROUND_TRIPS` per started channel);
      the connect handshake is not included (TCP, key exchange and authentication take about 4
      more, RFC 4253 section 7 and RFC 4252).

    Thread-safe. ``provision -vv`` prints them at the end of a run, ``--json`` puts
    :meth:`snapshot` under ``stats``.
    """

    KEYS = ("connects", "commands", "round_trips")

    def __init__(self) -> None:
        """Start with no host counted."""
        self._lock = threading.Lock()
        self._hosts: dict[str, dict[str, int]] = {}

    def add(self, host: str, *, connects: int = 0, commands: int = 0,
            round_trips: int = 0) -> None:
        """Add to ``host``'s counters (ints >= 0)."""
        with self._lock:
            counts = self._hosts.setdefault(host, dict.fromkeys(self.KEYS, 0))
            counts["connects"] += connects
            counts["commands"] += commands
            counts["round_trips"] += round_trips

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Return ``{host: {"connects", "commands", "round_trips"}}``, hosts in first-use order
        (a copy)."""
        with self._lock:
            return {host: dict(counts) for host, counts in self._hosts.items()}

    def reset(self) -> None:
        """Forget every count (tests, or a caller measuring one step)."""
        with self._lock:
            self._hosts.clear()


#: the process's counters (one CLI command per process)
STATS = ConnectionStats()


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did.

    Attributes:
        exit_code: the command's exit status (sudo's 1 when sudo itself refused).
        stdout: standard output, decoded as UTF-8 (invalid bytes replaced).
        stderr: standard error, decoded likewise.
        duration_s: wall time of the round trip, in seconds.
    """

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the exit status is 0."""
        return self.exit_code == 0


@dataclass(frozen=True)
class ConnectionOptions:
    """Settings shared by every connection of a run.

    Attributes:
        connect_timeout_s: TCP + SSH handshake timeout per attempt, in seconds.
        command_timeout_s: default time limit of one remote command, in seconds.
        host_key_policy: ``strict`` (refuse unknown keys) or ``accept-new`` (learn unknown keys,
            append them to the first writable known_hosts file; changed keys are still refused).
        forks: how many connections are opened at once.
        connect_attempts: attempts for transient connect errors (refused, reset, banner timeout).

    The defaults are those of the shared command-line options (``--timeout``,
    ``--host-key-policy``, ``-f``): :data:`DEFAULT_TIMEOUT_S`, :data:`DEFAULT_HOST_KEY_POLICY`,
    :data:`DEFAULT_FORKS`.
    """

    connect_timeout_s: float = DEFAULT_TIMEOUT_S
    command_timeout_s: float = DEFAULT_TIMEOUT_S
    host_key_policy: HostKeyPolicyName = DEFAULT_HOST_KEY_POLICY
    forks: int = DEFAULT_FORKS
    connect_attempts: int = 3


class Connection(Protocol):
    """What modules need from a connection (``HostConnection``, ``LocalConnection``, a fake)."""

    name: str

    def run(self, command: str, *, sudo: bool | None = None, stdin: str | bytes | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult: ...


def fingerprint_sha256(key_bytes: bytes) -> str:
    """Return OpenSSH's ``SHA256:<base64 without padding>`` fingerprint of a raw public key blob."""
    digest = hashlib.sha256(key_bytes).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """Return the known_hosts host field: ``addr`` on port 22, else ``[addr]:port`` (sshd(8))."""
    return address if port == 22 else f"[{address}]:{port}"


def sudo_wrap(command: str, become_user: str = "root") -> str:
    """Wrap ``command`` to run through non-interactive sudo as ``become_user``.

    ``sudo -n`` never prompts (sudo(8)): a missing NOPASSWD rule fails fast with "a password is
    required" instead of hanging the run.
    """
    return f"sudo -n -H -u {quote(become_user)} -- /bin/sh -c {quote(command)}"


# One jump host usually serves every host of a run, so several connections may learn its key at
# once: appends are serialised and re-read so the key is written once and two differing keys
# for one name are refused.
_LEARN_LOCK = threading.Lock()


@dataclass(frozen=True)
class JumpHost:
    """One ProxyJump hop (a Fabric gateway ``Connection``) on the way to an inventory host.

    Attributes:
        address: the hop's address after ``~/.ssh/config`` (``HostName``).
        port: its SSH port.
    """

    address: str
    port: int

    @property
    def label(self) -> str:
        """``address:port``, as in our other connection messages."""
        return f"{self.address}:{self.port}"


class _KnownHostsPolicy:
    """Paramiko missing-host-key policy: refuse (``strict``) or learn and save (``accept-new``).

    ``jump_host`` is set when the policy guards a ProxyJump hop of ``host`` rather than ``host``
    itself: messages then name the jump host and the host it leads to.
    """

    def __init__(self, host: Host, policy: HostKeyPolicyName, write_file: Path | None,
                 jump_host: JumpHost | None = None) -> None:
        self.host = host
        self.policy = policy
        self.write_file = write_file
        self.jump_host = jump_host
        self.accepted: str | None = None

    def _subject(self, hostname: str) -> str:
        if self.jump_host is None:
            return hostname
        return f"{hostname}, the jump host (ProxyJump) for {self.host.name},"

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        fingerprint = fingerprint_sha256(key.asbytes())
        owner = "the server's" if self.jump_host is None else "the jump host's"
        if self.policy != "accept-new":
            raise HostKeyError.single(
                self.host.name,
                f"unknown SSH host key for {self._subject(hostname)} "
                f"({key.get_name()} {fingerprint})",
                fix=f"check the fingerprint with {owner} owner (ssh-keygen -lf "
                    "/etc/ssh/ssh_host_*_key.pub on it), then add it to known_hosts or rerun "
                    "with --host-key-policy accept-new",
            )
        if self.write_file is None:
            raise HostKeyError.single(
                self.host.name,
                f"no writable known_hosts file to record the key of {self._subject(hostname)} in",
                fix="create ~/.ssh/known_hosts or set provision_known_hosts_file")
        with _LEARN_LOCK:
            recorded = self._recorded_key(hostname, key.get_name())
            if recorded is not None and recorded.asbytes() != key.asbytes():
                raise HostKeyError.single(
                    self.host.name,
                    f"the SSH host key of {self._subject(hostname)} CHANGED during this run: "
                    f"learned {key.get_name()} {fingerprint_sha256(recorded.asbytes())}, "
                    f"now offered {fingerprint}",
                    fix="suspect an attack; check both fingerprints with the server's owner")
            if recorded is None:
                self.write_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                with self.write_file.open("a", encoding="ascii") as handle:
                    handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = fingerprint
        if recorded is None:
            log.warning("%s: accepted new host key of %s %s %s into %s", self.host.name,
                        self._subject(hostname).rstrip(","), key.get_name(), fingerprint,
                        self.write_file)

    def _recorded_key(self, hostname: str, key_type: str) -> paramiko.PKey | None:
        """The key of ``key_type`` the write file already holds for ``hostname``, if any."""
        import paramiko

        if self.write_file is None or not self.write_file.is_file():
            return None
        entry = paramiko.HostKeys(str(self.write_file)).lookup(hostname)
        return None if entry is None else entry.get(key_type)


def _known_hosts_files(host: Host) -> list[Path]:
    files = [SYSTEM_KNOWN_HOSTS, USER_KNOWN_HOSTS.expanduser(), *host.known_hosts_files]
    return [Path(os.path.expanduser(str(f))) for f in files]


def _first_writable(host: Host) -> Path | None:
    # OpenSSH writes learned keys to the first UserKnownHostsFile: the host's own file first.
    for candidate in [*host.known_hosts_files, USER_KNOWN_HOSTS]:
        path = Path(os.path.expanduser(str(candidate)))
        if path.exists() and os.access(path, os.W_OK):
            return path
        if not path.exists() and os.access(_existing_parent(path), os.W_OK):
            return path
    return None


def _existing_parent(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists():
            return parent
    return Path("/")


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

    def _prepare(self) -> tuple[Any, _KnownHostsPolicy]:
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
                         jump_host: JumpHost | None) -> _KnownHostsPolicy:
        """Load our known_hosts files into ``client`` and set our policy on it."""
        for path in _known_hosts_files(self.host):
            if path.is_file():
                try:
                    client.load_system_host_keys(str(path))
                except OSError as exc:  # unreadable: say so, but other files may still know it
                    log.warning("%s: cannot read known_hosts %s: %s", self.name, path, exc)
        policy = _KnownHostsPolicy(self.host, self.options.host_key_policy,
                                   _first_writable(self.host), jump_host)
        # paramiko duck-types the policy; subclassing would import paramiko at module load
        client.set_missing_host_key_policy(cast("paramiko.MissingHostKeyPolicy", policy))
        return policy

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
                channel.exec_command(line)
                STATS.add(self.name, commands=1, round_trips=START_ROUND_TRIPS)
            except Exception as exc:  # paramiko.SSHException, OSError, EOFError
                raise UnreachableError.single(
                    self.name, f"connection to {self._address_label()} lost: {exc}") from None
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
            channel.exec_command(line)
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
            while True:
                while channel.recv_ready():
                    out += channel.recv(65536)
                    alive.heard()
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    alive.heard()
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


class LocalConnection:
    """Runs commands on the controller (``delegate_to: localhost``, unit tests), via ``/bin/sh``."""

    def __init__(self, name: str = "localhost", *, become: bool = False,
                 command_timeout_s: float = 30.0) -> None:
        """Create a local connection named ``name``; ``become`` wraps commands in ``sudo -n``."""
        self.name = name
        self.become = become
        self.command_timeout_s = command_timeout_s
        self.calls: list[str] = []

    def run(self, command: str, *, sudo: bool | None = None,
            stdin: str | bytes | IO[bytes] | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        """Same contract as :meth:`HostConnection.run`, executed locally."""
        self.calls.append(command)
        use_sudo = self.become if sudo is None else sudo
        line = sudo_wrap(command) if use_sudo and os.geteuid() != 0 else command
        data = stdin.encode() if isinstance(stdin, str) else stdin
        if data is not None and not isinstance(data, bytes):
            data = data.read()
        started = time.monotonic()
        try:
            proc = subprocess.run(["/bin/sh", "-c", line], input=data, capture_output=True,
                                  timeout=timeout_s or self.command_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise UnreachableError.single(self.name, "local command timed out") from None
        result = CommandResult(proc.returncode, proc.stdout.decode(errors="replace"),
                               proc.stderr.decode(errors="replace"), time.monotonic() - started)
        if check and not result.ok:
            raise command_failed(self.name, command, result)
        return result


def command_failed(host: str, command: str, result: CommandResult) -> ProvisionError:
    """Build the error for a command that had to succeed and did not."""
    detail = (result.stderr.strip() or result.stdout.strip())[-2000:]
    return ProvisionError.single(host, f"command failed with exit status {result.exit_code}: "
                                       f"{command[:200]}", actual=detail)


def open_connections(hosts: Iterable[Host], options: ConnectionOptions,
                     factory: Callable[[Host], HostConnection] | None = None,
                     ) -> tuple[dict[str, HostConnection], dict[str, UnreachableError]]:
    """Open one connection per host, at most ``options.forks`` at once.

    Returns:
        ``(open connections by host name, errors by host name)``; every host is in exactly one.
    """
    make = factory or (lambda host: HostConnection(host, options))
    hosts = list(hosts)
    connections: dict[str, HostConnection] = {}
    errors: dict[str, UnreachableError] = {}

    def one(host: Host) -> tuple[str, HostConnection | UnreachableError]:
        conn = make(host)
        try:
            conn.open()
        except UnreachableError as exc:
            return host.name, exc
        except ProvisionError as exc:
            return host.name, UnreachableError(exc.problems)
        return host.name, conn

    if not hosts:
        return connections, errors
    with ThreadPoolExecutor(max_workers=max(1, min(options.forks, len(hosts)))) as pool:
        for name, outcome in pool.map(one, hosts):
            if isinstance(outcome, UnreachableError):
                errors[name] = outcome
            else:
                connections[name] = outcome
    return connections, errors


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
    "COMMAND_ROUND_TRIPS", "STATS", "CommandResult", "Connection", "ConnectionOptions",
    "ConnectionStats", "HostConnection", "HostKeyError",
    "JumpHost", "LocalConnection", "Problem", "UnreachableError", "close_all", "fingerprint_sha256",
    "known_hosts_name", "open_connections", "probe_tcp", "sudo_wrap",
]
