"""Where each rank or Ray bundle runs: host, processes, ``CUDA_VISIBLE_DEVICES`` and the GPU
indexes nvidia-smi shows for those processes.

mp (:func:`unit_placement`): per node, every process of the node's units (the unit's cgroup,
``systemctl show -p ControlGroup``, systemd.exec(5)), its ``CUDA_VISIBLE_DEVICES`` from
``/proc/<pid>/environ``, and the GPUs nvidia-smi lists it on (``--query-compute-apps=pid,
gpu_uuid`` joined with ``--query-gpu=index,uuid``).

Ray (:func:`ray_placement`): bundle index -> node from Ray's placement-group table on the head
(``ray.util.placement_group_table``, the GCS view that Ray's state API serves; its REST form,
``ray list placement-groups``, needs the dashboard of ``ray[default]``, which a plain
``ray start`` does not run), node -> address from ``ray.nodes()``, and each bundle's GPUs from
the actor living in it: Ray's actor table gives each alive actor's node and PID, nvidia-smi on
that node the PID's GPUs. Ray's tables do not say which actor holds which bundle of a node;
vLLM creates one worker per bundle in bundle order (vllm/v1/executor/ray_executor.py), so a
node's bundles are matched with its actors in actor start order. A mismatch in numbers leaves
``gpus`` None with a note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_provision.core import hostjson
from vllm_provision.core.quoting import quote, shell_join

NVIDIA_SMI = ("nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null "
              "| sed 's/^/@@gpu /'; nvidia-smi --query-compute-apps=pid,gpu_uuid "
              "--format=csv,noheader 2>/dev/null | sed 's/^/@@app /'; true")


def node_script(units: Sequence[str]) -> str:
    """Shell printing ``@@proc <unit> <pid> <CUDA_VISIBLE_DEVICES or ->`` per process of each
    unit, then nvidia-smi's GPUs (``@@gpu <index>, <uuid>``) and compute apps (``@@app <pid>,
    <uuid>``). Unit names are quoted words; needs root to read other users' environ."""
    listed = " ".join(quote(u) for u in units)
    procs = ('for u in ' + listed + '; do cg=$(systemctl show -p ControlGroup --value -- "$u"); '
             '[ -n "$cg" ] || continue; for p in $(cat "/sys/fs/cgroup$cg/cgroup.procs" '
             '2>/dev/null); do c=$(tr "\\0" "\\n" < "/proc/$p/environ" 2>/dev/null '
             '| sed -n "s/^CUDA_VISIBLE_DEVICES=//p"); echo "@@proc $u $p ${c:--}"; done; done')
    return f"{procs}; {NVIDIA_SMI}"


def parse_node(stdout: str) -> tuple[list[dict[str, Any]], dict[int, list[int]]]:
    """:func:`node_script` output -> (processes ``{"unit", "pid", "cuda_visible_devices"}``,
    PID -> GPU indexes nvidia-smi lists it on)."""
    procs: list[dict[str, Any]] = []
    uuids: dict[str, int] = {}
    apps: list[tuple[int, str]] = []
    pid_text: str
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "@@proc":
            parts = rest.split()
            if len(parts) == 3 and parts[1].isdigit():
                procs.append({"unit": parts[0], "pid": int(parts[1]),
                              "cuda_visible_devices": None if parts[2] == "-" else parts[2]})
        elif word == "@@gpu":
            index, _, uuid = (x.strip() for x in rest.partition(","))
            if index.isdigit():
                uuids[uuid] = int(index)
        elif word == "@@app":
            pid_text, _, uuid = (x.strip() for x in rest.partition(","))
            if pid_text.isdigit():
                apps.append((int(pid_text), uuid))
    gpus: dict[int, list[int]] = {}
    for pid, uuid in apps:
        if uuid in uuids:
            gpus.setdefault(pid, []).append(uuids[uuid])
    return procs, {pid: sorted(set(v)) for pid, v in gpus.items()}


def unit_placement(replica: Any, connections: Mapping[str, Any],
                   vars_: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per node in rank order: ``{"rank", "host", "address", "processes": [{"unit",
    "pid", "cuda_visible_devices", "gpus"}], "gpus"}`` (``gpus``: nvidia-smi's indexes for the
    unit processes; the processes nvidia-smi does not list are left out of ``processes``
    unless none is listed, then every process is kept so the entry shows who runs).

    Raises:
        UnreachableError: a node's connection failed.
    """
    out = []
    for node in replica.nodes:
        units = replica.backend_type.node_units(replica, node, node.host.vars)
        result = connections[node.name].run(node_script(units), timeout_s=30)
        procs, gpus = parse_node(result.stdout)
        for proc in procs:
            proc["gpus"] = gpus.get(proc["pid"], [])
        on_gpu = [p for p in procs if p["gpus"]]
        out.append({"rank": node.rank, "host": node.name, "address": node.host_ip,
                    "processes": on_gpu or procs,
                    "gpus": sorted({g for p in on_gpu for g in p["gpus"]})})
    return out


RAY_SCRIPT = r"""
import json, sys
import ray
from ray._private import state
from ray.util import placement_group_table
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False,
         include_dashboard=False)
nodes = {n["NodeID"]: {"ip": n.get("NodeManagerAddress"), "hostname": n.get("NodeManagerHostname"),
                       "alive": bool(n.get("Alive"))} for n in ray.nodes()}
groups = [{"id": pg_id, "state": pg.get("state"), "strategy": pg.get("strategy"),
           "bundles": {str(k): dict(v) for k, v in (pg.get("bundles") or {}).items()},
           "bundles_to_node_id": {str(k): v for k, v in
                                  (pg.get("bundles_to_node_id") or {}).items()}}
          for pg_id, pg in placement_group_table().items()]
actors = [{"id": a.get("ActorID"), "class": a.get("ActorClassName"), "pid": a.get("Pid"),
           "node_id": (a.get("Address") or {}).get("NodeID"), "start": a.get("StartTime")}
          for a in state.actors().values() if a.get("State") == "ALIVE"]
print("RAY-PLACEMENT " + json.dumps({"nodes": nodes, "groups": groups, "actors": actors}))
"""


def ray_command(replica: Any, vars_: Mapping[str, Any], auth_env: Sequence[str] = ()) -> str:
    """The head-side command running :data:`RAY_SCRIPT` (on stdin) as the service user, as the
    cluster wait's snapshot does (modules/ray_wait_cluster.py), with ``auth_env``: the
    replica's Ray authentication environment as ``NAME=value`` words (the caller's
    ``settings.ray_auth.env_words``, a room above this one: a Ray driver needs the token when
    ``vllm_ray_auth: token``).

    Args:
        replica: the Ray replica.
        vars_: rank 0's resolved settings (``vllm_provision.settings.layered``, defaults
            applied: this room is below the resolver and cannot apply them itself).

    Raises:
        KeyError: ``vars_`` lacks ``vllm_venv``, ``ray_port``, ``vllm_service_user`` or
            ``vllm_state_dir`` (not resolved).
    """
    python = f"{vars_['vllm_venv']}/bin/python"
    address = f"{replica.master.host_ip}:{vars_['ray_port']}"
    return shell_join(["runuser", "-u", str(vars_["vllm_service_user"]), "--",
                       "env", f"HOME={vars_['vllm_state_dir']}", *auth_env,
                       "RAY_USAGE_STATS_ENABLED=0", python, "-", address])


def parse_ray(stdout: str) -> dict[str, Any] | None:
    """:data:`RAY_SCRIPT`'s JSON line, or None when it printed none or not a JSON object (the
    host's answer is not trusted)."""
    for line in stdout.splitlines():
        if line.startswith("RAY-PLACEMENT "):
            try:
                found = hostjson.loads(line.removeprefix("RAY-PLACEMENT "))
            except ValueError:
                return None
            return dict(found) if isinstance(found, dict) else None
    return None


def bundles_of(table: Mapping[str, Any], gpus_by_ip: Mapping[str, Mapping[int, list[int]]],
               host_by_ip: Mapping[str, str]) -> list[dict[str, Any]]:
    """Pure: the bundles of the placement group holding GPU bundles (the engine's; the one with
    the most GPU bundles when there are several), each ``{"bundle", "node_id", "host",
    "address", "resources", "pid", "gpus", "note"}``, by bundle index.

    Args:
        table: :func:`parse_ray`'s object. gpus_by_ip: node address -> PID -> GPU indexes
            (nvidia-smi on that node). host_by_ip: node address -> inventory host name.
    """
    groups = [g for g in table.get("groups", []) if g.get("state") == "CREATED"
              and any("GPU" in b for b in g.get("bundles", {}).values())]
    if not groups:
        return []
    group = max(groups, key=lambda g: sum("GPU" in b for b in g["bundles"].values()))
    nodes = table.get("nodes", {})
    by_node: dict[str, list[int]] = {}
    for index, node_id in group.get("bundles_to_node_id", {}).items():
        by_node.setdefault(node_id, []).append(int(index))
    assigned: dict[int, tuple[int | None, list[int] | None, str]] = {}
    for node_id, indexes in by_node.items():
        ip = (nodes.get(node_id) or {}).get("ip", "")
        on_gpu = gpus_by_ip.get(ip, {})
        actors = sorted((a for a in table.get("actors", [])
                         if a.get("node_id") == node_id and a.get("pid") in on_gpu),
                        key=lambda a: (a.get("start") or 0, a.get("pid") or 0))
        for n, index in enumerate(sorted(indexes)):
            if len(actors) == len(indexes):
                pid = int(actors[n]["pid"])
                assigned[index] = (pid, on_gpu[pid], "")
            else:
                assigned[index] = (None, None, f"{len(actors)} GPU actors on this node for "
                                   f"{len(indexes)} bundles: GPUs not matched")
    out = []
    for key in sorted(group["bundles"], key=int):
        index = int(key)
        node_id = group.get("bundles_to_node_id", {}).get(key, "")
        ip = (nodes.get(node_id) or {}).get("ip", "")
        actor_pid, gpus, note = assigned.get(index, (None, None, "bundle not placed"))
        out.append({"bundle": index, "node_id": node_id, "host": host_by_ip.get(ip, ip),
                    "address": ip, "resources": group["bundles"][key], "pid": actor_pid,
                    "gpus": gpus, "note": note})
    return out


def ray_placement(replica: Any, connections: Mapping[str, Any], vars_: Mapping[str, Any],
                  auth_env: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The Ray replica's bundles (:func:`bundles_of`), read over the head's connection and
    nvidia-smi on every node; ``vars_``: rank 0's resolved settings, ``auth_env``: Ray's
    authentication environment (:func:`ray_command`).

    Raises:
        ProvisionError: Ray's tables could not be read on the head (the error's tail).
        UnreachableError: a connection failed.
    """
    from vllm_provision.core.errors import ProvisionError

    head = connections[replica.master.name]
    result = head.run(ray_command(replica, vars_, auth_env), stdin=RAY_SCRIPT, timeout_s=90)
    table = parse_ray(result.stdout) if result.exit_code == 0 else None
    if table is None:
        raise ProvisionError.single(replica.master.name, "could not read Ray's placement-group "
                                    "and actor tables on the head: "
                                    + (result.stderr or result.stdout).strip()[-300:],
                                    fix="check the Ray head unit with `provision status`")
    gpus_by_ip = {}
    for node in replica.nodes:
        found = connections[node.name].run(NVIDIA_SMI, timeout_s=30)
        gpus_by_ip[node.host_ip] = parse_node(found.stdout)[1]
    return bundles_of(table, gpus_by_ip, {n.host_ip: n.name for n in replica.nodes})
