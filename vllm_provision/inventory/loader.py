"""``load_inventory``: read, merge and validate an inventory into ``models.Inventory``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_provision.core.models import Group, Host, Inventory, Replica
from vllm_provision.inventory import aliases
from vllm_provision.inventory.gateways import GATEWAYS_GROUP, check_gateways
from vllm_provision.inventory.hosts import INVALID, build_host, merge_host_vars, plain
from vllm_provision.inventory.replicas import REPLICAS_GROUP, build_replicas, synthetic_groups
from vllm_provision.inventory.source import Origin, Problems, Setting
from vllm_provision.inventory.sources import read_inventory, vars_base
from vllm_provision.inventory.tree import Tree
from vllm_provision.inventory.values import _owned_dirs as owned_dirs_context
from vllm_provision.inventory.values import check_setting
from vllm_provision.inventory.vars_dirs import read_vars_dir


def _checked(settings: Mapping[str, Setting], problems: Problems) -> dict[str, Setting]:
    """Validate every setting; an invalid one keeps its origin with the value ``INVALID``. A
    legacy alias (``ansible_ssh_host``) is validated as the variable it sets, with a warning."""
    result: dict[str, Setting] = {}
    for name, setting in settings.items():
        aliases.warn_deprecated(name, setting.origin.where)
        checked = check_setting(aliases.canonical(name), setting, problems)
        result[name] = checked if checked is not None else Setting(INVALID, setting.origin)
    return result


def _owned_dirs(sources: list[Mapping[str, Setting]]) -> tuple[str, ...]:
    """Every valid path listed in ``provision_owned_dirs`` anywhere in the inventory or ``-e``:
    the directories the operator declares ours (never a system directory)."""
    from vllm_provision.settings import kinds

    found: list[str] = []
    for settings in sources:
        setting = settings.get("provision_owned_dirs")
        if setting is None or not isinstance(setting.value, list):
            continue
        found.extend(item for item in setting.value if isinstance(item, str)
                     and kinds.check_path(item) is None and not kinds.is_system_dir(item))
    return tuple(found)


def _group_merged_vars(tree: Tree, name: str,
                       group_files: Mapping[str, Mapping[str, Setting]]) -> dict[str, Any]:
    """The vars a group sees: its ancestors' and its own, inventory file < group_vars/."""
    chain = sorted(tree.ancestors(name) | {"all"}, key=lambda g: (tree.depth.get(g, 0), g))
    merged: dict[str, Setting] = {}
    for group in chain:
        merged.update(tree.groups[group].vars)
    for group in ["all", *[g for g in chain if g != "all"]]:
        merged.update(group_files.get(group, {}))
    return plain(merged)


def _synthetic_groups(replicas: tuple[Replica, ...], hosts: Mapping[str, Host]) -> dict[str, Group]:
    """``vllm_master`` (rank 0 of each replica), ``vllm_followers`` (ranks > 0) and one
    ``vllm_<backend>`` per registered backend (``vllm_mp``, ``vllm_ray``: nodes of replicas with
    that backend); hosts in inventory order."""
    members: dict[str, set[str]] = {name: set() for name in synthetic_groups()}
    for replica in replicas:
        members["vllm_master"].add(replica.master.name)
        members["vllm_followers"].update(node.name for node in replica.followers)
        members[f"vllm_{replica.backend}"].update(node.name for node in replica.nodes)
    return {name: Group(name, hosts=tuple(h for h in hosts if h in names))
            for name, names in members.items()}


def load_inventory(path: Path, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
    """Load and validate an Ansible inventory: a YAML or INI file, or a directory of them.

    Reads ``path`` (:func:`~.sources.read_inventory`) and the ``group_vars/`` and ``host_vars/``
    folders of its base (:func:`~.sources.vars_base`), merges variables
    with Ansible's precedence (see :func:`~.hosts.merge_host_vars`), validates every variable we
    read against :mod:`vllm_provision.settings.variables`, resolves connection settings and builds
    the
    replicas (child groups of ``vllm_replicas``) and the synthetic groups ``vllm_master``,
    ``vllm_followers``, ``vllm_mp`` and ``vllm_ray``. Opens no connection.

    Args:
        path: the inventory file or directory.
        extra_vars: ``-e`` values, highest precedence; strings are converted for integer,
            boolean, list and mapping variables.

    Returns:
        the validated inventory.

    Raises:
        InventoryError: listing every problem found, each with file, key path, value (secrets
            masked), what was expected and a fix.
    """
    path = Path(path)
    problems = Problems()
    tree = read_inventory(path, problems)
    if tree is None:
        problems.raise_if_any()
    assert tree is not None
    for name in synthetic_groups():
        if name in tree.groups:
            problems.add(f"{tree.file}: " + ".".join(map(str, tree.groups[name].key)),
                         f"the group name {name!r} is reserved: provision adds it itself",
                         fix=f"rename the group; {', '.join(synthetic_groups())} are derived from "
                             "the replicas")
    base = vars_base(path)
    raw_groups = read_vars_dir(base / "group_vars", tree.groups, problems, kind="group")
    raw_hosts = read_vars_dir(base / "host_vars", tree.hosts, problems, kind="host")
    raw_extra = {str(name): Setting(value, Origin(None, (str(name),)))
                 for name, value in (extra_vars or {}).items()}
    token = owned_dirs_context.set(_owned_dirs(
        [*(g.vars for g in tree.groups.values()), *(h.vars for h in tree.hosts.values()),
         *raw_groups.values(), *raw_hosts.values(), raw_extra]))
    try:
        for group in tree.groups.values():
            group.vars = _checked(group.vars, problems)
        for host_node in tree.hosts.values():
            host_node.vars = _checked(host_node.vars, problems)
        group_files = {name: _checked(values, problems) for name, values in raw_groups.items()}
        host_files = {name: _checked(values, problems) for name, values in raw_hosts.items()}
        extra = _checked(raw_extra, problems)
    finally:
        owned_dirs_context.reset(token)
    base = base.absolute()

    settings = {name: aliases.apply(merge_host_vars(tree, name, group_files, host_files, extra))
                for name in tree.hosts}
    hosts = {name: build_host(name, settings[name], tuple(tree.groups_of(name)), base, problems)
             for name in tree.hosts}
    replica_groups = tree.groups[REPLICAS_GROUP].children if REPLICAS_GROUP in tree.groups else []
    replicas = build_replicas(tree, hosts, settings,
                              {g: _group_merged_vars(tree, g, group_files) for g in replica_groups},
                              problems)
    check_gateways(tree, hosts, settings, replicas, problems)
    problems.raise_if_any()

    synthetic = _synthetic_groups(replicas, hosts)
    groups: dict[str, Group] = {}
    for name, node in tree.groups.items():
        own = {**plain(node.vars), **plain(group_files.get(name, {}))}
        groups[name] = Group(name, hosts=tuple(node.hosts), children=tuple(node.children),
                             vars=own)
    groups.update(synthetic)
    # the playbooks' front-door plays name vllm_gateways: an inventory without it has it empty
    # (an existing but empty group matches no host, as vllm_ray in an mp-only inventory)
    groups.setdefault(GATEWAYS_GROUP, Group(GATEWAYS_GROUP))
    final_hosts: dict[str, Host] = {}
    for name, host in hosts.items():
        extra_groups = tuple(g for g in synthetic_groups() if name in synthetic[g].hosts)
        final_hosts[name] = _with_groups(host, host.groups + extra_groups)
    replicas = tuple(_rebind(replica, final_hosts) for replica in replicas)
    return Inventory(path=path, hosts=final_hosts, groups=groups, replicas=replicas,
                     extra_vars=plain(extra))


def require_replicas(inventory: Inventory) -> None:
    """Refuse an inventory that defines no replica, for the commands that act on replicas
    (``check``, ``up``, ``restart``, ``down``): they would otherwise check and change nothing and
    still exit 0. ``facts``, ``status`` and ``play`` work on any host and do not call this.

    Raises:
        InventoryError: no child group of ``vllm_replicas`` with hosts.
    """
    if inventory.replicas:
        return
    present = REPLICAS_GROUP in inventory.groups
    problems = Problems()
    problems.add(f"{inventory.path}: all.children.{REPLICAS_GROUP}" if present else
                 str(inventory.path),
                 f"the inventory defines no replica: {REPLICAS_GROUP} "
                 + ("has no child group" if present else "is missing"),
                 expected=f"one child group of {REPLICAS_GROUP} per replica, holding its hosts",
                 fix=f"add all.children.{REPLICAS_GROUP}.children.<replica>.hosts (see "
                     "inventory/example-2x4-mp.yml)")
    problems.raise_if_any()


def _with_groups(host: Host, groups: tuple[str, ...]) -> Host:
    from dataclasses import replace

    return replace(host, groups=groups)


def _rebind(replica: Replica, hosts: Mapping[str, Host]) -> Replica:
    """Point the replica's nodes at the final hosts (with synthetic groups)."""
    from dataclasses import replace

    nodes = tuple(replace(node, host=hosts[node.name]) for node in replica.nodes)
    return replace(replica, nodes=nodes)
