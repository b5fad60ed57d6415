"""``provision bench``: streamed completions to the replica, timed on the client, checked
against vLLM's ``/metrics``, with the conditions and GPU placement (docs/evidence.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import (
    HOST_OPTIONS,
    CommonOptions,
    echo,
    replica_option,
    shared_options,
)
from vllm_provision.core.errors import ProvisionError


def pick_replica(inventory: Any, name: str | None) -> Any:
    """The replica named ``name``, or the inventory's only one.

    Raises:
        ProvisionError: no such replica, or several and none named.
    """
    replicas = {r.name: r for r in inventory.replicas}
    if name is not None:
        if name not in replicas:
            raise ProvisionError.single(str(inventory.path), f"no replica named {name!r}",
                                        expected=", ".join(replicas) or "a replica",
                                        fix="name one of the inventory's replicas")
        return replicas[name]
    if len(replicas) != 1:
        raise ProvisionError.single(str(inventory.path), f"{len(replicas)} replicas",
                                    expected="exactly one, or --replica NAME",
                                    fix="add --replica NAME")
    return next(iter(replicas.values()))


def connect(opts: CommonOptions, replica: Any) -> dict[str, Any]:
    """Open one connection per node of ``replica``
    (:func:`vllm_provision.transport.connection.open_all`).

    Raises:
        ProvisionError: a node cannot be reached (every reason, one per host).
    """
    from vllm_provision.transport.connection import open_all

    return open_all([n.host for n in replica.nodes], opts.connection_options())


def fmt_ms(value: float | None) -> str:
    """Seconds as milliseconds with one decimal, ``-`` for None."""
    return "-" if value is None else f"{value * 1000:.1f}"


def fmt_delta(value: float | None) -> str:
    """A difference in seconds as signed milliseconds with two decimals, ``-`` for None."""
    return "-" if value is None else f"{value * 1000:+.2f}"


def print_result(result: dict[str, Any]) -> None:
    """The human report of a bench result."""
    cond, client, server = result["conditions"], result["client"], result["server"]
    agree = result["agreement"]
    echo(f"replica {cond['replica']} ({cond['backend']}): model {cond['model']}, dtype "
               f"{cond['dtype']}, TP={cond['tensor_parallel_size']} "
               f"PP={cond['pipeline_parallel_size']}, vLLM {cond['vllm_version']}, "
               f"start to serving {cond['start_to_serving_s']} s")
    echo(f"inputs: {cond['inputs']}; API path: {cond.get('api_path', 'direct')}")
    echo(f"completed {client['completed']}/{client['requests']} "
               f"(rate {client['completion_rate']}), errors {client['errors'] or 'none'}, "
               f"{client['output_tokens_per_s']} output tokens/s over {client['duration_s']} s")
    echo(f"{'ms':<8}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}  /metrics mean  p50  p90"
               "  agrees")
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        c, s = client[key], server.get(key) or {}
        echo(f"{label:<8}{fmt_ms(c['p50']):>9}{fmt_ms(c['p90']):>9}{fmt_ms(c['p99']):>9}"
                   f"{fmt_ms(c['mean']):>9}  {fmt_ms(s.get('mean')):>13} "
                   f"{fmt_ms(s.get('p50')):>5} {fmt_ms(s.get('p90')):>5}  "
                   f"{agree[key]['agrees']}")
    echo(f"finished requests: client {agree['requests']['client']}, /metrics "
               f"{agree['requests']['server']}")
    echo("placement:")
    for line in placement_lines(cond["placement"]):
        echo(f"  {line}")
    door = result.get("front_door")
    if door:
        c, added = door["client"], door["added"]
        echo(f"front door {door['host']} ({door['url']}): completed {c['completed']}/"
             f"{c['requests']}, failed {door['failed']}, errors {c['errors'] or 'none'}")
        echo(f"  added against direct: TTFT p50 {fmt_delta(added['ttft_p50_s'])} p99 "
             f"{fmt_delta(added['ttft_p99_s'])} ms, end-to-end p50 "
             f"{fmt_delta(added['e2e_p50_s'])} p99 {fmt_delta(added['e2e_p99_s'])} ms")


def placement_lines(placement: dict[str, Any]) -> list[str]:
    """One line per rank (mp) or bundle (Ray): node and GPUs."""
    if placement.get("kind") == "bundles":
        return [f"bundle {b['bundle']}: {b['host']} ({b['address']}) node {b['node_id'][:12]} "
                f"GPUs {b['gpus']} pid {b['pid']}{' ' + b['note'] if b['note'] else ''}"
                for b in placement.get("bundles", [])]
    return [f"rank {r['rank']}: {r['host']} ({r['address']}) GPUs {r['gpus']}; "
            + ", ".join(f"pid {p['pid']} {p['unit']} CUDA_VISIBLE_DEVICES="
                        f"{p['cuda_visible_devices'] or '(unset)'} GPUs {p['gpus']}"
                        for p in r["processes"])
            for r in placement.get("ranks", [])]


@click.command("bench", epilog=examples(
    'provision bench -i inventory.yml --requests 50 --concurrency 4 --plot bench.png',
    'provision bench -i inventory.yml --rate 2 --seed 7 --out bench.json --json',
    'provision bench -i inventory.yml --requests 50 --concurrency 1 --front-door gw1'))
@shared_options(HOST_OPTIONS)
@replica_option("The replica to benchmark")
@click.option("--requests", type=click.IntRange(1, 100000), default=100, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Requests in flight at most.")
@click.option("--rate", type=click.FloatRange(min=0.001), default=None,
              help="Poisson arrivals, requests/s (default: as fast as --concurrency allows).")
@click.option("--prompt-tokens", type=click.IntRange(1, 100000), default=32,
              show_default=True, help="Words per seeded prompt.")
@click.option("--max-tokens", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="Output tokens per request (ignore_eos).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the prompts and arrivals.")
@click.option("--read-timeout", type=click.FloatRange(min=0.1), default=60.0,
              show_default=True, help="Seconds without a byte before a stream counts as hung.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a PNG of the TTFT, ITL and end-to-end CDFs (needs the plot extra).")
@click.option("--out", "out_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the result as JSON to this file.")
@click.option("--front-door", "front_door", metavar="HOST", default=None,
              help="After the direct run, send the same requests through the front door on "
                   "HOST (a host of vllm_gateways) and report its failed requests and the "
                   "latency it adds (docs/front-door.md).")
def command(replica_name: str | None, requests: int, concurrency: int, rate: float | None,
            prompt_tokens: int, max_tokens: int, seed: int, read_timeout: float,
            plot_path: Path | None, out_path: Path | None, front_door: str | None,
            **kwargs: Any) -> None:
    """Benchmark the replica with streamed completions and record the conditions.

    Reports client-side completion rate, TTFT, ITL and end-to-end latency (p50/p90/p99),
    output tokens/s and errors by kind; the deltas of vLLM's /metrics histograms over the run
    beside them; the model, dtype, sizes, backend, vLLM version, hosts, seeded inputs and GPU
    placement; the last ``up``'s start to serving. The result is stored in the controller's
    state folder for ``provision record``. With ``--front-door HOST`` the same requests then
    go through the front door, and its failed requests and added latency are reported. Exit 0
    when every request completed (both runs), 3 otherwise.
    """
    from rich.progress import Progress

    from vllm_provision import state
    from vllm_provision.evidence import bench, store
    from vllm_provision.transport.connection import close_all
    from vllm_provision.transport.tunnel import route_for

    opts = CommonOptions.from_kwargs(kwargs)
    inv = opts.load_inventory(require_replica=True)
    replica = pick_replica(inv, replica_name)
    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401 - fail before the run, not after it
        except ImportError:
            raise ProvisionError.single("--plot", "matplotlib is not installed",
                                        fix="pip install 'vllm-provision[plot]'") from None
    door = None
    if front_door is not None:
        from vllm_provision.inventory.gateways import client_url

        door = (front_door, client_url(inv, front_door))
    vars_ = dict(replica.master.host.vars)
    connections = connect(opts, replica)
    try:
        placement = replica.backend_type.placement(replica, connections, vars_)
        # through SSH (vllm_api_via) the load rides rank 0's connection: held until the end
        route = route_for(replica, connections.get(replica.master.name))
        record = state.read_controller_record(inv.path)
        start_s = state.last_start_s(record).get(replica.name)
        starts = state.recorded_starts(record).get(replica.name, {})
        with Progress(transient=True, disable=opts.json) as progress:
            task = progress.add_task(f"bench {replica.name}",
                                     total=requests * (2 if door else 1))
            result = bench.run(replica, vars_, requests=requests, concurrency=concurrency,
                               rate=rate, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                               seed=seed, placement=placement, start_to_serving_s=start_s,
                               starts=starts, read_timeout_s=read_timeout,
                               progress=lambda n: progress.update(task, completed=n),
                               route=route, front_door=door)
    finally:
        close_all(connections)
    stored = store.update(inv.path, bench=result)
    if out_path is not None:
        store.write_json(out_path, result)
    if plot_path is not None:
        bench.plot(result, plot_path)
    if opts.json:
        echo(json.dumps({**result, "stored": str(stored)}))
    else:
        print_result(result)
        echo(f"stored: {stored}" + (f"; plot: {plot_path}" if plot_path else ""))
    failed = result.get("front_door", {}).get("failed", 0)
    raise SystemExit(0 if result["client"]["completed"] == requests and not failed else 3)
