"""OpenSSH-style ServerAlive for a running command
(vllm_provision.transport.connection._AliveProbe): a
silent host that answers the keepalive request stays alive; one that answers nothing is lost
after ALIVE_COUNT_MAX intervals. The lab's `lab cut` mid-install case is in
tests/lab/test_stack_sync.py."""

from __future__ import annotations

import threading
import time

from vllm_provision.transport.connection import ALIVE_COUNT_MAX, _AliveProbe


class _Transport:
    """A paramiko transport's ``global_request``: answers at once, or never (a cut cable)."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.requests: list[str] = []
        self.closed = threading.Event()

    def global_request(self, kind: str, wait: bool = True) -> None:
        self.requests.append(kind)
        if not self.answers:
            self.closed.wait(30)

    def is_active(self) -> bool:
        return not self.closed.is_set()


def _watch(probe: _AliveProbe, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if probe.lost():
            return True
        time.sleep(0.01)
    return False


def test_a_silent_host_that_answers_keepalives_is_not_lost() -> None:
    transport = _Transport(answers=True)
    probe = _AliveProbe(transport, 1.0)
    probe.interval_s = 0.05
    assert not _watch(probe, 0.05 * ALIVE_COUNT_MAX * 4)
    assert transport.requests and set(transport.requests) == {"keepalive@openssh.com"}


def test_a_host_that_answers_nothing_is_lost_after_count_max_intervals() -> None:
    transport = _Transport(answers=False)
    probe = _AliveProbe(transport, 1.0)
    probe.interval_s = 0.05
    started = time.monotonic()
    assert _watch(probe, 5)
    assert 0.05 * ALIVE_COUNT_MAX <= time.monotonic() - started < 2
    assert transport.requests == ["keepalive@openssh.com"]  # one request in flight at a time
    transport.closed.set()


def test_output_counts_as_an_answer() -> None:
    transport = _Transport(answers=False)
    probe = _AliveProbe(transport, 1.0)
    probe.interval_s = 0.05
    deadline = time.monotonic() + 0.05 * ALIVE_COUNT_MAX * 3
    while time.monotonic() < deadline:
        probe.heard()  # a command that prints keeps its host alive
        assert not probe.lost()
        time.sleep(0.01)
    transport.closed.set()
