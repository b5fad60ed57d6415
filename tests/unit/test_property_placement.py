"""Property test (hypothesis): the counted placement search (checks/placement.py) says what a
brute force over every assignment of bundles to nodes says, on small clusters, and the
assignment it returns is one the strategy allows and the nodes' resources hold."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_provision.checks import placement

PROFILE = settings(max_examples=600, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow])
IPS = ("10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14")


def holds(bundles: Sequence[Mapping[str, float]], nodes: Mapping[str, Mapping[str, float]],
          assignment: Sequence[str], strategy: str) -> bool:
    """Every node holds the sum of its bundles, and the strategy's rule is kept (Ray docs,
    placement-group.rst: STRICT_PACK one node, STRICT_SPREAD distinct nodes)."""
    if len(assignment) != len(bundles) or not set(assignment) <= set(nodes):
        return False
    if strategy == "STRICT_PACK" and len(set(assignment)) > 1:
        return False
    if strategy == "STRICT_SPREAD" and len(set(assignment)) < len(assignment):
        return False
    for name, capacity in nodes.items():
        used: dict[str, float] = {}
        for bundle, where in zip(bundles, assignment, strict=True):
            if where == name:
                for resource, amount in bundle.items():
                    if amount > 0:
                        used[resource] = used.get(resource, 0.0) + amount
        if any(amount > capacity.get(resource, 0.0) + 1e-9 for resource, amount in used.items()):
            return False
    return True


def brute_force(bundles, nodes, strategy) -> bool:
    return any(holds(bundles, nodes, assignment, strategy)
               for assignment in itertools.product(list(nodes), repeat=len(bundles)))


@st.composite
def clusters(draw):
    count = draw(st.integers(1, 4))
    nodes = {}
    for i in range(count):
        # mostly the sizes of real nodes, so that identical nodes are common
        gpus = draw(st.one_of(st.sampled_from([4, 8, 8]), st.integers(0, 8)))
        resources = placement.node_resources(gpus, IPS[i],
                                             draw(st.one_of(st.none(), st.integers(0, 16))))
        if draw(st.booleans()):
            resources["accel"] = float(draw(st.integers(0, 2)))
        nodes[f"h{i + 1}"] = resources
    shape = st.fixed_dictionaries(
        {"GPU": st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0])},
        optional={"CPU": st.sampled_from([1.0, 2.0, 4.0, 8.0]),
                  "accel": st.sampled_from([0.5, 1.0]),
                  f"node:{IPS[0]}": st.just(0.001),
                  f"node:{IPS[1]}": st.just(0.001)})
    # few distinct shapes, repeated: the case the counted search is built for
    shapes = draw(st.lists(shape, min_size=1, max_size=3))
    picks = draw(st.lists(st.integers(0, len(shapes) - 1), min_size=1, max_size=6))
    bundles = [dict(shapes[i]) for i in picks]
    return bundles, nodes


@PROFILE
@given(clusters(), st.sampled_from(placement.STRATEGIES))
def test_counted_search_agrees_with_brute_force(case, strategy):
    bundles, nodes = case
    decision = placement.decide_placement(bundles, strategy, nodes)
    assert decision.decided
    assert decision.feasible == brute_force(bundles, nodes, strategy), decision.reason
    if decision.feasible:
        assert holds(bundles, nodes, decision.assignment, strategy), decision.assignment
    else:
        assert decision.assignment == ()
    if decision.shortfall:  # the totals alone said no, and they were right to
        assert not decision.feasible
