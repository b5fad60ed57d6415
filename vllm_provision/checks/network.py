"""Network checks: cluster interface, VLLM_HOST_IP, routes, hostname, reachability and ports.

Sources: vLLM docs ``serving/distributed_troubleshooting.md`` and public vLLM reports:
VLLM_HOST_IP vs the IP Ray registered (vllm #7815), the Gloo/NCCL interface, the rendezvous
endpoint unreachable (vllm #14340), EADDRINUSE (vllm #15987).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vllm_provision.checks.context import NodeScope, ReplicaScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Node, Replica
from vllm_provision.facts.model import HostFacts, Interface


def interface_of(facts: HostFacts, address: str) -> Interface | None:
    """Return the interface holding ``address``, or None."""
    for interface in facts.interfaces.values():
        if address in interface.addresses:
            return interface
    return None


@check("network.interface", order=10, scope="node", reads=("node", "facts", "interface"))
def check_interface(node: Node, facts: HostFacts, interface_name: str | None) -> list[Finding]:
    """The cluster interface exists, is UP, and holds the node's VLLM_HOST_IP.

    Source: NCCL docs "Troubleshooting: IP Network Interfaces" and vllm #7074 (Gloo/NCCL bind
    to the interface named by ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``); vllm #7815 (the
    IP vLLM uses must be one the node has).
    """
    findings = []
    holder = interface_of(facts, node.host_ip)
    if interface_name:
        interface = facts.interfaces.get(interface_name)
        if interface is None:
            return [Finding(
                "network.interface", Severity.ERROR, node.name, f"interface {interface_name}",
                expected="present", actual="absent (has: " + ", ".join(sorted(facts.interfaces))
                + ")", fix=f"set vllm_cluster_interface to the interface of {node.host_ip} on "
                           f"{node.name}" + (f" ({holder.name})" if holder else ""),
                source="NCCL docs: NCCL_SOCKET_IFNAME")]
    else:
        interface = holder
    if interface is None:
        return [Finding(
            "network.host_ip", Severity.ERROR, node.name, "VLLM_HOST_IP on an interface",
            expected=f"{node.host_ip} on a local interface", actual="no interface has it",
            fix=f"set vllm_host_ip of {node.name} to its cluster address",
            source="vllm #7815 (VLLM_HOST_IP must be the node's cluster IP)")]
    if not interface.is_up:
        findings.append(Finding(
            "network.interface", Severity.ERROR, node.name, f"interface {interface.name}",
            expected="UP", actual=interface.state,
            fix=f"bring {interface.name} up on {node.name} (ip link set {interface.name} up)",
            source="NCCL docs: IP network interfaces"))
    else:
        findings.append(Finding("network.interface", Severity.OK, node.name,
                                f"interface {interface.name}", expected="UP", actual="UP"))
    if node.host_ip not in interface.addresses:
        findings.append(Finding(
            "network.host_ip", Severity.ERROR, node.name, "VLLM_HOST_IP",
            expected=f"{node.host_ip} on {interface.name}",
            actual=", ".join(interface.addresses) or "no address",
            fix=f"set vllm_host_ip of {node.name} to the address of {interface.name}, or "
                "vllm_cluster_interface to the interface holding it",
            source="vllm #7815"))
    else:
        findings.append(Finding("network.host_ip", Severity.OK, node.name, "VLLM_HOST_IP",
                                expected=f"on {interface.name}", actual=node.host_ip))
    return findings


@check("network.host_ip_unique", order=60, scope="replica", reads=("replica",))
def check_host_ip_unique(replica: Replica) -> list[Finding]:
    """VLLM_HOST_IP is unique per node.

    Source: vLLM Ray executor: "Every node should have a unique IP address ... If you set
    VLLM_HOST_IP environment variable, make sure it is unique for each node."
    (``vllm/v1/executor/ray_executor.py``).
    """
    seen: dict[str, str] = {}
    findings = []
    for node in replica.nodes:
        if node.host_ip in seen:
            findings.append(Finding(
                "network.host_ip_unique", Severity.ERROR, node.name, "VLLM_HOST_IP",
                expected=f"unique (not {seen[node.host_ip]}'s)", actual=node.host_ip,
                fix=f"give {node.name} its own vllm_host_ip",
                source="vllm/v1/executor/ray_executor.py (unique IP per node)"))
        seen.setdefault(node.host_ip, node.name)
    if not findings:
        findings.append(Finding("network.host_ip_unique", Severity.OK, "*", "VLLM_HOST_IP",
                                expected="unique", actual=", ".join(seen)))
    return findings


@check("network.routes", order=70, scope="replica", reads=("replica", "facts", "interface"))
def check_routes(replica: Replica, facts: Mapping[str, HostFacts],
                 interface_name: str | None) -> list[Finding]:
    """Traffic to each peer leaves through the cluster interface (warning otherwise).

    Source: NCCL docs "IP Network Interfaces" (an interface that is UP but cannot reach the
    other node hangs init); vLLM docs ``serving/distributed_troubleshooting.md``.
    """
    findings = []
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None:
            continue
        expected_dev = interface_name or getattr(interface_of(f, node.host_ip), "name", "")
        for peer, route in f.routes.items():
            if route.error:  # no route at all
                severity, actual, fix = (Severity.ERROR, route.error,
                                         f"add a route to {peer} on {node.name}")
            elif expected_dev and route.dev != expected_dev:
                severity, actual, fix = (
                    Severity.WARNING, f"via {route.dev}",
                    f"route the cluster network over {expected_dev} on {node.name}")
            else:
                continue
            findings.append(Finding(
                "network.route", severity, node.name, f"route to {peer}",
                expected=f"via {expected_dev or 'the cluster interface'}", actual=actual,
                fix=fix, source="NCCL docs: IP network interfaces"))
    return findings


@check("network.hostname", order=30, scope="node", reads=("node", "facts"))
def check_hostname(node: Node, facts: HostFacts) -> list[Finding]:
    """The hostname resolves (warning): Gloo falls back to it without GLOO_SOCKET_IFNAME.

    Source: vllm #7074 "Unable to resolve hostname to a (local) address".
    """
    if facts.hostname_addresses:
        return [Finding("network.hostname", Severity.OK, node.name, "hostname resolves",
                        expected="an address", actual=f"{facts.hostname} -> "
                        + ", ".join(facts.hostname_addresses))]
    return [Finding("network.hostname", Severity.WARNING, node.name, "hostname resolves",
                    expected=f"{facts.hostname} resolves to an address", actual="unresolvable",
                    fix=f"add {facts.hostname} to /etc/hosts on {node.name}",
                    source="vllm #7074 (Gloo: unable to resolve hostname)")]


def check_reachability(replica: Replica, facts: Mapping[str, HostFacts], port: int,
                       what: str) -> list[Finding]:
    """Every follower reached rank 0's rendezvous port over TCP during the probe.

    Source: vllm #14340, #6650 (``DistNetworkError: The client socket has timed out ... while
    trying to connect to (IP, port)``): firewall or wrong master address.

    Args:
        replica: the replica.
        facts: facts by host name.
        port: master_port (mp) or ray_port (Ray).
        what: words for the port (``"master port"``).
    """
    findings = []
    target = f"{replica.master_addr}:{port}"
    for node in replica.followers:
        f = facts.get(node.name)
        if f is None:
            continue
        results = [r for r in f.reachability if r.address == replica.master_addr and r.port == port]
        if not results:
            continue
        result = results[0]
        if result.ok:
            findings.append(Finding("network.reach", Severity.OK, node.name,
                                    f"TCP to {what} {target}", expected="reachable",
                                    actual=f"connected in {result.elapsed_s:g} s"))
        else:
            findings.append(Finding(
                "network.reach", Severity.ERROR, node.name, f"TCP to {what} {target}",
                expected="reachable", actual=result.error or "not reachable",
                fix=f"open TCP {port} (and all ports between the nodes) from {node.name} to "
                    f"{replica.master.name} on the cluster network",
                source="vllm #14340, #6650 (rendezvous unreachable)"))
    return findings


def _owned(unit: str, own_units: Sequence[str]) -> bool:
    return bool(unit) and unit in own_units


def check_ports(node: Node, facts: HostFacts, ports: Sequence[tuple[int, str]],
                own_units: Sequence[str], *, alternative: str = "choose another port",
                source: str = "vllm #15987, #39015 (EADDRINUSE)",
                leaving: Sequence[str] = ()) -> list[Finding]:
    """Ports we will bind are free, held by our own unit, or held by a unit of an earlier plan
    that ``provision up`` stops before the start (``leaving``).

    Source: vllm #15987 and #39015 (EADDRINUSE on start: a stale process or a second
    instance on master_port / 8000 / 6379).

    Args:
        node: the node.
        facts: its facts.
        ports: ``(port, what)`` pairs to check on this node.
        own_units: unit names that may hold them (``vllm.service``, ``ray-head.service``).
        leaving: units the host's state record lists that this plan no longer has: stopped
            and removed before anything starts (``vllm_provision.state.prune``), so they may hold
            them now.
        alternative: the fix besides stopping the holder (``"set vllm_watchdog_port ..."``).
        source: the source cited by an error finding.
    """
    findings = []
    for port, what in ports:
        holders = [s for s in facts.listening if s.port == port]
        foreign = [s for s in holders if not _owned(s.unit, (*own_units, *leaving))]
        if foreign:
            holder = foreign[0]
            who = (f"{holder.process or 'a process'}"
                   + (f" (pid {holder.pid}" + (f", {holder.unit}" if holder.unit else "") + ")"
                      if holder.pid else ""))
            findings.append(Finding(
                "network.ports", Severity.ERROR, node.name, f"{what} {port}",
                expected=f"free or held by {' / '.join(own_units)}",
                actual=f"in use by {who} on {holder.address}",
                fix=f"stop {who} on {node.name}, or {alternative}",
                source=source))
        else:
            state = f"held by {holders[0].unit}" if holders else "free"
            if holders and holders[0].unit in leaving:
                state += " (an earlier plan's unit: stopped and removed before the start)"
            findings.append(Finding("network.ports", Severity.OK, node.name, f"{what} {port}",
                                    expected="free or ours", actual=state))
    return findings


def check_watchdog_port(node: Node, facts: HostFacts, port: int,
                        watchdog_unit: str) -> list[Finding]:
    """The peer watchdog's port is free, or held by our own watchdog unit (and nothing else).

    Source: docs/recovery.md §2 (each node's ``vllm-watchdog.service`` serves ``GET /state``
    on ``<node ip>:vllm_watchdog_port`` and its peers poll it): a watchdog that cannot bind
    exits at start and restarts forever (``Restart=always``, no start limit), its peers never
    bind to it, and ``provision up`` fails at its last step waiting for a bound watchdog.

    Args:
        node: the node.
        facts: its facts.
        port: the node's ``vllm_watchdog_port``.
        watchdog_unit: ``vllm_watchdog_unit_name`` (``vllm-watchdog.service``).
    """
    return check_ports(
        node, facts, [(port, "watchdog port")], (watchdog_unit,),
        alternative="set vllm_watchdog_port to a free port in the replica's group vars (the "
                    "same on every node: each watchdog polls its peers on its own port)",
        source="docs/recovery.md §2 (the peer watchdog serves its state on this port)")


@check("network.exposure", order=20, scope="node", reads=("node", "facts", "replica", "interface"))
def check_exposure(node: Node, facts: HostFacts, replica: Replica,
                   interface_name: str | None) -> list[Finding]:
    """Warn when the cluster interface holds a public address and ``vllm_firewall`` is off.

    The inter-node ports (vLLM's TCP store, Ray's GCS and the other Ray ports, the peer
    watchdog) have no authentication: Ray's security docs say a Ray cluster must not be
    reachable from untrusted networks (unauthenticated job submission, CVE-2023-48022). Public
    means ``ipaddress``'s ``is_global`` (:func:`vllm_provision.settings.firewall.is_public`): not
    RFC
    1918, ULA, loopback, link-local, CGNAT or documentation space.

    Args:
        node: the node; facts: its facts.
        replica: its replica (the ports come from its backend, the option from its vars).
        interface_name: ``vllm_cluster_interface``, or None: the interface holding the node's
            ``vllm_host_ip``.

    Returns:
        one ``network.exposure`` warning naming the public addresses and every exposed port, or
        nothing (firewall on, interface unknown, no public address).
    """
    from vllm_provision import settings
    from vllm_provision.settings import firewall

    if settings.replica_settings(replica)["vllm_firewall"] == "nftables":
        return []
    interface = (facts.interfaces.get(interface_name) if interface_name
                 else interface_of(facts, node.host_ip))
    if interface is None:
        return []
    public = firewall.public_addresses({interface.name: list(interface.addresses)})
    if not public:
        return []
    ports = [f"{p.text()} ({p.what})" for p in firewall.peer_only_ports(replica)]
    if node.rank == 0:
        ports.insert(0, f"{replica.engine.api_port} (API port)")
    return [Finding(
        "network.exposure", Severity.WARNING, node.name, f"interface {interface.name}",
        expected="private addresses only (RFC 1918, ULA), or vllm_firewall: nftables",
        actual=f"public {', '.join(public[interface.name])}: exposes TCP " + ", ".join(ports),
        fix="set vllm_firewall: nftables (and vllm_api_allow_from) in the replica's group vars, "
            "or put the cluster network on private addresses (docs/security.md)",
        source="Ray docs, Security (CVE-2023-48022); vllm --master-port has no authentication")]


@check("network.ray_auth", order=25, scope="node", reads=("node", "facts", "replica"))
def check_ray_auth(node: Node, facts: HostFacts, replica: Replica) -> list[Finding]:
    """Ray token authentication on a Ray node: Ray below 2.52 has none (Ray's docs, "Ray token
    authentication", https://docs.ray.io/en/latest/ray-security/token-auth.html) and lets
    anyone who reaches its ports run code (CVE-2025-62593, through the job API).

    Ray's version is the node's (``facts.packages["ray"]``, the venv's); unknown: no finding
    (``host.venv`` and ``parity`` name a missing Ray). With ``vllm_firewall: nftables`` only
    the replica's nodes reach the Ray ports (docs/security.md, "Network exposure"), so old Ray
    is a warning. With the firewall off the ports are reachable from outside the replica:
    an error with ``vllm_ray_auth: token`` (the default: the operator asked for
    authentication this Ray cannot give), a warning with ``vllm_ray_auth: none`` (the operator
    stated that Ray runs without it).

    Args:
        node: the node; facts: its facts; replica: its replica (its settings give
            ``vllm_firewall`` and ``vllm_ray_auth``).

    Returns:
        at most one ``network.ray_auth`` finding; nothing for a backend without a Ray cluster,
        Ray >= 2.52 or an unknown version.
    """
    from vllm_provision import settings
    from vllm_provision.settings import ray_auth

    if not replica.backend_type.ray_cluster:
        return []
    version = facts.packages.get("ray")
    if ray_auth.supports_token(version) is not False:
        return []
    values = settings.replica_settings(replica)
    firewall_on = values["vllm_firewall"] == "nftables"
    wants_token = ray_auth.auth_on(values)
    severity = Severity.ERROR if wants_token and not firewall_on else Severity.WARNING
    reach = ("only the replica's nodes reach its ports (vllm_firewall: nftables)" if firewall_on
             else "its ports are reachable from outside the replica (vllm_firewall: off)")
    return [Finding(
        "network.ray_auth", severity, node.name, "Ray token authentication",
        expected=f"Ray >= {'.'.join(map(str, ray_auth.MIN_RAY))} (token authentication)",
        actual=f"Ray {version} has no authentication ({ray_auth.CVE}: anyone who reaches "
               f"its ports can run code); {reach}",
        fix="upgrade Ray on every node (ray_version, `provision stack sync`); until then set "
            "vllm_firewall: nftables, or state vllm_ray_auth: none to accept it "
            "(docs/security.md)",
        source="Ray docs, Ray token authentication (Ray 2.52)")]


# -- checks that read their scope (checks/context.py) -----------------------------------


@check("network.reachability", order=80, scope="replica")
def _reachability(scope: ReplicaScope) -> list[Finding]:
    """The backend's rendezvous port is reachable from every node (when it has one)."""
    meeting = scope.replica.backend_type.rendezvous(scope.replica)
    if meeting is None:
        return []
    return check_reachability(scope.replica, scope.facts, *meeting)


@check("network.ports", order=40, scope="node")
def _ports(scope: NodeScope) -> list[Finding]:
    """The node's listen ports are free or held by our own units."""
    planned, leaving = scope.units
    ports = scope.replica.backend_type.listen_ports(scope.replica, scope.node.rank)
    return check_ports(scope.node, scope.facts, ports, planned, leaving=leaving)


@check("network.watchdog_port", order=50, scope="node")
def _watchdog_port(scope: NodeScope) -> list[Finding]:
    """The peer watchdog's port is free or held by the watchdog."""
    from vllm_provision.settings import watchdog_port

    return check_watchdog_port(scope.node, scope.facts, watchdog_port(scope.replica, scope.node),
                               scope.settings.watchdog_unit)
