"""``provision init``: a first, working inventory written from the facts of the hosts (pure part).

:func:`plan_inventory` turns the facts of the hosts (one probe each, ``vllm_provision.facts``) and
what the operator asked for (:class:`InitRequest`) into an :class:`InventoryPlan`: the inventory
data and a comment for each choice. :func:`render_inventory` writes it as YAML with PyYAML's
emitter (values are data, never pasted into text) and puts the comments above their keys. The
command (``vllm_provision.cli.init``) opens the connections, runs the probe and loads the result
back through the inventory loader before printing it, so what it prints is an inventory
``provision up`` accepts.

Every value read from a host (an interface name, a host name, a venv path) is checked by kind
(``vllm_provision.settings.kinds``) before it lands in the inventory; comments carry such values
only
after every character that could end a YAML comment line is removed (:func:`comment_text`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from vllm_provision import backends
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.facts.model import HostFacts
from vllm_provision.inventory.replicas import REPLICAS_GROUP, synthetic_groups
from vllm_provision.inventory.tree import check_name
from vllm_provision.settings import kinds, variables

# the replica's group name when the operator gives none (a child group of vllm_replicas)
DEFAULT_REPLICA = "llm"
# the backend when the operator names none: vLLM's multi-node multiprocessing
DEFAULT_BACKEND = "mp"
KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class InitRequest:
    """What the operator asked ``provision init`` for; everything else comes from the facts.

    Attributes:
        addresses: the SSH addresses (IPs or DNS names) in rank order: the first is rank 0 (the
            mp master or the Ray head, which serves the API).
        backend: a registered backend's name (``mp``, ``ray``; ``vllm_provision.backends``).
        model: the model's absolute path on every host (``vllm_model``): the one choice no
            fact can make.
        venv: the virtual environment the operator named (``vllm_venv``), or None: the one
            the probe found vLLM in.
        tensor_parallel_size, pipeline_parallel_size: sizes the operator set, or None: GPUs
            per node and number of nodes.
        connection: the ``all.vars`` connection settings (``ansible_user``, ``ansible_port``,
            ``ansible_ssh_private_key_file``, ``provision_known_hosts_file``,
            ``ansible_become``), already checked by the command.
        replica: the replica group's name.
        ips: the IP address of each address that is a DNS name, as this machine resolves it
            (the routes between the hosts are read towards IPs); an IP stands for itself.
    """

    addresses: tuple[str, ...]
    model: str
    backend: str = DEFAULT_BACKEND
    venv: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    connection: Mapping[str, Any] = field(default_factory=dict)
    replica: str = DEFAULT_REPLICA
    ips: Mapping[str, str] = field(default_factory=dict)

    def ip(self, address: str) -> str:
        """The IP that ``address`` stands for (itself when it is one)."""
        return self.ips.get(address, address)


@dataclass(frozen=True)
class InventoryPlan:
    """An inventory ``provision init`` will print.

    Attributes:
        data: the inventory as plain YAML data (``{"all": {...}}``).
        comments: comment lines by the key path they explain (``("all", "vars")``); the empty
            path holds the file's header.
        warnings: what the operator should still look at (printed on stderr).
    """

    data: dict[str, Any]
    comments: Mapping[KeyPath, tuple[str, ...]]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sizes:
    """TP and PP chosen, each with the reason shown in the inventory's comment."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    tp_reason: str
    pp_reason: str


def comment_text(text: str) -> str:
    """``text`` made safe for one YAML comment line: every control and non-printable character
    (newlines included: YAML ends a comment at a line break, YAML 1.1 sec. 5.4 counts NEL,
    LS and PS as breaks too) becomes a space."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def memory_fit_note(facts: Mapping[str, HostFacts], sizes: Sizes,
                    request: InitRequest) -> str | None:
    """Hook for the memory-fit estimate: one comment line saying whether the model's weights
    and KV cache fit the GPUs at ``sizes``, or None when no estimate is available.

    The estimate (weights from the model's files in ``HostFacts.model_files``, GPU memory from
    ``HostFacts.gpus``) belongs to the preflight checks; when it exists, call it here and
    :func:`plan_inventory` prints its line above the TP/PP sizes. Today: None.

    Args:
        facts: the facts of every host, by host address.
        sizes: the TP/PP sizes chosen.
        request: what the operator asked for (the model path).
    """
    del facts, sizes, request
    return None


def choose_sizes(gpu_counts: Mapping[str, int], request: InitRequest,
                 problems: list[Problem]) -> Sizes | None:
    """TP = GPUs per node and PP = the number of nodes, unless the operator set them.

    vLLM runs TP x PP workers, TP inside a node and PP across nodes, one GPU each
    (docs/deploy.md); every node must then hold TP GPUs. Records a problem naming the host
    and returns None when the GPU counts differ (and no TP was set), a node has no GPU or fewer
    than TP, or TP x PP is not GPUs-per-node x nodes.

    Args:
        gpu_counts: GPUs per host address, in rank order.
        request: the operator's sizes (None: choose).
        problems: where problems are recorded.
    """
    before = len(problems)
    nodes = len(gpu_counts)
    counts = sorted(set(gpu_counts.values()))
    for address, count in gpu_counts.items():
        if count == 0:
            problems.append(Problem(address, "no GPU found (nvidia-smi lists none)",
                                    expected="at least one GPU per node", actual="0",
                                    fix=f"check the NVIDIA driver on {address} "
                                        "(`nvidia-smi -L`), or leave the host out of --hosts"))
    if any(count == 0 for count in gpu_counts.values()):
        return None
    told_tp = request.tensor_parallel_size
    if told_tp is None and len(counts) > 1:
        fewest = min(gpu_counts, key=lambda a: gpu_counts[a])
        listed = ", ".join(f"{a}: {c}" for a, c in gpu_counts.items())
        problems.append(Problem(
            fewest, "the hosts have different GPU counts, so there is no one TP size of "
            "'GPUs per node'", expected="the same number of GPUs on every node",
            actual=listed,
            fix=f"pass --tensor-parallel-size {gpu_counts[fewest]} (the fewest, on {fewest}) "
                "to use that many GPUs per node, or give hosts with equal counts"))
        return None
    tp = told_tp if told_tp is not None else counts[0]
    tp_reason = ("--tensor-parallel-size" if told_tp is not None else
                 f"the {tp} GPU{'s' if tp != 1 else ''} every node has")
    for address, count in gpu_counts.items():
        if count < tp:
            problems.append(Problem(address, f"TP {tp} needs {tp} GPUs per node",
                                    expected=f">= {tp} GPUs", actual=str(count),
                                    fix=f"pass --tensor-parallel-size {count} or leave "
                                        f"{address} out of --hosts"))
    told_pp = request.pipeline_parallel_size
    pp = told_pp if told_pp is not None else nodes
    pp_reason = ("--pipeline-parallel-size" if told_pp is not None else
                 f"one pipeline stage per node ({nodes} node{'s' if nodes != 1 else ''})")
    workers = tp * pp
    if len(problems) == before and (workers % nodes or workers // nodes > min(counts)):
        message = (f"TP {tp} x PP {pp} = {workers} workers cannot be spread evenly over "
                   f"{nodes} nodes" if workers % nodes else
                   f"TP {tp} x PP {pp} = {workers} workers need {workers // nodes} GPUs on each "
                   f"of the {nodes} nodes")
        problems.append(Problem(
            "--tensor-parallel-size/--pipeline-parallel-size", message,
            expected=f"TP x PP a multiple of {nodes}, at most {min(counts)} per node",
            actual=f"{tp} x {pp}", fix="leave the sizes out to use every GPU, or change them"))
    if len(problems) > before:
        return None
    return Sizes(tp, pp, tp_reason, pp_reason)


def _node_name(facts: HostFacts, address: str, taken: set[str],
               groups: frozenset[str] = frozenset()) -> tuple[str, str]:
    """The inventory name of a node and why: its short host name when that is a valid,
    unused inventory host name that is no group's name (``groups``: ``all``, ``ungrouped``,
    ``vllm_replicas``, the replica's group and the groups the loader adds, such as
    ``vllm_followers``: a pattern or ``-l`` naming it would mean the group), else its address.
    The host name is what the host reports, so it is only a suggestion."""
    short = facts.hostname.split(".", 1)[0]
    if short in groups:
        return address, (f"its address (host name {short!r} is also a group's name; rename "
                         "it in the inventory if you like, to a name no group has)")
    if short and check_name(short, "host") is None and short not in taken:
        return short, "its host name"
    return address, (f"its address (host name {short!r} is not usable as an inventory name)"
                     if short else "its address")


def _cluster_interface(facts: HostFacts, address: str, peers: Sequence[str],
                       problems: list[Problem]) -> tuple[str, str] | None:
    """The interface carrying the routes from this host to its peers (``ip route get``),
    and this host's source address on it; None (with a problem) when the routes disagree or
    are missing."""
    devices = {}
    for peer in peers:
        route = facts.routes.get(peer)
        if route is None or route.error or not route.dev:
            problems.append(Problem(address, f"no route to the peer {peer}",
                                    expected="a route to every other node",
                                    actual=route.error if route else "not probed",
                                    fix=f"check the network between {address} and {peer}"))
            return None
        devices[peer] = route
    names = {route.dev for route in devices.values()}
    if len(names) > 1:
        problems.append(Problem(
            address, "the routes to the other nodes leave by different interfaces",
            expected="one cluster interface to every peer",
            actual=", ".join(f"{p} via {r.dev}" for p, r in devices.items()),
            fix="put the nodes on one network (or one routed interface), or give each node's "
                "vllm_cluster_interface by hand after init"))
        return None
    name = names.pop()
    bad = kinds.check("vllm_cluster_interface", name)
    if bad or name == "lo":
        problems.append(Problem(address, f"the route to the peers leaves by {name!r}",
                                expected=bad or "a network interface, not loopback",
                                actual=comment_text(name),
                                fix="give each host once in --hosts, by an address the others "
                                    "reach"))
        return None
    return name, next(iter(devices.values())).src


def _choose_venv(facts: Mapping[str, HostFacts], request: InitRequest,
                 problems: list[Problem]) -> tuple[str, str] | None:
    """The venv holding vLLM on every host and why: the one asked for, else the one the probe
    found on every host. Records a problem naming the host when a host has none or the hosts
    hold vLLM at different paths."""
    found = {address: {v.path: v.vllm for v in f.vllm_venvs} for address, f in facts.items()}
    if request.venv is not None:
        for address, venvs in found.items():
            if request.venv not in venvs:
                problems.append(Problem(address, f"no vLLM in {request.venv}",
                                        expected=f"{request.venv}/bin/python with vllm installed",
                                        actual=", ".join(venvs) or "no venv with vllm found",
                                        fix=f"install vllm into {request.venv} on {address}, "
                                            "or pass --venv with the path that holds it"))
        return (request.venv, "--venv") if not problems else None
    for address, venvs in found.items():
        if not venvs:
            problems.append(Problem(address, "no virtual environment with vLLM found",
                                    expected="a venv holding vllm (looked in /opt/*, /srv/*, "
                                             "/usr/local/*, ~/* and the PATH)",
                                    actual="none", fix=f"install vllm on {address}, or pass "
                                                       "--venv PATH"))
    if problems:
        return None
    common = set.intersection(*(set(v) for v in found.values()))
    if not common:
        listed = "; ".join(f"{a}: {', '.join(v)}" for a, v in found.items())
        odd = next(a for a, v in found.items() if set(v) != set(next(iter(found.values()))))
        problems.append(Problem(odd, "vLLM is installed at different paths on the hosts",
                                expected="the same venv path on every node (one vllm_venv per "
                                         "replica)", actual=listed,
                                fix=f"install vLLM on {odd} at the path the others use, or "
                                    "pass --venv PATH where every host has it"))
        return None
    for path in sorted(common):
        if kinds.check("vllm_venv", path) is not None:
            common.discard(path)  # a path we could not write safely is no choice
    if not common:
        problems.append(Problem(next(iter(found)), "no usable venv path with vLLM",
                                expected="an absolute path of plain characters",
                                fix="pass --venv PATH"))
        return None
    default = variables.defaults().get("vllm_venv")
    if default in common:
        return str(default), "where vLLM is installed on every node (the default path)"
    if len(common) > 1:
        problems.append(Problem(next(iter(found)), "vLLM is installed in several venvs on "
                                "every host", expected="one", actual=", ".join(sorted(common)),
                                fix="pass --venv PATH to pick one"))
        return None
    return common.pop(), "where vLLM is installed on every node"


def plan_inventory(request: InitRequest, facts: Mapping[str, HostFacts]) -> InventoryPlan:
    """Choose every value of a first inventory from the facts, with a comment for each.

    Choices: ranks in the order of ``request.addresses``; TP/PP by :func:`choose_sizes`; the
    cluster interface is the one carrying the routes between the hosts (``ip route get``, per
    host when the names differ; none for one host); ``vllm_host_ip`` only where the route's
    source address is not the SSH address; the venv by :func:`_choose_venv`; node names from
    the hosts' names.

    Args:
        request: what the operator asked for.
        facts: the probe's facts by address, for every address of ``request``.

    Returns:
        the plan :func:`render_inventory` writes.

    Raises:
        ProvisionError: the facts disagree or miss something (GPU counts, venv paths, a route,
            the model missing on a host), each problem naming the host and what to change.
    """
    problems: list[Problem] = []
    addresses = list(request.addresses)
    missing = [a for a in addresses if a not in facts]
    if missing:
        raise ProvisionError([Problem(a, "no facts for this host", fix="rerun init")
                              for a in missing])
    for address in addresses:
        if facts[address].model_files is None:
            problems.append(Problem(address, f"the model folder {request.model} is missing",
                                    expected="the same absolute path on every node",
                                    actual="no such directory",
                                    fix=f"copy the model to {request.model} on {address}, "
                                        "or pass --model with its path there"))
    sizes = choose_sizes({a: len(facts[a].gpus) for a in addresses}, request, problems)
    venv = _choose_venv(facts, request, problems)
    interfaces: dict[str, tuple[str, str]] = {}
    if len(addresses) > 1:
        for address in addresses:
            found = _cluster_interface(facts[address], address,
                                       [request.ip(a) for a in addresses if a != address],
                                       problems)
            if found is not None:
                interfaces[address] = found
    if problems:
        raise ProvisionError(problems)
    assert sizes is not None and venv is not None

    comments: dict[KeyPath, tuple[str, ...]] = {}
    warnings: list[str] = []
    taken: set[str] = set()
    groups = frozenset({"all", "ungrouped", REPLICAS_GROUP, request.replica,
                        *synthetic_groups()})
    hosts: dict[str, dict[str, Any]] = {}
    for rank, address in enumerate(addresses):
        f = facts[address]
        name, why = _node_name(f, address, taken, groups)
        taken.add(name)
        entry: dict[str, Any] = {"ansible_host": address, "vllm_node_rank": rank}
        gpus = f"{len(f.gpus)} x {f.gpu_model}" if f.gpus else "no GPU"
        role = "rank 0 (serves the API)" if rank == 0 else f"rank {rank}"
        comments[("all", "children", "vllm_replicas", "children", request.replica, "hosts",
                  name)] = (comment_text(f"{role}; named after {why}; {gpus}, "
                                         f"{f.os_release or 'OS unknown'}"),)
        if address in interfaces:
            src = interfaces[address][1]
            if src and src != address and kinds.check("vllm_host_ip", src) is None:
                entry["vllm_host_ip"] = src
                comments[("all", "children", "vllm_replicas", "children", request.replica,
                          "hosts", name, "vllm_host_ip")] = (
                    "the address the route to the other nodes leaves from (VLLM_HOST_IP)",)
            else:
                _ip_or_warn(address, name, warnings)
        hosts[name] = entry
    replica_vars: dict[str, Any] = {"vllm_backend": request.backend}
    path = ("all", "children", "vllm_replicas", "children", request.replica, "vars")
    comments[(*path, "vllm_backend")] = (
        ("the default" if request.backend == DEFAULT_BACKEND else "chosen with --backend")
        + f" (one of {', '.join(backends.names())}; choosing one: docs/deploy.md)",)
    replica_vars["vllm_model"] = request.model
    files = facts[addresses[0]].model_files or ()
    comments[(*path, "vllm_model")] = (comment_text(
        f"found on every node ({len(files)} files, {_size(sum(m.size for m in files))} on "
        f"{addresses[0]})"),)
    replica_vars["vllm_tensor_parallel_size"] = sizes.tensor_parallel_size
    replica_vars["vllm_pipeline_parallel_size"] = sizes.pipeline_parallel_size
    fit = memory_fit_note(facts, sizes, request)
    comments[(*path, "vllm_tensor_parallel_size")] = tuple(
        line for line in ("GPUs per pipeline stage, inside one node: " + sizes.tp_reason,
                          fit) if line)
    comments[(*path, "vllm_pipeline_parallel_size")] = (
        "pipeline stages across the nodes: " + sizes.pp_reason,)
    names = {route for route, _src in interfaces.values()}
    if len(names) == 1:
        replica_vars["vllm_cluster_interface"] = names.pop()
        comments[(*path, "vllm_cluster_interface")] = (
            "carries the routes between the nodes (ip route get): NCCL_SOCKET_IFNAME and "
            "GLOO_SOCKET_IFNAME",)
    elif names:
        for (address, (dev, _src)), name in zip(interfaces.items(), hosts, strict=True):
            hosts[name]["vllm_cluster_interface"] = dev
            comments[("all", "children", "vllm_replicas", "children", request.replica,
                      "hosts", name, "vllm_cluster_interface")] = (
                comment_text(f"the route from {address} to the other nodes leaves here"),)
    replica_vars["vllm_venv"] = venv[0]
    version = next((v.vllm for v in facts[addresses[0]].vllm_venvs if v.path == venv[0]), "")
    comments[(*path, "vllm_venv")] = (comment_text(
        f"{venv[1]}" + (f" (vllm {version})" if version else "")),)

    all_vars = dict(request.connection)
    data = {"all": {"vars": all_vars, "children": {"vllm_replicas": {"children": {
        request.replica: {"vars": replica_vars, "hosts": hosts}}}}}}
    if not all_vars:
        del data["all"]["vars"]
    else:
        comments[("all", "vars")] = ("how provision reaches every host (the options init was "
                                     "given); ~/.ssh/config applies too",)
    comments[("all", "children", "vllm_replicas", "children", request.replica)] = (
        "the replica: one vLLM server spread over these nodes (a child group of "
        "vllm_replicas)",)
    comments[()] = (
        comment_text("Written by `provision init --hosts " + ",".join(addresses) + "` from the "
                     "facts of the hosts."),
        "Next: provision check -i THIS_FILE, then provision up -i THIS_FILE.",
        "Every variable: docs/inventory.md.")
    return InventoryPlan(data, comments, tuple(warnings))


def _size(size: int) -> str:
    """A byte count for a comment: GiB from 1 GiB up, else MiB."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _ip_or_warn(address: str, name: str, warnings: list[str]) -> None:
    """Warn when a node's SSH address is a name (vLLM needs an IP: ``vllm_host_ip``)."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        warnings.append(f"{name}: {address} is a name; add vllm_host_ip: <its cluster IP>")


def _key_lines(node: yaml.Node, path: KeyPath, out: dict[KeyPath, tuple[int, int]]) -> None:
    """Record the (line, column) of every mapping key below ``node`` by its key path."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, str(key.value))
            out[child] = (key.start_mark.line, key.start_mark.column)
            _key_lines(value, child, out)


def render_inventory(plan: InventoryPlan) -> str:
    """The inventory as YAML text: the data dumped by PyYAML's safe emitter (block style, keys
    in the plan's order), each comment on its own line(s) above the key it explains, the header
    first. A comment whose key is not in the data is dropped.

    The result loads back to exactly ``plan.data`` (comments carry no YAML).
    """
    text = yaml.safe_dump(plan.data, sort_keys=False, default_flow_style=False,
                          allow_unicode=False, width=100)
    positions: dict[KeyPath, tuple[int, int]] = {}
    _key_lines(yaml.compose(text, Loader=yaml.SafeLoader), (), positions)
    above: dict[int, list[str]] = {}
    for path, comments in plan.comments.items():
        if path in positions:
            row, column = positions[path]
            above.setdefault(row, []).extend(" " * column + "# " + comment_text(c)
                                             for c in comments)
    out = ["# " + comment_text(c) for c in plan.comments.get((), ())]
    for number, emitted in enumerate(text.splitlines()):
        out.extend(above.get(number, []))
        out.append(emitted)
    return "\n".join(out) + "\n"
