"""`lab delay` adds the asked one-way delay; `lab cut` blacks a host out until `lab heal`.

Cost: about 25 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import re
import time

import pytest
from vllm_provision_lab import Lab

pytestmark = pytest.mark.lab


def _rtt_ms(lab: Lab, source: str, target: str) -> float:
    """Least ping round trip from ``source`` to ``target`` in milliseconds, over 5 pings.

    The least, not the average: the delay is a floor every packet pays, while a busy machine
    (three lab workers on two cores) adds scheduling latency to some packets only; CI once saw
    an average of 42 ms for an asked 25 ms. ping's summary is ``min/avg/max/mdev``.
    """
    proc = lab.ssh(source, f"ping -c 5 -i 0.2 -q {target}")
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"= ([\d.]+)/[\d.]+/", proc.stdout)
    assert match, proc.stdout
    return float(match.group(1))


@pytest.fixture
def no_delay(lab: Lab):
    yield
    lab.delay("h1", 0)


def test_delay_raises_round_trip_by_the_asked_amount(lab: Lab, no_delay: None) -> None:
    before = _rtt_ms(lab, "h2", "h1")
    lab.delay("h1", 25)
    delayed = _rtt_ms(lab, "h2", "h1")
    # at least the asked delay, and not twice it (which a delay on both directions would give)
    assert 25 <= delayed - before < 2 * 25
    lab.delay("h1", 0)
    assert _rtt_ms(lab, "h2", "h1") < before + 5


def test_delay_to_one_peer_leaves_others_alone(lab: Lab, no_delay: None) -> None:
    lab.delay("h1", 30, peer="h2")
    assert _rtt_ms(lab, "h2", "h1") >= 30
    assert _rtt_ms(lab, "h1", lab.config.bridge_address) < 10


def test_cut_makes_ssh_time_out_and_heal_restores_it(lab: Lab) -> None:
    lab.cut("h2")
    try:
        started = time.monotonic()
        proc = lab.ssh("h2", "true", timeout_s=30)
        waited = time.monotonic() - started
        assert proc.returncode == 255
        assert "timed out" in proc.stderr.lower()
        assert waited >= 4  # a silent black hole: the connect waits out ConnectTimeout
        assert [s.state for s in lab.status() if s.name == "h2"] == ["unreachable"]
    finally:
        lab.heal("h2")
    assert lab.ssh("h2", "true").returncode == 0
    assert [s.cut for s in lab.status() if s.name == "h2"] == [False]
