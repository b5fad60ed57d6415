"""The mp backend: vLLM's own multi-node multiprocessing (``--distributed-executor-backend mp``).

Every node runs one vLLM unit: rank 0 serves the API and holds the torch.distributed TCP store on
``--master-port``; the other ranks run ``--headless`` and join it (vLLM docs, "Multi-node
deployment with mp"; vllm/v1/executor/multiproc_executor.py). The followers start first, then
the master (playbook ``plays/start.yml`` of role vllm_mp).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from vllm_provision.backends.base import Backend, builtin, unit_var

if TYPE_CHECKING:
    from vllm_provision.core.models import Node, Replica


@builtin(order=10)
class MpBackend(Backend):
    """vLLM multi-node multiprocessing: one vLLM unit per node, every node depends on every
    other (a torch.distributed group cannot be rejoined, docs/recovery.md)."""

    name = "mp"
    role = "vllm_mp"

    def node_units(self, replica: Replica, node: Node, vars_: Mapping[str, Any]) -> list[str]:
        """Every node runs ``vllm_unit_name``."""
        return [unit_var(vars_, "vllm_unit_name", "vllm.service")]

    def rendezvous(self, replica: Replica) -> tuple[int, str] | None:
        """Rank 0's TCP store: ``vllm_master_port``."""
        return replica.engine.master_port, "master port"

    def other_ports(self, agreed: Mapping[str, Any],
                    host_value: Callable[[str], Any]) -> dict[str, Any]:
        """The master port."""
        return {"vllm_master_port": agreed.get("vllm_master_port")}

    def rendered_flags(self, replica: Replica) -> list[str]:
        """``--distributed-executor-backend mp --nnodes N``."""
        return ["--distributed-executor-backend", "mp", "--nnodes", str(replica.nnodes)]

    def node_role(self, replica: Replica, node: Node) -> str:
        """``master`` (rank 0) or ``headless``."""
        return "master" if node.rank == 0 else "headless"

    def serve_argv(self, replica: Replica, node: Node, engine_argv: list[str]) -> list[str] | None:
        """``--nnodes N --node-rank R --master-addr A --master-port P``, then ``--host``/``--port``
        on rank 0 or ``--headless`` elsewhere, then ``--distributed-executor-backend mp``
        (roles/vllm_mp/templates/vllm.service.j2)."""
        engine = replica.engine
        argv = [*engine_argv, "--nnodes", str(replica.nnodes), "--node-rank", str(node.rank),
                "--master-addr", replica.master_addr, "--master-port", str(engine.master_port)]
        argv += (["--host", engine.api_host, "--port", str(engine.api_port)] if node.rank == 0
                 else ["--headless"])
        return [*argv, "--distributed-executor-backend", "mp"]

    def plan(self, replica: Replica, node: Node) -> dict[str, Any]:
        """This node's vLLM depends on every other node's vLLM, both ways; a headless node's rule
        for rank 0 names the rendezvous (``master_addr``/``master_port``), which its workers must
        have joined before it binds rank 0 (docs/recovery.md)."""
        unit = unit_var(node.host.vars, "vllm_unit_name", "vllm.service")
        rules = []
        for other in replica.nodes:
            if other.rank == node.rank:
                continue
            rule: dict[str, Any] = {"unit": unit, "peer": other.name, "peer_unit": unit,
                                    "mutual": True}
            if other.rank == 0:
                rule |= {"master_addr": replica.master_addr,
                         "master_port": int(replica.engine.master_port)}
            rules.append(rule)
        return {"units": [unit], "rules": rules, "probe": node.rank == 0, "restarts": "vLLM"}
