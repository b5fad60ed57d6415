"""provision bench / fault / record on the lab's stand-in, mp and Ray on the same two hosts:
one `up` per backend (`down` between them), small request counts.

What is checked against what really happened: the bench's client percentiles against the
delays in the hosts' stand-in spec (/etc/vllm-lab/spec.json) and against /metrics; the plot as
a PNG read back; the placement against the TP x PP workers; each in-flight stream's fate
against the journal of rank 0's API unit (a stream cut when the API process went away is an
error after fewer tokens than asked, a completed one has them all and ended before it went).

Cost: about 361 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_support import complete, provision

pytestmark = pytest.mark.lab

REQUESTS, MAX_TOKENS, STREAM_TOKENS = 12, 16, 300
# The stated tolerance (docs/evidence.md): the client adds the network, HTTP and, on the lab's
# shared 2 cores, scheduling; Ray adds one actor call per request before the first token.
TTFT_SLACK_S, ITL_SLACK_S = 0.12, 0.015


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("evidence")


def deploy(lab: Any, backend: str, other: str, state: Path) -> Iterator[Path]:
    """`down` the other backend (same hosts), `up` this one; `down` it at the end."""
    inv = Path(lab.inventory_path(backend))
    provision("down", "-i", str(lab.inventory_path(other)), state_home=state)
    up = provision("up", "-i", str(inv), state_home=state)
    assert up.returncode == 0, up.stdout + up.stderr
    yield inv
    down = provision("down", "-i", str(inv), state_home=state)
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="module")
def mp(lab: Any, folder: Path) -> Iterator[Path]:
    yield from deploy(lab, "mp", "ray", folder / "state")


@pytest.fixture(scope="module")
def ray(lab: Any, folder: Path, mp: Path) -> Iterator[Path]:
    """After the mp deployment (same hosts): its `down`, then Ray's `up`."""
    yield from deploy(lab, "ray", "mp", folder / "state")


def spec(lab_host: Any) -> dict[str, Any]:
    return dict(json.loads(lab_host("h1").check_output("cat /etc/vllm-lab/spec.json")))


def bench(inv: Path, folder: Path, backend: str) -> dict[str, Any]:
    plot = folder / f"{backend}.png"
    out = folder / f"{backend}.json"
    run = provision("bench", "-i", str(inv), "--requests", str(REQUESTS), "--concurrency", "4",
                    "--max-tokens", str(MAX_TOKENS), "--prompt-tokens", "8", "--seed", "7",
                    "--plot", str(plot), "--out", str(out), state_home=folder / "state")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "TTFT" in run.stdout and "placement:" in run.stdout
    return dict(json.loads(out.read_text()))


def check_bench(result: dict[str, Any], standin: dict[str, Any], plot: Path) -> None:
    client, server = result["client"], result["server"]
    assert client["completed"] == REQUESTS and client["completion_rate"] == 1.0
    assert client["errors"] == {}
    ttft, itl = float(standin["ttft_s"]), float(standin["token_s"])
    # the client cannot see a first token sooner than the stand-in sends it
    assert ttft <= client["ttft_s"]["p50"] <= ttft + TTFT_SLACK_S, client["ttft_s"]
    # a stream's gaps add up to at least its tokens' pacing, however a loaded controller bunches
    # its reads (two chunks read at once make one short gap after one long one), so the mean is
    # bounded below and the median above
    assert itl * 0.9 <= client["itl_s"]["mean"], client["itl_s"]
    assert client["itl_s"]["p50"] <= itl + ITL_SLACK_S, client["itl_s"]
    assert client["e2e_s"]["p50"] >= ttft + (MAX_TOKENS - 1) * itl
    # /metrics saw the same requests and the same pacing
    assert server["e2e_s"]["count"] == REQUESTS
    assert server["itl_s"]["count"] == REQUESTS * (MAX_TOKENS - 1)
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert result["agreement"][key]["agrees"] is True, result["agreement"]
    # the plot: a PNG whose three panels have labelled axes, read back
    from PIL import Image

    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size[0] > 600
        labels = image.text["Description"]  # the axes' labels as drawn (bench.plot)
    for label in ("x TTFT (ms), y fraction of requests", "x ITL (ms), y fraction of gaps",
                  "x end-to-end latency (ms), y fraction of requests"):
        assert label in labels, labels


def check_fault(run: Any, result: dict[str, Any], api_unit_went: float) -> None:
    """The replica serves again, the recovery time is given, and each stream's fate agrees
    with when rank 0's API process went away (``api_unit_went``: seconds after the fault)."""
    assert run.returncode == 0, run.stdout + run.stderr
    rec = result["recovery"]
    assert rec["recovered_s"] is not None and rec["recovered_s"] > 0, rec
    assert not rec["served_throughout"] and rec["first_failure_s"] is not None
    assert f"serving again {rec['recovered_s']}" in run.stdout
    assert len(result["streams"]) == 3
    for stream in result["streams"]:
        assert stream["tokens_before_fault"] >= 1  # generating when the fault hit
        if stream["fate"] == "completed":
            assert stream["tokens"] == STREAM_TOKENS
            assert stream["end_s"] <= api_unit_went + 1.0, (stream, api_unit_went)
        else:
            assert stream["fate"] == "error", stream  # the stand-in never hangs a stream here
            assert stream["tokens"] < STREAM_TOKENS
            # cut when the API process went, not before; no token after it
            assert stream["end_s"] >= api_unit_went - 0.5, (stream, api_unit_went)
            assert stream["last_token_s"] <= api_unit_went + 0.5, (stream, api_unit_went)
    assert result["start_limit_hit"] == []


def api_unit_went(result: dict[str, Any]) -> float:
    """When rank 0's vllm.service stopped or its main process ended, from the journal lines the
    fault result carries (systemd's own words)."""
    times = [e["t_s"] for e in result["events"] if e["host"] == "h1"
             and e["source"] == "systemd" and e["message"].startswith("vllm.service: ")
             and ("Main process exited" in e["message"] or "Sent signal" in e["message"])]
    times += [e["t_s"] for e in result["events"] if e["host"] == "h1"
              and e["message"].startswith("Stopping vllm.service")]
    assert times, result["events"]
    return min(times)


def fault(inv: Path, folder: Path, target: str) -> tuple[Any, dict[str, Any]]:
    run = provision("fault", "-i", str(inv), "--kill", target, "--streams", "3",
                    "--max-tokens", str(STREAM_TOKENS), "--bound", "150",
                    state_home=folder / "state", timeout=400)
    data = json.loads((folder / "state" / "vllm-provision").glob(
        f"{inv.stem}-*.evidence.json").__next__().read_text())
    key = target if ":" in target else next(k for k in data["faults"] if k.startswith(target))
    return run, data["faults"][key]


def test_mp_bench_placement_and_faults(mp: Path, folder: Path, lab_host: Any,
                                       lab: Any) -> None:
    result = bench(mp, folder, "mp")
    check_bench(result, spec(lab_host), folder / "mp.png")
    ranks = result["conditions"]["placement"]["ranks"]
    assert [(r["rank"], r["host"]) for r in ranks] == [(0, "h1"), (1, "h2")]
    for r in ranks:  # TP=4 on each node: nvidia-smi shows the rank's processes on 4 GPUs
        assert r["gpus"] == [0, 1, 2, 3], r
        assert all(p["unit"] == "vllm.service" for p in r["processes"])
    cond = result["conditions"]
    assert (cond["backend"], cond["tensor_parallel_size"], cond["pipeline_parallel_size"]) \
        == ("mp", 4, 2)
    assert cond["start_to_serving_s"] is not None
    model = cond["served_model"]
    for target in ("h2", "h1"):  # the headless node, then rank 0
        run, res = fault(mp, folder, target)
        went = api_unit_went(res)
        if target == "h1":
            assert went <= 0.5  # the fault itself
        check_fault(run, res, went)
        assert complete(f"http://{lab.config.address('h1')}:8000", model)


def test_ray_bench_placement_faults_and_record(mp: Path, ray: Path, folder: Path,
                                               lab_host: Any, lab: Any) -> None:
    result = bench(ray, folder, "ray")
    check_bench(result, spec(lab_host), folder / "ray.png")
    bundles = result["conditions"]["placement"]["bundles"]
    assert [b["bundle"] for b in bundles] == list(range(8))  # TP x PP bundles
    assert sorted({b["host"] for b in bundles}) == ["h1", "h2"]
    for host in ("h1", "h2"):  # each node's 4 GPUs, one per bundle
        gpus = [g for b in bundles if b["host"] == host for g in (b["gpus"] or [])]
        assert sorted(gpus) == [0, 1, 2, 3], bundles
    assert bundles[0]["host"] == "h1"  # bundle 0 pinned to the head (vLLM's node: resource)
    model = result["conditions"]["served_model"]
    for target in ("h2", "h1:vllm.service"):  # the Ray worker, then the head's API process
        run, res = fault(ray, folder, target)
        check_fault(run, res, api_unit_went(res))
        assert complete(f"http://{lab.config.address('h1')}:8000", model)
    out = folder / "record.md"
    rec = provision("record", "-i", str(mp), "--compare", str(ray), "--out", str(out),
                    state_home=folder / "state")
    assert rec.returncode == 0, rec.stdout + rec.stderr
    text = out.read_text()
    assert "| | mp | ray |" in text
    assert "not measured" not in text and "TODO" not in text
    assert "The GPU placement differs" not in text  # same hosts, every GPU: same placement
    assert "SIGKILL to h2:vllm.service" in text and "SIGKILL to h2:ray-worker.service" in text
    closing = text.rstrip().splitlines()
    assert closing[-3].startswith("Keep mp: the platform reserves the GPUs")
