"""``provision fault``: a bounded fault experiment: K streams in flight, one fault, polls until
the replica serves again; each stream's fate and what systemd and the watchdog did
(docs/evidence.md). It holds the run lock on every node of the replica, as ``provision up``
does (docs/security.md, "Run lock")."""

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
from vllm_provision.core.errors import ProvisionError


def parse_target(replica: Any, text: str) -> tuple[Any, str]:
    """``NODE[:UNIT]`` -> (the node, the unit); the unit defaults to the node's first unit in
    start order (mp: ``vllm.service``; Ray: the head's or worker's Ray unit).

    Raises:
        ProvisionError: no such node in the replica, or a unit that is not one of the node's.
    """
    name, _, unit = text.partition(":")
    nodes = {n.name: n for n in replica.nodes}
    if name not in nodes:
        raise ProvisionError.single("--kill", f"{name!r} is not a node of replica "
                                    f"{replica.name}", expected=", ".join(nodes),
                                    fix="name a node as the inventory does: --kill h2")
    node = nodes[name]
    units = replica.backend_type.node_units(replica, node, node.host.vars)
    if unit and unit not in units:
        raise ProvisionError.single("--kill", f"{unit!r} is not a unit of ours on {name}",
                                    expected=", ".join(units), fix=f"--kill {name}:{units[0]}")
    return node, unit or units[0]


def front_door_line(seen: dict[str, Any]) -> str:
    """One line of what the front door did (:mod:`vllm_provision.evidence.front_door`)."""
    down = ("never stopped sending to it" if seen["marked_down_s"] is None
            else f"stopped sending to it {seen['marked_down_s']} s after the fault")
    up = ("did not call it healthy again" if seen["marked_up_s"] is None
          else f"called it healthy {seen['marked_up_s']} s after it served again")
    up += ("" if seen.get("sent_again_s") is None
           else f" and sent it requests again {seen['sent_again_s']} s after")
    return (f"front door {seen['host']} ({seen['url']}): {seen['failed']} of "
            f"{seen['requests']} requests failed ({seen['failed_pct']} %"
            f"{', ' + str(seen['failures']) if seen['failures'] else ''}); it {down}, {up}")


@click.command("fault", epilog=examples(
    'provision fault -i inventory.yml --kill h2 --streams 3',
    'provision fault -i inventory.yml --kill h1:vllm.service --signal TERM'))
@shared_options(HOST_OPTIONS)
@replica_option()
@click.option("--kill", "target", required=True, metavar="NODE[:UNIT]",
              help="The node (and unit) to hit.")
@click.option("--signal", type=click.Choice(["KILL", "TERM", "STOP"]), default="KILL",
              show_default=True, help="KILL/TERM: the unit's main process; STOP: all of it.")
@click.option("--streams", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Streamed completions in flight when the fault hits.")
@click.option("--max-tokens", type=click.IntRange(1, 100000), default=512, show_default=True,
              help="Tokens each in-flight stream asks for (long enough to be cut).")
@click.option("--reboot", is_flag=True, help="Reboot the node instead of signalling.")
@click.option("--partition", "partition_s", type=click.FloatRange(min=0.1), default=None,
              metavar="SECONDS", help="Cut the node's network this long instead (lab, or "
              "with --partition-command and --heal-command).")
@click.option("--partition-command", metavar="CMD",
              help="Controller-side command cutting a real host's network (address appended).")
@click.option("--heal-command", metavar="CMD",
              help="Controller-side command healing it (address appended).")
@click.option("--bound", "bound_s", type=click.FloatRange(min=1), default=300.0,
              show_default=True, help="Seconds to poll for a new success before giving up.")
@click.option("--read-timeout", type=click.FloatRange(min=0.1), default=60.0,
              show_default=True, help="Seconds without a byte before a stream counts as hung.")
@click.option("--front-door", "front_door", metavar="HOST", default=None,
              help="Also keep a steady load going through the front door on HOST (a host of "
                   "vllm_gateways) and report its failed requests and when the router stopped "
                   "and resumed sending to the replica (docs/evidence.md).")
def command(replica_name: str | None, target: str, signal: str, streams: int,
            max_tokens: int, reboot: bool, partition_s: float | None,
            partition_command: str | None, heal_command: str | None, bound_s: float,
            read_timeout: float, front_door: str | None, **kwargs: Any) -> None:
    """Hit one node of a serving replica and measure how traffic returns.

    Starts K streamed completions, applies the fault once they generate (through the same
    SSH connections), polls with new completions until one succeeds or the bound passes, and
    reports the time from the fault to the first new success, each stream's fate, start
    limits hit, and systemd's and the watchdog's journal lines with their times. The result is
    stored for ``provision record``. Holds the run lock on every node of the replica, as
    `provision up` does. With ``--front-door HOST``, a steady load also goes through the front
    door, and its failed requests and the router's view of the replica are reported. Exit 0
    when the replica served again, 3 otherwise.
    """
    from vllm_provision.cli.bench import pick_replica
    from vllm_provision.evidence import fault, store
    from vllm_provision.transport import runlock
    from vllm_provision.transport.connection import close_all, open_all

    opts = CommonOptions.from_kwargs(kwargs)
    inv = opts.load_inventory(require_replica=True)
    replica = pick_replica(inv, replica_name)
    node, unit = parse_target(replica, target)
    if reboot and partition_s is not None:
        raise ProvisionError.single("--reboot", "--reboot and --partition are two faults",
                                    fix="run one experiment per fault")
    if (partition_command is None) != (heal_command is None):
        raise ProvisionError.single("--partition-command", "give both commands or neither",
                                    fix="add --heal-command (or --partition-command)")
    argv = (fault.partition_commands(node.host, partition_command, heal_command)
            if partition_s is not None else None)
    door = None
    if front_door is not None:
        from vllm_provision.inventory.gateways import client_url

        door = (front_door, client_url(inv, front_door))
    options = opts.connection_options()
    hosts = [n.host for n in replica.nodes]
    with runlock.locked_run(hosts, options, "fault",
                            warn=lambda line: click.echo(f"warning: {line}", err=True)
                            ) as factory:
        connections = open_all(hosts, options, factory)
        try:
            result = fault.run(replica, connections, dict(replica.master.host.vars), node=node,
                               unit=unit, signal=signal, streams=streams,
                               max_tokens=max_tokens, reboot=reboot, partition_s=partition_s,
                               partition_argv=argv, bound_s=bound_s,
                               read_timeout_s=read_timeout, held=factory.ensure_held,
                               front_door=door)
        finally:
            close_all(connections)
    result["conditions"] = {"replica": replica.name, "backend": replica.backend,
                            "model": replica.engine.model,
                            "tensor_parallel_size": replica.engine.tensor_parallel_size,
                            "pipeline_parallel_size": replica.engine.pipeline_parallel_size,
                            "hosts": [n.name for n in replica.nodes]}
    key = f"{node.name}:{unit}"
    stored = store.update(inv.path, fault=(key, result))
    rec = result["recovery"]
    if opts.json:
        echo(json.dumps({**result, "stored": str(stored)}))
    else:
        echo(f"fault on {key} (rank {node.rank}): {result['target']['applied']}")
        if rec["recovered_s"] is None:
            echo(f"no new successful completion within {bound_s:g} s "
                       f"({rec['polls']} polls, failures {rec['failures']})")
        elif rec["served_throughout"]:
            echo(f"served throughout: no poll failed within {bound_s:g} s")
        else:
            echo(f"first failed poll {rec['first_failure_s']} s after the fault; serving "
                       f"again {rec['recovered_s']} s after the fault ({rec['polls']} polls, "
                       f"failures {rec['failures']})")
        for i, item in enumerate(result["streams"]):
            echo(f"  stream {i}: {fault.describe_fate(item)}")
        echo(f"start limit hit: {', '.join(result['start_limit_hit']) or 'none'}")
        if "front_door" in result:
            echo(front_door_line(result["front_door"]))
        for event in result["events"]:
            when = "-" if event["t_s"] is None else f"{event['t_s']:+.1f} s"
            echo(f"  {when:>9} {event['host']:<6} {event['source']:<8} {event['message']}")
        echo(f"stored: {stored}")
    raise SystemExit(0 if rec["recovered_s"] is not None else 3)
