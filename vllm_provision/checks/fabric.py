"""Cluster-fabric checks across the nodes of one replica: MTU along the cluster path, RDMA.

Pure functions from every node's facts to replica-wide findings (``host`` is ``"*"``); each
names its source.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_provision.checks.context import check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.checks.network import interface_of
from vllm_provision.core.models import Node, Replica
from vllm_provision.facts.model import HostFacts, Interface

MTU_SOURCE = ("NCCL docs: Troubleshooting (network MTU must match end to end); NVIDIA "
              "networking: MTU troubleshooting for RoCE/IB")
RDMA_SOURCE = "NCCL docs: Environment Variables (NCCL_IB_DISABLE: without IB, NCCL uses sockets)"


def cluster_interface(node: Node, facts: HostFacts, interface: str | None) -> Interface | None:
    """The interface the node's cluster traffic leaves by: ``vllm_cluster_interface`` (the
    node's own value wins over the replica's ``interface``), else the one holding its
    VLLM_HOST_IP; None when neither is found."""
    from vllm_provision import settings

    # the node's own value, else the replica's: settings.node_settings with ``interface`` given
    name = settings.layered({"vllm_cluster_interface": interface, **dict(node.host.vars)}).get(
        "vllm_cluster_interface")
    if name:
        return facts.interfaces.get(str(name))
    return interface_of(facts, node.host_ip)


@check("fabric.mtu", order=90, scope="replica", reads=("replica", "facts", "interface"))
def check_mtu(replica: Replica, facts: Mapping[str, HostFacts],
              interface: str | None) -> list[Finding]:
    """The cluster interfaces of all nodes have the same MTU (error when they differ).

    A smaller MTU on one end drops the large frames the other sends: NCCL's troubleshooting
    guide and NIC vendors name mismatched MTUs as a cause of hangs in the first collective.

    Args:
        replica: the replica.
        facts: facts by host name; nodes without facts or without a known interface are left
            out (``network.interface`` reports them).
        interface: the replica's ``vllm_cluster_interface``, or None.
    """
    mtus: dict[str, tuple[str, int]] = {}
    for node in replica.nodes:
        f = facts.get(node.name)
        found = cluster_interface(node, f, interface) if f is not None else None
        if found is not None and found.mtu is not None:
            mtus[node.name] = (found.name, found.mtu)
    if len(replica.nodes) < 2 or len(mtus) < 2:
        return []
    described = ", ".join(f"{name} {dev} mtu {mtu}" for name, (dev, mtu) in mtus.items())
    values = {mtu for _dev, mtu in mtus.values()}
    if len(values) > 1:
        lowest = min(values)
        return [Finding(
            "network.mtu", Severity.ERROR, "*", "MTU along the cluster path",
            expected="the same MTU on every node", actual=described,
            fix="set one MTU on every node's cluster interface (ip link set dev IFACE mtu "
                f"{lowest}, made permanent in the network configuration), and on the switch",
            source=MTU_SOURCE)]
    return [Finding("network.mtu", Severity.OK, "*", "MTU along the cluster path",
                    expected="equal", actual=described)]


@check("fabric.rdma", order=100, scope="replica", reads=("replica", "facts"))
def check_rdma(replica: Replica, facts: Mapping[str, HostFacts]) -> list[Finding]:
    """RDMA (an ACTIVE InfiniBand/RoCE port) is on every node or on none (warning otherwise).

    NCCL needs a common transport: when some nodes have no usable RDMA port, the inter-node
    traffic of the whole replica goes over TCP sockets, many times slower.
    """
    have: dict[str, list[str]] = {}
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None:
            continue
        have[node.name] = [f"{p.device}/{p.port} {p.link_layer or '?'}"
                           for p in f.rdma_ports if p.active]
    if len(replica.nodes) < 2 or len(have) < 2:
        return []
    with_rdma = sorted(name for name, ports in have.items() if ports)
    without = sorted(name for name, ports in have.items() if not ports)
    if with_rdma and without:
        down = {name: [f"{p.device}/{p.port} {p.state}" for p in facts[name].rdma_ports]
                for name in without}
        detail = "; ".join(f"{name}: " + (", ".join(down[name]) or "no RDMA device")
                           for name in without)
        return [Finding(
            "network.rdma", Severity.WARNING, "*", "RDMA ports",
            expected="an ACTIVE RDMA port on every node, or on none",
            actual=f"active on {', '.join(with_rdma)}; not on {detail}",
            fix="bring the RDMA port up (check the cable, the subnet manager, ibstat) on "
                + ", ".join(without) + "; otherwise NCCL uses TCP sockets on every node",
            source=RDMA_SOURCE)]
    state = "on every node" if with_rdma else "on no node (NCCL uses TCP sockets)"
    return [Finding("network.rdma", Severity.OK, "*", "RDMA ports", expected="same on all",
                    actual=state)]


@check("fabric.peer_reach", order=110, scope="replica", reads=("replica", "facts"))
def check_peer_reach(replica: Replica, facts: Mapping[str, HostFacts]) -> list[Finding]:
    """Every node reached every peer's API and watchdog ports over TCP during the probe.

    The probe opens a short-lived listener on each port a node serves its peers where nothing
    listens yet (a running service answers itself), and every peer connects to it: a firewall
    that drops the port shows here, before anything starts. The rendezvous port is
    ``network.reach``. Source: vllm #14340 (peers time out on a port the firewall drops);
    docs/recovery.md (watchdogs poll each other's port).
    """
    from vllm_provision.facts.gather import peer_ports

    served = peer_ports(replica)
    findings = []
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None or not f.reachability:
            continue
        reached = []
        for peer in replica.nodes:
            if peer.name == node.name:
                continue
            for port, what in served[peer.name]:
                result = next((r for r in f.reachability
                               if r.address == peer.host_ip and r.port == port), None)
                if result is None:
                    continue
                if result.ok:
                    reached.append(f"{peer.name}:{port}")
                    continue
                findings.append(Finding(
                    "network.peer_reach", Severity.ERROR, node.name,
                    f"TCP to {peer.name}'s {what} {peer.host_ip}:{port}",
                    expected=f"reachable from {node.name}",
                    actual=result.error or "not reachable",
                    fix=f"open TCP {port} from {node.name} to {peer.name} in the firewall "
                        f"(nft/iptables/firewalld on {peer.name}, and the network between)",
                    source="vllm #14340 (unreachable peer port); docs/recovery.md"))
        if reached and not any(x.host == node.name for x in findings):
            findings.append(Finding("network.peer_reach", Severity.OK, node.name,
                                    "TCP to the peers' ports", expected="reachable",
                                    actual=", ".join(reached)))
    return findings
