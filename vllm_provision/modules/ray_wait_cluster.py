"""Wait until the Ray cluster of a replica has every node alive and every GPU, then check placement.

Run on the Ray head (``run_once`` on ``vllm_master``). The state comes from Ray's own API run with
the venv's Python on the head (``ray.nodes()``, ``ray.cluster_resources()``,
``ray.util.placement_group_table()``), never from ``ray status`` text. Also used by
``vllm_wait_ready`` to explain a placement group that stays pending.

Example task::

    - name: Wait until Ray reports every node and GPU
      ray_wait_cluster: {timeout_s: 300}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_provision import backends, settings
from vllm_provision.core import hostjson
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Replica
from vllm_provision.core.quoting import python_loader, shell_join
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext
from vllm_provision.output import progress
from vllm_provision.settings import ray_auth
from vllm_provision.transport.base import Connection

ARGUMENT_SPEC = ArgumentSpec("ray_wait_cluster", (
    Argument("timeout_s", "float", "seconds to wait in all",
             default_text="the ray_cluster_timeout_s variable (300)", minimum=0),
    Argument("poll_s", "float", "seconds between polls", default=2.0, minimum=0.05),
    Argument("gpus_per_node", "float", "GPUs every node must show in Ray",
             default_text="ray_num_gpus, else the GPUs preflight found, else world size / "
                          "nodes", minimum=0),
))

# Runs on the head as the service user; prints one JSON object. Ray API: ray.nodes(),
# ray.cluster_resources(), ray.available_resources(), ray.util.placement_group_table().
# Seconds the snapshot's Ray driver may take (connect, read the tables) before it is stopped:
# well under a command's time limit (30 s), since a play's batch of reads may carry it.
SNAPSHOT_BOUND_S = 20
SNAPSHOT_SCRIPT = r"""
import json, sys
import ray
from ray.util import placement_group_table
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False,
         include_dashboard=False)
nodes = ray.nodes()
ips = {n.get("NodeID"): n.get("NodeManagerAddress") for n in nodes}
out = {"nodes": [{"ip": n.get("NodeManagerAddress"), "alive": bool(n.get("Alive")),
                  "resources": n.get("Resources") or {}} for n in nodes],
       "total": ray.cluster_resources(), "available": ray.available_resources(),
       "placement_groups": [], "free": {}, "holders": []}
for pg_id, pg in placement_group_table().items():
    on = pg.get("bundles_to_node_id") or {}
    out["placement_groups"].append({
        "id": pg_id, "name": pg.get("name", ""), "state": pg.get("state"),
        "strategy": pg.get("strategy"),
        "bundles": [dict(b) for b in (pg.get("bundles") or {}).values()],
        "scheduling_state": (pg.get("stats") or {}).get("scheduling_state"),
        "nodes": [ips.get(on[k], "") for k in sorted(on)]})
try:  # DeveloperAPI (ray._private.state): each live node's free resources, by node id
    from ray._private import state
    for node_id, free in state.available_resources_per_node().items():
        out["free"][ips.get(node_id, node_id)] = free
    for actor in state.actors(actor_state_name="ALIVE").values():
        out["holders"].append({
            "kind": "actor", "name": actor.get("Name") or actor.get("ActorClassName") or "",
            "job": actor.get("JobID", ""), "pid": actor.get("Pid"),
            "ip": (actor.get("Address") or {}).get("IPAddress", "")})
except Exception:  # an older or newer Ray without it: the cluster-wide figures stay
    pass
print("RAY-SNAPSHOT " + json.dumps(out))
"""


@dataclass(frozen=True)
class RaySnapshot:
    """What Ray reports about its cluster.

    Attributes:
        nodes: ``{"ip", "alive", "resources"}`` per node (``resources["GPU"]`` = logical GPUs).
        total: ``ray.cluster_resources()`` of alive nodes.
        available: ``ray.available_resources()``.
        placement_groups: ``{"id","name","state","strategy","bundles","scheduling_state",
            "nodes"}`` (``nodes``: the IP each bundle was placed on, once placed).
        free: node IP -> its free resources now (Ray's DeveloperAPI
            ``ray._private.state.available_resources_per_node``); empty when this Ray lacks it.
        holders: alive actors ``{"kind", "name", "job", "pid", "ip"}``: who may hold resources
            (Ray's actor table; an actor's own demand is not in it).
    """

    nodes: list[dict[str, Any]]
    total: dict[str, float]
    available: dict[str, float]
    placement_groups: list[dict[str, Any]]
    free: dict[str, dict[str, float]] = field(default_factory=dict)
    holders: list[dict[str, Any]] = field(default_factory=list)

    @property
    def alive_ips(self) -> list[str]:
        """IPs of alive nodes (Ray's ``NodeManagerAddress``: its ``--node-ip-address``)."""
        return [str(n["ip"]) for n in self.nodes if n.get("alive")]

    def gpus_of(self, ip: str) -> float:
        """Logical GPUs Ray registered for the alive node at ``ip`` (0 when unknown)."""
        return sum(float(n["resources"].get("GPU", 0)) for n in self.nodes
                   if n.get("alive") and n["ip"] == ip)


def parse_snapshot(stdout: str) -> RaySnapshot | None:
    """Parse :data:`SNAPSHOT_SCRIPT`'s output; None when it printed no snapshot line, or one
    that is not the snapshot's JSON object (the host's answer is not trusted: a broken line is
    "no snapshot yet", never an internal error)."""
    for line in stdout.splitlines():
        if line.startswith("RAY-SNAPSHOT "):
            try:
                data = hostjson.loads(line.removeprefix("RAY-SNAPSHOT "))
                return RaySnapshot(data["nodes"], data["total"], data["available"],
                                   data["placement_groups"], data.get("free") or {},
                                   data.get("holders") or [])
            except (ValueError, KeyError, TypeError, AttributeError):
                return None
    return None


def cluster_gaps(snapshot: RaySnapshot, expected: Mapping[str, float]) -> list[str]:
    """What is missing for the cluster to be whole, in words; empty when whole.

    Args:
        expected: node IP -> GPUs it must contribute.
    """
    gaps = []
    for ip, gpus in expected.items():
        if ip not in snapshot.alive_ips:
            gaps.append(f"node {ip} is not alive in Ray")
        elif snapshot.gpus_of(ip) < gpus:
            gaps.append(f"node {ip} has {snapshot.gpus_of(ip):g} GPUs in Ray, expected {gpus:g}")
    return gaps


def placement_problem(snapshot: RaySnapshot, world_size: int, driver_ip: str,
                      where: str) -> Problem | None:
    """Can vLLM's placement group be placed on this live cluster?

    vLLM's Ray executor asks for ``world_size`` bundles of ``{"GPU": 1}`` with strategy PACK and
    pins bundle 0 to the driver with ``node:<VLLM_HOST_IP>`` (vllm/v1/executor/ray_utils.py,
    ``initialize_ray_cluster``). It is feasible when Ray knows the driver's IP, that node has a
    GPU, and the cluster has ``world_size`` GPUs.
    """
    if driver_ip not in snapshot.alive_ips:
        return Problem(where, f"vLLM's VLLM_HOST_IP {driver_ip} is not the address of any Ray "
                       "node, so its placement group (bundle 0 pinned to node:" + driver_ip +
                       ") can never be placed",
                       expected="one of Ray's node IPs: " + ", ".join(snapshot.alive_ips),
                       actual=driver_ip,
                       fix="remove the VLLM_HOST_IP override from vllm_env / vllm_node_env, or "
                           "make vllm_host_ip the address Ray uses (--node-ip-address)")
    if snapshot.gpus_of(driver_ip) < 1:
        return Problem(where, "the Ray head has no GPU, but vLLM pins its first worker there",
                       expected=">= 1 GPU on " + driver_ip, actual="0",
                       fix="set ray_num_gpus on the head")
    total = float(snapshot.total.get("GPU", 0))
    if total < world_size:
        return Problem(where, f"the Ray cluster has {total:g} GPUs, vLLM needs {world_size} "
                       "(tensor x pipeline parallel size)",
                       expected=f">= {world_size} GPUs", actual=f"{total:g}",
                       fix="add nodes/GPUs or lower the parallel sizes")
    return None


def pending_placement_problem(snapshot: RaySnapshot, where: str) -> Problem | None:
    """Explain a placement group that is still PENDING, with Ray's own reason; None if none.

    ``stats.scheduling_state`` comes from Ray: ``INFEASIBLE`` (no node can ever hold a bundle),
    ``NO_RESOURCES`` (feasible, but resources are held by others). A bundle pinned to
    ``node:<ip>`` that no Ray node has means VLLM_HOST_IP differs from Ray's node IP
    (vLLM docs distributed_troubleshooting.md).
    """
    for pg in snapshot.placement_groups:
        if pg.get("state") != "PENDING":
            continue
        pinned = {key.removeprefix("node:") for bundle in pg["bundles"] for key in bundle
                  if key.startswith("node:") and not key.startswith("node:__internal")}
        unknown = sorted(ip for ip in pinned if ip not in snapshot.alive_ips)
        state = pg.get("scheduling_state") or "unknown"
        if unknown:
            return Problem(where, f"placement group {pg['id'][:12]} is pending ({state}): it is "
                           f"pinned to node:{unknown[0]}, which is not a Ray node; VLLM_HOST_IP "
                           "does not match the IP Ray registered",
                           expected="VLLM_HOST_IP one of " + ", ".join(snapshot.alive_ips),
                           actual=unknown[0],
                           fix="make VLLM_HOST_IP equal to Ray's --node-ip-address on the head "
                               "(drop the override in vllm_env)")
        if state == "INFEASIBLE":
            misfits = [i for i, bundle in enumerate(pg["bundles"])
                       if not any(fits(bundle, n["resources"]) for n in snapshot.nodes
                                  if n.get("alive"))]
            named = ", ".join(f"bundle {i} {format_resources(pg['bundles'][i])}"
                              for i in misfits) or f"one of its bundles {pg['bundles']}"
            per_node = ", ".join(f"{n['ip']}: {n['resources'].get('GPU', 0):g} GPU"
                                 for n in snapshot.nodes if n.get("alive"))
            return Problem(where, f"placement group {pg['id'][:12]} is INFEASIBLE: no node can "
                           f"ever hold {named}",
                           expected="every bundle fits on one node", actual=per_node,
                           fix="a bundle must fit on a single node; lower the GPUs per bundle")
    return None


def fits(bundle: Mapping[str, float], resources: Mapping[str, float]) -> bool:
    """True when ``resources`` (one node's total or free) hold every amount ``bundle`` asks for.

    Ray places a bundle on a single node (docs.ray.io, "Placement Groups": "a bundle must be
    able to fit on a single node"); ``node:<ip>`` is a resource only that node has."""
    return all(float(resources.get(key, 0)) >= float(amount) for key, amount in bundle.items())


def format_resources(resources: Mapping[str, float]) -> str:
    """``{GPU: 1, node:10.0.0.11: 0.001}``: Ray's resource names and amounts, Ray's internal
    ``node:__internal_head__`` marker left out."""
    return "{" + ", ".join(f"{key}: {float(value):g}" for key, value in sorted(resources.items())
                           if not key.startswith("node:__internal")) + "}"


def pending_resources(snapshot: RaySnapshot) -> str | None:
    """Explain a placement group pending with NO_RESOURCES (feasible, but held by others).

    Says what each bundle asks for, each alive node's FREE resources of those kinds (Ray's
    per-node available resources) against its total, and where Ray knows who holds them: the
    alive actors and the other placement groups placed on a node that has less free than total.

    Returns:
        One line, or None when no placement group is pending for want of resources.
    """
    for pg in snapshot.placement_groups:
        if pg.get("state") != "PENDING" or pg.get("scheduling_state") != "NO_RESOURCES":
            continue
        counts: dict[str, int] = {}
        for bundle in pg["bundles"]:
            counts[format_resources(bundle)] = counts.get(format_resources(bundle), 0) + 1
        demand = " + ".join(f"{n} x {text}" for text, n in counts.items())
        kinds = sorted({k for b in pg["bundles"] for k in b if not k.startswith("node:")})
        free_parts, held_parts = [], []
        for node in snapshot.nodes:
            if not node.get("alive"):
                continue
            ip, total = str(node["ip"]), node["resources"]
            free = snapshot.free.get(ip)
            if free is None:
                continue
            free_parts.append(f"{ip}: " + ", ".join(
                f"{float(free.get(k, 0)):g} of {float(total.get(k, 0)):g} {k}" for k in kinds))
            if any(float(free.get(k, 0)) < float(total.get(k, 0)) for k in kinds):
                here = [f"actor {h['name']} (pid {h['pid']}, job {h['job']})"
                        for h in snapshot.holders if h.get("ip") == ip]
                here += [f"placement group {other['id'][:12]}" for other in
                         snapshot.placement_groups if other is not pg
                         and other.get("state") == "CREATED" and ip in other.get("nodes", [])]
                held_parts.append(f"{ip} by " + (", ".join(here) if here else
                                                 "something Ray does not name"))
        free_text = "; ".join(free_parts) if free_parts else "cluster-wide " + ", ".join(
            f"{float(snapshot.available.get(k, 0)):g} of {float(snapshot.total.get(k, 0)):g} {k}"
            for k in kinds)
        text = (f"placement group {pg['id'][:12]} ({pg.get('strategy')}) is pending "
                f"(NO_RESOURCES): it needs {demand}; free now: {free_text}")
        if held_parts:
            text += "; held on " + "; ".join(held_parts)
        return text
    return None


def snapshot_command(replica: Replica, vars_: Mapping[str, Any]) -> str:
    """The shell command printing a :class:`RaySnapshot` from the head, as the service user,
    with the replica's Ray authentication environment (``settings.ray_auth.env_words``: the
    snapshot is a Ray driver, refused without the token when ``vllm_ray_auth: token``).

    The script rides in the command line (``python -c``, :func:`~vllm_provision.core.quoting.
    python_loader`), so the command reads no standard input and a play's batch of reads can
    carry its first poll (:func:`read_command`). It is bounded, so that no batch waits on it:
    without a GCS accepting connections (bash's ``/dev/tcp``, 2 s) it prints nothing and exits
    3 at once, as a snapshot that found no Ray; the driver itself gets
    :data:`SNAPSHOT_BOUND_S` seconds (``ray.init`` retries a GCS that does not answer for a
    minute by default).
    """
    values = settings.layered(vars_)
    python = f"{values['vllm_venv']}/bin/python"
    address = f"{replica.master.host_ip}:{values['ray_port']}"
    user = str(values["vllm_service_user"])
    home = str(values["vllm_state_dir"])
    snapshot = shell_join(["timeout", str(SNAPSHOT_BOUND_S), "runuser", "-u", user, "--", "env",
                           f"HOME={home}", *ray_auth.env_words(values),
                           "RAY_USAGE_STATS_ENABLED=0", python, "-c",
                           python_loader(SNAPSHOT_SCRIPT, name="ray_snapshot.py"), address])
    listening = shell_join(["timeout", "2", "bash", "-c",
                            f": </dev/tcp/{replica.master.host_ip}/{int(values['ray_port'])}"])
    return (f"if {listening} 2>/dev/null; then {snapshot}; else echo 'no Ray GCS accepts "
            f"connections at '{shell_join([address])} >&2; exit 3; fi")


def read_command(ctx: ModuleContext, args: Any) -> str | None:
    """The first poll's command, on the head (the module read protocol, vllm_provision.modules,
    "read_command"): a play's batch carries it, so a Ray cluster that is already whole is seen
    without a round trip of its own; None in check mode or off a Ray replica (``run`` polls
    nothing there)."""
    replica = ctx.replica
    if replica is None or ctx.check_mode or not backends.of(replica).ray_cluster \
            or replica.master.name != ctx.host.name:
        return None
    return snapshot_command(replica, ctx.vars)


def read_snapshot(ctx: ModuleContext, replica: Replica) -> tuple[RaySnapshot | None, str]:
    """Run the snapshot on the head (its connection, else the task's); see
    :func:`read_head_snapshot`."""
    conn = ctx.connections.get(replica.master.name, ctx.conn)
    return read_head_snapshot(conn, replica, ctx.vars)


def read_head_snapshot(conn: Connection, replica: Replica, vars_: Mapping[str, Any],
                       ) -> tuple[RaySnapshot | None, str]:
    """Run the snapshot over ``conn`` (the head's connection) with the unit variables ``vars_``.

    Returns:
        (the snapshot, or None when Ray's API did not answer; the last 600 characters of the
        error output).

    Raises:
        UnreachableError: the connection failed.
    """
    result = conn.run(snapshot_command(replica, vars_), timeout_s=90)
    snapshot = parse_snapshot(result.stdout) if result.exit_code == 0 else None
    return snapshot, (result.stderr or result.stdout).strip()[-600:]


def expected_gpus(ctx: ModuleContext, replica: Replica,
                  gpus_per_node: float | None) -> dict[str, float]:
    """Node IP -> GPUs it must show in Ray: ``gpus_per_node``, else the node's own
    ``ray_num_gpus``, else the GPUs of its ``vllm_gpus`` (``Node.gpus``: all ``ray start`` sees
    through CUDA_VISIBLE_DEVICES, and its ``--num-gpus``), else the GPUs preflight found on that
    node, else the world size divided evenly over the nodes (roles/ray/templates/ray-unit.j2
    renders ``--num-gpus`` by the same rule).

    ``ray_num_gpus`` is a host variable (docs/inventory.md): each node's ``ray start`` gets its
    own (roles/ray/templates/ray-unit.j2 renders it on that host), so the expectation reads the
    node's settings (:func:`settings.node_settings`), never the task host's: a value set on the
    head alone is not the workers'.
    """
    expected = {}
    for node in replica.nodes:
        value: Any = gpus_per_node if gpus_per_node is not None else settings.node_settings(
            replica, node).get("ray_num_gpus")
        facts = ctx.facts.get(node.name) if isinstance(ctx.facts, Mapping) else None
        if value is None and node.gpus is not None:
            value = len(node.gpus)
        if value is None and facts is not None and getattr(facts, "gpus", None):
            value = len(facts.gpus)
        if value is None:
            value = replica.engine.world_size / replica.nnodes
        expected[node.host_ip] = float(value)
    return expected


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Poll Ray's API on the head until every node is alive with its GPUs, then check placement.

    Args:
        ctx: the task context. args: see ``ARGUMENT_SPEC`` (docs/modules.md).

    Returns:
        ok with ``data``: nodes, GPUs, seconds waited; failed naming the missing node/GPUs or
        why vLLM's placement group could not be placed.
    """
    values = ARGUMENT_SPEC.validate(args)
    replica = ctx.replica
    if replica is None or not backends.of(replica).ray_cluster:
        return ModuleResult(Status.SKIPPED, "not a node of a Ray replica")
    if ctx.check_mode:
        return ModuleResult(Status.SKIPPED, "check mode: the Ray cluster is not queried")
    timeout_s = float(values["timeout_s"] or settings.layered(ctx.vars)["ray_cluster_timeout_s"])
    poll_s = values["poll_s"]
    expected = expected_gpus(ctx, replica, values["gpus_per_node"])
    started = time.monotonic()
    with progress.wait(f"replica {replica.name}: waiting for every node in Ray",
                       [node.name for node in replica.nodes]) as view:
        snapshot = _poll_cluster(ctx, replica, expected, view, timeout_s, poll_s)
        view.finish(f"{len(expected)} nodes in Ray")
    driver_ip = str(_driver_ip(ctx, replica))
    problem = placement_problem(snapshot, replica.engine.world_size, driver_ip,
                                f"{replica.name}: placement")
    if problem is not None:
        raise ProvisionError([problem])
    waited = round(time.monotonic() - started, 3)
    return ModuleResult(Status.OK, f"{len(expected)} Ray nodes alive, "
                        f"{snapshot.total.get('GPU', 0):g} GPUs",
                        data={"ray_nodes": snapshot.alive_ips,
                              "ray_gpus": snapshot.total.get("GPU", 0),
                              "ray_cluster_wait_s": waited})


def _poll_cluster(ctx: ModuleContext, replica: Replica, expected: Mapping[str, float],
                  view: progress.Wait, timeout_s: float, poll_s: float) -> RaySnapshot:
    """Poll Ray until every expected node is alive with its GPUs; each node's row says whether
    Ray has it yet. Raises ProvisionError after ``timeout_s``."""
    started = time.monotonic()
    ips = {node.host_ip: node.name for node in replica.nodes}
    while True:
        snapshot, error = read_snapshot(ctx, replica)
        if snapshot is None:
            gaps = [f"Ray's API did not answer on {replica.master.name}: {error}"]
            view.update(replica.master.name, phase="Ray's API does not answer yet")
        else:
            gaps = cluster_gaps(snapshot, expected)
            for ip, name in ips.items():
                view.update(name, phase=(f"in Ray with {snapshot.gpus_of(ip):g} GPUs"
                                         if ip in snapshot.alive_ips else "not in Ray yet"))
            if not gaps:
                return snapshot
        if time.monotonic() - started >= timeout_s:
            raise ProvisionError.single(
                f"{replica.name}: Ray cluster", f"the cluster was not whole after {timeout_s:g} s",
                expected=f"{len(expected)} nodes alive with " + ", ".join(
                    f"{ip}: {g:g} GPU" for ip, g in expected.items()),
                actual="; ".join(gaps),
                fix="read the Ray units' journals (journalctl -u ray-worker / ray-head); check "
                    "that workers reach the head on port "
                    + str(settings.layered(ctx.vars)["ray_port"]))
        time.sleep(poll_s)


def _driver_ip(ctx: ModuleContext, replica: Replica) -> str:
    """VLLM_HOST_IP vLLM will use on the head: an operator override in ``vllm_env`` or in the
    head's ``vllm_node_env`` (written after ``vllm_env`` in the env file, so it wins) wins."""
    head = settings.master_settings(replica)  # the task runs on the head (vllm_ray start.yml)
    env = {**dict(head["vllm_env"]), **dict(head["vllm_node_env"])}
    return str(env.get("VLLM_HOST_IP", replica.master.host_ip))
