"""ProxyJump hops get the same host-key checking as the host they lead to.

Fabric 3.2.3 builds a ``gateway`` ``fabric.Connection`` per ProxyJump hop from ``~/.ssh/config``
and gives its paramiko client ``AutoAddPolicy`` (fabric/connection.py ``get_gateway``); these
tests point Fabric at a temporary ``$HOME/.ssh/config`` and, for the refusals, at an in-process
paramiko server on 127.0.0.1 standing in for the jump host (only the key exchange runs: the key
is refused before authentication, and the target address is never dialled).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from vllm_provision.core.models import Host
from vllm_provision.transport import base, hostkeys
from vllm_provision.transport.base import ConnectionOptions, HostKeyError, UnreachableError
from vllm_provision.transport.connection import HostConnection
from vllm_provision.transport.hostkeys import JumpHost, fingerprint_sha256

# TEST-NET-1 (RFC 5737): never routed, so a test that reached the target would hang, not pass
TARGET_ADDRESS = "192.0.2.10"


class JumpServer:
    """A paramiko server on 127.0.0.1 that completes the key exchange and refuses every login."""

    def __init__(self, host_key: paramiko.PKey) -> None:
        self.host_key = host_key
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.transports: list[paramiko.Transport] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # listener closed: the test is over
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.host_key)
            self.transports.append(transport)
            # the client drops the connection when it refuses the key: that is the point
            transport.start_server(event=threading.Event(), server=paramiko.ServerInterface())

    def close(self) -> None:
        self.listener.close()
        for transport in self.transports:
            transport.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``$HOME`` (Fabric reads ``~/.ssh/config`` from it), no system known_hosts."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(hostkeys, "SYSTEM_KNOWN_HOSTS", tmp_path / "no-system-known-hosts")
    (tmp_path / ".ssh").mkdir(mode=0o700)
    return tmp_path


@pytest.fixture
def jump_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


@pytest.fixture
def jump_server(jump_key: paramiko.PKey) -> Iterator[JumpServer]:
    server = JumpServer(jump_key)
    yield server
    server.close()


def write_ssh_config(home: Path, text: str) -> None:
    (home / ".ssh" / "config").write_text(text, encoding="ascii")


def known_hosts_line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def config_through(jump_port: int) -> str:
    return (f"Host target\n    HostName {TARGET_ADDRESS}\n    ProxyJump bastion\n"
            f"Host bastion\n    HostName 127.0.0.1\n    Port {jump_port}\n")


def open_target(policy: base.HostKeyPolicyName = "strict",
                name: str = "h1") -> HostConnection:
    options = ConnectionOptions(connect_timeout_s=5, connect_attempts=1, host_key_policy=policy)
    conn = HostConnection(Host(name, "target"), options)
    conn.open()
    return conn


def test_every_proxy_jump_hop_gets_our_policy_and_known_hosts(home: Path,
                                                               jump_key: paramiko.PKey) -> None:
    write_ssh_config(home, f"Host target\n    HostName {TARGET_ADDRESS}\n"
                           "    ProxyJump bastion1,bastion2\n"
                           "Host bastion1\n    HostName 192.0.2.1\n"
                           "Host bastion2\n    HostName 192.0.2.2\n    Port 2202\n")
    (home / ".ssh" / "known_hosts").write_text(
        known_hosts_line("192.0.2.1", jump_key) + known_hosts_line("[192.0.2.2]:2202", jump_key))
    conn = HostConnection(Host("h1", "target"))

    fabric_conn, _ = conn._prepare()

    hops, gateway = [], fabric_conn.gateway
    while gateway is not None:
        policy = gateway.client._policy
        assert isinstance(policy, hostkeys.KnownHostsPolicy)
        assert policy.jump_host == JumpHost(gateway.host, int(gateway.port))
        assert policy.host.name == "h1" and policy.policy == "strict"
        name = hostkeys.known_hosts_name(gateway.host, int(gateway.port))
        assert gateway.client._system_host_keys.lookup(name) is not None
        hops.append(gateway)
        gateway = gateway.gateway
    # Fabric's order: the last hop of the directive is dialled first (see docs/engine.md)
    assert conn.jump_hosts == [JumpHost("192.0.2.1", 22), JumpHost("192.0.2.2", 2202)]
    assert len(hops) == 2


def test_unknown_jump_host_key_is_refused_naming_the_jump_host(
        home: Path, jump_server: JumpServer, jump_key: paramiko.PKey) -> None:
    write_ssh_config(home, config_through(jump_server.port))

    with pytest.raises(HostKeyError) as caught:
        open_target("strict")

    message = caught.value.render()
    assert "unknown SSH host key" in message
    assert f"[127.0.0.1]:{jump_server.port}, the jump host (ProxyJump) for h1" in message
    assert fingerprint_sha256(jump_key.asbytes()) in message
    assert not (home / ".ssh" / "known_hosts").exists()


def test_changed_jump_host_key_is_refused_naming_the_jump_host(
        home: Path, jump_server: JumpServer, jump_key: paramiko.PKey) -> None:
    write_ssh_config(home, config_through(jump_server.port))
    old_key = paramiko.ECDSAKey.generate()
    entry = f"[127.0.0.1]:{jump_server.port}"
    (home / ".ssh" / "known_hosts").write_text(known_hosts_line(entry, old_key))

    with pytest.raises(HostKeyError) as caught:
        open_target("accept-new")  # accept-new never overrides a changed key

    message = caught.value.render()
    assert f"127.0.0.1:{jump_server.port}, the jump host (ProxyJump) for h1, CHANGED" in message
    assert fingerprint_sha256(old_key.asbytes()) in message
    assert fingerprint_sha256(jump_key.asbytes()) in message
    assert f"ssh-keygen -R '{entry}'" in message


def test_accept_new_learns_a_jump_host_key_once_for_all_hosts(
        home: Path, jump_server: JumpServer, jump_key: paramiko.PKey) -> None:
    write_ssh_config(home, config_through(jump_server.port))

    for name in ("h1", "h2"):
        # the key is learned, then the stand-in refuses the login: not a host-key error
        with pytest.raises(UnreachableError) as caught:
            open_target("accept-new", name)
        assert not isinstance(caught.value, HostKeyError)

    lines = (home / ".ssh" / "known_hosts").read_text().splitlines()
    assert lines == [known_hosts_line(f"[127.0.0.1]:{jump_server.port}", jump_key).strip()]


def learning_policy(home: Path) -> hostkeys.KnownHostsPolicy:
    return hostkeys.KnownHostsPolicy(Host("h1", "target"), "accept-new",
                                     home / ".ssh" / "known_hosts",
                                     JumpHost("192.0.2.1", 22))


def test_concurrent_learners_write_a_jump_host_key_once(home: Path,
                                                         jump_key: paramiko.PKey) -> None:
    for _ in range(2):  # two hosts' connections that loaded known_hosts before either wrote
        learning_policy(home).missing_host_key(paramiko.SSHClient(), "192.0.2.1", jump_key)

    assert (home / ".ssh" / "known_hosts").read_text() == known_hosts_line("192.0.2.1", jump_key)


def test_a_second_different_key_for_a_learned_jump_host_is_refused(
        home: Path, jump_key: paramiko.PKey) -> None:
    learning_policy(home).missing_host_key(paramiko.SSHClient(), "192.0.2.1", jump_key)

    with pytest.raises(HostKeyError, match="CHANGED during this run"):
        learning_policy(home).missing_host_key(paramiko.SSHClient(), "192.0.2.1",
                                               paramiko.ECDSAKey.generate())


def test_every_hop_is_bounded_by_the_connect_timeout_unless_ssh_config_sets_one(
        home: Path) -> None:
    write_ssh_config(home, f"Host target\n    HostName {TARGET_ADDRESS}\n"
                           "    ProxyJump bastion1,bastion2\n"
                           "Host bastion1\n    HostName 192.0.2.1\n    ConnectTimeout 3\n"
                           "Host bastion2\n    HostName 192.0.2.2\n")
    conn = HostConnection(Host("h1", "target"), ConnectionOptions(connect_timeout_s=7))

    fabric_conn, _ = conn._prepare()

    first, second = fabric_conn.gateway, fabric_conn.gateway.gateway
    assert (first.connect_timeout, second.connect_timeout) == (3, 7)
    for hop in (first, second):
        assert hop.connect_kwargs["banner_timeout"] == 7
        assert hop.connect_kwargs["auth_timeout"] == 7
