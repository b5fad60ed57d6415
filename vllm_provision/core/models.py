"""Typed, validated values the inventory loader produces: hosts, groups, replicas, nodes.

These are plain frozen dataclasses: everything downstream (connections, facts, checks, roles)
reads them and nothing writes them. ``inventory.load_inventory`` is the only producer.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from vllm_provision.backends import Backend


@dataclass(frozen=True)
class Host:
    """One server, as named in the inventory, with its connection settings resolved.

    Attributes:
        name: inventory host name (``h1``).
        address: where to connect: ``ansible_host`` or, if unset, the name.
        port: SSH port (``ansible_port``, default 22, or from ~/.ssh/config).
        user: SSH user (``ansible_user``; None = ~/.ssh/config or the local user).
        key_file: ``ansible_ssh_private_key_file`` (None = agent / ~/.ssh/config / default keys).
        known_hosts_files: extra known_hosts files (from ``UserKnownHostsFile`` in
            ``ansible_ssh_common_args``/``ansible_ssh_extra_args`` or
            ``provision_known_hosts_file``),
            read in addition to the system and user files.
        become: run privileged commands through ``sudo`` (``ansible_become``).
        become_user: the sudo target user (``ansible_become_user``, default ``root``).
        groups: names of every group the host belongs to, ``all`` first, most general first.
        vars: the host's merged variables (group vars < group_vars/ < host vars < host_vars/ <
            extra vars), without role defaults; read-only.
    """

    name: str
    address: str
    port: int = 22
    user: str | None = None
    key_file: Path | None = None
    known_hosts_files: tuple[Path, ...] = ()
    become: bool = False
    become_user: str = "root"
    groups: tuple[str, ...] = ("all",)
    vars: Mapping[str, Any] = field(default_factory=dict)

    @property
    def server(self) -> tuple[str, int]:
        """Which server this host is, by its SSH target: the address (:func:`canonical_ip`; a
        name without case, RFC 4343) and the port. Two hosts with one target are one server
        (docs/inventory.md, "Shared servers")."""
        return canonical_ip(self.address).lower(), self.port


@dataclass(frozen=True)
class Group:
    """An inventory group: its direct hosts, child groups and its own vars (not inherited ones)."""

    name: str
    hosts: tuple[str, ...] = ()
    children: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineArgs:
    """The ``vllm serve`` arguments every node of a replica shares: the ONE source they render from.

    Sizes are counts; ports are TCP ports; ``max_model_len`` is in tokens;
    ``gpu_memory_utilization`` is a fraction of each GPU's total memory.
    ``api_key`` is a secret: it is rendered only into the 0600 environment file, never into a
    unit or output. ``data_parallel_size`` > 1 makes a data-parallel replica
    (docs/serving.md): ``data_parallel_size`` engines of TP x PP GPUs each,
    ``data_parallel_size_local`` of them on every node (None: the size over the node count),
    laid out ``internal`` (one API server on rank 0, the other nodes ``--headless``) or
    ``hybrid`` (an API server on every node); ``data_parallel_rpc_port`` is rank 0's
    handshake port (vLLM's ``--data-parallel-rpc-port``, default 29550 as vLLM's
    ``ParallelConfig.data_parallel_rpc_port``).
    """

    model: str
    served_model_name: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    api_host: str = "0.0.0.0"
    api_port: int = 8000
    master_port: int = 29501
    extra_args: tuple[str, ...] = ()
    api_key: str | None = None
    data_parallel_size: int = 1
    data_parallel_size_local: int | None = None
    data_parallel_layout: str = "internal"
    data_parallel_rpc_port: int = 29550

    @property
    def world_size(self) -> int:
        """TP x PP: the GPU workers of one engine (of the replica, without data parallel)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class Node:
    """One host's place in a replica.

    Attributes:
        host: the inventory host.
        rank: node rank, 0..nnodes-1; rank 0 is the master (mp) or the Ray head.
        host_ip: this node's address on the cluster network (``vllm_host_ip``, default the
            host's ``ansible_host``); becomes ``VLLM_HOST_IP`` and Ray's ``--node-ip-address``.
        gpus: the GPU indexes (nvidia-smi's ``index``) of ``vllm_gpus``, in the order written
            (CUDA numbers the visible devices in that order), checked at load: distinct ints
            >= 0, at least the replica's :attr:`Replica.gpus_per_node`; rendered as
            ``CUDA_VISIBLE_DEVICES``. None: unset, the replica uses GPUs ``0..N-1``.
    """

    host: Host
    rank: int
    host_ip: str
    gpus: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        """The inventory host name."""
        return self.host.name


@dataclass(frozen=True)
class Replica:
    """One vLLM replica: a child group of ``vllm_replicas`` in the inventory.

    Attributes:
        name: the group name.
        backend: the registered backend's name: ``mp`` (vLLM multi-node multiprocessing),
            ``ray`` or another one (:mod:`vllm_provision.backends`).
        nodes: ordered by rank; ``nodes[0]`` is rank 0.
        engine: the shared engine arguments.
        vars: the replica group's merged vars (for roles), read-only.
        backend_reason: empty when ``vllm_backend`` is set; else why vLLM's default rule gave
            ``backend`` (``backends.choice.backend_choice``), shown by ``provision check``.
        declared_id: ``vllm_replica_id`` when the inventory sets it, else None
            (:attr:`replica_id` is then derived).
    """

    name: str
    backend: str
    nodes: tuple[Node, ...]
    engine: EngineArgs
    vars: Mapping[str, Any] = field(default_factory=dict)
    backend_reason: str = ""
    declared_id: str | None = None

    @property
    def replica_id(self) -> str:
        """The replica's owner id in state records: ``vllm_replica_id`` when declared, else
        :func:`derived_replica_id` (docs/deploy.md, "Who owns a host")."""
        return self.declared_id or derived_replica_id(self)

    @property
    def backend_type(self) -> Backend:
        """The :class:`~vllm_provision.backends.Backend` named by ``backend`` (units, ports,
        watchdog plan, checks); templates read it as ``replica.backend_type``."""
        from vllm_provision import backends

        return backends.get(self.backend)

    @property
    def master(self) -> Node:
        """Rank 0: the mp master (serves HTTP) or the Ray head (runs vLLM)."""
        return self.nodes[0]

    @property
    def followers(self) -> tuple[Node, ...]:
        """Ranks > 0: headless mp nodes or Ray workers."""
        return self.nodes[1:]

    @property
    def nnodes(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    @property
    def master_addr(self) -> str:
        """Rank 0's cluster address: ``--master-addr`` (mp), ``--data-parallel-address`` (data
        parallel) or the Ray head address."""
        return self.master.host_ip

    @property
    def data_parallel(self) -> bool:
        """Whether the replica is data parallel (``vllm_data_parallel_size`` > 1)."""
        return self.engine.data_parallel_size > 1

    @property
    def dp_size_local(self) -> int:
        """Data-parallel engines per node: ``vllm_data_parallel_size_local``, else the size over
        the node count (at least 1); 1 without data parallel."""
        if not self.data_parallel:
            return 1
        return self.engine.data_parallel_size_local or max(
            1, self.engine.data_parallel_size // self.nnodes)

    @property
    def gpus_per_node(self) -> int:
        """GPU workers each node runs: TP x PP x engines per node with data parallel (each
        engine's TP x PP group is on one node), else TP x PP over the nodes (the mp executor's
        ``world_size // nnodes``, vllm/v1/executor/multiproc_executor.py)."""
        if self.data_parallel:
            return self.engine.world_size * self.dp_size_local
        return self.engine.world_size // max(1, self.nnodes)

    def node_gpus(self, node: Node) -> tuple[int, ...]:
        """The GPU indexes (nvidia-smi's ``index``) this replica's processes may use on
        ``node``: its ``vllm_gpus`` (:attr:`Node.gpus`, every one listed: mp's workers take the
        first :attr:`gpus_per_node` of them, Ray may hand out any), else ``0..gpus_per_node-1``
        (vLLM puts its local ranks on the first visible devices). The GPU checks of preflight
        and the shared pool's gang start read these and no others.

        Args:
            node: one of :attr:`nodes`.
        """
        if node.gpus is not None:
            return node.gpus
        return tuple(range(self.gpus_per_node))

    @property
    def hybrid(self) -> bool:
        """A data-parallel replica laid out ``hybrid``: an API server on every node."""
        return self.data_parallel and self.engine.data_parallel_layout == "hybrid"

    @property
    def api_nodes(self) -> tuple[Node, ...]:
        """The nodes that serve the OpenAI API: every node of a hybrid replica, else rank 0."""
        return self.nodes if self.hybrid else (self.master,)

    def node_api_url(self, node: Node) -> str:
        """``node``'s OpenAI API base URL, ``http://host:port``, as :attr:`api_url` for rank 0:
        an all-interfaces bind is reached on the node's cluster IP."""
        host = self.engine.api_host
        if host in ("0.0.0.0", "::", ""):
            host = node.host_ip
        return f"http://{host_port(host, self.engine.api_port)}"

    @property
    def api_urls(self) -> tuple[str, ...]:
        """Every API base URL of the replica (:attr:`api_nodes`, by rank): the front door's
        workers for it; rank 0's :attr:`api_url` alone unless hybrid data parallel."""
        return tuple(self.node_api_url(node) for node in self.api_nodes)

    @property
    def api_url(self) -> str:
        """rank 0's OpenAI API base URL, ``http://host:port``: an all-interfaces bind
        (``0.0.0.0``, ``::``, empty) is reached on rank 0's cluster IP; IPv6 in brackets."""
        return self.node_api_url(self.master)


class _GroupLike(Protocol):
    @property
    def hosts(self) -> Iterable[str]: ...

    @property
    def children(self) -> Iterable[str]: ...


def hosts_under(groups: Mapping[str, _GroupLike], hosts: Iterable[str], name: str) -> list[str]:
    """Names of every host of group ``name`` or its descendant groups, in the order of ``hosts``.

    Args:
        groups: group name -> a group with ``hosts`` and ``children`` (name collections); the
            loaded :class:`Group` or the loader's tree node.
        hosts: every host name of the inventory, in inventory order.
        name: the group; an unknown name gives ``[]``. Cycles are walked once.
    """
    members: set[str] = set()
    stack, seen = [name], set()
    while stack:
        current = stack.pop()
        if current in seen or current not in groups:
            continue
        seen.add(current)
        members.update(groups[current].hosts)
        stack.extend(groups[current].children)
    return [host for host in hosts if host in members]


# The version of what derived_replica_id hashes: a change of its inputs is a new version, so
# that every derived id changes at once and on purpose.
DERIVED_ID_VERSION = 1


def host_port(host: str, port: int) -> str:
    """``host:port`` as URLs and Prometheus targets write it: an IPv6 address in brackets
    (RFC 3986, "IP-literal")."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def canonical_ip(address: str) -> str:
    """Return one spelling per IP address: an IPv4-mapped IPv6 address (``::ffff:10.0.0.1``)
    becomes the IPv4 address, IPv6 is compressed (``ipaddress``' ``str``); a non-address is
    returned as it is. The inventory's ``ip`` kind (``settings.kinds``) and the derived replica
    id both use it, so an address written two ways is one address."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(parsed)


def derived_replica_id(replica: Replica) -> str:
    """The owner id of a replica that declares no ``vllm_replica_id``: ``<name>@<16 hex>``.

    The hex digits are the first 16 of the sha256 of a JSON document (sorted keys, no spaces)
    holding, and holding only: the replica's name; its nodes in node-rank order, each as
    ``[inventory host name, cluster address]`` (``Node.host_ip``: ``vllm_host_ip``, else
    ``ansible_host``; one spelling per IP); ``vllm_model``; and :data:`DERIVED_ID_VERSION`.
    These say which machines serve which model under which name: two inventories that agree
    on them describe the same replica, wherever their files lie. The inventory's path, the
    controller, the backend, ports, engine arguments other than the model, the SSH address
    (how one controller reaches a host, which may differ between controllers) and secrets are
    left out, so none of them changes the owner (docs/deploy.md, "Who owns a host").

    ``@`` is not allowed in a declared id (``settings.kinds.REPLICA_ID_RE``), so a derived id
    never equals a declared one.

    Args:
        replica: the replica (nodes already sorted by rank, as the loader builds them).
    """
    content = {"v": DERIVED_ID_VERSION, "replica": replica.name,
               "nodes": [[node.name, canonical_ip(node.host_ip)]
                         for node in sorted(replica.nodes, key=lambda n: n.rank)],
               "model": replica.engine.model}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return f"{replica.name}@{hashlib.sha256(text.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class Inventory:
    """A loaded, validated inventory.

    Attributes:
        path: the inventory file.
        hosts: by name, in file order.
        groups: by name (``all`` and ``ungrouped`` included).
        replicas: every child group of ``vllm_replicas``, in file order.
        extra_vars: ``-e`` values (highest precedence), already merged into hosts' vars.
    """

    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, Group]
    replicas: tuple[Replica, ...] = ()
    extra_vars: Mapping[str, Any] = field(default_factory=dict)

    def hosts_in_group(self, name: str) -> list[str]:
        """Names of every host in group ``name`` or its descendant groups, in inventory order
        (``all``: every host; an unknown name: none)."""
        if name == "all":
            return list(self.hosts)
        return hosts_under(self.groups, self.hosts, name)

    def replica_of(self, host_name: str) -> Replica | None:
        """Return the replica ``host_name`` belongs to, or None."""
        for replica in self.replicas:
            if any(node.name == host_name for node in replica.nodes):
                return replica
        return None
