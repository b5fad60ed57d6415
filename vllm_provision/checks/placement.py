"""Ray placement-group feasibility: can a set of bundles EVER be placed on these nodes?

A placement group reserves all its bundles atomically or stays PENDING forever, silently on a
manual cluster (Ray docs, ``ray-core/scheduling/placement-group.rst``). This module decides,
from per-node resources, whether a bundle shape can be placed at all, and explains why not.
"""

from __future__ import annotations

import math
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
VLLM_GROUP = "vLLM placement group"
# Ray's node resource is "node:<ip>" with capacity 1.0; vLLM asks for 0.001 of it on bundle 0.
NODE_RESOURCE_PREFIX = "node:"
_EPSILON = 1e-9


@dataclass(frozen=True)
class PlacementDecision:
    """Whether a placement group can be placed, and why.

    Attributes:
        feasible: True when some assignment of bundles to nodes satisfies the strategy, and
            also when the search was not decided (``decided`` False: nothing proves it cannot).
        reason: one sentence for a person (why not, or where it goes).
        assignment: node name per bundle index when feasible and decided, else ``()``.
        shortfall: ``(resource, have, need)`` for each resource the bundles ask for more of
            than all nodes together have (the totals answer); ``()`` otherwise.
        decided: False when the search met :data:`SEARCH_STEPS` without an answer.
    """

    feasible: bool
    reason: str
    assignment: tuple[str, ...] = ()
    shortfall: tuple[tuple[str, float, float], ...] = ()
    decided: bool = True


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


def _positive(bundle: Bundle) -> tuple[tuple[str, float], ...]:
    """A bundle's demands above zero, sorted: the key that makes two bundles interchangeable."""
    return tuple(sorted((str(k), float(v)) for k, v in bundle.items() if v > 0))


def _pinned(shape: tuple[tuple[str, float], ...]) -> bool:
    return any(name.startswith(NODE_RESOURCE_PREFIX) for name, _ in shape)


def _unit(name: str) -> str:
    return f"{name}s" if name in ("GPU", "CPU") else name


def cluster_text(nodes: Mapping[str, Bundle], resource: str) -> str:
    """``"23 GPUs on 3 nodes (8, 8, 7)"``: a resource's total and its amount per node, in the
    nodes' order (``15 x 8, 7`` style runs past 6 nodes).

    Args:
        nodes: node name -> Ray resources.
        resource: a resource name (``GPU``, ``CPU``, a custom one).
    """
    amounts = [float(r.get(resource, 0.0)) for r in nodes.values()]
    if len(amounts) <= 6:
        each = ", ".join(f"{a:g}" for a in amounts)
    else:
        runs: list[list[float]] = []
        for amount in sorted(amounts, reverse=True):
            if runs and runs[-1][0] == amount:
                runs[-1][1] += 1
            else:
                runs.append([amount, 1])
        each = ", ".join(f"{int(n)} x {a:g}" if n > 1 else f"{a:g}" for a, n in runs)
    plural = "node" if len(amounts) == 1 else "nodes"
    return f"{sum(amounts):g} {_unit(resource)} on {len(amounts)} {plural} ({each})"


def _shortfalls(bundles: Sequence[Bundle], nodes: Mapping[str, Bundle],
                ) -> tuple[tuple[str, float, float], ...]:
    """Each resource the bundles ask for more of, in total, than all nodes have:
    ``(name, have, need)``. A necessary condition whatever the strategy (the group is atomic)."""
    need: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in _positive(bundle):
            need[name] = need.get(name, 0.0) + amount
    slack = _EPSILON * (len(bundles) + len(nodes) + 1)
    found = []
    for name, amount in need.items():
        have = sum(float(r.get(name, 0.0)) for r in nodes.values())
        if amount > have + slack:
            found.append((name, have, amount))
    return tuple(found)


class _OutOfSteps(Exception):
    """The counted search met its step limit (:data:`SEARCH_STEPS`) without an answer."""


# The counted search's limit, in steps (a node tried with some bundles left, or one shape's
# count chosen on a node): the hardest case of bench/placement.py takes under 3,000; 50,000
# took 0.2 s (17 distinct custom shapes packed tightly on 16 nodes, 2 cores at load 4).
SEARCH_STEPS = 50_000


def _pack_counts(shapes: Sequence[tuple[float, ...]], counts: Sequence[int],
                 caps: Sequence[tuple[float, ...]], one_each: bool,
                 ) -> list[tuple[int, ...]] | None:
    """How many bundles of each shape go on each node, or None when no split fits.

    Bundles of one shape are interchangeable, so the state is (node position, bundles left per
    shape) and a state that failed once is never searched again, nor the same bundles from a
    later node (fewer nodes cannot do better): the number of states is at
    most ``len(caps) x prod(count + 1)``, polynomial in the bundles for a fixed number of
    distinct shapes (bin packing is NP-hard only in the number of distinct sizes). Identical
    nodes lie next to each other. Of all placements, the one whose splits (node by node,
    each compared shape by shape) are largest has two properties the search asks of every
    split, so they lose no answer: each split is maximal (a bundle left over that still fit
    on the node would make it larger), and no node's split is above that of an identical node
    before it (swapping the two would).

    Args:
        shapes: per distinct shape, its amount of each resource (same order as ``caps``).
        counts: bundles per shape.
        caps: per node, its amount of each resource.
        one_each: STRICT_SPREAD: at most one bundle per node.

    Raises:
        _OutOfSteps: the search took more than :data:`SEARCH_STEPS` steps.
    """
    n, k, width = len(caps), len(shapes), len(caps[0]) if caps else 0
    suffix = [[0.0] * width for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        suffix[i] = [suffix[i + 1][r] + caps[i][r] for r in range(width)]
    fits_alone = [[all(shape[r] <= caps[i][r] + _EPSILON for r in range(width))
                   for i in range(n)] for shape in shapes]
    last_fit = [max((i for i in range(n) if fits_alone[s][i]), default=-1) for s in range(k)]
    slack = _EPSILON * (sum(counts) + n + 1)
    same_as_before = [i > 0 and caps[i] == caps[i - 1] for i in range(n)]
    # per node position and resource: the capacity every node from there on has, or None
    uniform: list[list[float | None]] = [[None] * width for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for r in range(width):
            later = uniform[i + 1][r] if i + 1 < n else caps[i][r]
            uniform[i][r] = caps[i][r] if later == caps[i][r] else None
    failed_from: dict[tuple[int, ...], int] = {}  # bundles left -> first node they failed from
    failed: set[tuple[int, tuple[int, ...], tuple[int, ...] | None]] = set()
    steps = [0]
    chosen: list[tuple[int, ...]] = []

    def splits(i: int, left: tuple[int, ...], bound: tuple[int, ...] | None):
        """Bundles per shape that fit node ``i`` together, fullest first; only maximal ones
        (no bundle left over still fits beside them), and none above ``bound`` (in the order
        of the shapes) when the node before is identical."""
        free = list(caps[i])
        taken = [0] * k

        def walk(s: int, room: int, tight: bool):
            steps[0] += 1
            if steps[0] > SEARCH_STEPS:
                raise _OutOfSteps
            if s == k:
                if room and any(taken[t] < left[t] and all(
                        shapes[t][r] <= free[r] + _EPSILON for r in range(width))
                        for t in range(k)):
                    return
                yield tuple(taken)
                return
            most = left[s] if fits_alone[s][i] else 0
            most = min(most, room)
            if tight and bound is not None:
                most = min(most, bound[s])
            shape = shapes[s]
            for r in range(width):
                if shape[r] > 0:
                    most = min(most, max(0, int((free[r] + _EPSILON) // shape[r])))
            for count in range(most, -1, -1):
                for r in range(width):
                    free[r] -= shape[r] * count
                taken[s] = count
                yield from walk(s + 1, room - count,
                                tight and bound is not None and count == bound[s])
                for r in range(width):
                    free[r] += shape[r] * count
            taken[s] = 0

        yield from walk(0, 1 if one_each else sum(left), True)

    def hopeless(i: int, left: tuple[int, ...]) -> bool:
        """What no search from node ``i`` can place: bounds that need no search."""
        if failed_from.get(left, n) <= i:
            return True
        if any(left[s] and last_fit[s] < i for s in range(k)):
            return True
        if one_each and sum(left) > n - i:
            return True
        if any(sum(left[s] * shapes[s][r] for s in range(k)) > suffix[i][r] + slack
               for r in range(width)):
            return True
        return any(uniform[i][r] is not None and _nodes_needed(
            [(shapes[s][r], left[s]) for s in range(k) if left[s]], uniform[i][r]) > n - i
            for r in range(width))

    def place(i: int, left: tuple[int, ...], bound: tuple[int, ...] | None) -> bool:
        steps[0] += 1
        if not any(left):
            chosen.extend([(0,) * k] * (n - i))
            return True
        if i == n or (i, left, bound) in failed:
            return False
        if hopeless(i, left):
            failed_from[left] = min(i, failed_from.get(left, n))
            return False
        for split in splits(i, left, bound):
            chosen.append(split)
            after = tuple(a - b for a, b in zip(left, split, strict=True))
            if place(i + 1, after, split if i + 1 < n and same_as_before[i + 1] else None):
                return True
            chosen.pop()
        if bound is None:  # no bound: a failure for every later node too
            failed_from[left] = min(i, failed_from.get(left, n))
        failed.add((i, left, bound))
        return False

    return chosen if place(0, tuple(counts), None) else None


def _nodes_needed(amounts: Sequence[tuple[float, int]], capacity: float) -> int:
    """A lower bound on the nodes of ``capacity`` that hold these bundles, one resource seen
    alone: Martello and Toth's L2 bound for bin packing (Knapsack Problems, 1990, section
    8.3.1), over (amount, count) pairs. For each threshold ``k`` up to half the capacity:
    each bundle above half needs its own node, those above ``capacity - k`` share with no
    bundle of ``k`` or more, and the bundles from ``k`` to half fill what the others leave.
    A placement of whole bundles holds each resource's projection, so the bound holds for it.
    """
    half = capacity / 2
    best = 0
    for k in {0.0, *(a for a, _ in amounts if a <= half + _EPSILON)}:
        alone = sum(c for a, c in amounts if a > capacity - k + _EPSILON)
        big = [(a, c) for a, c in amounts if half + _EPSILON < a <= capacity - k + _EPSILON]
        room = sum(c * (capacity - a) for a, c in big)
        small = sum(a * c for a, c in amounts if k - _EPSILON <= a <= half + _EPSILON)
        over = small - room
        extra = math.ceil(over / capacity - 1e-9) if over > 0 and capacity > 0 else 0
        best = max(best, alone + sum(c for _, c in big) + extra)
    return best


def _search_counts(bundles: Sequence[Bundle], names: Sequence[str],
                   nodes: Mapping[str, Bundle], one_each: bool) -> tuple[str, ...] | None:
    """Group bundles by shape and nodes by capacity, run :func:`_pack_counts`, and hand out
    bundle indices: the node name per bundle, or None when nothing fits.

    Raises:
        _OutOfSteps: from :func:`_pack_counts`.
    """
    members: dict[tuple[tuple[str, float], ...], list[int]] = {}
    for index, bundle in enumerate(bundles):
        members.setdefault(_positive(bundle), []).append(index)
    # pinned shapes first, then the largest: the shapes that decide feasibility come first
    keys = sorted(members, key=lambda key: (not _pinned(key), -sum(
        v for name, v in key if not name.startswith(NODE_RESOURCE_PREFIX))))
    resources = sorted({name for key in keys for name, _ in key})
    shapes = [tuple(dict(key).get(r, 0.0) for r in resources) for key in keys]
    cap_of = {name: tuple(float(nodes[name].get(r, 0.0)) for r in resources) for name in names}
    pins = [r for r in resources if r.startswith(NODE_RESOURCE_PREFIX)]
    # nodes holding a pinned resource first, then the largest; identical nodes side by side
    order = sorted(names, key=lambda name: (
        not any(cap_of[name][resources.index(p)] > 0 for p in pins),
        tuple(-c for c in cap_of[name])))
    split = _pack_counts(shapes, [len(members[key]) for key in keys],
                         [cap_of[name] for name in order], one_each)
    if split is None:
        return None
    placed: list[str] = [""] * len(bundles)
    queues = [list(members[key]) for key in keys]
    for name, counts in zip(order, split, strict=True):
        for s, count in enumerate(counts):
            for _ in range(count):
                placed[queues[s].pop(0)] = name
    return tuple(placed)


def decide_placement(bundles: Sequence[Bundle], strategy: str,
                     nodes: Mapping[str, Bundle]) -> PlacementDecision:
    """Decide whether ``bundles`` can ever be placed on ``nodes`` (all resources free).

    Rules (Ray docs, placement-group.rst): a bundle must fit on a single node; STRICT_PACK puts
    every bundle on one node; STRICT_SPREAD puts each bundle on a distinct node; PACK and SPREAD
    are soft (any node that fits). The group is atomic: one bundle that fits nowhere blocks all.

    In this order, each answer as soon as it is known: a bundle that fits no node alone; the
    totals (per resource, all bundles against all nodes: one sum, whatever the strategy); the
    strategy's own rule; then a search over counts (bundles grouped by shape, nodes by
    capacity; :func:`_pack_counts`), which answers vLLM's bundles (two shapes) on 16 nodes in
    milliseconds (bench/placement.py).

    Args:
        bundles: resource maps (``{"GPU": 1.0, "node:10.0.0.11": 0.001}``).
        strategy: one of :data:`STRATEGIES`.
        nodes: node name -> total resources (see :func:`node_resources`).

    Returns:
        The decision with a reason a person can act on; a shortfall of the totals is in
        ``shortfall`` too, for the caller to phrase (TP x PP for vLLM's group).

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
    short = _shortfalls(bundles, nodes)
    if short:
        parts = []
        for name, have, need in short:
            if name.startswith(NODE_RESOURCE_PREFIX):
                parts.append(f"{len(bundles)} bundles ask for {need:g} of {name}, which has "
                             f"{have:g}")
            else:
                parts.append(f"the cluster has {cluster_text(nodes, name)}; the "
                             f"{len(bundles)} bundles need {need:g}")
        return PlacementDecision(False, "; ".join(parts), shortfall=short)
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
    try:
        placed = _search_counts(bundles, names, nodes, strategy == "STRICT_SPREAD")
    except _OutOfSteps:
        return PlacementDecision(
            True, f"{strategy}: not decided: {SEARCH_STEPS} steps of the search over "
                  f"{len(bundles)} bundles ({len(set(map(_positive, bundles)))} shapes) and "
                  f"{len(names)} nodes gave no answer; Ray decides at start",
            decided=False)
    if placed is not None:
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
        raise ValueError("preflight_placement_bundles must be a list of mappings such as {GPU: 4}")
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
        custom_bundles: ``preflight_placement_bundles`` from the inventory, or None.
        custom_strategy: ``preflight_placement_strategy`` (default PACK).
    """
    if not replica.backend_type.ray_cluster:
        return []
    findings = []
    shapes: list[tuple[str, list[dict[str, float]], str]] = [(
        VLLM_GROUP, vllm_bundles(replica.engine.world_size, replica.master_addr),
        "PACK")]
    if custom_bundles is not None:
        strategy = (custom_strategy or "PACK").upper()
        try:
            shapes.append(("custom placement group", _as_bundles(custom_bundles), strategy))
        except ValueError as exc:
            findings.append(Finding("placement", Severity.ERROR, "*", "custom placement group",
                                    expected="a list of bundles such as [{GPU: 4}, {GPU: 4}]",
                                    actual=str(exc), fix="fix preflight_placement_bundles",
                                    source=RAY_PG_DOC))
    capacity = ", ".join(f"{name}: {res.get('GPU', 0):g} GPU" for name, res in nodes.items())
    for item, bundles, strategy in shapes:
        try:
            decision = decide_placement(bundles, strategy, nodes)
        except ValueError as exc:
            findings.append(Finding("placement", Severity.ERROR, "*", item,
                                    expected=f"strategy one of {', '.join(STRATEGIES)}",
                                    actual=str(exc), fix="fix preflight_placement_strategy",
                                    source=RAY_PG_DOC))
            continue
        shape = f"{len(bundles)} bundles {strategy} ({_describe(bundles[0])}" + (
            ", ...)" if len(bundles) > 1 else ")")
        if not decision.decided:
            findings.append(Finding(
                "placement", Severity.WARNING, "*", item, expected=f"{shape} placeable",
                actual=decision.reason,
                fix="use fewer distinct bundle shapes in preflight_placement_bundles, or skip "
                    "the check with preflight_skip_checks",
                source=RAY_PG_DOC))
        elif decision.feasible:
            findings.append(Finding("placement", Severity.OK, "*", item,
                                    expected=shape, actual=decision.reason, source=RAY_PG_DOC))
        elif item == VLLM_GROUP and any(name == "GPU" for name, _, _ in decision.shortfall):
            findings.append(_vllm_shortfall(replica, nodes, decision, shape))
        else:
            fix = ("ask for fewer or smaller bundles in preflight_placement_bundles, or add "
                   "nodes: the whole cluster has less than the bundles need"
                   if decision.shortfall else
                   "change the bundle shape (each bundle within one node's GPUs) or the "
                   "strategy; vLLM would wait 1800 s for it and fail")
            findings.append(Finding(
                "placement", Severity.ERROR, "*", item,
                expected=f"{shape} placeable on {capacity}",
                actual=f"can never be placed: {decision.reason}", fix=fix,
                source=RAY_PG_DOC + "; vllm/v1/executor/ray_utils.py"))
    return findings


def _vllm_shortfall(replica: Replica, nodes: Mapping[str, Bundle], decision: PlacementDecision,
                    shape: str) -> Finding:
    """The finding for vLLM's own group when the cluster has fewer GPUs than TP x PP: the
    sum, per node, and what to change (a node that lost a GPU, or a TP/PP typo)."""
    engine = replica.engine
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    have, need = next((h, n) for name, h, n in decision.shortfall if name == "GPU")
    missing = need - have
    gone = ("bring the missing GPU back" if missing == 1 else
            f"bring the {missing:g} missing GPUs back (or add nodes)")
    return Finding(
        "placement", Severity.ERROR, "*", VLLM_GROUP,
        expected=f"{shape}: TP x PP = {need:g} GPUs",
        actual=f"can never be placed: the cluster has {cluster_text(nodes, 'GPU')}; "
               f"TP={tp} x PP={pp} needs {need:g}",
        fix=f"{gone} or lower TP/PP (TP x PP at most {have:g}); check nvidia-smi and "
            "ray_num_gpus on each node; vLLM would wait 1800 s for the placement group and fail",
        source=RAY_PG_DOC + "; vllm/v1/executor/ray_utils.py")


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


# -- checks that read their scope (checks/context.py) -----------------------------------

@check("placement.backend", order=20, scope="replica")
def _backend(scope: ReplicaScope) -> list[Finding]:
    """The replica's backend's own checks (``Backend.check_replica``; Ray's are the placement
    rules above)."""
    return scope.replica.backend_type.check_replica(scope.replica, scope.facts, scope.settings)
