"""The mp backend: vLLM's own multi-node multiprocessing (``--distributed-executor-backend mp``).

Every node runs one vLLM unit: rank 0 serves the API and holds the torch.distributed TCP store on
``--master-port``; the other ranks run ``--headless`` and join it (vLLM docs, "Multi-node
deployment with mp"; vllm/v1/executor/multiproc_executor.py). The followers start first, then
the master (playbook ``plays/start.yml`` of role vllm_mp).

A data-parallel replica (``vllm_data_parallel_size`` > 1, docs/serving.md) runs one vLLM unit
per node too, with vLLM's data-parallel options in place of ``--nnodes``: every node starts
``--data-parallel-size-local`` engines of TP x PP GPUs from its ``--data-parallel-start-rank``
and meets rank 0 on ``--data-parallel-address``:``--data-parallel-rpc-port``; the other nodes
are ``--headless`` (layout ``internal``) or serve an API of their own
(``--data-parallel-hybrid-lb``, layout ``hybrid``) (vLLM docs, "Data Parallel Deployment").
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
        """Rank 0's TCP store, ``vllm_master_port``; with data parallel, rank 0's handshake
        port, ``vllm_data_parallel_rpc_port``."""
        if replica.data_parallel:
            return replica.engine.data_parallel_rpc_port, "data parallel RPC port"
        return replica.engine.master_port, "master port"

    def listen_ports(self, replica: Replica, rank: int) -> list[tuple[int, str]]:
        """Rank 0: the API port and :meth:`rendezvous`; every node of a hybrid data-parallel
        replica serves the API port too."""
        if rank != 0 and replica.hybrid:
            return [(replica.engine.api_port, "API port")]
        return super().listen_ports(replica, rank)

    def other_ports(self, agreed: Mapping[str, Any],
                    host_value: Callable[[str], Any]) -> dict[str, Any]:
        """The master port; with data parallel the RPC port instead (no ``--master-port`` is
        rendered then)."""
        size = agreed.get("vllm_data_parallel_size")
        if isinstance(size, int) and size > 1:
            return {"vllm_data_parallel_rpc_port": agreed.get("vllm_data_parallel_rpc_port")}
        return {"vllm_master_port": agreed.get("vllm_master_port")}

    def rendered_flags(self, replica: Replica) -> list[str]:
        """``--distributed-executor-backend mp --nnodes N``; with data parallel
        ``--data-parallel-size D --data-parallel-size-local L`` (and
        ``--data-parallel-hybrid-lb``)."""
        if replica.data_parallel:
            return ["--distributed-executor-backend", "mp",
                    *self._data_parallel_flags(replica)]
        return ["--distributed-executor-backend", "mp", "--nnodes", str(replica.nnodes)]

    @staticmethod
    def _data_parallel_flags(replica: Replica) -> list[str]:
        flags = ["--data-parallel-size", str(replica.engine.data_parallel_size),
                 "--data-parallel-size-local", str(replica.dp_size_local)]
        return [*flags, "--data-parallel-hybrid-lb"] if replica.hybrid else flags

    def node_role(self, replica: Replica, node: Node) -> str:
        """``master`` (rank 0), ``headless``, or ``api`` (a hybrid replica's other nodes)."""
        if node.rank == 0:
            return "master"
        return "api" if replica.hybrid else "headless"

    def serve_argv(self, replica: Replica, node: Node, engine_argv: list[str]) -> list[str] | None:
        """``--nnodes N --node-rank R --master-addr A --master-port P``, then ``--host``/``--port``
        on rank 0 or ``--headless`` elsewhere, then ``--distributed-executor-backend mp``
        (roles/vllm_mp/templates/vllm.service.j2). With data parallel, in place of the first
        four: ``--data-parallel-size D --data-parallel-size-local L [--data-parallel-hybrid-lb]
        --data-parallel-start-rank R x L --data-parallel-address A --data-parallel-rpc-port P``,
        and ``--host``/``--port`` on every node of a hybrid replica."""
        engine = replica.engine
        if replica.data_parallel:
            argv = [*engine_argv, *self._data_parallel_flags(replica),
                    "--data-parallel-start-rank", str(node.rank * replica.dp_size_local),
                    "--data-parallel-address", replica.master_addr,
                    "--data-parallel-rpc-port", str(engine.data_parallel_rpc_port)]
        else:
            argv = [*engine_argv, "--nnodes", str(replica.nnodes), "--node-rank",
                    str(node.rank), "--master-addr", replica.master_addr, "--master-port",
                    str(engine.master_port)]
        serves = node in replica.api_nodes
        argv += (["--host", engine.api_host, "--port", str(engine.api_port)] if serves
                 else ["--headless"])
        return [*argv, "--distributed-executor-backend", "mp"]

    def plan(self, replica: Replica, node: Node) -> dict[str, Any]:
        """This node's vLLM depends on every other node's vLLM, both ways; a headless node's rule
        for rank 0 names the rendezvous (``master_addr``/``master_port``), which its workers must
        have joined before it binds rank 0 (docs/recovery.md); with data parallel the port is 0:
        any connection to rank 0 counts (every engine meets rank 0 only when it starts, and a
        mixture-of-experts model's engines step in lockstep, so a data-parallel node depends on
        the others as a TP/PP node does: docs/serving.md)."""
        unit = unit_var(node.host.vars, "vllm_unit_name", "vllm.service")
        rules = []
        for other in replica.nodes:
            if other.rank == node.rank:
                continue
            rule: dict[str, Any] = {"unit": unit, "peer": other.name, "peer_unit": unit,
                                    "mutual": True}
            if other.rank == 0:
                # data parallel: port 0, any connection to rank 0 (after the handshake on the
                # RPC port, an engine keeps ZMQ connections to the front end's sockets on rank
                # 0, on ports rank 0 chooses: vllm/v1/engine/core.py, vllm/v1/engine/utils.py)
                rule |= {"master_addr": replica.master_addr,
                         "master_port": 0 if replica.data_parallel
                         else int(replica.engine.master_port)}
            rules.append(rule)
        return {"units": [unit], "rules": rules, "probe": node.rank == 0, "restarts": "vLLM"}
