"""What ``provision inventory`` shows: the inventory as ``ansible-inventory`` shows it, plus the
replicas only this tool knows.

The Ansible part follows ansible-core ``cli/inventory.py``: ``--list`` is a mapping of group
name to ``{"hosts": [...], "children": [...]}`` (empty keys and empty groups left out, ``all``
without ``hosts``), with ``_meta.hostvars`` holding every host's merged variables (hosts without
variables left out) and ``_meta.profile`` (ansible-core 2.19's ``inventory_legacy``);
``--graph`` is the ``@group:`` / ``|--`` tree; ``--host`` the variables of one
host. The variables are the values as Ansible types them (an INI ``port=8000`` is the number 8000),
merged with Ansible's precedence (:func:`~.hosts.merge_host_vars`); secrets are masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_provision.core.models import Inventory, Node, Replica
from vllm_provision.inventory.hosts import merge_host_vars, plain
from vllm_provision.inventory.source import Origin, Problems, Setting, VaultValue
from vllm_provision.inventory.sources import read_inventory, vars_base
from vllm_provision.inventory.tree import Tree
from vllm_provision.inventory.vars_dirs import read_vars_dir
from vllm_provision.settings import variables

EXTRA_KEY = "_vllm_provision"


def _json_value(name: str, value: Any) -> Any:
    """A variable's value as JSON data, a secret (by its name) masked."""
    value = variables.mask(name, value)
    if isinstance(value, VaultValue):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value("", item) for item in value]
    if isinstance(value, str):
        return str(value)
    return value


def read_tree(path: Path, extra_vars: Mapping[str, Any] | None
              ) -> tuple[Tree, dict[str, dict[str, Any]]]:
    """Read ``path`` as Ansible would and return its tree and every host's merged variables.

    Raises:
        InventoryError: the inventory cannot be read (the same problems as :func:`load_inventory`
            reports for the files themselves).
    """
    problems = Problems()
    tree = read_inventory(Path(path), problems)
    problems.raise_if_any()
    assert tree is not None
    base = vars_base(Path(path))
    groups = read_vars_dir(base / "group_vars", tree.groups, Problems(), kind="group")
    hosts = read_vars_dir(base / "host_vars", tree.hosts, Problems(), kind="host")
    extra = {str(k): Setting(v, Origin(None, (str(k),))) for k, v in (extra_vars or {}).items()}
    hostvars = {name: plain(merge_host_vars(tree, name, groups, hosts, extra))
                for name in tree.hosts}
    return tree, hostvars


def _all_children(tree: Tree) -> list[str]:
    children = tree.groups["all"].children
    return ["ungrouped", *[c for c in children if c != "ungrouped"]]


def ansible_list(tree: Tree, hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``ansible-inventory --list``: groups in tree order from ``all``, then ``_meta``."""
    result: dict[str, Any] = {}
    seen: set[str] = set()

    def visit(name: str) -> None:
        group = tree.groups[name]
        entry: dict[str, Any] = {}
        if name != "all" and group.hosts:
            entry["hosts"] = list(group.hosts)
        children = _all_children(tree) if name == "all" else list(group.children)
        if children:
            entry["children"] = children
        if entry:
            result[name] = entry
        for child in children:
            if child not in seen:
                seen.add(child)
                visit(child)

    visit("all")
    meta = {name: {k: _json_value(k, v) for k, v in values.items()}
            for name, values in _hosts_in_order(tree, hostvars)}
    return {**result, "_meta": {"hostvars": {k: v for k, v in meta.items() if v},
                                 "profile": "inventory_legacy"}}


def _hosts_in_order(tree: Tree, hostvars: Mapping[str, Mapping[str, Any]]
                    ) -> list[tuple[str, Mapping[str, Any]]]:
    return [(name, hostvars[name]) for name in tree.hosts]


def ansible_host(hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """``ansible-inventory --host NAME``: the host's variables, secrets masked."""
    return {k: _json_value(k, v) for k, v in hostvars.items()}


def ansible_graph(tree: Tree, top: str = "all") -> str:
    """``ansible-inventory --graph``: ``@group:`` lines, children before hosts, ``  |--``
    indentation per level. From ``all``, the front door's group (``vllm_gateways``,
    docs/front-door.md) is listed even when the inventory does not define it, empty, so the
    graph shows where a gateway host goes."""
    from vllm_provision.inventory.gateways import GATEWAYS_GROUP

    lines: list[str] = []

    def visit(name: str, depth: int) -> None:
        lines.append(("  |" * depth + "--" if depth else "") + f"@{name}:")
        children = _all_children(tree) if name == "all" else tree.groups[name].children
        for child in children:
            visit(child, depth + 1)
        if name != "all":
            for host in tree.groups[name].hosts:
                lines.append("  |" * (depth + 1) + "--" + host)

    visit(top, 0)
    if top == "all" and GATEWAYS_GROUP not in tree.groups:
        lines.append(f"  |--@{GATEWAYS_GROUP}:")
    return "\n".join(lines)


def node_role(replica: Replica, node: Node) -> str:
    """The node's role from its backend (:meth:`~vllm_provision.backends.Backend.node_role`):
    ``master``, ``headless`` and ``api`` (mp; ``api``: a hybrid data-parallel replica's other
    nodes, docs/serving.md), ``ray-head`` and ``ray-worker`` (ray)."""
    from vllm_provision import backends

    return backends.of(replica).node_role(replica, node)


def engine_argv(replica: Replica) -> list[str]:
    """The ``vllm serve`` engine words every node of ``replica`` shares, as
    ``roles/vllm_common/templates/engine_args.j2`` renders them."""
    engine = replica.engine
    argv = [engine.model, "--tensor-parallel-size", str(engine.tensor_parallel_size),
            "--pipeline-parallel-size", str(engine.pipeline_parallel_size)]
    if engine.served_model_name:
        argv += ["--served-model-name", engine.served_model_name]
    if engine.max_model_len:
        argv += ["--max-model-len", str(engine.max_model_len)]
    argv += ["--gpu-memory-utilization", str(engine.gpu_memory_utilization)]
    return argv + list(engine.extra_args)


def node_argv(replica: Replica, node: Node) -> list[str] | None:
    """The arguments after ``vllm serve`` in ``node``'s vLLM unit, from its backend
    (:meth:`~vllm_provision.backends.Backend.serve_argv`), or None for a node that runs no vLLM
    process (a Ray worker)."""
    from vllm_provision import backends

    return backends.of(replica).serve_argv(replica, node, engine_argv(replica))


def replicas_view(inventory: Inventory) -> dict[str, Any]:
    """The replicas: owner id (``Replica.replica_id``), backend, API URL, and per node its rank,
    role, cluster IP and ``vllm serve`` arguments; every secret value masked
    (:class:`~vllm_provision.settings.masking.Masker`)."""
    from vllm_provision.settings.masking import Masker

    masker = Masker.from_inventory(inventory)
    replicas: dict[str, Any] = {}
    for replica in inventory.replicas:
        replicas[replica.name] = {
            "replica_id": replica.replica_id,
            "backend": replica.backend,
            "api_url": replica.api_url,
            "nodes": [{"host": node.name, "rank": node.rank, "role": node_role(replica, node),
                       "host_ip": node.host_ip, "address": node.host.address,
                       "port": node.host.port,
                       "argv": (["vllm", "serve", *argv] if (argv := node_argv(replica, node))
                                is not None else None)}
                      for node in replica.nodes],
        }
    return masker.data({"replicas": replicas})
