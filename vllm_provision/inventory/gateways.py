"""The front door: the hosts of group ``vllm_gateways`` and what each one's router is told.

Each host of ``vllm_gateways`` runs vLLM's router, ``vllm-router`` 0.1.17 (PyPI; Rust, with a
Python launcher), under systemd (role ``vllm_gateway``), listening on ``vllm_gateway_port`` and
sending to every replica's rank-0 OpenAI API (docs/front-door.md). This module is pure: the
worker list and the router's command line come from the loaded inventory, and
:func:`check_gateways` refuses at load what the router could not do. Opens no connection.

Sources, in the router's wheel (``vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl``):
``vllm_router/router_args.py`` declares every flag (``--worker-urls`` at line 139, ``--policy``
161, ``--api-key`` 386, ``--prometheus-port`` 460, ``--request-timeout-secs`` 478,
``--health-failure-threshold`` 542, ``--health-success-threshold`` 548,
``--health-check-timeout-secs`` 554, ``--health-check-interval-secs`` 560);
``vllm_router/launch_router.py:103`` is the ``vllm-router`` console script.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_provision import settings as settings_chain
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host, Inventory, Replica, host_port, hosts_under
from vllm_provision.inventory.source import Problems, Setting
from vllm_provision.inventory.tree import Tree
from vllm_provision.settings import variables

GATEWAYS_GROUP = "vllm_gateways"
"""The inventory group whose hosts run the front door."""

ROUTER_DISTRIBUTION = "vllm-router"
ROUTER_VERSION = "0.1.17"
"""The router release the role installs and whose flags :meth:`Gateway.argv` writes."""

# The variables of the front door, read per gateway host (scope "host").
GATEWAY_VARIABLES = (
    "vllm_gateway_port", "vllm_gateway_host", "vllm_gateway_metrics_port",
    "vllm_gateway_policy", "vllm_gateway_health_check_interval_s",
    "vllm_gateway_health_check_timeout_s", "vllm_gateway_health_failure_threshold",
    "vllm_gateway_request_timeout_s", "vllm_gateway_venv", "vllm_gateway_wheelhouse",
)


@dataclass(frozen=True)
class Gateway:
    """One host's front door, as its unit runs it.

    Attributes:
        host: the inventory host name.
        bind: ``vllm_gateway_host``. port: ``vllm_gateway_port``.
        metrics_port: ``vllm_gateway_metrics_port``.
        policy: ``vllm_gateway_policy`` (a choice of ``--policy``, router_args.py:161).
        health_check_interval_s, health_check_timeout_s, health_failure_threshold,
        request_timeout_s: the variables of the same names.
        venv: ``vllm_gateway_venv`` on the host.
        wheelhouse: ``vllm_gateway_wheelhouse`` on the controller, an absolute path resolved
            against the inventory's folder; None when unset (refused at load).
        workers: every replica's rank-0 API base URL (``http://ip:port``), in inventory order.
    """

    host: str
    bind: str
    port: int
    metrics_port: int
    policy: str
    health_check_interval_s: int
    health_check_timeout_s: int
    health_failure_threshold: int
    request_timeout_s: int
    venv: str
    wheelhouse: str | None
    workers: tuple[str, ...]

    @property
    def local_host(self) -> str:
        """The router's address as the gateway host reaches it: the bind address, but the
        loopback address for an all-interfaces bind (``0.0.0.0``, ``::``, empty)."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.bind, self.bind)

    @property
    def local_url(self) -> str:
        """The router's base URL as the gateway host reaches it (:attr:`local_host`)."""
        return f"http://{host_port(self.local_host, self.port)}"

    def reached_at(self, host_address: str) -> str:
        """The address another machine (the controller, a Prometheus server) reaches this front
        door on: ``vllm_gateway_host`` when it names one address, else ``host_address`` (the
        host's ``ansible_host``) when the router binds every interface."""
        return host_address if self.bind in ("", "0.0.0.0", "::") else self.bind

    @property
    def requirement(self) -> str:
        """What pip installs on the host: ``vllm-router==0.1.17`` (the release whose flags
        :meth:`argv` writes)."""
        return f"{ROUTER_DISTRIBUTION}=={ROUTER_VERSION}"

    @property
    def executable(self) -> str:
        """The ``vllm-router`` console script in the venv (``[console_scripts]`` of the wheel:
        ``vllm-router = vllm_router.launch_router:main``)."""
        return f"{self.venv}/bin/vllm-router"

    def argv(self) -> list[str]:
        """The unit's command line, one list item per word (the unit template quotes each
        with ``systemd_exec_quote``; nothing goes through a shell).

        ``--worker-startup-timeout-secs``: the router exits when no worker answers ``/health``
        within it (seen with 0.1.17: ``Timeout 3s waiting for hosts [...] to become
        healthy``), and systemd starts it again; ``up`` starts it once the replicas serve.
        ``--health-success-threshold 1``: one passing check takes a replica back.
        The circuit breaker (per worker; ``router_args.py`` ``cb_*``): ``--cb-failure-threshold
        3`` (the router's 10 let a request spend all 5 of its retries on a dead replica, whose
        empty queue ``power_of_two`` keeps choosing, and answer 500), ``--cb-timeout-duration-secs
        3`` and ``--cb-success-threshold 1`` (with the router's 60 s and 3, a replica that
        served again got no request for up to a minute although ``/workers`` called it
        healthy; both seen on the lab with ``provision fault --front-door``, docs/evidence.md).
        """
        return [
            self.executable,
            "--host", self.bind,
            "--port", str(self.port),
            "--prometheus-host", self.bind,
            "--prometheus-port", str(self.metrics_port),
            "--policy", self.policy,
            "--health-check-interval-secs", str(self.health_check_interval_s),
            "--health-check-timeout-secs", str(self.health_check_timeout_s),
            "--health-failure-threshold", str(self.health_failure_threshold),
            "--health-success-threshold", "1",
            "--cb-failure-threshold", "3",
            "--cb-success-threshold", "1",
            "--cb-timeout-duration-secs", "3",
            "--request-timeout-secs", str(self.request_timeout_s),
            "--worker-startup-timeout-secs", "600",
            "--worker-startup-check-interval", "2",
            "--log-level", "info",
            "--worker-urls", *self.workers,
        ]


def _value(values: Mapping[str, Any], name: str) -> Any:
    """A host's value of ``name``, or the table's default."""
    value = values.get(name)
    return variables.VARIABLES[name].default if value is None else value


def workers(replicas: Sequence[Replica]) -> tuple[str, ...]:
    """Every serving replica's API base URLs (``Replica.api_urls``: rank 0's, or every node's
    of a hybrid data-parallel replica), in order, each once: the replicas whose backend serves
    the OpenAI API (``Backend.serves_openai``)."""
    urls: list[str] = []
    for replica in replicas:
        if not replica.backend_type.serves_openai:
            continue
        for url in replica.api_urls:
            if url not in urls:
                urls.append(url)
    return tuple(urls)


def policy_for(chosen: Any, count: int) -> str:
    """The ``--policy`` the router runs: ``chosen`` (``vllm_gateway_policy``) when set, else the
    default, ``power_of_two``, with two workers or more and ``round_robin`` with one
    (vllm-router 0.1.17 exits with "Power-of-two policy requires at least 2 workers"; an
    explicit ``power_of_two`` with one replica is refused at load by :func:`check_gateways`)."""
    if chosen:
        return str(chosen)
    default = str(variables.VARIABLES["vllm_gateway_policy"].default)
    return default if default != "power_of_two" or count >= 2 else "round_robin"


def wheelhouse_path(inventory_path: Path, value: Any) -> str | None:
    """``vllm_gateway_wheelhouse`` as an absolute controller path (text, as a task argument
    takes it): relative to the inventory file's folder (the inventory folder itself for a
    directory inventory), or absolute; None unset."""
    if not value:
        return None
    base = inventory_path if inventory_path.is_dir() else inventory_path.parent
    return str((base / str(value)).absolute())


def gateway_hosts(inventory: Inventory) -> list[str]:
    """The hosts of ``vllm_gateways`` in inventory order (none when the group is absent)."""
    return inventory.hosts_in_group(GATEWAYS_GROUP)


def gateway_of(inventory: Inventory, host_name: str) -> Gateway | None:
    """The front door ``host_name`` runs, or None when it is not in ``vllm_gateways``.

    Args:
        inventory: the loaded inventory (its replicas give the workers).
        host_name: an inventory host name.
    """
    if host_name not in gateway_hosts(inventory):
        return None
    values: Mapping[str, Any] = inventory.hosts[host_name].vars
    return Gateway(
        host=host_name,
        bind=str(_value(values, "vllm_gateway_host")),
        port=int(_value(values, "vllm_gateway_port")),
        metrics_port=int(_value(values, "vllm_gateway_metrics_port")),
        policy=policy_for(values.get("vllm_gateway_policy"), len(workers(inventory.replicas))),
        health_check_interval_s=int(_value(values, "vllm_gateway_health_check_interval_s")),
        health_check_timeout_s=int(_value(values, "vllm_gateway_health_check_timeout_s")),
        health_failure_threshold=int(_value(values, "vllm_gateway_health_failure_threshold")),
        request_timeout_s=int(_value(values, "vllm_gateway_request_timeout_s")),
        venv=str(_value(values, "vllm_gateway_venv")),
        wheelhouse=wheelhouse_path(inventory.path,
                                   _value(values, "vllm_gateway_wheelhouse")),
        workers=workers(inventory.replicas),
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def front_doors(inventory: Inventory) -> list[Gateway]:
    """The inventory's front doors (:func:`gateway_of` of every host of ``vllm_gateways``), in
    inventory order; none without the group."""
    return [g for g in (gateway_of(inventory, h) for h in gateway_hosts(inventory))
            if g is not None]


def client_url(inventory: Inventory, host_name: str) -> str:
    """The front door on ``host_name`` as a client reaches it: ``http://ADDRESS:PORT``
    (:meth:`Gateway.reached_at` the host's address, ``vllm_gateway_port``).

    Raises:
        ProvisionError: ``host_name`` is not a host of ``vllm_gateways``, naming the inventory
            and the hosts that are.
    """
    gateway = gateway_of(inventory, host_name)
    if gateway is None:
        hosts = gateway_hosts(inventory)
        raise ProvisionError.single(
            str(inventory.path), f"{host_name!r} runs no front door",
            expected="a host of vllm_gateways: " + (", ".join(hosts) or "(the group is empty)"),
            fix="name a host of vllm_gateways (docs/front-door.md)")
    address = gateway.reached_at(inventory.hosts[host_name].address)
    return f"http://{host_port(address, gateway.port)}"


def check_gateways(tree: Tree, hosts: Mapping[str, Host],
                   settings: Mapping[str, Mapping[str, Setting]],
                   replicas: Sequence[Replica], problems: Problems) -> None:
    """Refuse at load a front door the router cannot run (each problem names the file, the
    host and the variable, what was expected and the fix).

    Refused: ``vllm_gateways`` with hosts but no replica that serves the OpenAI API (the router
    would have no worker); a gateway host without ``vllm_gateway_wheelhouse`` (the hosts have
    no index: docs/front-door.md, "Wheels"); a replica with ``vllm_api_key`` (vllm-router
    0.1.17 takes the workers' key only as a command-line flag, ``--api-key``,
    router_args.py:386, which every local user reads in ``ps``); a replica whose API binds a
    loopback address while the gateway is on another host; the gateway port equal to its
    metrics port, or to a port the host's own replica node listens on (its API, rendezvous or
    watchdog port).

    Args:
        tree: the inventory's group tree (for the group's place in the file).
        hosts: the built hosts (each one's merged variables).
        settings: each host's merged settings with their origins (where a value was written).
        replicas: the built replicas.
        problems: where problems are recorded.
    """
    members = hosts_under(tree.groups, tree.hosts, GATEWAYS_GROUP)
    if not members:
        return
    group = tree.groups[GATEWAYS_GROUP]
    group_where = f"{tree.file}: " + ".".join(map(str, group.key))

    def where(host: str, name: str) -> str:
        setting = settings.get(host, {}).get(name)
        return setting.origin.where if setting is not None else f"{group_where} (host {host})"

    serving = [r for r in replicas if r.backend_type.serves_openai]
    if not serving:
        problems.add(group_where, f"{GATEWAYS_GROUP} has hosts ({', '.join(members)}) but the "
                     "inventory has no replica to send to",
                     expected=f"one or more child groups of vllm_replicas beside {GATEWAYS_GROUP}",
                     fix=f"add the replicas to this inventory, or remove {GATEWAYS_GROUP}")
    for replica in serving:
        if replica.engine.api_key:
            problems.add(f"{group_where} (replica {replica.name})",
                         f"replica {replica.name!r} sets vllm_api_key, which the front door "
                         f"cannot send safely: {ROUTER_DISTRIBUTION} {ROUTER_VERSION} takes the "
                         "replicas' key only as a command-line flag (--api-key), which every "
                         "user of the gateway host reads in ps",
                         expected=f"no vllm_api_key on replicas behind {GATEWAYS_GROUP}",
                         fix="remove vllm_api_key and restrict the API port with "
                             "vllm_api_allow_from (the gateway hosts), or remove "
                             f"{GATEWAYS_GROUP}")
    for host in members:
        values = hosts[host].vars if host in hosts else {}
        if values.get("vllm_gateway_policy") == "power_of_two" and len(workers(serving)) == 1:
            problems.add(where(host, "vllm_gateway_policy"),
                         f"vllm_gateway_policy of gateway host {host} is power_of_two, which "
                         f"needs two replicas; {ROUTER_DISTRIBUTION} {ROUTER_VERSION} exits with "
                         "\"Power-of-two policy requires at least 2 workers\"",
                         expected="round_robin, random or cache_aware with one replica",
                         fix="remove vllm_gateway_policy (one replica: round_robin) or add a "
                             "replica")
        if not _value(values, "vllm_gateway_wheelhouse"):
            problems.add(where(host, "vllm_gateway_wheelhouse"),
                         f"gateway host {host} has no vllm_gateway_wheelhouse: the router is "
                         "installed from wheels the controller sends (the hosts have no index)",
                         expected=f"a folder of wheels holding {ROUTER_DISTRIBUTION}=="
                                  f"{ROUTER_VERSION} and its dependencies",
                         fix="set vllm_gateway_wheelhouse in the vars of vllm_gateways "
                             "(docs/front-door.md, \"Wheels\", says how to fill it)")
        for replica in serving:
            if _loopback(replica.engine.api_host) and replica.master.name != host:
                problems.add(where(host, "vllm_gateway_port"),
                             f"replica {replica.name!r} binds its API to "
                             f"{replica.engine.api_host}, which gateway host {host} cannot reach",
                             expected="vllm_api_host 0.0.0.0 or an address the gateway reaches",
                             fix=f"set vllm_api_host of {replica.name} to 0.0.0.0, or put the "
                                 f"gateway on {replica.master.name}")
        _check_ports(host, values, replicas, where, problems)


def _check_ports(host: str, values: Mapping[str, Any], replicas: Sequence[Replica],
                 where: Any, problems: Problems) -> None:
    """The gateway's two ports differ from each other and from the ports the host's replica
    node listens on (``Backend.listen_ports``) and its watchdog port."""
    port, metrics = _value(values, "vllm_gateway_port"), _value(values, "vllm_gateway_metrics_port")
    if port == metrics:
        problems.add(where(host, "vllm_gateway_metrics_port"),
                     f"vllm_gateway_port and vllm_gateway_metrics_port of gateway host {host} "
                     f"are both {port}", expected="two different ports",
                     fix="give vllm_gateway_metrics_port another port")
    taken: dict[int, str] = {}
    for replica in replicas:
        for node in replica.nodes:
            if node.name != host:
                continue
            for number, label in replica.backend_type.listen_ports(replica, node.rank):
                taken.setdefault(number, f"the {label} of replica {replica.name!r}")
            taken.setdefault(settings_chain.watchdog_port(replica, node),
                             f"the watchdog port of replica {replica.name!r}")
    for name, number in (("vllm_gateway_port", port), ("vllm_gateway_metrics_port", metrics)):
        if number in taken:
            problems.add(where(host, name),
                         f"{name} of gateway host {host} is {number}, {taken[number]} on the "
                         "same host", expected=f"a port other than {number}",
                         fix=f"give {name} a port no unit of this host listens on")
