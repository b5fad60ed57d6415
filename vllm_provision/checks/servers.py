"""One node per server: no two nodes of the inventory's replicas are one running system.

Everything this tool installs on a node is named per server (``vllm.service``, the watchdog, the
firewall table, the state record in ``/var/lib/vllm-provision``, the run lock), so two nodes on
one machine, of one replica or of two, would overwrite each other's units and records, and one
run would wait on its own run lock. The loader already refuses two hosts with the same SSH
address and port (docs/inventory.md, "One node per server"); this check finds the same machine
under two addresses (a management and a cluster address, a DNS alias), from what each host
says it is: ``/etc/machine-id`` (machine-id(5): one per installation) and the kernel's boot id
(``/proc/sys/kernel/random/boot_id``: one per boot). Two cloned installations share a
machine-id but not a boot id; containers of one kernel may share the boot id (systemd-nspawn
gives each its own, others may not) but not the machine-id; only the same running system shares
both.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_provision.checks.context import InventoryScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica
from vllm_provision.facts.model import HostFacts

SOURCE = "machine-id(5); proc(5) /proc/sys/kernel/random/boot_id; docs/inventory.md"


def check_one_node_per_server(replica: Replica, facts: Mapping[str, HostFacts],
                              nodes: Mapping[str, str]) -> list[Finding]:
    """One ``servers.one_node`` error per node of ``replica`` that is the same running system as
    another node of the inventory (same machine-id and boot id), naming the other node(s) and
    their replicas.

    Args:
        replica: the replica checked.
        facts: facts by host name (a node without facts, or whose probe could not read both
            ids, is skipped).
        nodes: every node of the inventory's replicas -> its replica's name; hosts that are
            no node (a front door host, a monitoring host) may share a machine with a node.
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
        others = [n for n in machines[(f.machine_id, f.boot_id)] if n != node.name]
        if not others:
            continue
        named = ", ".join(f"{other} (replica {nodes[other]!r})" for other in others)
        findings.append(Finding(
            "servers.one_node", Severity.ERROR, node.name, "one node per server",
            expected="a machine no other node of the inventory runs on",
            actual=f"the same machine as {named}: machine-id {f.machine_id[:12]}..., the "
                   "same boot",
            fix=f"keep one entry for this machine: put {node.name} and {others[0]} on servers "
                "of their own, or serve both from one replica with vllm_data_parallel_size "
                "(docs/serving.md)",
            source=SOURCE))
    return findings


# -- registered checks (checks/context.py): what run.py runs, in this order ------------------

@check("servers.one_node", order=5, scope="inventory")
def _one_node(scope: InventoryScope) -> list[Finding]:
    """No two nodes of the inventory are one running system."""
    return check_one_node_per_server(scope.replica, scope.of.facts, scope.nodes)
