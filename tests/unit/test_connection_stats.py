"""The connection layer's own counters (``stats.STATS``): what ``-vv`` prints and ``--json``
puts under ``stats``. Commands run on the fake transport of ``test_connection_exec``."""

from __future__ import annotations

import pytest
from test_connection_exec import FakeChannel, connected

from vllm_provision.output import report
from vllm_provision.runner.prefetch import PrefetchingConnection
from vllm_provision.transport.stats import COMMAND_ROUND_TRIPS, STATS, ConnectionStats


@pytest.fixture(autouse=True)
def _fresh_counters() -> None:
    STATS.reset()


def test_each_command_counts_once_with_its_round_trips() -> None:
    conn = connected(FakeChannel([b"5.10\n"], 0, finish_after_s=0.01))
    conn.run("uname -r", timeout_s=5)
    conn.run("uname -r", timeout_s=5)
    assert STATS.snapshot() == {"h1": {"connects": 0, "commands": 2,
                                       "round_trips": 2 * COMMAND_ROUND_TRIPS,
                                       "exchanges": 0}}


def test_a_prefetched_answer_sends_nothing() -> None:
    """A read the runner prefetched is one command on the wire; the module asking for it
    again is answered from the cache and sends nothing more."""
    wrapped = PrefetchingConnection(connected(FakeChannel([b"a\n"], 0, finish_after_s=0.01)))
    assert wrapped.prefetch(["cat /a"]) == 1
    assert wrapped.run("cat /a").stdout == "a\n"
    assert STATS.snapshot() == {"h1": {"connects": 0, "commands": 1,
                                       "round_trips": COMMAND_ROUND_TRIPS,
                                       "exchanges": 0}}


def test_counters_add_per_host_in_first_use_order_and_render_for_vv() -> None:
    stats = ConnectionStats()
    stats.add("h2", connects=1)
    stats.add("h1", commands=1, round_trips=3)
    stats.add("h2", commands=2, round_trips=6)
    snap = stats.snapshot()
    assert list(snap) == ["h2", "h1"]
    assert snap["h2"] == {"connects": 1, "commands": 2, "round_trips": 6, "exchanges": 0}
    assert report.stats_lines(snap)[0] == ("ssh h2: 1 connection(s), 2 remote command(s), "
                                           "6 round trip(s) after connecting")
    snap["h1"]["commands"] = 99  # a copy
    assert stats.snapshot()["h1"]["commands"] == 1
