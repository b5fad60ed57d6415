"""``provision bench``: streamed completions against a replica, timed on the client, checked
against the deltas of vLLM's ``/metrics`` histograms, with the conditions they ran under.

docs/evidence.md describes the method and each number. The result (JSON-ready) has keys
``kind`` (``bench``), ``time``, ``conditions`` (:func:`conditions`), ``client``
(:func:`~vllm_provision.evidence.load.client_summary`), ``server`` (the histogram deltas),
``agreement`` (:func:`agreement`), ``requests`` (per request: tokens, error, token times).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_provision import settings
from vllm_provision.core.errors import ProvisionError

# Agreement of the client's numbers with /metrics (docs/evidence.md, "Tolerance"): the client
# measures from sending the request, vLLM from its arrival at the engine; the difference is the
# network, a new connection per request, HTTP parsing, the API server and, under a shared CPU,
# scheduling delays (measured on the lab's 2 shared cores: 9 ms on mp, up to 51 ms on Ray while
# other labs deployed beside it).
TOLERANCE_S = 0.06
TOLERANCE_RELATIVE = 0.25


def dtype_of(extra_args: tuple[str, ...]) -> str:
    """The ``--dtype`` of ``vllm_extra_args`` (``--dtype X`` or ``--dtype=X``), else ``auto``
    (vLLM's default: the model config's torch_dtype)."""
    for i, arg in enumerate(extra_args):
        if arg == "--dtype" and i + 1 < len(extra_args):
            return extra_args[i + 1]
        if arg.startswith("--dtype="):
            return arg.partition("=")[2]
    return "auto"


def served_model(replica: Any) -> str:
    """The model id requests must name: ``vllm_served_model_name``, else the model path."""
    return str(replica.engine.served_model_name or replica.engine.model)


def conditions(replica: Any, vars_: Mapping[str, Any], version: str,
               placement: dict[str, Any], inputs: dict[str, Any],
               start_to_serving_s: float | None, api_path: str = "direct",
               starts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a result was measured under: ``replica``, ``backend``, ``model``, ``served_model``,
    ``dtype``, ``tensor_parallel_size``, ``pipeline_parallel_size``, ``vllm_version`` (rank
    0's ``/version``), ``gpu_pool`` (``vllm_gpu_pool``), ``hosts`` (name, address, rank),
    ``inputs`` (seed, counts, digest), ``placement`` (the backend's
    :meth:`~vllm_provision.backends.Backend.placement`), ``start_to_serving_s`` (of the last
    ``up``, from the state record; None when not measured), ``starts`` (the state record's
    last cold and warm start, :func:`vllm_provision.state.recorded_starts`; a kind never
    measured is absent), ``api_path`` (``direct`` or ``ssh via <rank 0>``: the client's
    latencies include the path, docs/deploy.md)."""
    engine = replica.engine
    return {"replica": replica.name, "backend": replica.backend, "model": engine.model,
            "served_model": served_model(replica), "dtype": dtype_of(engine.extra_args),
            "tensor_parallel_size": engine.tensor_parallel_size,
            "pipeline_parallel_size": engine.pipeline_parallel_size,
            "vllm_version": version, "gpu_pool": str(settings.layered(vars_)["vllm_gpu_pool"]),
            "hosts": [{"host": n.name, "address": n.host_ip, "rank": n.rank}
                      for n in replica.nodes],
            "inputs": inputs, "placement": placement,
            "start_to_serving_s": start_to_serving_s, "starts": dict(starts or {}),
            "api_path": api_path}


def scrape(base_url: str, model: str, timeout_s: float = 10.0, route: Any = None,
           ) -> dict[str, Any]:
    """GET ``/metrics`` and parse vLLM's request histograms
    (:func:`~vllm_provision.evidence.stats.parse_histograms`); ``route``: how the controller
    reaches rank 0 (:class:`~vllm_provision.transport.tunnel.ApiRoute`; None: direct).

    Raises:
        ProvisionError: no answer, a non-200 status, or a body that is not Prometheus text.
    """
    import httpx

    from vllm_provision.evidence.stats import parse_histograms
    from vllm_provision.transport.tunnel import http_client

    url = base_url + "/metrics"
    try:
        with (route.client(timeout_s) if route is not None
              else http_client(timeout_s)) as client:
            answer = client.get(url)
    except httpx.HTTPError as exc:
        raise ProvisionError.single(url, f"no answer: {exc}",
                                    fix="check rank 0 with `provision status`") from None
    if answer.status_code != 200:
        raise ProvisionError.single(url, f"answered {answer.status_code}",
                                    expected="200 with vLLM's Prometheus metrics")
    try:
        return parse_histograms(answer.text, model)
    except ValueError as exc:
        raise ProvisionError.single(url, f"not Prometheus text: {exc}") from None


def agreement(client: Mapping[str, Any], server: Mapping[str, Any]) -> dict[str, Any]:
    """Client means against the ``/metrics`` means per histogram (``ttft_s``, ``itl_s``,
    ``e2e_s``), and the count of finished requests: ``{key: {"client", "server", "agrees"}}``
    plus ``requests`` (completed on the client vs the e2e histogram's count delta) and
    ``tolerance`` (the rule, :func:`~vllm_provision.evidence.stats.agrees`)."""
    from vllm_provision.evidence.stats import agrees

    out: dict[str, Any] = {}
    for key in ("ttft_s", "itl_s", "e2e_s"):
        c = (client.get(key) or {}).get("mean")
        s = (server.get(key) or {}).get("mean")
        out[key] = {"client": c, "server": s,
                    "agrees": agrees(c, s, TOLERANCE_S, TOLERANCE_RELATIVE)}
    counted = (server.get("e2e_s") or {}).get("count")
    out["requests"] = {"client": client.get("completed"), "server": counted,
                       "agrees": None if counted is None else counted == client.get("completed")}
    out["tolerance"] = {"absolute_s": TOLERANCE_S, "relative": TOLERANCE_RELATIVE}
    return out


def added_latency(direct: Mapping[str, Any], through: Mapping[str, Any]) -> dict[str, Any]:
    """What the front door adds: for TTFT and end-to-end latency, the front door run's p50 and
    p99 minus the direct run's (seconds, rounded to the microsecond; None where either run has
    no completed request). Both runs send the same seeded inputs (:func:`run`)."""
    out: dict[str, Any] = {}
    for key in ("ttft_s", "e2e_s"):
        for q in ("p50", "p99"):
            a, b = (direct.get(key) or {}).get(q), (through.get(key) or {}).get(q)
            out[f"{key.removesuffix('_s')}_{q}_s"] = (None if a is None or b is None
                                                     else round(b - a, 6))
    return out


def run(replica: Any, vars_: Mapping[str, Any], *, requests: int, concurrency: int,
        rate: float | None, prompt_tokens: int, max_tokens: int, seed: int,
        placement: dict[str, Any], start_to_serving_s: float | None,
        starts: Mapping[str, Any] | None = None, read_timeout_s: float = 60.0,
        progress: Callable[[int], None] | None = None, route: Any = None,
        front_door: tuple[str, str] | None = None) -> dict[str, Any]:
    """Run the benchmark against ``replica``'s rank 0 and return the result (module doc).

    Args:
        replica: the replica. vars_: rank 0's variables.
        requests, concurrency, rate (requests/s, None: as fast as the concurrency allows),
        prompt_tokens (words), max_tokens, seed: the load (:mod:`~vllm_provision.evidence.load`).
        placement, start_to_serving_s, starts: read before, recorded in the conditions.
        progress: called with the number of finished requests after each one (both runs
            count with a front door).
        route: how the controller reaches rank 0 (``vllm_api_via``,
            :func:`~vllm_provision.transport.tunnel.route_for`); None: direct.
        front_door: ``(host, base URL)`` of a front door (``vllm_gateways``,
            :func:`vllm_provision.inventory.gateways.client_url`): after the direct run, the
            same seeded requests go through it (reached directly from the controller) and the
            result gains ``front_door``: its host and URL, its client numbers (failed requests
            by kind among them) and :func:`added_latency` against the direct run. The
            ``/metrics`` agreement stays the direct run's.

    Raises:
        ProvisionError: rank 0's ``/version`` or ``/metrics`` did not answer.
    """
    from vllm_provision.evidence import load
    from vllm_provision.evidence.stats import histogram_deltas
    from vllm_provision.transport.api import Endpoint

    endpoint = Endpoint.for_replica(replica, route=route)
    version = endpoint.version()
    model = served_model(replica)
    prompts = load.seeded_prompts(requests, prompt_tokens, seed)
    offsets = load.arrival_offsets(requests, rate, seed)
    inputs = {"seed": seed, "requests": requests, "concurrency": concurrency, "rate": rate,
              "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
              "digest": load.inputs_digest(prompts, max_tokens)}
    headers = ({"Authorization": f"Bearer {replica.engine.api_key}"}
               if replica.engine.api_key else {})
    before = scrape(replica.api_url, model, route=route)
    finished = [0]

    def done(_result: load.StreamResult) -> None:
        finished[0] += 1
        if progress is not None:
            progress(finished[0])

    started = datetime.now(UTC)
    results, wall = load.run_load(replica.api_url + "/v1/completions", model, prompts,
                                  max_tokens, concurrency, offsets, headers, read_timeout_s,
                                  on_done=done, route=route)
    after = scrape(replica.api_url, model, route=route)
    client = load.client_summary(results, wall)
    server = histogram_deltas(before, after)
    extra: dict[str, Any] = {}
    if front_door is not None:
        host, url = front_door
        through, through_wall = load.run_load(url + "/v1/completions", model, prompts,
                                              max_tokens, concurrency, offsets, headers,
                                              read_timeout_s, on_done=done)
        summary = load.client_summary(through, through_wall)
        extra["front_door"] = {"host": host, "url": url, "client": summary,
                               "failed": summary["requests"] - summary["completed"],
                               "added": added_latency(client, summary)}
    return {"kind": "bench", "time": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "conditions": conditions(replica, vars_, version, placement, inputs,
                                     start_to_serving_s,
                                     route.describe if route is not None else "direct",
                                     starts),
            "client": client, "server": server, "agreement": agreement(client, server),
            "requests": [r.as_dict() for r in results], **extra}


def plot(result: Mapping[str, Any], path: Path) -> None:
    """Write a PNG of the empirical CDFs of TTFT, ITL and end-to-end latency (three panels,
    milliseconds on x, fraction of requests (of gaps, for ITL) on y), titled with the
    conditions; the panels' titles and axis labels are also written as the PNG's
    ``Description`` text chunk.

    Raises:
        ProvisionError: matplotlib is not installed (the ``plot`` extra) or the file cannot be
            written.
    """
    try:
        import matplotlib
    except ImportError:
        raise ProvisionError.single("--plot", "matplotlib is not installed",
                                    fix="pip install 'vllm-provision[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in result["requests"] if r["error"] is None and r["done"]]
    series = {"TTFT": [r["token_times"][0] for r in done if r["token_times"]],
              "ITL": [b - a for r in done
                      for a, b in zip(r["token_times"], r["token_times"][1:], strict=False)],
              "end-to-end latency": [r["end"] for r in done]}
    cond = result["conditions"]
    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    for axis, (label, values) in zip(axes, series.items(), strict=True):
        ordered = sorted(v * 1000 for v in values)
        n = len(ordered)
        axis.step(ordered, [(i + 1) / n for i in range(n)], where="post")
        axis.set_xlabel(f"{label} (ms)")
        axis.set_ylabel("fraction of " + ("gaps" if label == "ITL" else "requests"))
        axis.set_title(f"{label} CDF (n={n})")
        axis.set_ylim(0, 1.02)
        axis.grid(True, alpha=0.3)
    figure.suptitle(f"{cond['replica']}: {cond['backend']}, TP={cond['tensor_parallel_size']} "
                    f"PP={cond['pipeline_parallel_size']}, vLLM {cond['vllm_version']}, "
                    f"{cond['inputs']['requests']} requests x {cond['inputs']['max_tokens']} "
                    f"tokens, concurrency {cond['inputs']['concurrency']}")
    figure.tight_layout()
    # the axes' own labels, also as PNG text chunks, so a reader (or a test) can check them
    labels = "; ".join(f"{axis.get_title()}: x {axis.get_xlabel()}, y {axis.get_ylabel()}"
                       for axis in axes)
    try:
        figure.savefig(path, format="png", dpi=90,
                       metadata={"Title": figure.get_suptitle(), "Description": labels,
                                 "Software": "vllm-provision bench"})
    except OSError as exc:
        raise ProvisionError.single(str(path), f"cannot write the plot: {exc.strerror}",
                                    fix="name a file in a writable folder") from None
    finally:
        plt.close(figure)
