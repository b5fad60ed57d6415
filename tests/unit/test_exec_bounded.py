"""``transport.connection.exec_bounded``: an exec request the host never answers ends at its
deadline (paramiko's ``Channel.exec_command`` waits without one), and a normal one passes."""

from __future__ import annotations

import threading
import time

import pytest

from vllm_provision.transport.connection import exec_bounded


class SilentChannel:
    """A channel whose exec request is never answered: ``exec_command`` waits until the
    channel is closed, then fails the way paramiko does (``SSHException("Channel closed.")``,
    here a RuntimeError stands in)."""

    def __init__(self, answer_after_s: float | None = None) -> None:
        self.closed = threading.Event()
        self.answer_after_s = answer_after_s
        self.commands: list[str] = []

    def exec_command(self, line: str) -> None:
        self.commands.append(line)
        if self.answer_after_s is not None and not self.closed.wait(self.answer_after_s):
            return
        self.closed.wait()
        raise RuntimeError("Channel closed.")

    def close(self) -> None:
        self.closed.set()


def test_an_unanswered_exec_request_times_out_and_closes_the_channel() -> None:
    channel = SilentChannel()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="within 0.3 s"):
        exec_bounded(channel, "true", 0.3)
    assert channel.closed.is_set()
    assert time.monotonic() - started < 5


def test_an_answered_exec_request_returns_and_leaves_the_channel_open() -> None:
    channel = SilentChannel(answer_after_s=0.05)
    exec_bounded(channel, "echo hi", 5.0)
    time.sleep(0.1)
    assert channel.commands == ["echo hi"]
    assert not channel.closed.is_set()


def test_an_error_before_the_deadline_is_the_channels_own() -> None:
    class Broken(SilentChannel):
        def exec_command(self, line: str) -> None:
            raise EOFError("transport closed")

    with pytest.raises(EOFError):
        exec_bounded(Broken(), "true", 5.0)
