"""One remote command's output is bounded (``vllm_command_output_limit_mib``): past the cap the
channel is closed, nothing more is read, and the command fails naming the host, while the
connection stays usable."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.transport.connection import HostConnection


class Flood:
    """A paramiko channel stand-in that sends ``total`` bytes of stdout in 64 KiB reads and
    never exits."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.read = 0
        self.closed = False
        self.eof_received = False

    def exec_command(self, line: str) -> None: ...
    def shutdown_write(self) -> None: ...
    def settimeout(self, s: float) -> None: ...

    def recv_ready(self) -> bool:
        return self.left > 0 and not self.closed

    def recv(self, n: int) -> bytes:
        chunk = min(n, self.left)
        self.left -= chunk
        self.read += chunk
        return b"x" * chunk

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return self.left == 0

    def recv_exit_status(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    class status_event:  # noqa: N801 - paramiko's attribute name
        @staticmethod
        def wait(timeout: float) -> None: ...


class Transport:
    def __init__(self, channel: Flood) -> None:
        self.channel = channel
        self.clear_to_send_timeout = 30.0

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float) -> Flood:
        return self.channel

    def global_request(self, *args: Any, **kwargs: Any) -> None: ...


def _connection(channel: Flood, limit_mib: int | None) -> HostConnection:
    vars_ = {} if limit_mib is None else {"vllm_command_output_limit_mib": limit_mib}
    conn = HostConnection(Host("h1", "10.0.0.1", vars=vars_))
    transport = Transport(channel)

    class Client:
        def get_transport(self) -> Transport:
            return transport

    class Fabric:
        client = Client()

    conn._fabric = Fabric()
    return conn


def test_output_past_the_cap_fails_naming_the_host_and_reads_no_more() -> None:
    channel = Flood(10 << 20)
    conn = _connection(channel, 1)
    with pytest.raises(ProvisionError) as raised:
        conn.run("cat /dev/zero")
    text = raised.value.render()
    assert "h1" in text and "more than 1 MiB" in text and "vllm_command_output_limit_mib" in text
    assert channel.closed and channel.read <= (1 << 20) + 2 * 65536
    assert conn._broken is None  # the connection itself is fine


def test_output_under_the_default_cap_is_kept_whole() -> None:
    channel = Flood(3 << 20)
    conn = _connection(channel, None)
    assert conn.output_limit == 64 << 20
    result = conn.run("big")
    assert len(result.stdout) == 3 << 20 and result.exit_code == 0
