"""A fake monotonic clock for the unit tests of code that waits: ``clock`` and ``sleep``
arguments that make a bounded wait instant and exact."""

from __future__ import annotations


class FakeClock:
    """Monotonic time that only advances when the code under test sleeps.

    Call it for the time (seconds, from 0.0); pass its ``sleep`` as the code's sleep, which
    records each sleep in ``sleeps`` and moves ``now`` on by it.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
