"""What every connection shares: the ``Connection`` protocol, its result and options, its errors.

:class:`Connection` is what modules and the runner need from a connection (the SSH
:class:`~vllm_provision.transport.connection.HostConnection`, the controller's
:class:`~vllm_provision.transport.local.LocalConnection`, a test's fake). Here too: the defaults
of the shared command-line options (``--timeout``, ``-f``, ``--host-key-policy``), the errors a
connection raises (:class:`UnreachableError`, :class:`HostKeyError`), how a command is wrapped in
non-interactive sudo (:func:`sudo_wrap`) and the error of a command that had to succeed
(:func:`command_failed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import quote

HostKeyPolicyName = Literal["strict", "accept-new"]

# The one set of defaults of the shared command-line options (``vllm_provision.cli.options``
# reads them from here): seconds for the SSH connect and for one command, parallel hosts.
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_FORKS = 10
DEFAULT_HOST_KEY_POLICY: HostKeyPolicyName = "strict"


class UnreachableError(ProvisionError):
    """The host cannot be reached: connect refused or timed out, authentication failed, host key
    refused, or an operation on an open connection timed out. The runner reports ``unreachable``.
    """


class HostKeyError(UnreachableError):
    """The host's SSH key is unknown (policy ``strict``) or differs from the known one."""


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


def sudo_wrap(command: str, become_user: str = "root") -> str:
    """Wrap ``command`` to run through non-interactive sudo as ``become_user``.

    ``sudo -n`` never prompts (sudo(8)): a missing NOPASSWD rule fails fast with "a password is
    required" instead of hanging the run.
    """
    return f"sudo -n -H -u {quote(become_user)} -- /bin/sh -c {quote(command)}"


def command_failed(host: str, command: str, result: CommandResult) -> ProvisionError:
    """Build the error for a command that had to succeed and did not."""
    detail = (result.stderr.strip() or result.stdout.strip())[-2000:]
    return ProvisionError.single(host, f"command failed with exit status {result.exit_code}: "
                                       f"{command[:200]}", actual=detail)


__all__ = [
    "DEFAULT_FORKS", "DEFAULT_HOST_KEY_POLICY", "DEFAULT_TIMEOUT_S", "CommandResult",
    "Connection", "ConnectionOptions", "HostKeyError", "HostKeyPolicyName", "UnreachableError",
    "command_failed", "sudo_wrap",
]
