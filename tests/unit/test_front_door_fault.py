"""``provision fault --front-door HOST`` (evidence/front_door.py): what a client of the front door
saw and when the router stopped and resumed sending to the replica, from the watch's records;
the JSON validates against fault's schema."""

from __future__ import annotations

from vllm_provision.cli import json_schemas
from vllm_provision.evidence.front_door import (
    SETTLE_S,
    FrontDoorWatch,
    finished_count,
    sent_again,
    summarise,
)

METRICS = """\
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 40.0
vllm:request_success_total_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
"""


def test_the_finished_count_sums_every_reason_and_ignores_created() -> None:
    assert finished_count(METRICS) == 43.0
    assert finished_count("# nothing here\n") is None


def test_the_router_sends_again_when_the_count_grows_past_its_value_after_the_settle() -> None:
    served = 100.0
    counts = [(99.0, 10.0), (100.2, 11.0),  # the recovery probe's own completion
              (100.0 + SETTLE_S + 0.1, 11.0), (101.0, 11.0), (101.5, 12.0), (102.0, 20.0)]
    assert sent_again(counts, served) == 101.5
    assert sent_again(counts[:4], served) is None


def test_the_summary_times_the_router_s_decisions_against_the_fault_and_the_recovery() -> None:
    fault = 50.0
    outcomes = [(49.0, None), (50.1, "incomplete"), (51.0, None), (52.0, "http_500")] + [
        (53.0 + i, None) for i in range(196)]
    views = [(49.5, True), (50.5, True), (52.6, False), (55.0, False), (60.9, True)]
    counts = [(61.0, 5.0), (61.6, 5.0), (62.1, 6.0)]
    seen = summarise("h1", "http://10.0.0.11:30000", "http://10.0.0.12:8000", outcomes, views,
                     fault, 10.5, counts)
    assert seen["requests"] == 200 and seen["failed"] == 2 and seen["failed_pct"] == 1.0
    assert seen["failures"] == {"http_500": 1, "incomplete": 1}
    assert seen["failed_at_s"] == [0.1, 2.0]
    assert seen["marked_down_s"] == 2.6 and seen["marked_up_s"] == 0.4
    assert seen["sent_again_s"] == 1.6
    never = summarise("h1", "u", "w", [], [(51.0, True)], fault, None)
    assert never["marked_down_s"] is None and never["marked_up_s"] is None
    assert never["sent_again_s"] is None and never["failed_pct"] is None
    result = {"kind": "fault", "time": "2026-12-04T00:00:00Z",
              "target": {"host": "h1", "rank": 0, "unit": "vllm.service", "signal": "KILL",
                         "reboot": False, "partition_s": None, "applied": "x"},
              "conditions": {"replica": "a", "backend": "mp", "model": "/m",
                             "tensor_parallel_size": 4, "pipeline_parallel_size": 1,
                             "hosts": ["h1"]},
              "streams": [], "recovery": {}, "start_limit_hit": [], "events": [],
              "front_door": seen, "stored": "/tmp/x.json"}
    json_schemas.validate("fault", result)


def test_a_workers_answer_is_read_for_the_replica_only() -> None:
    watch = FrontDoorWatch("h1", "http://g:30000", "http://10.0.0.11:8000", "m")
    healthy = ('{"workers": [{"url": "http://10.0.0.11:8000", "is_healthy": true, "load": 0}, '
               '{"url": "http://10.0.0.12:8000", "is_healthy": false}]}')
    assert watch.healthy(healthy)
    assert not watch.healthy(healthy.replace("true", "false"))
    assert not watch.healthy('{"workers": []}') and not watch.healthy("not json")
    assert not watch.healthy('["a list"]')
