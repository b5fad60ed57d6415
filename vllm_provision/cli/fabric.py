"""``provision fabric``: measure the cluster network between every pair of a replica's nodes
(vllm_provision/evidence/fabric.py)."""

from __future__ import annotations

import json
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
from vllm_provision.evidence.fabric import DEFAULT_MIN_RATIO, DEFAULT_PORT, DEFAULT_SECONDS


@click.command("fabric", epilog=examples(
    'provision fabric -i inventory.yml',
    'provision fabric -i inventory.yml --seconds 5 --min-ratio 0.7 --json',
    'provision fabric -i inventory.yml --no-collective'))
@shared_options(HOST_OPTIONS)
@replica_option("The replica whose nodes to measure")
@click.option("--port", type=click.IntRange(1024, 65535), default=DEFAULT_PORT,
              show_default=True, help="TCP port the receiving node listens on during the test "
              "(a firewall must let the replica's nodes reach it).")
@click.option("--seconds", type=click.FloatRange(0.5, 60), default=DEFAULT_SECONDS,
              show_default=True, help="Seconds of streaming per pair of nodes.")
@click.option("--min-ratio", type=click.FloatRange(0.01, 1.0), default=DEFAULT_MIN_RATIO,
              show_default=True, help="Below this fraction of the link's rated speed a pair "
              "is slow (a warning naming the likely causes).")
@click.option("--rated-gbps", type=click.FloatRange(min=0.001), default=None, metavar="GBPS",
              help="The link's rate in Gb/s, for NICs that report none (virtual NICs, some "
              "bonds) or report it wrong; wins over what they report.")
@click.option("--no-collective", is_flag=True,
              help="Skip the torch.distributed all-reduce and all-gather across the nodes.")
def command(replica_name: str | None, port: int, seconds: float, min_ratio: float,
            rated_gbps: float | None, no_collective: bool, **kwargs: Any) -> None:
    """Measure the link between every pair of a replica's nodes: TCP throughput and RTT.

    For each pair, over the nodes' cluster addresses, with the nodes' own python3: one node
    listens on --port (under ``timeout``, so nothing stays running), the other measures the
    round-trip time and streams for --seconds; the figures sit beside each end's interface,
    rated speed and MTU. Below --min-ratio of the slower end's rate the pair is slow, with the
    likely causes in order. Then every node at once runs torch.distributed all-reduce and
    all-gather with the replica's own venv (NCCL with a GPU, gloo without; bus bandwidth as
    nccl-tests reports it), skipped with the reason on a node without torch. The result is
    stored for ``provision record``. Holds the run lock on every node of the replica. Exit 0
    when every pair was measured and none is slow, 3 otherwise.
    """
    from vllm_provision import settings
    from vllm_provision.cli.bench import pick_replica
    from vllm_provision.evidence import fabric, store
    from vllm_provision.transport import runlock
    from vllm_provision.transport.connection import close_all, open_all

    opts = CommonOptions.from_kwargs(kwargs)
    inv = opts.load_inventory(require_replica=True)
    replica = pick_replica(inv, replica_name)
    layered = {n.name: settings.layered(dict(n.host.vars)) for n in replica.nodes}
    interfaces = {name: values.get("vllm_cluster_interface") for name, values in layered.items()}
    # the replica's own interpreter, whose torch the collective uses (the Ray gate's default)
    pythons = {name: f"{values['vllm_venv']}/bin/python3" for name, values in layered.items()}
    hosts = [n.host for n in replica.nodes]
    with runlock.locked_run(hosts, opts.connection_options(), "fabric",
                            warn=lambda line: click.echo(f"warning: {line}", err=True)
                            ) as factory:
        connections = open_all(hosts, opts.connection_options(), factory)
        try:
            result = fabric.run(replica, connections, interfaces, port=port, seconds=seconds,
                                min_ratio=min_ratio, rated_gbps=rated_gbps,
                                pythons=None if no_collective else pythons)
        finally:
            close_all(connections)
    stored = store.update(inv.path, fabric=result)
    if opts.json:
        echo(json.dumps({**result, "stored": str(stored)}))
    else:
        echo(f"fabric of replica {replica.name} ({len(result['pairs'])} pair(s), "
             f"{seconds:g} s each, port {port})")
        for pair in result["pairs"]:
            echo(f"  {fabric.describe(pair)}")
            for host, link in pair["links"].items():
                echo(f"    {host}: {link.get('interface') or '?'} rated "
                     f"{link.get('speed_mbps') or '?'} Mb/s, MTU {link.get('mtu') or '?'}")
            for i, cause in enumerate(pair["causes"], 1):
                echo(f"    likely cause {i}: {cause}")
        echo(fabric.describe_collective(result["collective"]))
        echo(f"stored: {stored}")
    bad = [p for p in result["pairs"] if p["verdict"] in ("failed", "slow")]
    raise SystemExit(3 if bad else 0)
