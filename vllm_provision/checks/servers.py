"""One node per server: no two nodes of the inventory's replicas are one running system, unless
they are nodes of replicas that share it by design (``vllm_instance``, disjoint ``vllm_gpus``).

What this tool installs on a node is named per server (``vllm.service``, the watchdog, the
firewall table, the state record in ``/var/lib/vllm-provision``, the run lock) unless the
replica declares a ``vllm_instance`` (settings/instance.py), so two nodes on one machine
without one, of one replica or of two, would overwrite each other's units and records. The
loader already checks two hosts with the same SSH address and port (docs/inventory.md, "Shared
servers"); this check finds the same machine under two addresses (a management and a cluster
address, a DNS alias), from what each host says it is: ``/etc/machine-id`` (machine-id(5): one
per installation) and the kernel's boot id (``/proc/sys/kernel/random/boot_id``: one per
boot). Two cloned installations share a machine-id but not a boot id; containers of one kernel
may share the boot id (systemd-nspawn gives each its own, others may not) but not the
machine-id; only the same running system shares both.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_provision.checks.context import check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Node, Replica
from vllm_provision.facts.model import HostFacts

SOURCE = "machine-id(5); proc(5) /proc/sys/kernel/random/boot_id; docs/inventory.md"


@check("servers.one_node", order=5, scope="inventory", reads=("replica", "of.facts", "nodes"))
def check_one_node_per_server(replica: Replica, facts: Mapping[str, HostFacts],
                              nodes: Mapping[str, Replica]) -> list[Finding]:
    """One ``servers.one_node`` error per node of ``replica`` that is the same running system
    as another node of the inventory (same machine-id and boot id), naming the other node(s),
    their replicas and why they may not share it; none where both replicas declare their own
    ``vllm_instance`` and their nodes' ``vllm_gpus`` are disjoint.

    Args:
        replica: the replica checked.
        facts: facts by host name (a node without facts, or whose probe could not read both
            ids, is skipped).
        nodes: every node of the inventory's replicas -> its replica; hosts that are no node
            (a front door host, a monitoring host) may share a machine with a node.
    """
    machines: dict[tuple[str, str], list[str]] = {}
    for name in sorted(nodes):
        f = facts.get(name)
        if f is not None and f.machine_id and f.boot_id:
            machines.setdefault((f.machine_id, f.boot_id), []).append(name)
    findings = []
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None or not f.machine_id or not f.boot_id:
            continue
        clashes = [(other, why) for other in machines[(f.machine_id, f.boot_id)]
                   if other != node.name
                   and (why := _why_not_shared(replica, node, nodes[other], other))]
        if not clashes:
            continue
        named = "; ".join(f"{other} (replica {nodes[other].name!r}): {why}"
                          for other, why in clashes)
        findings.append(Finding(
            "servers.one_node", Severity.ERROR, node.name, "one node per server",
            expected="a machine of its own, or one shared by replicas with their own "
                     "vllm_instance on disjoint vllm_gpus",
            actual=f"the same machine (machine-id {f.machine_id[:12]}..., the same boot) as "
                   f"{named}",
            fix=f"put {node.name} and {clashes[0][0]} on servers of their own, or give their "
                "replicas each a vllm_instance and GPUs of their own (docs/inventory.md, "
                "\"Shared servers\")",
            source=SOURCE))
    return findings


def _why_not_shared(replica: Replica, node: Node, other_replica: Replica, other: str) -> str:
    """Why ``node`` of ``replica`` and node ``other`` of ``other_replica`` may not share one
    machine, or ``""`` when they may."""
    if other_replica.name == replica.name:
        return "two nodes of one replica"
    mine, theirs = (r.vars.get("vllm_instance") for r in (replica, other_replica))
    if not mine or not theirs:
        return "without a vllm_instance on each replica"
    if mine == theirs:
        return f"both replicas use vllm_instance {mine!r}"
    peer = next(n for n in other_replica.nodes if n.name == other)
    if node.gpus is None or peer.gpus is None:
        return "without vllm_gpus on both"
    common = sorted(set(node.gpus) & set(peer.gpus))
    return f"their vllm_gpus overlap (GPU {', '.join(map(str, common))})" if common else ""
