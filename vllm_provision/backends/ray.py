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

from vllm_provision.backends import Backend, unit_var

if TYPE_CHECKING:
    from vllm_provision.checks.finding import Finding
    from vllm_provision.errors import Problem
    from vllm_provision.facts.model import HostFacts
    from vllm_provision.models import Node, Replica

HEAD_UNIT = ("ray_head_unit_name", "ray-head.service")
WORKER_UNIT = ("ray_worker_unit_name", "ray-worker.service")


class RayBackend(Backend):
    """A Ray cluster with vLLM on the head (roles ray and vllm_ray)."""

    name = "ray"
    role = "vllm_ray"
    packages = ("vllm", "ray")
    ray_cluster = True

    def node_units(self, replica: Replica, node: Node, vars_: Mapping[str, Any]) -> list[str]:
        """The head: ``ray_head_unit_name``, ``vllm_unit_name``; a worker:
        ``ray_worker_unit_name``."""
        if node.rank == 0:
            return [unit_var(vars_, *HEAD_UNIT), unit_var(vars_, "vllm_unit_name", "vllm.service")]
        return [unit_var(vars_, *WORKER_UNIT)]

    def env_file_variable(self, node: Node) -> str:
        """vLLM's env file on the head, Ray's on a worker."""
        return "vllm_env_file" if node.rank == 0 else "ray_env_file"

    def rendezvous(self, replica: Replica) -> tuple[int, str] | None:
        """The head's GCS: ``ray_port`` (rank 0's value)."""
        from vllm_provision.facts.gather import host_var

        return int(host_var(replica.master.host, "ray_port")), "Ray GCS port"

    def listen_ports(self, replica: Replica, rank: int) -> list[tuple[int, str]]:
        """The head: API, GCS, dashboard and client server ports (checks/network.py)."""
        from vllm_provision.checks import network

        return [*super().listen_ports(replica, rank),
                *(network.RAY_HEAD_EXTRA_PORTS if rank == 0 else ())]

    def other_ports(self, agreed: Mapping[str, Any],
                    host_value: Callable[[str], Any]) -> dict[str, Any]:
        """The GCS port."""
        return {"ray_port": host_value("ray_port")}

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
        from vllm_provision.checks.topology import NNODES_BACKEND_ERROR

        text = NNODES_BACKEND_ERROR if flag in ("--nnodes", "-n") else \
            f"{flag} is rendered from the inventory"
        return "no --nnodes with the ray backend", text

    def plan(self, replica: Replica, node: Node) -> dict[str, Any]:
        """vLLM on the head and every worker depend on the head's ``ray start``, one way."""
        vars_ = node.host.vars
        head = unit_var(vars_, *HEAD_UNIT)
        vllm = unit_var(vars_, "vllm_unit_name", "vllm.service")
        if node.rank == 0:
            return {"units": [head, vllm], "probe": True, "restarts": "vLLM",
                    "rules": [{"unit": vllm, "peer": node.name, "peer_unit": head,
                               "mutual": False}]}
        worker = unit_var(vars_, *WORKER_UNIT)
        return {"units": [worker], "probe": False, "restarts": "Ray worker",
                "rules": [{"unit": worker, "peer": replica.master.name, "peer_unit": head,
                           "mutual": False}]}

    def ready_check(self, ctx: Any, replica: Replica) -> Callable[[], Problem | None] | None:
        """A placement group vLLM cannot place ends the wait (modules/ray_wait_cluster.py)."""
        from vllm_provision.modules.ray_wait_cluster import (
            pending_placement_problem,
            read_snapshot,
        )

        def ray_check() -> Problem | None:
            snapshot, _ = read_snapshot(ctx, replica)
            return pending_placement_problem(snapshot, f"{replica.name}: placement") \
                if snapshot is not None else None

        return ray_check

    def check_replica(self, replica: Replica, facts: Mapping[str, HostFacts],
                      settings: Any) -> list[Finding]:
        """vLLM's and the inventory's placement groups fit the nodes' Ray resources
        (checks/placement.py)."""
        from vllm_provision.checks import placement

        resources = {}
        for node in replica.nodes:
            if node.name not in facts:
                continue
            declared = node.host.vars.get("ray_num_gpus")
            resources[node.name] = placement.node_resources(
                int(declared) if declared is not None else len(facts[node.name].gpus),
                node.host_ip, facts[node.name].cpu_count)
        if len(resources) != replica.nnodes:
            return []
        return placement.check_placement(replica, resources, settings.placement_bundles,
                                          settings.placement_strategy)

    def status_view(self, replica: Replica, states: Sequence[Any], lost: dict[str, str],
                    connections: Mapping[str, Any], vars_: Mapping[str, Any]) -> dict[str, Any]:
        """``ray``: the alive nodes' IPs and the cluster's GPUs, read on the head, or an
        error."""
        from vllm_provision.cli.status import one_line
        from vllm_provision.connection import UnreachableError
        from vllm_provision.modules.ray_wait_cluster import read_head_snapshot

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
        return {"ray": ({"nodes": snapshot.alive_ips, "gpus": snapshot.total.get("GPU", 0)}
                        if snapshot else {"error": error or "no answer"})}

    def placement(self, replica: Replica, connections: Mapping[str, Any],
                  vars_: Mapping[str, Any]) -> dict[str, Any]:
        """``{"kind": "bundles", "bundles": [...]}``: each bundle index of vLLM's placement
        group with its node and GPU ids (:func:`vllm_provision.evidence.placement.
        ray_placement`: Ray's placement-group and actor tables, read on the head).

        Raises:
            ProvisionError: Ray's tables could not be read. UnreachableError: a connection
                failed.
        """
        from vllm_provision.evidence.placement import ray_placement

        return {"kind": "bundles", "bundles": ray_placement(replica, connections, vars_)}
