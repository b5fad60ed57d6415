"""The ray backend: a Ray cluster (``ray start`` on every node) and vLLM on the head
(``--distributed-executor-backend ray``).

The head runs ``ray_head_unit_name`` then ``vllm_unit_name``; every other node runs
``ray_worker_unit_name``. Workers join the head's GCS on ``ray_port`` and do not rejoin a
restarted head (ray-project/ray#1345), so vLLM and every worker depend on the head one way.
vLLM rejects ``--nnodes`` > 1 with this backend (vllm/config/parallel.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vllm_provision.backends.base import Backend, builtin, unit_var

if TYPE_CHECKING:
    from vllm_provision.checks.finding import Finding
    from vllm_provision.core.errors import Problem
    from vllm_provision.core.models import Node, Replica
    from vllm_provision.facts.model import HostFacts

HEAD_UNIT = ("ray_head_unit_name", "ray-head.service")
# The ports `ray start` is told to listen on besides the GCS (roles/ray/templates/ray-unit.j2;
# ray python/ray/scripts/scripts.py options of the same names). The client server runs on the
# head only; the rest on every node.
PINNED_PORTS = ("ray_node_manager_port", "ray_object_manager_port", "ray_client_server_port",
                "ray_dashboard_agent_listen_port", "ray_dashboard_agent_grpc_port",
                "ray_runtime_env_agent_port", "ray_metrics_export_port")
WORKER_RANGE = ("ray_min_worker_port", "ray_max_worker_port")
# ray python/ray/scripts/scripts.py, --ray-client-server-port: "default to 10001, or None if
# ray[client] is not installed" (what listens when ray_client_server_port is unset).
DEFAULT_CLIENT_SERVER_PORT = 10001
WORKER_UNIT = ("ray_worker_unit_name", "ray-worker.service")

# Ray's GCS health check of every raylet (src/ray/common/ray_config_def.h, read from the GCS's
# environment as RAY_<name>; src/ray/gcs/gcs_health_check_manager.cc): one check every period,
# each failing after the timeout, the node DEAD after the threshold of consecutive failures.
HEALTH_CHECK_DEFAULTS = {"RAY_health_check_period_ms": 3000,
                         "RAY_health_check_timeout_ms": 10000,
                         "RAY_health_check_failure_threshold": 5}
# Seconds between two reads of the GCS node table by the head's watchdog.
NODE_TABLE_POLL_S = 2.0


def health_check_bound_s(env: Mapping[str, Any]) -> float:
    """Seconds within which Ray's GCS declares a silent raylet (frozen, or cut off) DEAD: each of
    ``failure_threshold`` consecutive checks waits up to its timeout, then one period
    (gcs_health_check_manager.cc), so ``threshold x (timeout + period)``: 65 s with Ray's
    defaults (measured on the lab: a frozen worker was DEAD after about 60 s).

    Args:
        env: the head's Ray environment (``RAY_health_check_*`` values as strings or numbers;
            absent or non-numeric ones take Ray's defaults, :data:`HEALTH_CHECK_DEFAULTS`).
    """
    values = {}
    for name, default in HEALTH_CHECK_DEFAULTS.items():
        try:
            values[name] = max(0, int(str(env.get(name, default)).strip()))
        except ValueError:
            values[name] = default
    return values["RAY_health_check_failure_threshold"] * (
        values["RAY_health_check_timeout_ms"] + values["RAY_health_check_period_ms"]) / 1000


def gcs_address(replica: Replica) -> str:
    """``<head cluster IP>:<ray_port>``: where every node reaches the head's GCS."""
    from vllm_provision.facts.gather import host_var

    return f"{replica.master.host_ip}:{host_var(replica.master.host, 'ray_port')}"


def ray_environment(vars_: Mapping[str, Any]) -> dict[str, Any]:
    """A node's Ray environment from its variables, in the order ray.env.j2 merges them:
    ``vllm_env``, then ``ray_env``, then ``vllm_node_env`` (last wins)."""
    merged: dict[str, Any] = {}
    for name in ("vllm_env", "ray_env", "vllm_node_env"):
        value = vars_.get(name)
        if isinstance(value, Mapping):
            merged.update(value)
    return merged


@builtin(order=20)
class RayBackend(Backend):
    """A Ray cluster with vLLM on the head (roles ray and vllm_ray)."""

    name = "ray"
    role = "vllm_ray"
    packages = ("vllm", "ray")
    ray_cluster = True
    title = "Ray"
    gpu_reservation = "Ray's placement group reserves the GPUs"

    def node_units(self, replica: Replica, node: Node, vars_: Mapping[str, Any]) -> list[str]:
        """The head: ``ray_head_unit_name``, ``vllm_unit_name``; a worker:
        ``ray_worker_unit_name``."""
        if node.rank == 0:
            return [unit_var(vars_, *HEAD_UNIT), unit_var(vars_, "vllm_unit_name", "vllm.service")]
        return [unit_var(vars_, *WORKER_UNIT)]

    def journal_units(self, replica: Replica, node: Node,
                      vars_: Mapping[str, Any]) -> dict[str, list[str]]:
        """The head: ``ray`` its Ray head unit, ``vllm`` the vLLM unit; a worker: ``ray`` its
        Ray worker unit and no vLLM unit (vLLM's workers are Ray actors, logging to the head's
        driver); every node: the watchdog."""
        units = super().journal_units(replica, node, vars_)
        if node.rank == 0:
            return {**units, "ray": [unit_var(vars_, *HEAD_UNIT)],
                    "vllm": [unit_var(vars_, "vllm_unit_name", "vllm.service")]}
        return {**units, "ray": [unit_var(vars_, *WORKER_UNIT)], "vllm": []}

    def env_file_variable(self, node: Node) -> str:
        """vLLM's env file on the head, Ray's on a worker."""
        return "vllm_env_file" if node.rank == 0 else "ray_env_file"

    def rendezvous(self, replica: Replica) -> tuple[int, str] | None:
        """The head's GCS: ``ray_port`` (rank 0's value)."""
        from vllm_provision.facts.gather import host_var

        return int(host_var(replica.master.host, "ray_port")), "Ray GCS port"

    def listen_ports(self, replica: Replica, rank: int) -> list[tuple[int, str]]:
        """The head: API, GCS, the client server port and, when on, the dashboard port (their
        inventory values; checks/network.py)."""
        if rank != 0:
            return []
        from vllm_provision.facts.gather import host_var

        head = replica.master.host
        client = host_var(head, "ray_client_server_port")
        ports = [*super().listen_ports(replica, rank),
                 (int(client) if client is not None else DEFAULT_CLIENT_SERVER_PORT,
                  "Ray client server")]
        if host_var(head, "ray_include_dashboard") is True:
            ports.append((int(host_var(head, "ray_dashboard_port")), "Ray dashboard"))
        return ports

    def other_ports(self, agreed: Mapping[str, Any],
                    host_value: Callable[[str], Any]) -> dict[str, Any]:
        """The GCS port and every other port ``ray start`` is told to listen on
        (:data:`PINNED_PORTS`; the dashboard's only when ``ray_include_dashboard``)."""
        ports = {name: host_value(name) for name in ("ray_port", *PINNED_PORTS)}
        if ports["ray_client_server_port"] is None:
            ports["ray_client_server_port"] = DEFAULT_CLIENT_SERVER_PORT
        if host_value("ray_include_dashboard") is True:
            ports["ray_dashboard_port"] = host_value("ray_dashboard_port")
        return ports

    def port_ranges(self, agreed: Mapping[str, Any],
                    host_value: Callable[[str], Any]) -> dict[tuple[str, str], tuple[Any, Any]]:
        """The worker processes' range (``--min-worker-port`` .. ``--max-worker-port``)."""
        return {WORKER_RANGE: (host_value(WORKER_RANGE[0]), host_value(WORKER_RANGE[1]))}

    def peer_ports(self, replica: Replica) -> list[tuple[str, int, int]]:
        """The GCS, every pinned port, the worker range and (when on) the dashboard: Ray has
        no authentication, so only the replica's nodes may reach any of them (Ray docs,
        "Security": a Ray cluster must not be reachable from untrusted networks)."""
        from vllm_provision.facts.gather import host_var

        head = replica.master.host
        found = [("Ray GCS port", int(host_var(head, "ray_port")),
                  int(host_var(head, "ray_port")))]
        for name in PINNED_PORTS:
            value = host_var(head, name)
            port = int(value) if value is not None else DEFAULT_CLIENT_SERVER_PORT
            found.append((name, port, port))
        low, high = (int(host_var(head, n)) for n in WORKER_RANGE)
        found.append(("Ray worker ports", low, high))
        if host_var(head, "ray_include_dashboard") is True:
            port = int(host_var(head, "ray_dashboard_port"))
            found.append(("Ray dashboard and job API", port, port))
        return found

    def extra_args_note(self) -> str:
        """vLLM rejects --nnodes > 1 with Ray."""
        return (" With vllm_backend: ray, vLLM rejects --nnodes > 1 (\"nnodes > 1 can "
                "only be set when distributed executor backend is mp\", "
                "vllm/config/parallel.py).")

    def rendered_flags(self, replica: Replica) -> list[str]:
        """``--distributed-executor-backend ray`` (never ``--nnodes``)."""
        return ["--distributed-executor-backend", "ray"]

    def flag_finding(self, flag: str) -> tuple[str, str]:
        """``--nnodes`` gets vLLM's own error text."""
        from vllm_provision.backends.choice import NNODES_BACKEND_ERROR

        text = NNODES_BACKEND_ERROR if flag in ("--nnodes", "-n") else \
            f"{flag} is rendered from the inventory"
        return "no --nnodes with the ray backend", text

    def node_role(self, replica: Replica, node: Node) -> str:
        """``ray-head`` (rank 0) or ``ray-worker``."""
        return "ray-head" if node.rank == 0 else "ray-worker"

    def serve_argv(self, replica: Replica, node: Node, engine_argv: list[str]) -> list[str] | None:
        """On the head: ``--host``/``--port`` and ``--distributed-executor-backend ray``, never
        ``--nnodes`` (roles/vllm_ray/templates/vllm.service.j2); None on a worker, which runs no
        vLLM process (Ray places the replica's workers on it)."""
        if node.rank != 0:
            return None
        engine = replica.engine
        return [*engine_argv, "--host", engine.api_host, "--port", str(engine.api_port),
                "--distributed-executor-backend", "ray"]

    def plan(self, replica: Replica, node: Node) -> dict[str, Any]:
        """vLLM on the head and every worker depend on the head's ``ray start``, one way; the
        head reads the GCS node table (``ray.observe``); a worker restarts its Ray unit when
        the GCS reports its raylet dead or stays unreachable for :func:`health_check_bound_s`
        (``ray.unreachable_s``, also the grace of its rule for the head: Ray tolerates a
        shorter silence). docs/recovery.md, "Ray: what the GCS knows"."""
        vars_ = node.host.vars
        head = unit_var(vars_, *HEAD_UNIT)
        vllm = unit_var(vars_, "vllm_unit_name", "vllm.service")
        gcs = gcs_address(replica)
        if node.rank == 0:
            return {"units": [head, vllm], "probe": True, "restarts": "vLLM",
                    "rules": [{"unit": vllm, "peer": node.name, "peer_unit": head,
                               "mutual": False}],
                    "ray": {"gcs": gcs, "observe": True, "poll_s": NODE_TABLE_POLL_S}}
        worker = unit_var(vars_, *WORKER_UNIT)
        bound = health_check_bound_s(ray_environment(replica.master.host.vars))
        return {"units": [worker], "probe": False, "restarts": "Ray worker",
                "rules": [{"unit": worker, "peer": replica.master.name, "peer_unit": head,
                           "mutual": False, "grace_s": bound}],
                "ray": {"gcs": gcs, "observe": False, "head": replica.master.name,
                        "unit": worker, "unreachable_s": bound}}

    def start_gate_argv(self, replica: Replica, timeout_s: Any) -> list[str]:
        """The words after the watchdog script in vLLM's ``ExecStartPre`` on the head: wait up
        to ``timeout_s`` seconds (``ray_cluster_timeout_s``) until every node of the replica is
        alive in Ray and they hold the world size in GPUs (``--wait-ray-cluster GCS TIMEOUT_S
        GPUS IP...``, roles/vllm_watchdog); systemd's ``Restart=`` retries after a timeout."""
        return ["--wait-ray-cluster", gcs_address(replica), str(int(float(timeout_s))),
                str(replica.engine.world_size), *(n.host_ip for n in replica.nodes)]

    def ready_check(self, ctx: Any, replica: Replica) -> Callable[[], Problem | None] | None:
        """A placement group vLLM cannot place ends the wait (modules/ray_wait_cluster.py).

        One pending for want of free resources (NO_RESOURCES: held by other jobs) is waited on
        up to ``vllm_gpu_wait_timeout_s`` from the first time it is seen, printing on stderr,
        at each check (every 5 s), what it needs and each node's free resources; then it ends
        the wait with that explanation. INFEASIBLE ends it at once.
        """
        import sys
        import time

        from vllm_provision import settings
        from vllm_provision.core.errors import Problem
        from vllm_provision.modules.ray_wait_cluster import (
            pending_placement_problem,
            pending_resources,
            read_snapshot,
        )

        bound_s = float(settings.layered(ctx.vars)["vllm_gpu_wait_timeout_s"])
        pending_since: list[float] = []

        def ray_check() -> Problem | None:
            snapshot, _ = read_snapshot(ctx, replica)
            if snapshot is None:
                return None
            where = f"{replica.name}: placement"
            problem = pending_placement_problem(snapshot, where)
            waiting = pending_resources(snapshot) if problem is None else None
            if waiting is None:
                pending_since.clear()
                return problem
            pending_since[:] = pending_since or [time.monotonic()]
            waited = time.monotonic() - pending_since[0]
            if waited >= bound_s:
                return Problem(where, f"vLLM's placement group stayed pending for want of free "
                               f"resources for {waited:.0f} s (vllm_gpu_wait_timeout_s "
                               f"{bound_s:g})", expected="every bundle placed",
                               actual=waiting,
                               fix="free the GPUs the other jobs hold (the holders are named "
                                   "above), or raise vllm_gpu_wait_timeout_s")
            sys.stderr.write(f"{replica.name}: waiting for Ray resources ({waited:.0f} s of "
                             f"{bound_s:g} s): {waiting}\n")
            sys.stderr.flush()
            return None

        return ray_check

    def check_replica(self, replica: Replica, facts: Mapping[str, HostFacts],
                      settings: Any) -> list[Finding]:
        """vLLM's and the inventory's placement groups fit the nodes' Ray resources, and
        Ray's logical GPUs are whole physical GPUs (checks/placement.py). A node's GPUs are
        what its ``ray start`` declares (roles/ray/templates/ray-unit.j2): ``ray_num_gpus``,
        else the size of its ``vllm_gpus``, else the GPUs nvidia-smi lists; the physical ones
        are those of its ``vllm_gpus`` the host has (``checks.context.device_counts``)."""
        from vllm_provision.checks import placement
        from vllm_provision.checks.context import device_counts
        from vllm_provision.settings import node_settings

        # ray_num_gpus is a host variable: each node's own, or None
        declared_by = {node.name: node_settings(replica, node).get("ray_num_gpus")
                       for node in replica.nodes}
        resources = {}
        for node in replica.nodes:
            if node.name not in facts:
                continue
            declared = declared_by[node.name]
            gpus = (int(declared) if declared is not None else
                    len(node.gpus) if node.gpus is not None else len(facts[node.name].gpus))
            resources[node.name] = placement.node_resources(gpus, node.host_ip,
                                                            facts[node.name].cpu_count)
        logical = placement.check_logical_gpus(
            replica, device_counts(facts, "cuda", replica),
            {name: (int(value) if value is not None else None)
             for name, value in declared_by.items()},
            settings.placement_bundles)
        if len(resources) != replica.nnodes:
            return logical
        return logical + placement.check_placement(replica, resources,
                                                    settings.placement_bundles,
                                                    settings.placement_strategy)

    def status_view(self, replica: Replica, states: Sequence[Any], lost: dict[str, str],
                    connections: Mapping[str, Any], vars_: Mapping[str, Any]) -> dict[str, Any]:
        """``ray``: the alive nodes' IPs and the cluster's GPUs, read on the head, or an
        error."""
        from vllm_provision.core.text import one_line
        from vllm_provision.modules.ray_wait_cluster import read_head_snapshot
        from vllm_provision.transport.base import UnreachableError

        head_unit = str(vars_.get(HEAD_UNIT[0], HEAD_UNIT[1]))
        head_active = any(s.host == replica.master.name and s.unit == head_unit
                          and s.active_state == "active" for s in states)
        if replica.master.name in lost:
            return {"ray": {"error": lost[replica.master.name]}}
        if not head_active:
            # ray.init() against a head that is not running retries for minutes (GCS reconnect
            # timeout); there is no cluster to ask.
            return {"ray": {"error": f"{head_unit} is not active on {replica.master.name}"}}
        try:
            snapshot, error = read_head_snapshot(connections[replica.master.name], replica,
                                                 vars_)
        except UnreachableError as exc:  # lost after its units were read: say so, keep them
            lost[replica.master.name] = error = one_line(exc)
            snapshot = None
        if not snapshot:
            return {"ray": {"error": error or "no answer"}}
        from vllm_provision.modules.ray_wait_cluster import (
            pending_placement_problem,
            pending_resources,
        )

        view: dict[str, Any] = {"nodes": snapshot.alive_ips, "gpus": snapshot.total.get("GPU", 0)}
        problem = pending_placement_problem(snapshot, "placement")
        pending = problem.message if problem is not None else pending_resources(snapshot)
        if pending:  # a replica whose vLLM waits for its placement group: say for what
            view["pending"] = pending
        return {"ray": view}

    def placement(self, replica: Replica, connections: Mapping[str, Any],
                  vars_: Mapping[str, Any]) -> dict[str, Any]:
        """``{"kind": "bundles", "bundles": [...]}``: each bundle index of vLLM's placement
        group with its node and GPU ids (:func:`vllm_provision.backends.placement.
        ray_placement`: Ray's placement-group and actor tables, read on the head).

        Raises:
            ProvisionError: Ray's tables could not be read. UnreachableError: a connection
                failed.
        """
        from vllm_provision import settings
        from vllm_provision.backends.placement import ray_placement
        from vllm_provision.settings.ray_auth import env_words

        values = settings.layered(vars_)
        return {"kind": "bundles",
                "bundles": ray_placement(replica, connections, values, env_words(values))}
