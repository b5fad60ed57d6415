"""``provision status``: per node unit state, main PID, since when, restarts, last failure; rank 0
health; Ray nodes and GPUs; whether the replica is whole (peer watchdogs, docs/recovery.md); one
verdict line (serving / degraded / down). A node it cannot reach is reported, not fatal."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, echo, shared_options
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.text import one_line

if TYPE_CHECKING:
    from vllm_provision.core.models import Replica


def replica_status(replica: Any, connections: dict[str, Any], vars_: dict[str, Any],
                   unreachable: dict[str, str] | None = None, *,
                   deployed_at: float | None = None) -> dict[str, Any]:
    """Read one replica's units, rank 0's /health and (Ray) the cluster; return a JSON-ready dict.

    Args:
        replica: the :class:`~vllm_provision.core.models.Replica`.
        connections: host name -> open connection, for the nodes that could be reached.
        vars_: rank 0's variables (unit names).
        unreachable: host name -> one-line reason, for nodes whose connection failed to open;
            a node in neither mapping, or whose command fails with
            :class:`~vllm_provision.transport.base.UnreachableError`, joins them.
        deployed_at: when the ``up`` that last (re)started the replica began (epoch seconds,
            from the state record, ``vllm_provision.state``); failures before it are older
            ones. None: every failure of this boot is current.

    Keys: ``replica``, ``backend``, ``api_path`` (``direct`` or ``ssh via <rank 0>``: how
    ``health`` was read, ``vllm_api_via``), ``units`` (host, unit, state, main_pid, since, restarts,
    result, exit_status, last_failure: the last one since ``deployed_at``, older_failures: the
    earlier ones of this boot, newest first; state ``unreachable`` and the rest None for the
    units of an unreachable node), ``unreachable`` (host -> reason, one line naming host and
    address), ``health`` (HTTP status or None), ``ray`` (nodes and GPUs, Ray only),
    ``watchdogs`` (host -> running: the watchdog unit is active; whole, held_until, probe: the
    completion probe's published state, and age_s: seconds since the watchdog wrote them, all
    None when it does not run), ``down`` (true when every unit is stopped and rank 0 does not
    answer: nothing else is worth reading), ``whole``
    (bool, None when unknown; False when a node is unreachable),
    ``verdict`` (never ``serving`` when a node is unreachable).
    """
    from vllm_provision import settings
    from vllm_provision.modules.vllm_wait_ready import replica_units
    from vllm_provision.state.recovery import (
        WATCHDOG_STATE,
        WATCHDOG_UNIT,
        node_command,
        parse_node,
        replica_whole,
    )
    from vllm_provision.transport.api import Endpoint, parse_show, show_command, verdict
    from vllm_provision.transport.base import UnreachableError
    from vllm_provision.transport.tunnel import route_for

    nodes = {node.name: node for node in replica.nodes}

    def watchdog_of(host: str) -> tuple[str, str]:
        """The node's watchdog state file and unit (``vllm_watchdog_state_file``,
        ``vllm_watchdog_unit_name``: its own on a shared server, docs/inventory.md "Shared
        servers")."""
        if host not in nodes:
            return WATCHDOG_STATE, WATCHDOG_UNIT
        values = settings.node_settings(replica, nodes[host])
        return (str(values["vllm_watchdog_state_file"]),
                str(values["vllm_watchdog_unit_name"]))

    expected = replica_units(replica, vars_)
    lost = {host: reason for host, reason in (unreachable or {}).items() if host in expected}
    states = []
    recovery = {}
    for host, units in expected.items():
        if host in lost or host not in connections:
            lost.setdefault(host, f"{host}: no connection")
            continue
        try:
            result = connections[host].run(
                show_command(units) + "; " + node_command(units, *watchdog_of(host)),
                timeout_s=30)
        except UnreachableError as exc:
            lost[host] = one_line(exc)
            continue
        shown, _, rest = result.stdout.partition("== vllm-provision ")
        states.extend(parse_show(host, shown)[0])
        recovery[host] = parse_node("== vllm-provision " + rest if rest else "")
    try:
        route = route_for(replica, connections.get(replica.master.name))
        health = Endpoint.for_replica(replica, timeout_s=5, route=route).health()
        api_path = route.describe
    except ProvisionError:  # through SSH, and rank 0 has no connection: no answer
        health, api_path = None, f"ssh via {replica.master.name} (no connection)"
    servers = _api_servers(replica, connections, health)
    info: dict[str, Any] = {
        "replica": replica.name, "backend": replica.backend, "health": health,
        "api_path": api_path,
        "units": [{"host": s.host, "unit": s.unit, "state": s.describe, "main_pid": s.main_pid,
                   "since": _iso(s.started_at) if s.active_state == "active" else None,
                   "restarts": s.restarts, "result": s.result, "exit_status": s.exit_status,
                   "last_failure": recovery[s.host].failures_since(s.unit, deployed_at)[0],
                   "older_failures": recovery[s.host].failures_since(s.unit, deployed_at)[1]}
                  for s in states]
        + [{"host": host, "unit": unit, "state": "unreachable", "main_pid": None, "since": None,
            "restarts": None, "result": None, "exit_status": None, "last_failure": "",
            "older_failures": []}
           for host in lost for unit in expected[host]],
        "unreachable": lost,
        "watchdogs": {host: {"running": bool(r.watchdog_running), "whole": r.whole,
                             "held_until": (r.watchdog or {}).get("held_until"),
                             "probe": (r.watchdog or {}).get("probe"),
                             "age_s": (None if r.watchdog_age_s is None
                                       else round(r.watchdog_age_s, 1))}
                      for host, r in recovery.items()}}
    if servers is not None:
        info["api_servers"] = servers
        # the replica serves when every API server does: the first that does not decides
        health = next((code for code in servers.values() if code != 200), health)
    info.update(replica.backend_type.status_view(replica, states, lost, connections, vars_))
    ray_alive = len(info["ray"].get("nodes", [])) if "nodes" in info.get("ray", {}) else None
    info["whole"] = False if lost else replica_whole(
        recovery, ray_alive, replica.nnodes if ray_alive is not None else None)
    info["verdict"] = verdict(states, health, whole=info["whole"],
                              expected_units=sum(len(units) for units in expected.values()))
    info["down"] = (info["verdict"] == "down" and not lost and bool(states)
                    and all(s.active_state == "inactive" for s in states))
    return info


def _api_servers(replica: Replica, connections: Mapping[str, Any],
                 rank0: int | None) -> dict[str, int | None] | None:
    """Each API server's ``/health`` status (None: no answer) by host, rank 0's as read
    (``rank0``), of a hybrid data-parallel replica (docs/serving.md); None for other replicas,
    which serve from rank 0 alone."""
    if not replica.hybrid:
        return None
    from vllm_provision.transport.api import Endpoint
    from vllm_provision.transport.tunnel import route_to_node

    found: dict[str, int | None] = {replica.master.name: rank0}
    for node in replica.api_nodes[1:]:
        try:
            route = route_to_node(replica, node, connections.get(node.name))
            found[node.name] = Endpoint(route.base_url, replica.engine.api_key, timeout_s=5,
                                        route=route).health()
        except ProvisionError:
            found[node.name] = None
    return found


def _watchdog_word(state: dict[str, Any]) -> str:
    if not state.get("running", True):
        return "not running"
    word = "held" if state["held_until"] else {True: "bound", False: "unbound",
                                               None: "absent"}[state["whole"]]
    age = state.get("age_s")
    return f"{word} {age:.0f} s ago" if isinstance(age, (int, float)) else word


def deployment_times(record: dict[str, Any] | None) -> dict[str, float]:
    """Replica name -> ``deployed_at`` of the state record as epoch seconds (those recorded)."""
    found: dict[str, float] = {}
    for name, item in ((record or {}).get("replicas") or {}).items():
        stamp = item.get("deployed_at") if isinstance(item, dict) else None
        if isinstance(stamp, str):
            try:
                found[str(name)] = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
                    tzinfo=UTC).timestamp()
            except ValueError:
                continue
    return found


def _iso(seconds: float | None) -> str | None:
    return datetime.fromtimestamp(seconds, UTC).isoformat() if seconds else None


@click.command("status", epilog=examples(
    'provision status -i inventory.yml',
    'provision status -i inventory.yml --history',
    'provision status -i inventory.yml --json | jq ".replicas[].verdict"',
    'provision status -i fleet.yml --watch --duration 600 --json > capacity.json'))
@shared_options(HOST_OPTIONS)
@click.option("--history", is_flag=True,
              help="Also show failures from before the current deployment (this boot).")
@click.option("--watch", is_flag=True,
              help="Poll every replica's /health each --interval and show how many serve, "
                   "second by second, until Ctrl-C or --duration (no SSH).")
@click.option("--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              metavar="S", help="With --watch: seconds between polls.")
@click.option("--duration", type=click.FloatRange(min=0), default=None, metavar="S",
              help="With --watch: stop after S seconds.")
def command(history: bool, watch: bool, interval: float, duration: float | None,
            **kwargs: Any) -> None:
    """Show each replica's units, rank 0's health, Ray's nodes and GPUs, and a verdict.

    A node that cannot be reached (SSH refused or timed out, authentication or host key refused)
    is reported as ``unreachable`` with the reason; the others are read as usual. A replica whose
    units are all stopped prints only ``<replica>: down``. "last failure" is the current
    deployment's (since the ``up`` that last started the replica, from the state record);
    ``--history`` adds the older ones. The watchdog's state is read only while it runs, with
    its age.

    With a front door (group ``vllm_gateways``), each replica shows what every gateway's
    router thinks of it (``front door h1: healthy (load 0)``, ``unhealthy``, ``absent``),
    read from the router's ``GET /workers`` through the gateway host's SSH connection; a
    gateway that cannot be read shows ``unknown`` with the reason and changes no exit code.

    Exit code: 0 when every replica serves, 3 otherwise (as ``systemctl status``), 1 on an
    invalid inventory or when a node is unreachable (the report is printed first).
    """
    from vllm_provision import state
    from vllm_provision.state.recovery import describe_probe
    from vllm_provision.transport import router
    from vllm_provision.transport.connection import close_all, open_connections

    opts = CommonOptions.from_kwargs(kwargs)
    inv = opts.load_inventory()
    if watch:
        sys.exit(_watch(inv, interval, duration, opts.json, opts))
    try:
        record = state.read_controller_record(inv.path)
    except ProvisionError:
        record = None  # an unreadable record: every failure of this boot is current
    deployed = deployment_times(record)
    starts = state.recorded_starts(record)
    as_json = opts.json
    hosts = {node.name: node.host for replica in inv.replicas for node in replica.nodes}
    gateways = router.front_doors(inv)
    hosts.update({g.host: inv.hosts[g.host] for g in gateways})
    connections, errors = open_connections(hosts.values(), opts.connection_options())
    unreachable = {host: one_line(error) for host, error in errors.items()}
    try:
        replicas = [replica_status(replica, connections, dict(replica.master.host.vars),
                                   unreachable, deployed_at=deployed.get(replica.name))
                    for replica in inv.replicas]
        doors = router.read_front_doors(gateways, connections, unreachable)
    finally:
        close_all(connections)
    for info, replica in zip(replicas, inv.replicas, strict=True):
        info["starts"] = starts.get(info["replica"], {})  # the state record's (docs/deploy.md)
        info["front_door"] = router.replica_view(replica.api_url, doors)
    if as_json:
        echo(json.dumps({"replicas": replicas,
                         "gateways": {h: read.to_json() for h, read in doors.items()}}))
    else:
        for info in replicas:
            if info["down"]:  # stopped on purpose or not: nothing else to read
                echo(f"{info['replica']}: down")
                continue
            echo(f"replica {info['replica']} ({info['backend']})")
            for unit in info["units"]:
                if unit["state"] == "unreachable":  # one line per node below, with the reason
                    continue
                echo(f"  {unit['host']:<12} {unit['unit']:<20} {unit['state']:<24} "
                           f"pid {unit['main_pid']:<7} since {unit['since'] or '-'}  "
                           f"restarts {unit['restarts']}  result {unit['result']}")
                if unit["last_failure"]:
                    echo(f"    last failure: {unit['last_failure']}")
                for line in unit["older_failures"] if history else ():
                    echo(f"    earlier failure: {line}")
            for host, reason in info["unreachable"].items():
                echo(f"  {host:<12} {'unreachable':<20} {reason}")
            echo(f"  rank 0 /health: {info['health'] or 'no answer'}  "
                       f"(API path: {info['api_path']})")
            if "api_servers" in info:  # hybrid data parallel: every node serves its engines
                echo("  API servers /health: " + ", ".join(
                    f"{host} {code or 'no answer'}" for host, code in info["api_servers"].items()))
            echo(f"  starts (state record): {state.describe_starts(info['starts'])}")
            if "ray" in info:
                ray = dict(info["ray"])
                pending = ray.pop("pending", None)
                echo(f"  ray: {ray}")
                if pending:
                    echo(f"  pending: {pending}")
            whole = {True: "yes", False: "no",
                     None: "unknown (no running watchdog)"}[info["whole"]]
            echo(f"  whole: {whole}  (watchdogs: " + ", ".join(
                [f"{h} {_watchdog_word(w)}" for h, w in info["watchdogs"].items()
                 if h not in info["unreachable"]]
                + [f"{h} unreachable" for h in info["unreachable"]]) + ")")
            for host, watchdog in info["watchdogs"].items():
                probe = describe_probe(watchdog.get("probe"), watchdog.get("age_s") or 0.0)
                if probe:
                    echo(f"  completion probe on {host}: {probe}")
            for host, seen in info["front_door"].items():
                echo("  " + router.describe_view(host, seen))
            echo(f"{info['replica']}: {info['verdict']}")
    if any(info["unreachable"] for info in replicas):
        sys.exit(1)
    sys.exit(0 if all(i["verdict"] == "serving" for i in replicas) else 3)


def _watch(inv: Any, interval_s: float, duration_s: float | None, as_json: bool,
           opts: CommonOptions) -> int:
    """``status --watch``: the capacity probe (``vllm_provision.operations.fleet.CapacityProbe``)
    over
    every replica's endpoint, one line per poll; the record at the end (``--json``: the one
    object). Exit 0 when every replica served at every poll, 3 otherwise. A replica reached
    through SSH (``vllm_api_via``) is polled over a connection to its rank 0, held meanwhile."""
    from vllm_provision.transport.connection import close_all, open_connections
    from vllm_provision.transport.tunnel import choices_for, route_for

    chosen = choices_for(list(inv.replicas))
    masters = [r.master.host for r in inv.replicas if chosen[r.name].via == "ssh"]
    connections, _ = (open_connections(masters, opts.connection_options()) if masters
                      else ({}, {}))
    routes = {}
    for replica in inv.replicas:
        try:
            routes[replica.name] = route_for(replica, connections.get(replica.master.name))
        except ProvisionError:
            pass  # rank 0 unreachable over SSH: polled directly, and counted down
    try:
        return _watch_routes(inv, interval_s, duration_s, as_json, routes)
    finally:
        close_all(connections)


def _watch_routes(inv: Any, interval_s: float, duration_s: float | None, as_json: bool,
                  routes: dict[str, Any]) -> int:
    from vllm_provision.operations import fleet

    endpoints = {replica.name: replica.api_url for replica in inv.replicas}

    def line(sample: dict[str, Any]) -> None:
        down = f"  down: {', '.join(sample['down'])}" if sample["down"] else ""
        echo(f"{sample['t_s']:8.1f} s  serving {sample['serving']}/{len(endpoints)}"
                   f"{down}", err=as_json)

    probe = fleet.CapacityProbe(endpoints, interval_s, on_sample=line, routes=routes)
    try:
        probe.run(duration_s)
    except KeyboardInterrupt:
        pass
    record = fleet.capacity_summary(probe.samples, len(endpoints), interval_s)
    if as_json:
        echo(json.dumps({"watch": record}))
    elif record["samples"]:
        echo(f"at least {record['min_serving']} of {len(endpoints)} replicas served at "
                   f"every poll ({len(record['samples'])} polls)")
    return 0 if record["min_serving"] == len(endpoints) else 3
