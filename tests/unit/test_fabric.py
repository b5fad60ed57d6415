"""``provision fabric`` (vllm_provision/evidence/fabric.py): the probe script both ends run,
run here for real over loopback (two python3 processes, one TCP connection), and the verdict
against the links' rated speeds (docs/evidence.md, "provision fabric")."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_provision.evidence import fabric


class LocalConnection:
    """Runs a probe command on this machine (``python3`` is this interpreter's)."""

    def run(self, command: str, timeout_s: float = 60) -> Any:
        command = command.replace(" python3 ", f" {sys.executable} ", 1)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        return SimpleNamespace(stdout=done.stdout, stderr=done.stderr, exit_status=done.returncode)


def _node(name: str, rank: int, ip: str = "127.0.0.1") -> Any:
    return SimpleNamespace(name=name, rank=rank, host_ip=ip)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_probe_measures_rtt_and_what_the_receiver_counted_over_loopback() -> None:
    conns = {"h1": LocalConnection(), "h2": LocalConnection()}
    pair = fabric.measure_pair(conns, _node("h1", 0), _node("h2", 1), port=_free_port(),
                               seconds=0.5, interfaces={"h1": "lo", "h2": "lo"})
    assert pair["problem"] is None, pair
    assert pair["bytes"] > 0 and 0 < pair["seconds"] <= 5
    assert pair["gbps"] == pytest.approx(pair["bytes"] * 8 / pair["seconds"] / 1e9, rel=0.01)
    assert 0 < pair["rtt_ms"]["min"] <= pair["rtt_ms"]["median"]
    assert pair["links"]["h1"]["interface"] == "lo" and pair["links"]["h1"]["mtu"] > 0


def test_a_receiver_nobody_reaches_is_the_pairs_problem_not_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fabric, "CONNECT_WAIT_S", 1.0)
    conns = {"h1": LocalConnection(), "h2": LocalConnection()}
    # b's address is not one of this machine's (TEST-NET-1): it cannot listen there, and the
    # sender gives up connecting after its wait
    a, b = _node("h1", 0), _node("h2", 1, "192.0.2.1")
    pair = fabric.measure_pair(conns, a, b, port=_free_port(), seconds=0.2,
                               interfaces={"h1": "lo", "h2": "lo"})
    assert pair["gbps"] is None and pair["problem"], pair
    judged = fabric.judge(pair, 0.5, SimpleNamespace(tensor_parallel_size=4,
                                                     pipeline_parallel_size=2), 2)
    assert judged["verdict"] == "failed" and "not measured" in fabric.describe(judged)


def _measured(gbps: float, speeds: tuple[int | None, int | None],
              mtus: tuple[int, int] = (9000, 9000)) -> dict[str, Any]:
    return {"a": "h1", "b": "h2", "gbps": gbps, "rtt_ms": {"min": 0.1, "median": 0.2},
            "links": {"h1": {"interface": "eth0", "speed_mbps": speeds[0], "mtu": mtus[0]},
                      "h2": {"interface": "eth0", "speed_mbps": speeds[1], "mtu": mtus[1]}},
            "problem": None}


@pytest.mark.parametrize(("gbps", "speeds", "verdict", "ratio"), [
    (60.0, (100000, 100000), "ok", 0.6),
    (8.0, (100000, 25000), "slow", 0.32),      # the slower end's rate counts
    (9.0, (None, 10000), "unrated", None),      # a virtual link has no rate
])
def test_the_verdict_is_the_measured_share_of_the_slower_ends_rate(
        gbps: float, speeds: tuple[int | None, int | None], verdict: str,
        ratio: float | None) -> None:
    engine = SimpleNamespace(tensor_parallel_size=8, pipeline_parallel_size=2)
    judged = fabric.judge(_measured(gbps, speeds), 0.5, engine, 2)
    assert (judged["verdict"], judged["ratio"]) == (verdict, ratio)
    assert bool(judged["causes"]) == (verdict == "slow")


def test_a_slow_links_causes_start_with_what_the_links_show() -> None:
    engine = SimpleNamespace(tensor_parallel_size=8, pipeline_parallel_size=1)
    mismatch = fabric.judge(_measured(1.0, (10000, 10000), (9000, 1500)), 0.5, engine, 2)
    assert mismatch["causes"][0].startswith("the MTUs differ (h1 9000, h2 1500)")
    assert "tensor parallelism spanning nodes" in mismatch["causes"][-1]
    small = fabric.judge(_measured(1.0, (10000, 10000), (1500, 1500)), 0.5,
                         SimpleNamespace(tensor_parallel_size=4, pipeline_parallel_size=2), 2)
    assert small["causes"][0].startswith("a small MTU (1500)")
    assert not any("tensor parallelism" in c for c in small["causes"])  # TP within a node


def test_the_probe_command_quotes_every_value_and_is_bounded() -> None:
    command = fabric.probe_command("receive", "10.0.0.2", 29499, 3.0, "eth 0; rm -rf /",
                                   "10.0.0.1", 53)
    assert command.startswith("timeout 53 python3 -c 'import base64;exec(compile(base64.b64decode(")
    assert "'eth 0; rm -rf /'" in command


def test_parse_line_takes_the_last_json_object() -> None:
    assert fabric.parse_line('noise\n{"a": 1}\n') == {"a": 1}
    assert "no result" in fabric.parse_line("Killed\n")["error"]


def test_pairs_are_measured_one_at_a_time_in_rank_order() -> None:
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def fake(conns: Any, a: Any, b: Any, **_: Any) -> dict[str, Any]:
        with lock:
            seen.append((a.name, b.name))
        return _measured(5.0, (10000, 10000))

    replica = SimpleNamespace(name="r", backend="mp", engine=SimpleNamespace(
        tensor_parallel_size=4, pipeline_parallel_size=3),
        nodes=[_node("h3", 2), _node("h1", 0), _node("h2", 1)])
    original = fabric.measure_pair
    fabric.measure_pair = fake  # type: ignore[assignment]
    try:
        result = fabric.run(replica, {}, {})
    finally:
        fabric.measure_pair = original  # type: ignore[assignment]
    assert seen == [("h1", "h2"), ("h1", "h3"), ("h2", "h3")]
    assert [p["verdict"] for p in result["pairs"]] == ["ok"] * 3
    assert result["collective"]["run"] is False


def test_the_record_shows_the_stored_fabric_result_or_says_there_is_none() -> None:
    from vllm_provision.evidence import record

    assert "not tested" in record.fabric_rows({"fabric": None})[0]
    pair = fabric.judge(_measured(9.4, (10000, 10000)), 0.5,
                        SimpleNamespace(tensor_parallel_size=4, pipeline_parallel_size=2), 2)
    [row] = record.fabric_rows({"fabric": {"time": "2026-12-04T12:00:00Z", "pairs": [pair]}})
    assert row.startswith("- h1 to h2: 9.4 Gb/s of 10 Gb/s rated (94%), RTT min 0.1 ms")
    assert ": ok (2026" in row


def _replica(*nodes: Any) -> Any:
    return SimpleNamespace(name="r", backend="mp", nodes=list(nodes), engine=SimpleNamespace(
        tensor_parallel_size=4, pipeline_parallel_size=2))


def test_the_collective_is_skipped_with_the_reason_on_a_node_without_torch() -> None:
    conns = {"h1": LocalConnection(), "h2": LocalConnection()}
    result = fabric.collective(_replica(_node("h1", 0), _node("h2", 1)), conns, {},
                               {"h1": sys.executable, "h2": sys.executable}, port=_free_port(),
                               bound_s=30)
    if result["run"]:  # this interpreter has torch: the gloo collective ran over loopback
        assert result["backend"] == "gloo" and result["world_size"] == 2
        return
    assert result["reason"].startswith("h1: no torch in ") and "h2: no torch" in result["reason"]
    assert "not run: h1: no torch" in fabric.describe_collective(result)


class CannedConnection:
    """Answers the collective's command with one canned JSON line (what a node printed)."""

    def __init__(self, line: dict[str, Any]) -> None:
        self.line = line

    def run(self, command: str, timeout_s: float = 60) -> Any:
        import json

        assert command.startswith("timeout 120 /opt/vllm/bin/python3 -c ")
        return SimpleNamespace(stdout=json.dumps(self.line) + "\n", stderr="", exit_status=0)


def test_the_collective_reports_rank_0s_figures_or_each_nodes_failure() -> None:
    sizes = [{"bytes": 1 << 20, "all_reduce": {"time_ms": 1.0, "algbw_gbytes": 1.049,
                                               "busbw_gbytes": 1.049},
              "all_gather": {"time_ms": 0.5, "algbw_gbytes": 2.097, "busbw_gbytes": 1.049}}]
    good = {"rank": 0, "backend": "gloo", "torch": "2.9.0", "sizes": sizes}
    pythons = {"h1": "/opt/vllm/bin/python3", "h2": "/opt/vllm/bin/python3"}
    replica = _replica(_node("h1", 0), _node("h2", 1))
    ran = fabric.collective(replica, {"h1": CannedConnection(good),
                                      "h2": CannedConnection({**good, "rank": 1})},
                            {}, pythons, port=29499)
    assert ran == {"run": True, "reason": None, "backend": "gloo", "torch": "2.9.0",
                   "world_size": 2, "sizes": sizes}
    assert "1 MiB: all-reduce 1.049 (1.0 ms), all-gather 1.049 (0.5 ms)" in \
        fabric.describe_collective(ran)
    failed = fabric.collective(replica, {"h1": CannedConnection(good), "h2": CannedConnection(
        {"rank": 1, "error": "DistNetworkError: timed out"})}, {}, pythons, port=29499)
    assert failed == {"run": False, "reason": "h2: DistNetworkError: timed out"}
