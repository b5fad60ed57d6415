"""Pure parts of bench, fault and record: statistics, /metrics deltas, journal parsing, the
record's refusals."""

from __future__ import annotations

import copy

from vllm_provision.evidence import fault, load, record, stats

METRICS = """# HELP vllm:time_to_first_token_seconds x
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.04",engine="0",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{le="0.06",engine="0",model_name="m"} COUNT
vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="0",model_name="m"} COUNT
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} SUM
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} COUNT
"""


def test_percentile_interpolates_between_closest_ranks() -> None:
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile([5.0], 99) == 5.0
    assert stats.percentile([], 50) is None


def test_histogram_delta_counts_only_the_run() -> None:
    before = stats.parse_histograms(METRICS.replace("COUNT", "2.0").replace("SUM", "0.1"))
    after = stats.parse_histograms(METRICS.replace("COUNT", "6.0").replace("SUM", "0.3"))
    delta = stats.histogram_deltas(before, after)["ttft_s"]
    assert delta["count"] == 4.0 and delta["mean"] == 0.05
    assert 0.04 < delta["p50"] <= 0.06  # inside the bucket holding the rank


def test_seeded_inputs_repeat() -> None:
    assert load.seeded_prompts(3, 5, 1) == load.seeded_prompts(3, 5, 1)
    assert load.seeded_prompts(3, 5, 1) != load.seeded_prompts(3, 5, 2)
    assert load.arrival_offsets(3, None, 0) == [0.0, 0.0, 0.0]


def test_journal_lines_become_timed_events_and_start_limits() -> None:
    text = ("1000.5 h2 systemd[1]: vllm.service: Main process exited, code=killed\n"
            "1001.0 h2 systemd[1]: vllm.service: Start request repeated too quickly.\n"
            "1002.0 h2 python3[9]: unrelated\n"
            "1003.0 h2 vllm-watchdog[7]: restarting vllm.service\n"
            "@@result vllm.service start-limit-hit\n")
    events, limited = fault.parse_journal("h2", text, 1000.0)
    assert [(e["t_s"], e["source"]) for e in events] == [(0.5, "systemd"), (1.0, "systemd"),
                                                         (3.0, "watchdog")]
    assert limited == ["h2:vllm.service"]
    # not recovered: the units' own last lines come too, the newest ones, printable text only
    text += "".join(f"{1004 + i}.0 h2 vllm[9]: waiting {i}\n" for i in range(3))
    events, _ = fault.parse_journal("h2", text, 1000.0, unit_lines=2)
    assert [(e["source"], e["message"]) for e in events if e["source"] == "unit"] == [
        ("unit", "waiting 1"), ("unit", "waiting 2")]


def test_kill_command_quotes_the_unit() -> None:
    assert fault.kill_command("vllm.service", "STOP").endswith(
        "--kill-whom=all --signal=SIGSTOP -- vllm.service")
    assert "'a b.service'" in fault.kill_command("a b.service", "KILL")


def bench_facts(backend: str, gpus: list[int]) -> dict:
    ranks = [{"rank": 0, "host": "h1", "gpus": gpus}, {"rank": 1, "host": "h2", "gpus": gpus}]
    cond = {"model": "m", "dtype": "auto", "tensor_parallel_size": 4,
            "pipeline_parallel_size": 2, "vllm_version": "1", "hosts": [
                {"host": "h1", "address": "a"}, {"host": "h2", "address": "b"}],
            "inputs": {"digest": "d", "requests": 1, "concurrency": 1, "rate": None},
            "placement": {"kind": "ranks", "ranks": ranks}}
    return {"backend": backend, "bench": {"conditions": cond}}


def test_record_refuses_to_credit_the_backend_when_placement_differs() -> None:
    same = record.refusals(bench_facts("mp", [0, 1, 2, 3]), bench_facts("ray", [0, 1, 2, 3]))
    assert same == []
    moved = record.refusals(bench_facts("mp", [0, 1, 2, 3]), bench_facts("ray", [4, 5, 6, 7]))
    assert len(moved) == 1 and "placement differs" in moved[0]
    other = bench_facts("ray", [0, 1, 2, 3])
    other = copy.deepcopy(other)
    other["bench"]["conditions"]["model"] = "n"
    assert any("model differs" in line for line in record.refusals(bench_facts("mp", [0]),
                                                                   other))


def test_the_evidence_file_is_written_atomically_and_private(tmp_path, monkeypatch):
    import stat

    from vllm_provision.evidence import store

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all: {}\n")
    path = store.update(inventory, bench={"kind": "bench"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store.read(inventory)["bench"] == {"kind": "bench"}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def _closing_facts(backend: str, pool: str) -> dict:
    facts = bench_facts(backend, [0, 1])
    facts["pool"] = pool
    facts["faults"] = {}
    facts["bench"]["client"] = {"completed": 7, "requests": 8}
    return facts


def test_the_closing_sentence_asks_who_reserves_the_gpus_of_the_backend() -> None:
    # mp leaves reservation to the platform; Ray's placement group reserves the GPUs itself
    assert record.closing(_closing_facts("mp", "dedicated")).startswith(
        "Keep mp: the platform reserves the GPUs")
    assert record.closing(_closing_facts("mp", "shared")).startswith(
        "Reconsider mp: nothing reserves the GPUs in a shared pool")
    assert record.closing(_closing_facts("ray", "shared")).startswith(
        "Keep Ray: Ray's placement group reserves the GPUs")
    assert record.closing(_closing_facts("ray", "dedicated")).startswith("Reconsider Ray")
    assert "7 of 8 benchmark requests" in record.closing(_closing_facts("mp", "dedicated"))
