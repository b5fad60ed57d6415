"""The replica's own nftables table (``vllm_firewall: nftables``) and who can reach which port.

A node's inter-node ports (the backend's :meth:`~vllm_provision.backends.Backend.peer_ports`:
mp's master port; Ray's GCS, every pinned Ray port and the worker range; plus the peer
watchdog's port) carry no authentication: vLLM's TCP store, Ray (Ray docs, "Security": Ray
expects a trusted network; CVE-2023-48022 is unauthenticated job submission) and our watchdog.
:func:`ruleset` renders one table of ours, ``inet vllm_provision``, that accepts those ports
only from the replica's own node addresses and the API port only from those and
``vllm_api_allow_from``,
and drops the rest of what is sent to them. Nothing else is filtered: the chain's policy is
accept, so SSH, NCCL's data connections and every other port stay as they were.

nftables semantics this relies on (nft(8), "CHAINS" and "VERDICT STATEMENT"): every base chain
of every table on a hook sees the packet; ``accept`` ends only our chain, ``drop`` is final. So
our table can close a port that another table leaves open, but never opens one that another
table drops; and the other tables are never read, flushed or changed.

The file loads atomically (``nft -f`` applies a file as one transaction): ``table`` + ``delete
table`` + the table's definition replaces ours in one step, whether it existed or not. Every
value is data: addresses and networks arrive as :mod:`ipaddress` objects (checked at inventory
load), ports as integers; the text around them is ours.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_provision.settings import instance

if TYPE_CHECKING:
    from vllm_provision.core.models import Replica

# The table of ours on every node: one name per replica on the host (``vllm_provision``, or
# ``vllm_provision_<instance>`` on a shared server: settings/instance.py), so a renamed replica
# replaces it instead of leaving an old one behind. nft(8): "inet" is IPv4 and IPv6.
FAMILY = "inet"
TABLE = instance.FIREWALL_TABLE
# Our input chain runs at the filter priority (nft(8), "Standard priority names": filter = 0).
CHAIN = "input"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class PortRange:
    """One port or range a node listens on.

    Attributes:
        what: what listens there, for the rule's comment and for messages ("master port").
        low, high: the first and last TCP port (equal for one port), 1-65535.
    """

    what: str
    low: int
    high: int

    def text(self) -> str:
        """``"29501"`` or ``"10002-10999"`` (nft's range syntax)."""
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


def watchdog_port(replica: Replica) -> int:
    """The replica's watchdog port in its firewall table: rank 0's value of the one rule,
    :func:`vllm_provision.settings.watchdog_port` (node, else replica, else role default)."""
    from vllm_provision import settings

    return settings.watchdog_port(replica)


def watchdog_ports(replica: Replica) -> list[int]:
    """Every node's peer watchdog port (``vllm_watchdog_port`` may differ per host), sorted:
    one table serves the whole replica, so each node's port is closed to all but the peers on
    every node (a port nothing listens on costs nothing)."""
    from vllm_provision import settings

    return sorted({settings.watchdog_port(replica, node) for node in replica.nodes})


def peer_only_ports(replica: Replica) -> list[PortRange]:
    """Every port the replica's nodes use among themselves: the backend's
    :meth:`~vllm_provision.backends.Backend.peer_ports` and every node's peer watchdog port."""
    ports = [PortRange(what, low, high)
             for what, low, high in replica.backend_type.peer_ports(replica)]
    ports += [PortRange("watchdog port", port, port) for port in watchdog_ports(replica)]
    return ports


def networks(items: Iterable[Any]) -> list[Network]:
    """``vllm_api_allow_from`` items (checked at load) as networks; an address is a /32 or /128.

    Raises:
        ValueError: an item is neither (the inventory check refuses those first).
    """
    return [ipaddress.ip_network(str(item), strict=True) for item in items]


def _elements(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


def _sorted_networks(items: Iterable[Any]) -> list[Network]:
    return sorted(set(networks(items)), key=lambda n: (n.version, int(n.network_address),
                                                       n.prefixlen))


def ruleset(replica: Replica, allow_from: Iterable[Any] = (), metrics_from: Iterable[Any] = (),
            exporters: Sequence[tuple[str, int]] = (), metrics_port: int | None = None,
            gateway: tuple[int, int] | None = None) -> str:
    """The nft file that installs our table on a node of ``replica``.

    Args:
        replica: the node's replica; its nodes' ``host_ip`` are the only sources the peer-only
            ports accept (:func:`peer_only_ports`).
        allow_from: ``vllm_api_allow_from``: IP addresses or CIDR networks that may reach the
            API port besides the replica's nodes; empty: any source (no API rule).
        metrics_from: ``vllm_metrics_allow_from``: the Prometheus servers' addresses or
            networks. They may reach the exporters, ``metrics_port`` when it is one of the
            peer-only ports, and the API port when ``allow_from`` closes it (vLLM serves
            ``/metrics`` on the API port; nftables cannot tell one path from another). Empty:
            no metrics rule.
        exporters: ``[(what, port), ...]`` the node's exporters serve on
            (:func:`vllm_provision.settings.monitoring.exporter_ports`). With ``metrics_from``
            they accept the replica's nodes and ``metrics_from`` only; without it, any source.
        metrics_port: Ray's metrics agent port (``ray_metrics_export_port``); it matters only
            where it is a peer-only port (a Ray replica).
        gateway: ``(vllm_gateway_port, vllm_gateway_metrics_port)`` when the node is a host
            of ``vllm_gateways`` (docs/front-door.md), else None. The gateway port is accepted
            from any source (there is no ``vllm_gateway_allow_from``: the front door is the
            clients' address, as the API port without ``vllm_api_allow_from``); the router's
            metrics port, with ``metrics_from``, from the peers and ``metrics_from`` only, else
            from any source. Both rules come before the peer-only drop, so neither port is
            closed by a range of the replica's.

    Returns:
        the text of an ``nft -f`` file: one transaction that replaces ``inet vllm_provision``
        (``vllm_provision_<instance>`` for a replica with a ``vllm_instance``:
        :func:`vllm_provision.settings.instance.firewall_table`) and touches no other table.

    Raises:
        ProvisionError: a ``vllm_firewall_table`` that is not one of ours.
    """
    table = instance.firewall_table(replica.vars)
    # a zone id (fe80::1%eth0) is no part of a packet's source address
    peers = sorted({ipaddress.ip_address(n.host_ip.split("%", 1)[0]) for n in replica.nodes},
                   key=lambda a: (a.version, int(a)))
    peers4 = [a for a in peers if a.version == 4]
    peers6 = [a for a in peers if a.version == 6]
    api = _sorted_networks(allow_from)
    api4 = [n for n in api if n.version == 4]
    api6 = [n for n in api if n.version == 6]
    metrics = _sorted_networks(metrics_from)
    metrics4 = [n for n in metrics if n.version == 4]
    metrics6 = [n for n in metrics if n.version == 6]
    ports = peer_only_ports(replica)
    port_set = "{ " + ", ".join(p.text() for p in ports) + " }"
    # Ray's metrics port is peer-only: a Prometheus of metrics_from reaches it before the drop
    peer_metrics = [metrics_port] if metrics and metrics_port is not None and any(
        p.low <= metrics_port <= p.high for p in ports) else []
    exporter_list = sorted({port for _, port in exporters}) if metrics else []
    lines = [
        "#!/usr/sbin/nft -f",
        f"# managed by vllm-provision, replica {replica.name}: do not edit here; change the "
        "inventory and run `provision up`.",
        "# Peer-only ports: " + "; ".join(f"{p.text()} ({p.what})" for p in ports) + ".",
        f"# API port {replica.engine.api_port}: "
        + ("from the peers and " + _elements(api + metrics) if api else "from any source")
        + ".",
        *([f"# Metrics ports {_elements(peer_metrics + exporter_list)}: from the peers and "
           f"{_elements(metrics)}."] if peer_metrics or exporter_list else []),
        *([f"# Front door port {gateway[0]}: from any source; its metrics port {gateway[1]}: "
           + (f"from the peers and {_elements(metrics)}." if metrics else "from any source.")]
          if gateway else []),
        "# One transaction (nft -f): create-if-absent, delete, define: replaces our table only.",
        f"table {FAMILY} {table}",
        f"delete table {FAMILY} {table}",
        f"table {FAMILY} {table} {{",
    ]
    for name, kind, members, flags in (("peers4", "ipv4_addr", peers4, False),
                                       ("peers6", "ipv6_addr", peers6, False),
                                       ("api4", "ipv4_addr", api4, True),
                                       ("api6", "ipv6_addr", api6, True),
                                       ("metrics4", "ipv4_addr", metrics4, True),
                                       ("metrics6", "ipv6_addr", metrics6, True)):
        if members:
            lines += [f"\tset {name} {{", f"\t\ttype {kind}"]
            if flags:
                lines.append("\t\tflags interval")
            lines += [f"\t\telements = {{ {_elements(members)} }}", "\t}"]
    lines += [
        f"\tchain {CHAIN} {{",
        "\t\ttype filter hook input priority filter; policy accept;",
        '\t\tiifname "lo" accept',
    ]
    if gateway:
        lines.append(f"\t\ttcp dport {gateway[0]} accept")
        if metrics:
            lines += _accept(str(gateway[1]), [("peers4", peers4), ("peers6", peers6),
                                               ("metrics4", metrics4), ("metrics6", metrics6)])
            lines.append(f"\t\ttcp dport {gateway[1]} drop")
        else:
            lines.append(f"\t\ttcp dport {gateway[1]} accept")
    lines += _accept(port_set, [("peers4", peers4), ("peers6", peers6)])
    lines += _accept(_elements(peer_metrics), [("metrics4", metrics4), ("metrics6", metrics6)])
    lines.append(f"\t\ttcp dport {port_set} drop")
    if api:
        port = str(replica.engine.api_port)
        # the replica's own nodes too: preflight checks that they reach it (network.peer_reach)
        lines += _accept(port, [("peers4", peers4), ("peers6", peers6), ("api4", api4),
                                ("api6", api6), ("metrics4", metrics4), ("metrics6", metrics6)])
        lines.append(f"\t\ttcp dport {port} drop")
    if exporter_list:
        exporter_set = "{ " + _elements(exporter_list) + " }"
        lines += _accept(exporter_set, [("peers4", peers4), ("peers6", peers6),
                                        ("metrics4", metrics4), ("metrics6", metrics6)])
        lines.append(f"\t\ttcp dport {exporter_set} drop")
    lines += ["\t}", "}"]
    return "\n".join(lines) + "\n"


def _accept(ports: str, sets: Sequence[tuple[str, Sequence[Any]]]) -> list[str]:
    """``tcp dport PORTS ip[6] saddr @SET accept`` for every non-empty set (none without
    ports); a set's family is the digit its name ends with."""
    if not ports:
        return []
    return [f"\t\ttcp dport {ports} {'ip6' if name.endswith('6') else 'ip'} saddr @{name} accept"
            for name, members in sets if members]


def exposed_ports(replica: Replica) -> list[PortRange]:
    """What a node of ``replica`` serves that has no authentication of its own: the peer-only
    ports (:func:`peer_only_ports`), for the public-address warning of preflight."""
    return peer_only_ports(replica)


def is_public(address: str) -> bool:
    """True when ``address`` may be reachable from the internet.

    ``ipaddress``'s ``is_global`` (the IANA special-purpose registries, RFC 6890) is the rule,
    so RFC 1918 (10/8, 172.16/12, 192.168/16), ULA (fc00::/7, RFC 4193), loopback, link-local,
    CGNAT shared space (100.64/10, RFC 6598: ``is_global`` is False, ``is_private`` too) and
    documentation ranges are not public. An IPv4-mapped IPv6 address is judged as IPv4.
    A text that is not an address is not public.
    """
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return bool(parsed.is_global)


def public_addresses(addresses: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``{interface: [public address, ...]}`` of ``addresses`` (interface -> its addresses),
    leaving out interfaces without one (:func:`is_public`)."""
    found = {name: [a for a in values if is_public(a)] for name, values in addresses.items()}
    return {name: values for name, values in found.items() if values}
