"""Build the replicas: every child group of ``vllm_replicas``, its nodes, ranks and engine args."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from typing import Any

from vllm_provision import backends
from vllm_provision.backends import choice
from vllm_provision.core.models import EngineArgs, Host, Node, Replica, canonical_ip
from vllm_provision.inventory.extra_args import (  # noqa: F401 - the tables, used here first
    RENDERED_OPTIONS,
    VARIABLE_OPTIONS,
    check_extra_args,
    pinned_version,
)
from vllm_provision.inventory.hosts import INVALID
from vllm_provision.inventory.source import Problems, Setting
from vllm_provision.inventory.tree import Tree
from vllm_provision.inventory.values import show
from vllm_provision.settings import instance, kinds, monitoring, variables, vllm_cli
from vllm_provision.settings import node_settings as settings_of
from vllm_provision.settings.monitoring import VARIABLES as MONITORING_VARIABLES

REPLICAS_GROUP = "vllm_replicas"
def synthetic_groups() -> tuple[str, ...]:
    """The groups the loader adds: ``vllm_master``, ``vllm_followers`` and ``vllm_<backend>``
    for every registered backend (:mod:`vllm_provision.backends`)."""
    return ("vllm_master", "vllm_followers", *(f"vllm_{name}" for name in backends.names()))

def _replica_scope() -> list[str]:
    return [v.name for v in variables.VARIABLES.values() if v.scope == "replica"]


def _agree(name: str, nodes: list[str], settings: Mapping[str, Mapping[str, Setting]],
           replica: str, tree: Tree, problems: Problems) -> Any:
    """Return the one value every node has for ``name`` (default if none sets it); record a
    problem naming both hosts and values when two nodes disagree."""
    var = variables.VARIABLES[name]
    default = variables.defaults().get(name)
    seen: list[tuple[str, Any, Setting | None]] = []
    for host in nodes:
        setting = settings[host].get(name)
        if setting is not None and setting.value is INVALID:
            return INVALID
        seen.append((host, setting.value if setting else default, setting))
    first_host, first_value, first_setting = seen[0]
    for host, value, setting in seen[1:]:
        if value != first_value:
            def origin(s: Setting | None) -> str:
                return f"from {s.origin.where}" if s else "the default"

            culprit = setting or first_setting
            problems.add(
                culprit.origin.where if culprit else f"{tree.file}: replica {replica!r}",
                f"{name} differs between nodes: {first_host} has {show(name, first_value)} "
                f"({origin(first_setting)}), {host} has {show(name, value)} "
                f"({origin(setting)})",
                expected=f"the same {name} on every node of the replica",
                actual=f"{show(name, first_value)} and {show(name, value)}",
                fix=f"set {name} once in the group vars of {replica!r} and remove the "
                    "per-host value" + ("" if var.engine_field is None else
                                        "; all nodes render from one set of engine arguments"))
            return INVALID
    return first_value


def _check_version_pin(replica: str, members: list[str],
                       settings: Mapping[str, Mapping[str, Setting]], agreed: Mapping[str, Any],
                       problems: Problems, where: str) -> bool:
    """Refuse a ``vllm_version`` pin that is not a vLLM version (no release segment such as
    ``0.12.0`` at its start: :func:`vllm_provision.settings.vllm_cli.parse_release`), naming
    where it was set. Returns False when a problem was recorded."""
    pin = pinned_version(agreed)
    if pin is None or vllm_cli.parse_release(pin) is not None:
        return True
    setting = settings[members[0]].get("vllm_version")
    problems.add(setting.origin.where if setting else where,
                 f"vllm_version of replica {replica!r} is not a vLLM version",
                 expected="a vLLM release such as 0.12.0 (a local part such as +cu129 is "
                          "allowed)", actual=repr(pin),
                 fix="set vllm_version to the release installed on the nodes (`pip show vllm` "
                     "in the venv), or remove it")
    return False


def _rank_of(host: str, settings: Mapping[str, Setting], single: bool) -> Any:
    setting = settings.get("vllm_node_rank")
    if setting is None:
        return 0 if single else None
    return setting.value


def _host_ip(host: Host, settings: Mapping[str, Setting], problems: Problems,
             file: str) -> str | None:
    setting = settings.get("vllm_host_ip")
    if setting is not None:
        return None if setting.value is INVALID else setting.value
    address = settings.get("ansible_host")
    try:
        ipaddress.ip_address(host.address)
    except ValueError:
        where = address.origin.where if address else f"{file}: host {host.name!r}"
        problems.add(where, f"host {host.name} has no vllm_host_ip and its address "
                     f"{host.address!r} is a name, not an IP address",
                     expected="vllm_host_ip set to the node's IP on the cluster network",
                     actual=repr(host.address),
                     fix=f"add vllm_host_ip: <IP> to {host.name}'s host vars (it becomes "
                         "VLLM_HOST_IP and Ray's --node-ip-address, which must be an IP)")
        return None
    return host.address


def _value(settings: Mapping[str, Setting], name: str) -> Any:
    """A host's value of ``name``: its setting, else the table's or the role's default."""
    setting = settings.get(name)
    if setting is not None:
        return setting.value
    return variables.defaults().get(name, variables.role_defaults().get(name))


def _is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _port_clashes(ports: Mapping[str, Any], ranges: Mapping[tuple[str, str], tuple[Any, Any]],
                  ) -> list[tuple[str, str, str, str]]:
    """``(first variable, second variable, what is wrong, expected)`` for every two ports that
    are equal, every port inside a range, and every range whose low end is above its high end
    (values that are not integers were refused already and are skipped)."""
    clashes: list[tuple[str, str, str, str]] = []
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if not _is_port(port):
            continue
        if port in seen:
            clashes.append((seen[port], name, f"are both {port}: two servers cannot listen on "
                            "one port", f"a port other than {port}"))
        else:
            seen[port] = name
    for (low_name, high_name), (low, high) in ranges.items():
        if not (_is_port(low) and _is_port(high)):
            continue
        if low >= high:  # Ray: "max_worker_port must be higher than min_worker_port"
            clashes.append((low_name, high_name, f"give no range ({low} is not below {high})",
                            f"{low_name} < {high_name}"))
            continue
        for name, port in ports.items():
            if _is_port(port) and low <= port <= high:
                clashes.append((name, f"{low_name}-{high_name}",
                                f"overlap: {port} is inside the range {low}-{high}",
                                f"a port outside {low}-{high}"))
    return clashes


def _check_conflicts(replica: str, members: list[str],
                     settings: Mapping[str, Mapping[str, Setting]], agreed: Mapping[str, Any],
                     problems: Problems, where: str) -> bool:
    """Refuse values that silently override one another: the API port equal to the master,
    Ray or watchdog port, and a ``vllm_env``/``vllm_node_env`` entry that overrides the
    NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set from ``vllm_cluster_interface``. Returns False
    when a problem was recorded."""
    ok = True
    backend = agreed.get("vllm_backend")
    reported: set[tuple[str, str]] = set()
    for host in members:
        values = settings[host]
        # unset: vLLM's default rule gives mp (backends.choice.backend_choice)
        chosen = backends.find(backend) or backends.get("mp")
        host_value = functools.partial(_value, values)
        ports = {"vllm_api_port": agreed.get("vllm_api_port"),
                 "vllm_watchdog_port": _value(values, "vllm_watchdog_port"),
                 **chosen.other_ports(agreed, host_value),
                 **{e.variable: e.port for e in monitoring.exporters(
                     {name: _value(values, name) for name in MONITORING_VARIABLES})}}
        for first, second, message, expected in _port_clashes(
                ports, chosen.port_ranges(agreed, host_value)):
            if (first, second) in reported:
                continue
            reported.add((first, second))
            setting = values.get(second) or values.get(first)
            problems.add(setting.origin.where if setting else where,
                         f"{first} and {second} of replica {replica!r} {message}",
                         expected=expected,
                         fix=f"give {first} and {second} values that do not overlap")
            ok = False
        interface = _value(values, "vllm_cluster_interface")
        if not interface or interface is INVALID:
            continue
        for env_name in ("vllm_env", "ray_env", "vllm_node_env"):
            setting = values.get(env_name)
            if setting is None or not isinstance(setting.value, Mapping):
                continue
            for key in kinds.INTERFACE_ENV:
                if key in setting.value:
                    problems.add(setting.origin.child(key).where,
                                 f"{env_name} sets {key}, which follows from "
                                 f"vllm_cluster_interface ({interface!r}) on host {host}",
                                 actual=f"{key}={setting.value[key]!r}",
                                 fix=f"remove {key} from {env_name} and set "
                                     "vllm_cluster_interface to the interface you want")
                    ok = False
    return ok


def _check_data_parallel(replica: str, agreed: Mapping[str, Any], backend: str, nnodes: int,
                         values: Mapping[str, Setting], problems: Problems, where: str) -> bool:
    """Refuse a data-parallel layout vLLM would not start or would start wrong; False when a
    problem was recorded.

    Rules (docs/serving.md, "Data parallel"): data parallel is rendered for the mp backend
    only (vLLM's Ray data parallel, ``--data-parallel-backend ray``, is not a layout here);
    the size is the engines per node times the nodes (vLLM starts ``--data-parallel-size-local``
    engines on each node from its ``--data-parallel-start-rank`` and waits for all of them,
    ``vllm/v1/engine/utils.py``); ``hybrid`` needs a size above 1 and an API bound on every
    interface (each node binds the same ``vllm_api_host``).
    """
    size = agreed["vllm_data_parallel_size"]
    local = agreed["vllm_data_parallel_size_local"]
    layout = agreed["vllm_data_parallel_layout"]

    def at(name: str) -> str:
        setting = values.get(name)
        return setting.origin.where if setting is not None else where

    if size == 1:
        if layout == "hybrid":
            problems.add(at("vllm_data_parallel_layout"),
                         f"replica {replica!r} sets vllm_data_parallel_layout: hybrid without "
                         "data parallel", expected="vllm_data_parallel_size > 1 with a layout",
                         actual="vllm_data_parallel_size: 1",
                         fix="set vllm_data_parallel_size (engines in all) or remove the layout")
            return False
        if local not in (None, 1):
            problems.add(at("vllm_data_parallel_size_local"),
                         f"replica {replica!r} sets vllm_data_parallel_size_local: {local} "
                         "without data parallel",
                         expected="vllm_data_parallel_size = local size x nodes",
                         actual="vllm_data_parallel_size: 1",
                         fix=f"set vllm_data_parallel_size: {local * nnodes} or remove "
                             "vllm_data_parallel_size_local")
            return False
        return True
    if backend != "mp":
        problems.add(at("vllm_data_parallel_size"),
                     f"replica {replica!r} is data parallel (vllm_data_parallel_size: {size}) "
                     f"on the {backend} backend", expected="vllm_backend: mp (or unset) for a "
                     "data-parallel replica", actual=f"vllm_backend: {backend}",
                     fix="set vllm_backend: mp (each engine's TP x PP stays on one node), or "
                         "declare one replica per engine behind the front door")
        return False
    if local is None and size % nnodes:
        near = sorted({n for n in (nnodes * (size // nnodes), nnodes * (size // nnodes + 1))
                       if n > 1})
        problems.add(at("vllm_data_parallel_size"),
                     f"vllm_data_parallel_size {size} of replica {replica!r} does not divide "
                     f"over its {nnodes} nodes", expected=f"a multiple of {nnodes} (the same "
                     "engines on every node)", actual=str(size),
                     fix=f"set vllm_data_parallel_size to {' or '.join(map(str, near))}, or "
                         "change the replica's nodes")
        return False
    if local is not None and local * nnodes != size:
        problems.add(at("vllm_data_parallel_size_local"),
                     f"replica {replica!r}: vllm_data_parallel_size {size} is not "
                     f"vllm_data_parallel_size_local {local} x {nnodes} nodes ({local * nnodes}); "
                     "vLLM would wait for engines no node starts"
                     if local * nnodes < size else
                     f"replica {replica!r}: vllm_data_parallel_size {size} is not "
                     f"vllm_data_parallel_size_local {local} x {nnodes} nodes ({local * nnodes}); "
                     "the last nodes' start ranks would be past the size",
                     expected="vllm_data_parallel_size = vllm_data_parallel_size_local x nodes",
                     actual=f"{size} and {local} x {nnodes}",
                     fix=f"set vllm_data_parallel_size: {local * nnodes}, or remove "
                         "vllm_data_parallel_size_local")
        return False
    host = agreed["vllm_api_host"]
    if layout == "hybrid" and host not in ("0.0.0.0", "::", ""):
        problems.add(at("vllm_api_host"),
                     f"replica {replica!r} is hybrid data parallel, so every node serves the "
                     f"API, but vllm_api_host {host} is one address: the other nodes cannot "
                     "bind it", expected="vllm_api_host 0.0.0.0 or :: (each node is reached on "
                                         "its vllm_host_ip)", actual=str(host),
                     fix="remove vllm_api_host (0.0.0.0), or use the internal layout")
        return False
    return True


# Ray's words when ``ray start --num-gpus`` asks for more GPUs than CUDA_VISIBLE_DEVICES holds
# (ResourceAndLabelSpec._resolve_accelerator_resources, ray/_private/resource_and_label_spec.py).
RAY_VISIBLE_GPUS_ERROR = ("Attempting to start raylet with {asked} GPU, but CUDA_VISIBLE_DEVICES "
                          "contains {visible}.")


def _check_gpu_sets(replica: Replica, agreed: Mapping[str, Any],
                    settings: Mapping[str, Mapping[str, Setting]], problems: Problems) -> bool:
    """Refuse a ``vllm_gpus`` that cannot hold the node's share of the replica, naming the file,
    the replica, the node and the fix; False when a problem was recorded.

    Rules (docs/inventory.md, "GPU sets"): each node's list holds at least
    :attr:`Replica.gpus_per_node` indexes (vLLM's mp executor asserts "local_world_size ... must
    be less than or equal to the number of visible devices", vllm PR #28873; Ray's placement
    group waits for GPUs no node shows); not with ``vllm_device: cpu`` (no GPU is used); a Ray
    node's ``ray_num_gpus`` is at most the list's length (Ray refuses to start:
    :data:`RAY_VISIBLE_GPUS_ERROR`); ``vllm_env``, ``ray_env`` and ``vllm_node_env`` set
    neither ``CUDA_VISIBLE_DEVICES`` nor ``CUDA_DEVICE_ORDER`` (one source: both are rendered
    from ``vllm_gpus``, :data:`~vllm_provision.settings.kinds.GPU_SET_ENV`). Whether the host
    has those GPUs is known from facts only: preflight's ``host.gpus``.
    """
    ok = True
    need = replica.gpus_per_node
    reported: set[str] = set()  # a group's vllm_env is one place, however many nodes read it
    for node in replica.nodes:
        if node.gpus is None:
            continue
        values = settings[node.name]
        setting = values["vllm_gpus"]
        where = setting.origin.where
        shown = "[" + ", ".join(map(str, node.gpus)) + "]"
        if agreed.get("vllm_device") == "cpu":
            problems.add(where, f"vllm_gpus is set on {node.name}, but replica {replica.name!r} "
                         "runs on CPUs (vllm_device: cpu)", expected="no vllm_gpus with "
                         "vllm_device: cpu", actual=shown,
                         fix=f"remove vllm_gpus from {node.name}, or set vllm_device: cuda")
            ok = False
            continue
        if len(node.gpus) < need:
            why = (f"{replica.dp_size_local} data-parallel engines x TP x PP "
                   f"{replica.engine.world_size}" if replica.data_parallel else
                   f"TP x PP {replica.engine.world_size} over {replica.nnodes} nodes")
            problems.add(where, f"vllm_gpus of {node.name} lists {len(node.gpus)} GPU"
                         f"{'s' if len(node.gpus) != 1 else ''}, but replica {replica.name!r} "
                         f"needs {need} on each node ({why})",
                         expected=f"at least {need} GPU indexes in vllm_gpus", actual=shown,
                         fix=f"list {need} of {node.name}'s GPUs in vllm_gpus, or lower the "
                             "replica's TP x PP"
                             + (" or vllm_data_parallel_size_local" if replica.data_parallel
                                else ""))
            ok = False
        if replica.backend_type.ray_cluster:
            declared = values.get("ray_num_gpus")
            if declared is not None and declared.value is not INVALID \
                    and declared.value > len(node.gpus):
                problems.add(declared.origin.where,
                             f"ray_num_gpus {declared.value} of {node.name} is more than the "
                             f"{len(node.gpus)} GPUs of its vllm_gpus {shown}; Ray would not "
                             "start: " + RAY_VISIBLE_GPUS_ERROR.format(
                                 asked=declared.value,
                                 visible=[str(i) for i in node.gpus]),
                             expected=f"ray_num_gpus <= {len(node.gpus)}",
                             actual=str(declared.value),
                             fix=f"remove ray_num_gpus from {node.name} (Ray then counts the "
                                 "GPUs of vllm_gpus), or list more GPUs in vllm_gpus")
                ok = False
        for env_name in ("vllm_env", "ray_env", "vllm_node_env"):
            env = values.get(env_name)
            if env is None or not isinstance(env.value, Mapping):
                continue
            for key in kinds.GPU_SET_ENV:
                if key not in env.value:
                    continue
                ok = False
                at = env.origin.child(key).where
                if at in reported:
                    continue
                reported.add(at)
                problems.add(at, f"{env_name} sets {key}, which follows from vllm_gpus "
                             f"({shown}) on host {node.name}",
                             actual=f"{key}={env.value[key]!r}",
                             fix=f"remove {key} from {env_name} and list the GPUs in "
                                 "vllm_gpus")
    return ok


def build_replicas(tree: Tree, hosts: Mapping[str, Host],
                   settings: Mapping[str, Mapping[str, Setting]],
                   group_vars: Mapping[str, Any], problems: Problems) -> tuple[Replica, ...]:
    """Build every replica (child group of ``vllm_replicas``), in file order.

    Checks: a replica has hosts; a host is in one replica only; ranks are 0..N-1, unique and
    complete (a single-host replica may omit its rank: 0); each node has an IP address; every
    replica-scope variable (engine arguments, backend, service settings) is equal on all nodes;
    ``vllm_model`` is set; ``vllm_extra_args`` holds no option we render; each node's
    ``vllm_gpus`` can hold its share of the replica (:func:`_check_gpu_sets`). A replica without
    ``vllm_backend`` gets vLLM's default backend (``backends.choice.backend_choice``), with the
    reason kept in ``Replica.backend_reason``.

    Args:
        tree: the parsed group tree.
        hosts: every host by name, built by :func:`~.hosts.build_host`.
        settings: every host's merged settings (validated).
        group_vars: each replica group's merged vars, by group name (for ``Replica.vars``).
        problems: where problems are recorded.
    """
    if REPLICAS_GROUP not in tree.groups:
        return ()
    file = tree.file
    replicas: list[Replica] = []
    owner: dict[str, str] = {}
    for host in tree.groups[REPLICAS_GROUP].hosts:
        problems.add(f"{file}: " + ".".join(map(str, tree.hosts[host].key)),
                     f"host {host} is directly in {REPLICAS_GROUP}, so it is in no replica",
                     expected=f"hosts inside a child group of {REPLICAS_GROUP} (one per replica)",
                     fix=f"move it to {REPLICAS_GROUP}.children.<replica>.hosts")
    for name in tree.groups[REPLICAS_GROUP].children:
        group = tree.groups[name]
        group_where = f"{file}: " + ".".join(str(k) for k in group.key)
        members = tree.hosts_of(name)
        if not members:
            problems.add(group_where, f"replica {name!r} has no hosts",
                         expected="at least one host under hosts:",
                         fix=f"add its nodes under {'.'.join(map(str, group.key))}.hosts, "
                             "each with vllm_node_rank")
            continue
        for host in members:
            if host in owner:
                problems.add(group_where, f"host {host} is in two replicas: {owner[host]!r} and "
                             f"{name!r}", expected="each host in one replica only",
                             fix=f"remove {host} from one of them")
            owner.setdefault(host, name)
        agreed = {var: _agree(var, members, settings, name, tree, problems)
                  for var in _replica_scope()}
        ok = True
        for var in ("vllm_backend", "vllm_model"):
            if agreed[var] is None and var == "vllm_model":
                problems.add(f"{group_where}.vars.{var}", f"replica {name!r} has no {var}",
                             expected=variables.VARIABLES[var].expected(),
                             fix=f"add {var}: {variables.VARIABLES[var].example} to the vars "
                                 f"of group {name!r}")
                ok = False
            elif agreed[var] is INVALID:
                ok = False
        if not _check_version_pin(name, members, settings, agreed, problems, group_where):
            ok = False
        extra = agreed["vllm_extra_args"]
        if extra is not INVALID:
            origin = settings[members[0]].get("vllm_extra_args")
            check_extra_args(extra, origin.origin if origin else None, agreed["vllm_backend"],
                             problems, group_where, pin=pinned_version(agreed))
        ranks: dict[int, list[str]] = {}
        nodes: list[Node] = []
        for host in members:
            rank = _rank_of(host, settings[host], len(members) == 1)
            if rank is INVALID:
                ok = False
                continue
            if rank is None:
                problems.add(f"{file}: " + ".".join(map(str, tree.hosts[host].key)),
                             f"host {host} of replica {name!r} has no vllm_node_rank",
                             expected=f"an integer 0-{len(members) - 1}",
                             fix=f"add vllm_node_rank to {host}'s host vars (0 for the master)")
                ok = False
                continue
            ranks.setdefault(rank, []).append(host)
            host_ip = _host_ip(hosts[host], settings[host], problems, file)
            gpus = _value(settings[host], "vllm_gpus")
            if host_ip is None or gpus is INVALID:
                ok = False
                continue
            nodes.append(Node(hosts[host], rank, host_ip,
                              None if gpus is None else tuple(int(i) for i in gpus)))
        for rank, holders in sorted(ranks.items()):
            if len(holders) > 1:
                problems.add(settings[holders[1]]["vllm_node_rank"].origin.where,
                             f"vllm_node_rank {rank} is used by {len(holders)} hosts of replica "
                             f"{name!r}: {', '.join(holders)}",
                             expected="a different rank per node", actual=str(rank),
                             fix=f"give the nodes of {name!r} the ranks 0..{len(members) - 1}, "
                                 "each once")
                ok = False
        wanted = set(range(len(members)))
        if ranks and not any(len(h) > 1 for h in ranks.values()) and set(ranks) != wanted:
            for rank in sorted(set(ranks) - wanted):
                holder = ranks[rank][0]
                missing = sorted(wanted - set(ranks))
                problems.add(settings[holder]["vllm_node_rank"].origin.where,
                             f"vllm_node_rank {rank} leaves a gap: replica {name!r} has "
                             f"{len(members)} nodes, so ranks are 0..{len(members) - 1} "
                             f"(missing {', '.join(map(str, missing))})",
                             expected=f"an integer 0-{len(members) - 1}", actual=str(rank),
                             fix=f"renumber the nodes of {name!r} 0..{len(members) - 1}")
            ok = False
        ips: dict[str, tuple[str, str]] = {}
        for node in nodes:
            # one address written two ways (::ffff:10.0.0.1 and 10.0.0.1) is one address
            same = canonical_ip(node.host_ip)
            if same in ips:
                other, written = ips[same]
                spelled = node.host_ip if written == node.host_ip else \
                    f"{written} and {node.host_ip}, the same address written two ways"
                problems.add(group_where, f"hosts {other} and {node.name} of replica "
                             f"{name!r} have the same cluster IP {spelled}",
                             expected="a different vllm_host_ip per node (VLLM_HOST_IP must be "
                                      "unique)", actual=node.host_ip,
                             fix="set vllm_host_ip on each node to its own address")
                ok = False
            ips[same] = (node.name, node.host_ip)
        ok = _check_conflicts(name, members, settings, agreed, problems, group_where) and ok
        if not ok or any(value is INVALID for value in agreed.values()):
            continue
        engine_values = {v.engine_field: agreed[v.name] for v in variables.VARIABLES.values()
                         if v.engine_field}
        engine_values["extra_args"] = tuple(engine_values["extra_args"] or ())
        # the names vllm_instance derives, under what the inventory sets (settings.instance)
        derived = {var: value for var, value in instance.derived(agreed["vllm_instance"]).items()
                   if not any(var in settings[host] for host in members)}
        agreed.update({var: value for var, value in derived.items() if var in agreed})
        replica_vars = {**derived, **{k: v for k, v in agreed.items() if v is not None},
                        **group_vars.get(name, {})}
        replica_vars.update({k: v for k, v in agreed.items() if v is not None})
        backend, backend_reason = agreed["vllm_backend"], ""
        if backend is None:  # vLLM's own default rule decides (docs/inventory.md)
            backend, backend_reason = choice.backend_choice(
                agreed["vllm_tensor_parallel_size"] * agreed["vllm_pipeline_parallel_size"],
                len(nodes))
        if not _check_data_parallel(name, agreed, backend, len(nodes), settings[members[0]],
                                    problems, group_where):
            continue
        replica = Replica(name=name, backend=backend,
                          nodes=tuple(sorted(nodes, key=lambda n: n.rank)),
                          engine=EngineArgs(**engine_values), vars=replica_vars,
                          backend_reason=backend_reason, declared_id=agreed["vllm_replica_id"])
        if not _check_gpu_sets(replica, agreed, settings, problems):
            continue
        replicas.append(replica)
    _check_replica_ids(replicas, tree, settings, problems)
    _check_one_node_per_server(replicas, tree, problems)
    return tuple(replicas)


def _check_one_node_per_server(replicas: list[Replica], tree: Tree, problems: Problems) -> None:
    """Record a problem for every node whose SSH target (address and port) an earlier node of
    the inventory already has, unless the two may share the server: nodes of two replicas
    that each declare their own ``vllm_instance``, both on the mp backend, on disjoint
    ``vllm_gpus``, with no port in common (:func:`_check_shared_server`).

    Two entries for one server without instances would install the same units
    (``vllm.service``), the same watchdog, firewall table and state record there, each run
    undoing the other's, and one run would wait on its own run lock. The same machine under
    two addresses is found by preflight (``servers.one_node``, from each host's machine-id and
    boot id). Rule source: docs/inventory.md, "Shared servers".
    """
    seen: dict[tuple[str, int], list[tuple[Node, Replica]]] = {}
    for replica in replicas:
        for node in replica.nodes:
            for first, first_replica in seen.get(node.host.server, []):
                if first.name == node.name:
                    continue  # one host in two replicas: build_replicas already said so
                if first_replica.name == replica.name and canonical_ip(first.host_ip) == \
                        canonical_ip(node.host_ip):
                    continue  # the same cluster IP twice: build_replicas already said so
                where = f"{tree.file}: " + ".".join(map(str, tree.hosts[node.name].key))
                _check_shared_server((first, first_replica), (node, replica), where, problems)
            seen.setdefault(node.host.server, []).append((node, replica))


def _node_ports(replica: Replica, node: Node) -> dict[int, str]:
    """Port -> the variable that sets it, for every port ``node`` of ``replica`` listens on
    (API, the backend's other ports, the watchdog)."""
    values = settings_of(replica, node)
    chosen = backends.find(replica.backend) or backends.get("mp")
    ports = {"vllm_api_port": values.get("vllm_api_port"),
             "vllm_watchdog_port": values.get("vllm_watchdog_port"),
             **chosen.other_ports(values, values.get)}
    return {port: name for name, port in ports.items() if isinstance(port, int)}


def _check_shared_server(first: tuple[Node, Replica], second: tuple[Node, Replica], where: str,
                         problems: Problems) -> None:
    """Record why two nodes with one SSH target may not share their server, if they may not
    (docs/inventory.md, "Shared servers")."""
    (a, ra), (b, rb) = first, second
    both = (f"replica {ra.name!r}" if ra.name == rb.name else
            f"replicas {ra.name!r} and {rb.name!r}")
    head = f"hosts {a.name} and {b.name} ({both}) are one server ({b.host.address} port " \
           f"{b.host.port})"
    ia, ib = ra.vars.get("vllm_instance"), rb.vars.get("vllm_instance")
    if ra.name == rb.name or not ia or not ib or ia == ib:
        why = ("two nodes of one replica" if ra.name == rb.name else
               f"both use vllm_instance {ia!r}" if ia and ia == ib else
               "without a vllm_instance on each")
        problems.add(where, f"{head}: {why}",
                     expected="one node per server, or replicas that each declare their own "
                              "vllm_instance",
                     actual=f"{a.name} and {b.name}",
                     fix=f"give {ra.name!r} and {rb.name!r} each a vllm_instance of its own "
                         "(with disjoint vllm_gpus and their own ports), or put them on "
                         "servers of their own" if ra.name != rb.name else
                         f"put the nodes of {ra.name!r} on servers of their own")
        return
    ray = next((r for r in (ra, rb) if r.backend != "mp"), None)
    if ray is not None:
        problems.add(where, f"{head}: replica {ray.name!r} runs on Ray, which cannot share a "
                     "server yet", expected="mp replicas on a shared server",
                     actual=f"vllm_backend {ray.backend}",
                     fix=f"give {ray.name!r} servers of its own, or set vllm_backend: mp")
        return
    if a.gpus is None or b.gpus is None:
        missing = a.name if a.gpus is None else b.name
        problems.add(where, f"{head}: {missing} has no vllm_gpus, so it would take GPUs 0..N-1 "
                     "of the server", expected="vllm_gpus on both, with no GPU in common",
                     fix=f"set vllm_gpus of {missing} to GPUs the other replica does not use")
    elif set(a.gpus) & set(b.gpus):
        common = ", ".join(map(str, sorted(set(a.gpus) & set(b.gpus))))
        problems.add(where, f"{head}: their vllm_gpus overlap (GPU {common})",
                     expected="disjoint GPU sets", actual=f"{a.name}: {list(a.gpus)}, "
                     f"{b.name}: {list(b.gpus)}",
                     fix=f"give {ra.name!r} and {rb.name!r} GPUs of their own")
    ports_a, ports_b = _node_ports(ra, a), _node_ports(rb, b)
    for port in sorted(set(ports_a) & set(ports_b)):
        problems.add(where, f"{head}: both listen on port {port} ({ports_a[port]} of "
                     f"{ra.name!r}, {ports_b[port]} of {rb.name!r})",
                     expected="ports of their own on a shared server", actual=str(port),
                     fix=f"set {ports_b[port]} of {rb.name!r} to a free port")


def _check_replica_ids(replicas: list[Replica], tree: Tree,
                       settings: Mapping[str, Mapping[str, Setting]], problems: Problems) -> None:
    """Record a problem for every replica whose declared ``vllm_replica_id`` another replica of
    the inventory declared first, naming both: two replicas with one id would own each other's
    hosts (docs/deploy.md, "Who owns a host")."""
    first: dict[str, str] = {}
    for replica in replicas:
        if replica.declared_id is None:
            continue
        if replica.declared_id not in first:
            first[replica.declared_id] = replica.name
            continue
        setting = settings[replica.nodes[0].name].get("vllm_replica_id")
        where = setting.origin.where if setting else f"{tree.file}: replica {replica.name!r}"
        other = first[replica.declared_id]
        problems.add(where, f"replicas {other!r} and {replica.name!r} both declare "
                     f"vllm_replica_id {replica.declared_id!r}",
                     expected="a different vllm_replica_id per replica of the inventory",
                     actual=repr(replica.declared_id),
                     fix=f"give {replica.name!r} an id of its own, or remove vllm_replica_id "
                         "from one of them (an unset id is derived from the replica's "
                         "content)")
