"""SSH material of a lab instance: the key pair, per-host host keys, known_hosts and ssh_config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vllm_provision_lab.system import run


def ensure_key_pair(key_file: Path) -> None:
    """Create the lab's ed25519 key pair ``key_file`` (+ ``.pub``) unless it exists (mode 0600)."""
    if key_file.is_file() and key_file.with_suffix(".pub").is_file():
        return
    key_file.unlink(missing_ok=True)
    key_file.with_suffix(".pub").unlink(missing_ok=True)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-provision-lab",
         "-f", str(key_file)])


def make_host_key(root: Path) -> str:
    """Write a fresh ed25519 host key into ``<root>/etc/ssh`` and return its public line.

    Returns:
        ``"ssh-ed25519 AAAA..."`` (type and key, no comment).
    """
    private = root / "etc/ssh/ssh_host_ed25519_key"
    private.unlink(missing_ok=True)
    private.with_suffix(".pub").unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(private)])
    return host_public_key(root)


def host_public_key(root: Path) -> str:
    """Return ``"ssh-ed25519 AAAA..."`` of the host whose root is ``root``."""
    fields = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    return f"{fields[0]} {fields[1]}"


def known_hosts_text(entries: Sequence[tuple[str, str, str]]) -> str:
    """Return known_hosts lines for ``(name, address, public key)`` triples (name and address)."""
    return "".join(f"{name},{address} {key}\n" for name, address, key in entries)


def ssh_config_text(hosts: Sequence[tuple[str, str]], key_file: Path, known_hosts: Path) -> str:
    """Return an ssh_config(5) with one block per ``(name, address)``: root, lab key, strict keys.

    ``StrictHostKeyChecking yes`` with the lab's own known_hosts: a host whose key changed is
    refused, as on real servers.
    """
    blocks = []
    for name, address in hosts:
        blocks.append(
            f"Host {name} {address}\n"
            f"  HostName {address}\n"
            "  User root\n"
            f"  IdentityFile {key_file}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 5\n"
            "  LogLevel ERROR\n")
    return "\n".join(blocks)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temporary file and rename (readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.chmod(mode)
    partial.replace(path)
