"""`provision top`: the quantile and rate math, the node script and its parser, a replica that
does not answer beside one that does, hostile host text, --once and --json, and the command's
wiring (click's CliRunner, the operation's I/O faked)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_runner_support import make_inventory

from vllm_provision.cli import json_schemas
from vllm_provision.cli import top as top_cli
from vllm_provision.cli.options import CommonOptions
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory
from vllm_provision.evidence.stats import percentile
from vllm_provision.operations import top
from vllm_provision.operations.top_view import plain, rich_view
from vllm_provision.transport.base import UnreachableError

TTFT_BOUNDS = (0.01, 0.05, 0.1, 0.5)


def histogram_text(name: str, bounds: tuple[float, ...], cumulative: list[int],
                   total: float, labels: str = 'engine="0",model_name="m"') -> str:
    """vLLM's text for one histogram (bucket counts cumulative, ``+Inf`` last)."""
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    for bound, count in zip([*map(str, bounds), "+Inf"], cumulative, strict=True):
        lines.append(f'{name}_bucket{{le="{bound}",{labels}}} {float(count)}')
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} "
              f"{float(cumulative[-1])}"]
    return "\n".join(lines) + "\n"


def metrics_text(*, ttft: list[int], itl: list[int] | None = None, generated: float = 100.0,
                 running: float = 2, waiting: float = 1, kv: float = 0.25,
                 old_names: bool = False) -> str:
    """A /metrics body as vLLM serves it (names of vllm/v1/metrics/loggers.py; ``old_names``:
    the names of the releases before the renames)."""
    kv_name = "vllm:gpu_cache_usage_perc" if old_names else "vllm:kv_cache_usage_perc"
    itl_name = ("vllm:time_per_output_token_seconds" if old_names
                else "vllm:inter_token_latency_seconds")
    lab = 'engine="0",model_name="m"'
    body = (f"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{lab}}} "
            f"{float(running)}\n"
            f"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{lab}}} "
            f"{float(waiting)}\n"
            f"# HELP {kv_name} KV-cache usage. 1 means 100 percent usage.\n"
            f"# TYPE {kv_name} gauge\n{kv_name}{{{lab}}} {kv}\n"
            f"# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
            f"# TYPE vllm:generation_tokens_total counter\n"
            f"vllm:generation_tokens_total{{{lab}}} {generated}\n")
    body += histogram_text("vllm:time_to_first_token_seconds", TTFT_BOUNDS, ttft, 1.0)
    body += histogram_text(itl_name, TTFT_BOUNDS, itl or ttft, 1.0)
    return body


# --- the math --------------------------------------------------------------------------------

def test_quantiles_of_a_cumulative_histogram_match_a_hand_computation() -> None:
    scrape = top.parse_metrics(metrics_text(ttft=[2, 6, 9, 10, 10]), at=0.0)
    found = top.latency(None, scrape, "ttft")
    # p50: rank 5 lies in (0.01, 0.05] holding ranks 2..6 -> 0.01 + 0.04 * (5 - 2) / (6 - 2)
    # p99: rank 9.9 lies in (0.1, 0.5] holding ranks 9..10 -> 0.1 + 0.4 * 0.9 / 1
    assert found == {"count": 10.0, "p50": 0.04, "p99": 0.46}


def test_quantiles_over_a_window_are_those_of_the_bucket_deltas() -> None:
    first = top.parse_metrics(metrics_text(ttft=[2, 6, 9, 10, 10]), at=0.0)
    last = top.parse_metrics(metrics_text(ttft=[2, 6, 9, 20, 20]), at=30.0)
    # the 10 new observations all lie in (0.1, 0.5]: p50 = 0.1 + 0.4 * 5/10
    assert top.latency(first, last, "ttft") == {"count": 10.0, "p50": 0.3, "p99": 0.496}
    # since start the old ones count too: rank 10 of 20 lies in (0.1, 0.5] holding ranks
    # 9..20 -> 0.1 + 0.4 * (10 - 9) / (20 - 9)
    assert top.latency(None, last, "ttft")["p50"] == round(0.1 + 0.4 / 11, 4)


def test_a_reset_counter_gives_the_new_histogram_not_negative_counts() -> None:
    first = top.parse_metrics(metrics_text(ttft=[2, 6, 9, 20, 20]), at=0.0)
    restarted = top.parse_metrics(metrics_text(ttft=[0, 1, 2, 2, 2]), at=5.0)
    # 2 observations: p50 rank 1 ends (0.01, 0.05]; p99 rank 1.98 in (0.05, 0.1] holding 1..2
    assert top.latency(first, restarted, "ttft") == {"count": 2.0, "p50": 0.05, "p99": 0.099}


def test_quantiles_agree_with_the_exact_percentiles_of_the_observations() -> None:
    rng = random.Random(7)
    values = [rng.uniform(0.0, 1.0) for _ in range(2000)]
    bounds = tuple(round(0.01 * i, 2) for i in range(1, 101))
    cumulative = [sum(1 for v in values if v <= b) for b in bounds] + [len(values)]
    body = metrics_text(ttft=[0] * 5).replace(
        "vllm:time_to_first_token_seconds", "vllm:unused_seconds") + histogram_text(
        "vllm:time_to_first_token_seconds", bounds, cumulative, sum(values))
    found = top.latency(None, top.parse_metrics(body, at=0.0), "ttft")
    assert found["count"] == 2000
    for q in (50, 99):  # one bucket is 10 ms wide: the estimate lies within it
        assert abs(found[f"p{q}"] - percentile(values, q)) <= 0.01


def test_rate_of_the_generation_counter_and_its_reset() -> None:
    first = top.parse_metrics(metrics_text(ttft=[0] * 5, generated=100.0), at=10.0)
    last = top.parse_metrics(metrics_text(ttft=[0] * 5, generated=400.0), at=12.0)
    assert top.rate(first, last) == 150.0
    restarted = top.parse_metrics(metrics_text(ttft=[0] * 5, generated=50.0), at=15.0)
    assert top.rate(last, restarted) == pytest.approx(50.0 / 3, abs=0.01)
    assert top.rate(None, last) is None
    assert top.rate(last, last) is None


def test_the_window_keeps_the_oldest_scrape_of_the_last_minute() -> None:
    history = [top.Scrape(at=t) for t in (0.0, 10.0, 50.0, 75.0)]
    first, last = top.window(history)
    assert (first.at, last.at) == (50.0, 75.0)  # 0 and 10 are more than 60 s old
    assert top.window(history[:1]) == (None, history[0])
    with pytest.raises(ValueError):
        top.window([])


def test_either_name_of_a_renamed_metric_is_read_and_named() -> None:
    new = top.parse_metrics(metrics_text(ttft=[1, 1, 1, 1, 1]), at=0.0)
    old = top.parse_metrics(metrics_text(ttft=[1, 1, 1, 1, 1], old_names=True), at=0.0)
    assert new.values["kv_cache"] == old.values["kv_cache"] == 0.25
    assert new.names["kv_cache"] == "vllm:kv_cache_usage_perc"
    assert old.names["kv_cache"] == "vllm:gpu_cache_usage_perc"
    assert old.names["itl"] == "vllm:time_per_output_token_seconds"
    assert old.histograms["itl"].count == 1.0


def test_engines_are_summed_and_the_kv_cache_is_the_fullest_engines() -> None:
    two = metrics_text(ttft=[1, 1, 1, 1, 1], kv=0.5).replace(
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3.0')
    body = two.replace('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5',
                       'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
                       'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75')
    scrape = top.parse_metrics(body, at=0.0)
    assert scrape.values["running"] == 5.0 and scrape.values["kv_cache"] == 0.75


# --- the node script and its parser -------------------------------------------------------------

def show_text(unit: str, state: str = "active", sub: str = "running", restarts: int = 0) -> str:
    return (f"Id={unit}\nLoadState=loaded\nActiveState={state}\nSubState={sub}\n"
            f"Result=success\nMainPID=42\nNRestarts={restarts}\n"
            "ExecMainStartTimestamp=@1764410000\nExecMainStatus=0\n\n")


def node_output(units: tuple[str, ...] = ("vllm.service",), *, gpu: str | None = None,
                state: str = "active", restarts_1h: int = 1) -> str:
    gpu = "0, 61440, 81559\n1, 61000, 81559\n" if gpu is None else gpu
    return ("".join(show_text(u, state, restarts=3) for u in units) + "1764410100.0\n"
            "== vllm-provision top gpu\n" + gpu + "== vllm-provision top restarts\n"
            + "".join(f"{u} {restarts_1h}\n" for u in units))


def test_the_node_script_quotes_units_and_reads_what_the_parser_expects() -> None:
    script = top.node_script(["vllm.service", "ray-head.service"])
    assert "nvidia-smi --query-gpu=index,memory.used,memory.total " \
           "--format=csv,noheader,nounits" in script
    assert script.count("journalctl -u ") == 2 and top.RESTART_SCHEDULED_ID in script
    hostile = top.node_script(["a;reboot.service"])
    assert "'a;reboot.service'" in hostile.split("== vllm-provision top restarts")[1]
    reading = top.parse_node("h1", node_output(("vllm.service", "ray-head.service")))
    assert [s.unit for s in reading.units] == ["vllm.service", "ray-head.service"]
    assert reading.units[0].restarts == 3
    assert reading.gpus == ({"index": 0, "memory_used_mib": 61440, "memory_total_mib": 81559},
                            {"index": 1, "memory_used_mib": 61000, "memory_total_mib": 81559})
    assert reading.restarts_1h == {"vllm.service": 1, "ray-head.service": 1}
    assert reading.gpu_error is None


def test_a_failing_nvidia_smi_is_its_first_line_made_printable() -> None:
    reading = top.parse_node("h1", node_output(gpu="NVIDIA-SMI has failed \x1b]0;owned\x07\n"))
    assert reading.gpus == ()
    assert reading.gpu_error == "NVIDIA-SMI has failed \\x1b]0;owned\\x07"


# --- the operation with faked I/O -------------------------------------------------------------

class Fleet:
    """Two replicas' hosts and rank 0 endpoints, answers settable per test."""

    def __init__(self) -> None:
        self.node: dict[str, str | Exception] = {}
        self.api: dict[str, top.ApiReading] = {}
        self.scripts: list[str] = []

    def run_node(self, host: str, command: str) -> str:
        self.scripts.append(command)
        answer = self.node.get(host, node_output())
        if isinstance(answer, Exception):
            raise answer
        return answer

    def read_api(self, name: str) -> top.ApiReading:
        return self.api[name]


def two_replicas(tmp_path: Path) -> Inventory:
    """``llama`` on h1, h2 and ``qwen`` on h3 (one node)."""
    first = make_inventory(tmp_path, ("h1", "h2"))
    other = make_inventory(tmp_path, ("h3",))
    qwen = replace(other.replicas[0], name="qwen")
    return replace(first, hosts={**first.hosts, **other.hosts},
                   replicas=(first.replicas[0], qwen))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_replica_that_does_not_answer_is_not_serving_and_the_other_is(tmp_path: Path,
                                                                          ) -> None:
    inventory = two_replicas(tmp_path)
    fleet = Fleet()
    clock = Clock()
    fleet.api = {"llama": top.ApiReading(200, metrics_text(ttft=[2, 6, 9, 10, 10],
                                                           generated=100.0)),
                 "qwen": top.ApiReading(None, None, "no answer (direct): timed out")}
    fleet.node["h3"] = UnreachableError.single("h3", "cannot connect to 10.0.0.11:22: refused")
    viewer = top.Top(inventory.replicas, fleet.run_node, fleet.read_api, clock=clock)
    viewer.refresh()
    clock.now += 2.0
    fleet.api["llama"] = top.ApiReading(200, metrics_text(ttft=[2, 6, 9, 20, 20],
                                                          generated=400.0))
    view = viewer.refresh()
    json_schemas.validate("top", json.loads(json.dumps(view)))
    llama, qwen = view["replicas"]
    assert llama["serving"] and not qwen["serving"]
    assert llama["tokens_per_s"] == 150.0
    assert llama["latency"]["window"] == "last 2 s"
    assert llama["latency"]["ttft_s"] == {"count": 10.0, "p50": 0.3, "p99": 0.496}
    assert llama["requests"] == {"running": 2.0, "waiting": 1.0}
    assert llama["kv_cache_perc"] == 25.0
    assert [n["gpus"][0]["memory_used_mib"] for n in llama["nodes"]] == [61440, 61440]
    assert qwen["error"] == "no answer (direct): timed out"
    assert qwen["tokens_per_s"] is None and qwen["metric_names"] == {}
    assert qwen["nodes"][0]["error"].startswith("h3: cannot connect")
    assert qwen["nodes"][0]["units"][0]["active_state"] is None
    # one SSH command per host per refresh: h1, h2, h3 twice
    assert len(fleet.scripts) == 6
    text = plain(view)
    assert "llama mp /srv/models/tiny  serving" in text
    assert "qwen mp /srv/models/tiny  not serving" in text
    assert "unreachable: h3: cannot connect" in text


def test_a_cumulative_refresh_says_since_start(tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path)
    fleet = Fleet()
    clock = Clock()
    fleet.api = {name: top.ApiReading(200, metrics_text(ttft=[2, 6, 9, 10, 10]))
                 for name in ("llama", "qwen")}
    viewer = top.Top(inventory.replicas[:1], fleet.run_node, fleet.read_api, clock=clock)
    first = viewer.refresh()["replicas"][0]
    assert first["latency"]["window"] == "since start" and first["tokens_per_s"] is None
    clock.now += 1.0
    once = viewer.refresh(cumulative=True)["replicas"][0]
    assert once["latency"] == {"window": "since start", "window_s": None,
                               "ttft_s": {"count": 10.0, "p50": 0.04, "p99": 0.46},
                               "itl_s": {"count": 10.0, "p50": 0.04, "p99": 0.46}}
    assert once["tokens_per_s"] == 0.0


HOSTILE = "\x1b]0;pwned\x07[bold red]x[/]\x1b[2J"


def test_hostile_host_text_never_reaches_the_terminal_as_an_escape(tmp_path: Path) -> None:
    inventory = two_replicas(tmp_path)
    fleet = Fleet()
    fleet.api = {"llama": top.ApiReading(200, metrics_text(ttft=[1, 1, 1, 1, 1]))}
    fleet.node["h1"] = node_output(state=f"active{HOSTILE}",
                                   gpu=f"no devices {HOSTILE}\n")
    viewer = top.Top(inventory.replicas[:1], fleet.run_node, fleet.read_api, clock=Clock())
    view = viewer.refresh()
    text = plain(view)
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;pwned\\x07[bold red]x[/]\\x1b[2J" in text
    from rich.console import Console

    console = Console(record=True, width=200, color_system="truecolor", force_terminal=True)
    console.print(rich_view(view))
    shown = console.export_text()
    assert "[bold red]x[/]" in shown  # the markup was printed as text, not applied
    assert "\x1b]0;" not in console.export_text(styles=True)


# --- the command ------------------------------------------------------------------------------

@pytest.fixture
def wired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    """`provision top` on two replicas whose I/O is a :class:`Fleet` (no SSH, no HTTP)."""
    inventory = two_replicas(tmp_path)
    fleet = Fleet()
    fleet.api = {"llama": top.ApiReading(200, metrics_text(ttft=[2, 6, 9, 10, 10])),
                 "qwen": top.ApiReading(None, None, "no answer (direct): refused")}
    closed: list[bool] = []

    def open_top(replicas: Any, options: Any, **_: Any) -> tuple[top.Top, Any]:
        return top.Top(replicas, fleet.run_node, fleet.read_api), lambda: closed.append(True)

    monkeypatch.setattr(CommonOptions, "load_inventory", lambda self, **_: inventory)
    monkeypatch.setattr(top, "open_top", open_top)
    monkeypatch.setattr(top_cli.time, "sleep", lambda s: None)
    fleet.closed = closed  # type: ignore[attr-defined]
    return fleet


def test_once_prints_one_plain_snapshot_and_exits_3_when_a_replica_does_not_serve(
        wired: Fleet) -> None:
    result = CliRunner().invoke(top_cli.command, ["-i", "inventory.yml", "--once"])
    assert result.exit_code == 3, result.output
    assert "serving 1/2" in result.output and "latency (since start)" in result.output
    assert "\x1b" not in result.output
    assert wired.closed == [True]  # type: ignore[attr-defined]


def test_json_validates_against_the_schema(wired: Fleet) -> None:
    result = CliRunner().invoke(top_cli.command, ["-i", "inventory.yml", "--json"])
    document = json.loads(result.output)
    json_schemas.validate("top", document)
    assert [r["serving"] for r in document["replicas"]] == [True, False]
    assert result.exit_code == 3


def test_limit_keeps_the_replicas_with_a_matching_node(wired: Fleet) -> None:
    result = CliRunner().invoke(top_cli.command, ["-i", "inventory.yml", "-l", "h2", "--json"])
    document = json.loads(result.output)
    assert [r["replica"] for r in document["replicas"]] == ["llama"]
    assert result.exit_code == 0


def test_ctrl_c_in_the_live_view_exits_0(wired: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(top_cli.time, "sleep", interrupted)
    result = CliRunner().invoke(top_cli.command, ["-i", "inventory.yml"])
    assert result.exit_code == 0, result.output
    assert "provision top" in result.output  # not a terminal: one plain snapshot per refresh
    assert wired.closed == [True]  # type: ignore[attr-defined]


def test_an_invalid_pattern_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError):
        top.chosen_replicas(two_replicas(tmp_path), "nosuch[")


def test_the_lab_standin_serves_every_metric_top_reads_under_real_vllms_first_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_provision_lab.gpu.install import GUEST_PACKAGE

    monkeypatch.syspath_prepend(str(GUEST_PACKAGE.parent))
    from vllm_lab_standin.metrics import Metrics

    metrics = Metrics("lab")
    metrics.running = 5
    metrics.finished("stop", 0.05, [0.1, 0.1], 0.3, prompt_tokens=3, generated=3)
    scrape = top.parse_metrics(metrics.render(), at=0.0)
    assert scrape.names == {key: names[0] for key, names in top.METRIC_NAMES.items()}
    assert scrape.values == {"running": 5.0, "waiting": 0.0, "kv_cache": 0.1,
                             "generation_tokens": 3.0}
    assert top.latency(None, scrape, "itl")["count"] == 2.0


class FakeEndpoint:
    """An endpoint whose client answers through httpx's MockTransport."""

    base_url = "http://10.0.0.11:8000"
    path = "direct"

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def client(self) -> Any:
        import httpx

        return httpx.Client(transport=httpx.MockTransport(self.handler))


def test_read_api_reads_health_and_metrics_and_turns_a_timeout_into_a_reason() -> None:
    import httpx

    body = metrics_text(ttft=[1, 1, 1, 1, 1])

    def answers(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body if request.url.path == "/metrics" else "")

    assert top.read_api(FakeEndpoint(answers)) == top.ApiReading(200, body)

    def dead_engine(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503 if request.url.path == "/health" else 404)

    assert top.read_api(FakeEndpoint(dead_engine)) == top.ApiReading(
        503, None, "/metrics answered HTTP 404")

    def silent(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    reading = top.read_api(FakeEndpoint(silent))
    assert reading.health is None and reading.error == "no answer (direct): timed out"


class FakeConnection:
    def __init__(self, output: str) -> None:
        self.output = output
        self.commands: list[str] = []

    def run(self, command: str, **kwargs: Any) -> Any:
        from vllm_provision.transport.base import CommandResult

        self.commands.append(command)
        return CommandResult(0, self.output, "")


def test_open_top_routes_each_replica_and_an_unreachable_rank_0_over_ssh_is_not_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_provision.transport import connection, tunnel

    inventory = two_replicas(tmp_path)
    llama, qwen = inventory.replicas
    over_ssh = {**llama.master.host.vars, "vllm_api_via": "ssh"}
    master = replace(llama.nodes[0], host=replace(llama.master.host, vars=over_ssh))
    llama = replace(llama, nodes=(master, *llama.nodes[1:]))
    qwen_host = {**qwen.master.host.vars, "vllm_api_via": "direct"}
    qwen = replace(qwen, nodes=(replace(qwen.nodes[0], host=replace(
        qwen.master.host, vars=qwen_host)),))
    h3 = FakeConnection(node_output())
    refused = UnreachableError.single("h1", "cannot connect to 10.0.0.11:22: refused")
    monkeypatch.setattr(connection, "open_connections",
                        lambda hosts, options: ({"h2": FakeConnection(node_output()),
                                                 "h3": h3}, {"h1": refused}))
    monkeypatch.setattr(connection, "close_all", lambda connections: None)
    read: list[str] = []
    monkeypatch.setattr(top, "read_api", lambda endpoint: read.append(endpoint.path)
                        or top.ApiReading(200, metrics_text(ttft=[1, 1, 1, 1, 1])))
    tunnel.forget()
    try:
        viewer, close = top.open_top([llama, qwen], connection.ConnectionOptions())
        view = viewer.refresh()
    finally:
        tunnel.forget()
    close()
    first, second = view["replicas"]
    assert not first["serving"] and "no SSH connection to rank 0" in first["error"]
    assert first["nodes"][0]["error"].startswith("h1: cannot connect")
    assert first["nodes"][1]["units"][0]["active_state"] == "active"
    assert second["serving"] and read == ["direct"]
    assert len(h3.commands) == 1 and "nvidia-smi" in h3.commands[0]


def test_ctrl_c_on_a_terminal_leaves_the_alternate_screen_and_shows_the_cursor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from vllm_provision.output import report

    inventory = two_replicas(tmp_path)
    fleet = Fleet()
    fleet.api = {"llama": top.ApiReading(200, metrics_text(ttft=[1, 1, 1, 1, 1]))}
    viewer = top.Top(inventory.replicas[:1], fleet.run_node, fleet.read_api)
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=160, color_system="standard")
    monkeypatch.setattr(report, "shared_console", lambda stream: terminal)
    sleeps: list[float] = []

    def interrupted(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(top_cli.time, "sleep", interrupted)
    top_cli._live(viewer, 1.0)  # returns: Ctrl-C is no error
    drawn = screen.getvalue()
    assert drawn.index("\x1b[?1049h") < drawn.index("serving 1/1")  # on the alternate screen
    assert drawn.rstrip().endswith(("\x1b[?1049l", "\x1b[?25h"))  # left, cursor shown
    assert "\x1b[?1049l" in drawn and "\x1b[?25h" in drawn
    assert len(fleet.scripts) == 4  # two refreshes (h1, h2 each) until Ctrl-C
