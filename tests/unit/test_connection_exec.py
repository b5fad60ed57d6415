"""How one command runs on an open connection (``HostConnection.run``), on a fake transport.

The channel here refuses ``fileno()``: selecting on a paramiko channel makes a pipe that the
transport thread may write to after the channel is closed (paramiko#2271, #692), which kills the
transport of a healthy host with EBADF ("Socket exception: Bad file descriptor (9)", seen in a CI
run's readiness wait). The command must be waited for without it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from vllm_provision.core.models import Host
from vllm_provision.transport.base import ConnectionOptions, UnreachableError
from vllm_provision.transport.connection import HostConnection


class FakeChannel:
    """A paramiko channel whose output and exit status arrive from another thread."""

    def __init__(self, chunks: list[bytes], exit_code: int, finish_after_s: float | None,
                 tail: bytes = b"", tail_after_s: float = 0.0, eof: bool = True) -> None:
        """``chunks`` arrive, then the exit status; ``tail`` arrives ``tail_after_s`` after the
        exit status (as sshd may send it), then EOF (unless ``eof`` is False)."""
        self.status_event = threading.Event()
        self.command = ""
        self.closed = False
        self.eof_received = False
        self._out = bytearray()
        self._code: int | None = None
        self._lock = threading.Lock()
        if finish_after_s is not None:
            def finish() -> None:
                for chunk in chunks:
                    with self._lock:
                        self._out += chunk
                with self._lock:
                    self._code = exit_code
                self.status_event.set()
                threading.Timer(tail_after_s, end).start()

            def end() -> None:
                with self._lock:
                    self._out += tail
                    self.eof_received = eof
            threading.Timer(finish_after_s, finish).start()

    def fileno(self) -> int:
        raise AssertionError("select() on a paramiko channel (its pipe races with close)")

    def exec_command(self, command: str) -> None:
        self.command = command

    def shutdown_write(self) -> None:
        """The fake reads no standard input: nothing to end."""

    def recv_ready(self) -> bool:
        with self._lock:
            return bool(self._out)

    def recv(self, size: int) -> bytes:
        with self._lock:
            data, self._out[:] = bytes(self._out[:size]), self._out[size:]
            return data

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_stderr(self, size: int) -> bytes:
        return b""

    def exit_status_ready(self) -> bool:
        return self._code is not None

    def recv_exit_status(self) -> int:
        assert self._code is not None
        return self._code

    def close(self) -> None:
        self.closed = True


class FakeTransport:
    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float) -> FakeChannel:
        return self.channel


def connected(channel: FakeChannel, **options: Any) -> HostConnection:
    conn = HostConnection(Host("h1", "192.0.2.1"), ConnectionOptions(**options))

    class Client:
        def get_transport(self) -> FakeTransport:
            return FakeTransport(channel)

    class Fabric:
        client = Client()

        def close(self) -> None:
            """No transport behind the fake: nothing to close."""

    conn._fabric = Fabric()
    return conn


def test_output_and_exit_status_arrive_without_selecting_on_the_channel() -> None:
    channel = FakeChannel([b"hello ", b"world\n"], 3, finish_after_s=0.2)
    result = connected(channel).run("echo hello world; exit 3", timeout_s=10)
    assert (result.exit_code, result.stdout) == (3, "hello world\n")
    assert channel.command == "echo hello world; exit 3" and channel.closed


def test_output_sent_after_the_exit_status_is_read_until_eof() -> None:
    """sshd sends the exit status when the child exits; bytes still in the pipe follow it, then
    EOF (OpenSSH session.c session_exit_message). The last line must not be lost."""
    channel = FakeChannel([b"first\n"], 0, finish_after_s=0.05, tail=b"last line\n",
                          tail_after_s=0.2)
    result = connected(channel).run("printf 'first\\n'; sleep 1; echo last line", timeout_s=10)
    assert (result.exit_code, result.stdout) == (0, "first\nlast line\n")


def test_a_command_whose_output_never_ends_returns_after_the_grace_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A background process left holding stdout keeps the channel open: the command returns
    with its exit status after EOF_GRACE_S, the connection stays usable."""
    import vllm_provision.transport.connection as connection

    monkeypatch.setattr(connection, "EOF_GRACE_S", 0.2)
    channel = FakeChannel([b"started\n"], 0, finish_after_s=0.05, eof=False)
    conn = connected(channel)
    result = conn.run("daemon &", timeout_s=10)
    assert (result.exit_code, result.stdout) == (0, "started\n")
    assert 0.2 <= result.duration_s < 2
    assert conn._broken is None


def test_a_command_past_its_timeout_marks_the_connection_lost() -> None:
    channel = FakeChannel([], 0, finish_after_s=None)  # never finishes
    conn = connected(channel)
    with pytest.raises(UnreachableError) as caught:
        conn.run("sleep 100", timeout_s=0.3)
    assert "timed out after 0.3 s" in str(caught.value)
    assert channel.closed
    with pytest.raises(UnreachableError):  # the connection stays marked lost
        conn.run("true", timeout_s=1)
