"""What operators see while waiting and reading logs: vLLM's phases from its own lines, the
incremental journal read, the progress rows (plain, never an escape code), `provision logs`'
commands, parsing and merge, and the units each backend names per kind."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.inventory import load_inventory
from vllm_provision.output import logs, progress
from vllm_provision.output.phases import PHASES, JournalTail, label_of, phase_of, split_output

# Lines as vLLM 0.32.0 prints them (texts from the installed package, see phases.py), with the
# process prefix its logger adds.
REAL_LINES = [
    ("(EngineCore pid=164) INFO 12-01 10:00:00 [gpu_model_runner.py:5040] Starting to load "
     "model /models/llama...", "loading weights"),
    ("Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:00<00:00,  4.45it/s]",
     "loading weights 40% (2/5 shards)"),
    ("(EngineCore pid=164) INFO 12-01 10:00:19 [default_loader.py:502] Loading weights took "
     "19.62 seconds", "weights loaded"),
    ("(Worker pid=170) DEBUG 12-01 10:00:20 [gpu_worker.py:758] Memory profiling takes 2.10 "
     "seconds. Total non KV cache memory: 14.1GiB", "profiling memory"),
    ("(Worker pid=170) INFO 12-01 10:00:21 [gpu_worker.py:760] Available KV cache memory: "
     "101.3 GiB", "sizing the KV cache"),
    ("(EngineCore pid=164) INFO 12-01 10:00:21 [kv_cache_utils.py:2328] GPU KV cache size: "
     "3,284,992 tokens, Maximum concurrency for 8,192 tokens per request: 401.00x",
     "sizing the KV cache"),
    ("INFO 12-01 10:00:21 [executor_base.py:1] # GPU blocks: 27000, # CPU blocks: 2048",
     "sizing the KV cache"),
    ("INFO 12-01 10:00:21 [cpu_model_runner.py:87] Warming up model for the compilation...",
     "compiling"),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|####      | 27/67",
     "capturing CUDA graphs 40%"),
    ("(EngineCore pid=164) INFO 12-01 10:00:30 [core.py:403] init engine (profile, create kv "
     "cache, warmup model) took 11.02 s", "engine ready"),
    ("(APIServer pid=1) INFO 12-01 10:00:31 [entry.py:140] Starting vLLM server on "
     "http://0.0.0.0:8000", "API server up"),
    ("(APIServer pid=1) INFO:     Application startup complete.", "API server up"),
]


@pytest.mark.parametrize(("line", "phase"), REAL_LINES)
def test_phase_of_reads_vllms_own_lines(line: str, phase: str) -> None:
    assert phase_of(line) == phase
    assert label_of(phase) in PHASES


def test_other_lines_announce_no_phase() -> None:
    assert phase_of('INFO 12-01 10:00:40 [launcher.py:1] "GET /health HTTP/1.1" 200') is None
    assert phase_of("") is None


def _poll(invocation: str, lines: list[str], cursor: str | None) -> str:
    out = f"== vllm-provision journal vllm.service {invocation}\n" + "".join(
        line + "\n" for line in lines)
    return out + (f"-- cursor: {cursor}\n" if cursor else "")


def test_journal_tail_follows_the_cursor_and_starts_afresh_on_a_new_invocation() -> None:
    tail = JournalTail()
    first = tail.command("h1", ["vllm.service"])
    assert "--after-cursor" not in first and "_SYSTEMD_INVOCATION_ID" in first
    tail.feed("h1", _poll("aaa", [REAL_LINES[0][0], REAL_LINES[1][0]], "s=1;i=2"))
    assert tail.phase("h1") == "loading weights 40% (2/5 shards)"
    again = tail.command("h1", ["vllm.service"])
    assert f"--after-cursor={shlex.quote('s=1;i=2')}" in again and "= aaa ]" in again
    tail.feed("h1", _poll("aaa", [], None))  # nothing new: phase and cursor stay
    assert tail.phase("h1").startswith("loading weights")
    assert "--after-cursor" in tail.command("h1", ["vllm.service"])
    tail.feed("h1", _poll("bbb", ["INFO: unrelated"], "s=9"))  # the unit restarted
    assert tail.phase("h1") == ""
    assert tail.phase("h2") == ""


def test_journal_output_is_split_from_the_unit_poll() -> None:
    head, journal = split_output("Id=vllm.service\nActiveState=active\n\nclock 1 2\n"
                                 "== vllm-provision journal vllm.service x\nId=not-a-unit\n")
    assert journal.startswith("== vllm-provision journal") and "Id=not-a-unit" not in head


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_progress_prints_changes_and_every_interval_without_escape_codes() -> None:
    stream = io.StringIO()
    clock = _Clock()
    progress.configure("plain", stream)
    try:
        with progress.wait("replica llm: waiting", ["h1", "h2"], clock=clock) as view:
            view.update("h1", state="vllm.service active (running)", phase="loading weights")
            view.update("h1", phase="loading weights")  # no change: no line
            clock.now += progress.PLAIN_EVERY_S
            view.update("h1", phase="loading weights")  # the interval passed: a line
            view.update("h2", phase="\x1b[2Jevil")  # host text is made printable
            view.finish("serving")
    finally:
        progress.configure("off")
    lines = stream.getvalue().splitlines()
    assert "\x1b" not in stream.getvalue()
    h1 = [line for line in lines if line.startswith("[replica llm: waiting] h1 ")]
    assert h1[1] == "[replica llm: waiting] h1 0 s vllm.service active (running): loading weights"
    assert h1[2].startswith("[replica llm: waiting] h1 10 s ") and len(h1) == 4
    assert lines[-1].endswith(": \\x1b[2Jevil (serving)")


def test_progress_mode_is_live_only_on_a_terminal_without_json() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert progress.choose_mode(json_mode=False, stream=Tty()) == "live"
    assert progress.choose_mode(json_mode=True, stream=Tty()) == "plain"
    assert progress.choose_mode(json_mode=False, stream=io.StringIO()) == "plain"


def test_since_takes_durations_and_iso_times() -> None:
    assert logs.parse_since("10m", now=1000.0) == 400.0
    assert logs.parse_since("1d", now=100000.0) == 13600.0
    assert logs.parse_since("2026-12-01T00:00:00+00:00") == 1796083200.0
    with pytest.raises(ProvisionError, match="not a time"):
        logs.parse_since("yesterday; rm -rf /")


@pytest.mark.parametrize("since", ["0999-01-01", "0001-01-01T00:00+00:00", "1969-12-31",
                                   "9" * 400 + "d", "100000d"])
def test_since_before_the_journal_epoch_is_a_clear_error(since: str) -> None:
    with pytest.raises(ProvisionError, match="before 1970-01-01") as caught:
        logs.parse_since(since, now=1796083200.0)
    assert caught.value.problems[0].fix


def test_journal_times_out_of_range_are_shown_never_a_crash() -> None:
    assert logs.format_time(-30641760000_000000) == "0999-01-01T00:00:00.000000Z"  # 4 digits
    assert logs.format_time(logs.MAX_TIME_US) == "9999-12-31T23:59:59.999999Z"
    for time_us in (logs.MAX_TIME_US + 1, logs.MIN_TIME_US - 1, -10**30):
        assert logs.format_time(time_us) == f"(time out of range: {time_us} us)"
    entry = logs.parse_entry(_entry(10**25, MESSAGE="clock gone wrong"), "h1", 0, ["v.service"])
    assert entry is not None
    assert logs.line_parts(entry, 2, 9)[0] == f"(time out of range: {10**25} us)"
    assert logs.merge([[entry], logs.parse_entries(_entry(5, MESSAGE="ok"), "h2", 1, [])])[0] \
        .message == "ok"
    assert logs.parse_entry("[" * 100_000, "h1", 0, []) is None  # nesting: not a crash


def test_journal_command_quotes_every_unit_and_follows_from_the_cursor() -> None:
    command = logs.journal_command(["vllm.service", "a b.service"], since=12.5, lines=None)
    words = shlex.split(command)
    assert words[:5] == ["journalctl", "-q", "--no-pager", "-o", "json"]
    assert ["-u", "a b.service"] == words[words.index("a b.service") - 1:][:2]
    assert "--since=@12.500000" in words and "-n" not in words
    follow = logs.follow_command(["vllm.service"], cursor="s=1;x=2")
    assert shlex.quote("--after-cursor=s=1;x=2") in follow and "kill" in follow
    assert "-n 0" in logs.follow_command(["vllm.service"])


def _entry(time_us: int, **fields: Any) -> str:
    return json.dumps({"__REALTIME_TIMESTAMP": str(time_us), "__CURSOR": f"c{time_us}",
                       **fields})


def test_entries_are_tagged_with_their_unit_and_merged_in_time_order() -> None:
    units = ["vllm.service", "vllm-watchdog.service"]
    h1 = logs.parse_entries("\n".join([
        _entry(30, MESSAGE="three", _SYSTEMD_UNIT="vllm.service"),
        _entry(10, MESSAGE="Started vllm-watchdog.service.", _SYSTEMD_UNIT="init.scope",
               UNIT="vllm-watchdog.service"),
        "not json"]), "h1", 0, units)
    h2 = logs.parse_entries(_entry(20, MESSAGE=[104, 105, 27], _SYSTEMD_UNIT="vllm.service"),
                            "h2", 1, units)
    merged = logs.merge([h1, h2])
    assert [(e.host, e.unit, e.message) for e in merged] == [
        ("h1", "vllm-watchdog.service", "Started vllm-watchdog.service."),
        ("h2", "vllm.service", "hi\\x1b"), ("h1", "vllm.service", "three")]
    assert h1[-1].cursor == "c10"
    assert logs.format_time(1796083200_123456) == "2026-12-01T00:00:00.123456Z"


INVENTORY = """\
all:
  vars: {{ansible_user: root}}
  children:
    vllm_replicas:
      children:
        llm:
          vars: {{vllm_model: /srv/models/m, vllm_backend: {backend}, vllm_tensor_parallel_size: 4,
                 vllm_pipeline_parallel_size: 2, ray_num_gpus: 4}}
          hosts:
            h1: {{ansible_host: 10.0.0.11, vllm_node_rank: 0}}
            h2: {{ansible_host: 10.0.0.12, vllm_node_rank: 1, vllm_watchdog_unit_name: wd.service}}
"""


@pytest.mark.parametrize(("backend", "expected"), [
    ("mp", {"h1": {"vllm": ["vllm.service"], "watchdog": ["vllm-watchdog.service"]},
            "h2": {"vllm": ["vllm.service"], "watchdog": ["wd.service"]}}),
    ("ray", {"h1": {"vllm": ["vllm.service"], "ray": ["ray-head.service"],
                    "watchdog": ["vllm-watchdog.service"]},
             "h2": {"vllm": [], "ray": ["ray-worker.service"], "watchdog": ["wd.service"]}}),
])
def test_backends_name_their_units_by_kind(tmp_path: Path, backend: str,
                                            expected: dict[str, Any]) -> None:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY.format(backend=backend))
    [replica] = load_inventory(path).replicas
    found = {node.name: replica.backend_type.journal_units(replica, node, node.host.vars)
             for node in replica.nodes}
    assert found == expected


def test_live_progress_keeps_each_rows_last_state_when_two_waits_overlap() -> None:
    stream = io.StringIO()
    progress.configure("live", stream)
    try:
        with progress.wait("replica a: waiting", ["h1"]) as first:
            first.update("h1", state="vllm.service active (running)", phase="[bold]x")
            with progress.wait("replica b: waiting", ["h3"]) as second:
                second.update("h3", phase="API server up")
            first.finish("serving")
    finally:
        progress.configure("off")
    text = stream.getvalue()
    assert "[replica b: waiting] h3 0 s: API server up" in text  # printed when b ended
    assert "replica a: waiting (serving)" in text and "[bold]x" in text  # markup stays text
