"""Host keys: the known_hosts files, the policy for an unknown key, and ProxyJump hops.

Fabric auto-accepts unknown keys (fabric/fabric#1804, #2071); we do not. The system file
``/etc/ssh/ssh_known_hosts``, the user file ``~/.ssh/known_hosts`` and the host's own
``known_hosts_files`` are loaded (:func:`known_hosts_files`); an unknown key is refused unless
the policy is ``accept-new`` (OpenSSH ``StrictHostKeyChecking=accept-new``, ssh_config(5)), which
appends it to the first writable file (:func:`first_writable`); a changed key is always refused.
:class:`~vllm_provision.transport.connection.HostConnection` sets :class:`KnownHostsPolicy` on the
target and on every ProxyJump hop (:class:`JumpHost`) Fabric builds from ``~/.ssh/config``.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_provision.core.models import Host
from vllm_provision.transport.base import HostKeyError, HostKeyPolicyName

if TYPE_CHECKING:  # paramiko loads lazily: `provision --help` must stay fast
    import paramiko

# The host-key warnings keep the logger name they had before this module was split out of
# connection.py (``-v`` prints it: "WARNING vllm_provision.transport.connection: ...").
log = logging.getLogger("vllm_provision.transport.connection")

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


def fingerprint_sha256(key_bytes: bytes) -> str:
    """Return OpenSSH's ``SHA256:<base64 without padding>`` fingerprint of a raw public key blob."""
    digest = hashlib.sha256(key_bytes).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """Return the known_hosts host field: ``addr`` on port 22, else ``[addr]:port`` (sshd(8))."""
    return address if port == 22 else f"[{address}]:{port}"


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


class KnownHostsPolicy:
    """Paramiko missing-host-key policy: refuse (``strict``) or learn and save (``accept-new``).

    ``jump_host`` is set when the policy guards a ProxyJump hop of ``host`` rather than ``host``
    itself: messages then name the jump host and the host it leads to.
    """

    def __init__(self, host: Host, policy: HostKeyPolicyName, write_file: Path | None,
                 jump_host: JumpHost | None = None) -> None:
        """Guard ``host`` (or its hop ``jump_host``) under ``policy``; learned keys are appended
        to ``write_file`` (:func:`first_writable`; None: nowhere to learn into)."""
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
        """Paramiko's hook for a key no loaded known_hosts file holds: learn it or refuse it.

        Under ``accept-new`` the key is appended to ``write_file`` once (re-read under a lock,
        so concurrent learners of one jump host write it once) and :attr:`accepted` is set to
        its fingerprint.

        Raises:
            HostKeyError: the policy is ``strict``; no writable known_hosts file; or another key
                for ``hostname`` was learned during this run.
        """
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


def known_hosts_files(host: Host) -> list[Path]:
    """The known_hosts files loaded for ``host``, ``~`` expanded: the system file, the user's,
    then the host's own ``known_hosts_files`` (a missing one is skipped by the caller)."""
    files = [SYSTEM_KNOWN_HOSTS, USER_KNOWN_HOSTS.expanduser(), *host.known_hosts_files]
    return [Path(os.path.expanduser(str(f))) for f in files]


def first_writable(host: Host) -> Path | None:
    """Where ``accept-new`` appends a learned key for ``host``: the first of its own
    ``known_hosts_files``, then ``~/.ssh/known_hosts``, that is writable (or can be created);
    None when none is."""
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


__all__ = [
    "SYSTEM_KNOWN_HOSTS", "USER_KNOWN_HOSTS", "JumpHost", "KnownHostsPolicy",
    "fingerprint_sha256", "first_writable", "known_hosts_files", "known_hosts_name",
]
