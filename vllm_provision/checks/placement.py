"""Ray placement-group feasibility: can a set of bundles EVER be placed on these nodes?

A placement group reserves all its bundles atomically or stays PENDING forever, silently on a
manual cluster (Ray docs, ``ray-core/scheduling/placement-group.rst``). This module decides,
from per-node resources, whether a bundle shape can be placed at all, and explains why not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_provision import settings
from vllm_provision.checks.context import ReplicaScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica

Bundle = Mapping[str, float]
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
RAY_PG_DOC = "Ray docs: ray-core/scheduling/placement-group.rst"
# Ray's node resource is "node:<ip>" with capacity 1.0; vLLM asks for 0.001 of it on bundle 0.
NODE_RESOURCE_PREFIX = "node:"
_EPSILON = 1e-9


@dataclass(frozen=True)
class PlacementDecision:
    """Whether a placement group can be placed, and why.

    Attributes:
        feasible: True when some assignment of bundles to nodes satisfies the strategy.
        reason: one sentence for a person (why not, or where it goes).
        assignment: node name per bundle index when feasible, else ``()``.
    """

    feasible: bool
    reason: str
    assignment: tuple[str, ...] = ()


def vllm_bundles(world_size: int, head_ip: str) -> list[dict[str, float]]:
    """The bundles vLLM's Ray executor requests: one ``{"GPU": 1}`` per worker, bundle 0 pinned.

    Source: ``initialize_ray_cluster`` in ``vllm/v1/executor/ray_utils.py``:
    ``[{"GPU": 1.0} for _ in range(world_size)]``, then
    ``placement_group_specs[0][f"node:{get_ip()}"] = 0.001``, strategy ``"PACK"``.

    Args:
        world_size: TP x PP.
        head_ip: the driver node's ``VLLM_HOST_IP``.
    """
    bundles: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(world_size)]
    if bundles:
        bundles[0][f"{NODE_RESOURCE_PREFIX}{head_ip}"] = 0.001
    return bundles


def node_resources(gpus: int, ip: str, cpus: int | None = None) -> dict[str, float]:
    """Ray's resources of one node: GPU count, ``node:<ip>`` = 1.0 and CPU when known."""
    resources: dict[str, float] = {"GPU": float(gpus), f"{NODE_RESOURCE_PREFIX}{ip}": 1.0}
    if cpus is not None:
        resources["CPU"] = float(cpus)
    return resources


def _fits(bundle: Bundle, free: Mapping[str, float]) -> bool:
    return all(amount <= free.get(name, 0.0) + _EPSILON
               for name, amount in bundle.items() if amount > 0)


def _take(bundle: Bundle, free: dict[str, float]) -> None:
    for name, amount in bundle.items():
        free[name] = free.get(name, 0.0) - amount


def _give(bundle: Bundle, free: dict[str, float]) -> None:
    for name, amount in bundle.items():
        free[name] = free.get(name, 0.0) + amount


def _describe(bundle: Bundle) -> str:
    parts = [f'"{k}": {v:g}' for k, v in bundle.items()]
    return "{" + ", ".join(parts) + "}"


def _never_fits_reason(bundle: Bundle, index: int, nodes: Mapping[str, Bundle]) -> str:
    pinned = [name for name in bundle if name.startswith(NODE_RESOURCE_PREFIX)]
    for name in pinned:
        if not any(name in resources for resources in nodes.values()):
            ip = name[len(NODE_RESOURCE_PREFIX):]
            known = ", ".join(sorted(k[len(NODE_RESOURCE_PREFIX):] for r in nodes.values()
                                     for k in r if k.startswith(NODE_RESOURCE_PREFIX)))
            return (f"bundle {index} is pinned to node IP {ip}, which no Ray node has "
                    f"(nodes: {known or 'none'}); VLLM_HOST_IP must equal the IP Ray registered "
                    "(ray start --node-ip-address)")
    shortages = []
    for name, amount in bundle.items():
        if name.startswith(NODE_RESOURCE_PREFIX):
            continue
        largest = max((resources.get(name, 0.0) for resources in nodes.values()), default=0.0)
        if amount > largest + _EPSILON:
            sizes = sorted({resources.get(name, 0.0) for resources in nodes.values()})
            size_text = "/".join(f"{s:g}" for s in sizes) or "0"
            unit = f"{name}s" if name in ("GPU", "CPU") else name
            shortages.append(
                f"no node has {amount:g} {unit}; a bundle cannot span nodes; adding more "
                f"{size_text}-{name} nodes will not help")
    if shortages:
        return f"bundle {index} {_describe(bundle)}: " + "; ".join(shortages)
    return f"bundle {index} {_describe(bundle)} fits no single node"


def _search(bundles: Sequence[Bundle], order: Sequence[int], names: Sequence[str],
            free: dict[str, dict[str, float]], assignment: list[str | None], position: int,
            distinct: bool) -> bool:
    if position == len(order):
        return True
    index = order[position]
    tried: set[tuple] = set()
    for name in names:
        if distinct and name in assignment:
            continue
        state = tuple(sorted(free[name].items()))
        if state in tried and not any(k.startswith(NODE_RESOURCE_PREFIX) for k in bundles[index]):
            continue  # an identical node was already tried for this bundle: same outcome
        tried.add(state)
        if _fits(bundles[index], free[name]):
            _take(bundles[index], free[name])
            assignment[index] = name
            if _search(bundles, order, names, free, assignment, position + 1, distinct):
                return True
            assignment[index] = None
            _give(bundles[index], free[name])
    return False


def decide_placement(bundles: Sequence[Bundle], strategy: str,
                     nodes: Mapping[str, Bundle]) -> PlacementDecision:
    """Decide whether ``bundles`` can ever be placed on ``nodes`` (all resources free).

    Rules (Ray docs, placement-group.rst): a bundle must fit on a single node; STRICT_PACK puts
    every bundle on one node; STRICT_SPREAD puts each bundle on a distinct node; PACK and SPREAD
    are soft (any node that fits). The group is atomic: one bundle that fits nowhere blocks all.

    Args:
        bundles: resource maps (``{"GPU": 1.0, "node:10.0.0.11": 0.001}``).
        strategy: one of :data:`STRATEGIES`.
        nodes: node name -> total resources (see :func:`node_resources`).

    Returns:
        The decision with a reason a person can act on.

    Raises:
        ValueError: unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement strategy {strategy!r}; expected one of {STRATEGIES}")
    if not bundles:
        return PlacementDecision(True, "no bundles requested")
    for index, bundle in enumerate(bundles):
        if not any(_fits(bundle, resources) for resources in nodes.values()):
            return PlacementDecision(False, _never_fits_reason(bundle, index, nodes))
    names = list(nodes)
    if strategy == "STRICT_PACK":
        total: dict[str, float] = {}
        for bundle in bundles:
            _give(bundle, total)
        for name in names:
            if _fits(total, nodes[name]):
                return PlacementDecision(True, f"all bundles on {name}",
                                         tuple(name for _ in bundles))
        return PlacementDecision(
            False, f"STRICT_PACK needs one node with {_describe(total)}; no node has that "
                   "(a STRICT_PACK group never spans nodes; use PACK or SPREAD)")
    if strategy == "STRICT_SPREAD" and len(bundles) > len(names):
        return PlacementDecision(
            False, f"STRICT_SPREAD needs {len(bundles)} distinct nodes, the cluster has "
                   f"{len(names)}")
    free = {name: dict(nodes[name]) for name in names}
    # Largest bundles first: a small search space on the shapes that decide feasibility.
    order = sorted(range(len(bundles)), key=lambda i: -sum(
        v for k, v in bundles[i].items() if not k.startswith(NODE_RESOURCE_PREFIX)))
    order.sort(key=lambda i: not any(k.startswith(NODE_RESOURCE_PREFIX) for k in bundles[i]))
    assignment: list[str | None] = [None] * len(bundles)
    if _search(bundles, order, names, free, assignment, 0, strategy == "STRICT_SPREAD"):
        placed = tuple(name or "" for name in assignment)
        counts = {name: placed.count(name) for name in names if name in placed}
        text = ", ".join(f"{count} on {name}" for name, count in counts.items())
        return PlacementDecision(True, f"{strategy}: {text}", placed)
    demand: dict[str, float] = {}
    for bundle in bundles:
        _give(bundle, demand)
    return PlacementDecision(
        False, f"{strategy}: the bundles need {_describe(demand)} in total, and no assignment of "
               "whole bundles to nodes fits the nodes' resources")


def _as_bundles(value: Any) -> list[dict[str, float]]:
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise ValueError("ray_placement_bundles must be a list of mappings such as {GPU: 4}")
    return [{str(k): float(v) for k, v in item.items()} for item in value]


def check_placement(replica: Replica, nodes: Mapping[str, Bundle],
                    custom_bundles: Any = None, custom_strategy: str | None = None,
                    ) -> list[Finding]:
    """Check that vLLM's own placement group (and a custom shape, if given) can be placed.

    Only for the Ray backend. Sources: vLLM ``vllm/v1/executor/ray_utils.py``
    (``initialize_ray_cluster``: world-size x ``{"GPU": 1}``, PACK, bundle 0 pinned to
    ``node:<VLLM_HOST_IP>``); Ray placement-group docs (strategies, a bundle fits one node).

    Args:
        replica: a Ray replica.
        nodes: host name -> Ray resources (:func:`node_resources` from facts).
        custom_bundles: ``ray_placement_bundles`` from the inventory, or None.
        custom_strategy: ``ray_placement_strategy`` (default PACK).
    """
    if not replica.backend_type.ray_cluster:
        return []
    findings = []
    shapes: list[tuple[str, list[dict[str, float]], str]] = [(
        "vLLM placement group", vllm_bundles(replica.engine.world_size, replica.master_addr),
        "PACK")]
    if custom_bundles is not None:
        strategy = (custom_strategy or "PACK").upper()
        try:
            shapes.append(("custom placement group", _as_bundles(custom_bundles), strategy))
        except ValueError as exc:
            findings.append(Finding("placement", Severity.ERROR, "*", "custom placement group",
                                    expected="a list of bundles such as [{GPU: 4}, {GPU: 4}]",
                                    actual=str(exc), fix="fix ray_placement_bundles",
                                    source=RAY_PG_DOC))
    capacity = ", ".join(f"{name}: {res.get('GPU', 0):g} GPU" for name, res in nodes.items())
    for item, bundles, strategy in shapes:
        try:
            decision = decide_placement(bundles, strategy, nodes)
        except ValueError as exc:
            findings.append(Finding("placement", Severity.ERROR, "*", item,
                                    expected=f"strategy one of {', '.join(STRATEGIES)}",
                                    actual=str(exc), fix="fix ray_placement_strategy",
                                    source=RAY_PG_DOC))
            continue
        shape = f"{len(bundles)} bundles {strategy} ({_describe(bundles[0])}" + (
            ", ...)" if len(bundles) > 1 else ")")
        if decision.feasible:
            findings.append(Finding("placement", Severity.OK, "*", item,
                                    expected=shape, actual=decision.reason, source=RAY_PG_DOC))
        else:
            findings.append(Finding(
                "placement", Severity.ERROR, "*", item,
                expected=f"{shape} placeable on {capacity}",
                actual=f"can never be placed: {decision.reason}",
                fix="change the bundle shape (each bundle within one node's GPUs) or the "
                    "strategy; vLLM would wait 1800 s for it and fail",
                source=RAY_PG_DOC + "; vllm/v1/executor/ray_utils.py"))
    return findings


RAY_RESOURCES_DOC = "Ray docs: ray-core/scheduling/resources.rst (physical vs logical resources)"


def _gpu_amounts(value: Any) -> list[float]:
    try:
        return [b.get("GPU", 0.0) for b in _as_bundles(value)]
    except ValueError:
        return []


def check_logical_gpus(replica: Replica, physical: Mapping[str, int],
                       declared: Mapping[str, int | None], custom_bundles: Any = None,
                       ) -> list[Finding]:
    """Warn where Ray's logical GPUs stop being one whole physical GPU per worker.

    Ray's resources are logical: a ``{"GPU": 0.5}`` request sets ``CUDA_VISIBLE_DEVICES`` and
    lets Ray put two such workers on one GPU, but nothing isolates or reserves that GPU's
    memory; "it is the user's responsibility to make sure that the individual tasks don't use
    more than their share of the GPU memory" (Ray docs, resources.rst and "Fractional
    resource requirements"). Each vLLM worker then still sizes its KV cache from the whole
    GPU's free memory, so the memory estimate (per GPU) no longer holds. Warnings for:
    ``VLLM_RAY_PER_WORKER_GPUS`` below 1 (vllm/envs.py: "if it is set to be a fraction, it
    allows ray to schedule multiple actors on a single GPU"), a custom placement bundle with a
    fractional GPU amount, and ``ray_num_gpus`` above the GPUs nvidia-smi lists on a node.

    Args:
        replica: a Ray replica.
        physical: host name -> GPUs nvidia-smi lists.
        declared: host name -> ``ray_num_gpus`` (None: the physical count).
        custom_bundles: ``preflight_placement_bundles``, or None.
    """
    if not replica.backend_type.ray_cluster:
        return []
    findings: list[Finding] = []
    why = ("Ray's GPUs are logical: they set CUDA_VISIBLE_DEVICES but do not isolate or "
           "reserve memory, so workers sharing a GPU share its memory and each sizes its KV "
           "cache as if the GPU were its own")
    env = {**dict(settings.replica_settings(replica)["vllm_env"]),
           **dict(settings.master_settings(replica)["vllm_node_env"])}
    text = env.get("VLLM_RAY_PER_WORKER_GPUS")
    if text is not None:
        try:
            share = float(text)
        except ValueError:
            share = 1.0
            findings.append(Finding(
                "placement.logical_gpus", Severity.WARNING, replica.master.name,
                "VLLM_RAY_PER_WORKER_GPUS", expected="a number such as 1.0",
                actual=repr(text), fix="remove VLLM_RAY_PER_WORKER_GPUS from vllm_env",
                source="vllm/envs.py"))
        if 0 < share < 1:
            findings.append(Finding(
                "placement.logical_gpus", Severity.WARNING, replica.master.name,
                "GPUs per Ray worker (VLLM_RAY_PER_WORKER_GPUS)",
                expected="1 (one whole GPU per worker)",
                actual=f"{share:g}: Ray may place {int(1 // share)} workers on one GPU; {why}",
                fix="remove VLLM_RAY_PER_WORKER_GPUS (or set it to 1) unless every process "
                    "on a shared GPU is given its part with vllm_gpu_memory_utilization",
                source=f"vllm/envs.py; {RAY_RESOURCES_DOC}"))
    fractional = [g for g in _gpu_amounts(custom_bundles) if g and g != int(g)]
    if fractional:
        findings.append(Finding(
            "placement.logical_gpus", Severity.WARNING, "*", "custom placement bundles",
            expected="whole GPUs per bundle",
            actual=f"GPU amounts {', '.join(f'{g:g}' for g in fractional)}; {why}",
            fix="ask for whole GPUs in preflight_placement_bundles",
            source=RAY_RESOURCES_DOC))
    for node in replica.nodes:
        have, says = physical.get(node.name), declared.get(node.name)
        if have is None or says is None or says <= have:
            continue
        findings.append(Finding(
            "placement.logical_gpus", Severity.WARNING, node.name, "ray_num_gpus",
            expected=f"at most the {have} GPUs nvidia-smi lists",
            actual=f"{says} logical GPUs declared to Ray; Ray can place {says} workers on "
                   f"{have} GPUs; {why}",
            fix=f"set ray_num_gpus on {node.name} to {have} or less (or remove it)",
            source=RAY_RESOURCES_DOC))
    return findings


# -- registered checks (checks/context.py): what run.py runs, in this order ------------------

@check("placement.backend", order=20, scope="replica")
def _backend(scope: ReplicaScope) -> list[Finding]:
    """The replica's backend's own checks (``Backend.check_replica``; Ray's are the placement
    rules above)."""
    return scope.replica.backend_type.check_replica(scope.replica, scope.facts, scope.settings)
