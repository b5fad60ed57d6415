"""Fixtures of the verify suite: testinfra hosts for every node of the inventory's replicas.

Run against your own servers after ``provision up``::

    provision verify -i inventory/my-cluster.yml          # installed (needs the `test` extra)
    .venv/bin/pytest tests/verify --inventory inventory/my-cluster.yml   # from a checkout

Without ``--inventory`` every test here is skipped. Hosts are reached the way ``provision``
reaches them (the inventory's address, port, user, key and known_hosts files), over paramiko
with unknown host keys refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_provision.core.models import Host, Inventory, Node, Replica

DEFAULT_KNOWN_HOSTS = (Path("/etc/ssh/ssh_known_hosts"), Path("~/.ssh/known_hosts").expanduser())


@pytest.fixture(scope="session")
def verify_inventory(request: pytest.FixtureRequest) -> Inventory:
    """The inventory named by ``--inventory`` (skips the suite when none is given)."""
    path = request.config.getoption("--inventory")
    if not path:
        pytest.skip("the verify suite needs --inventory INVENTORY (a deployed replica)")
    from vllm_provision.cli.options import parse_extra_vars
    from vllm_provision.inventory import load_inventory

    extra = parse_extra_vars(request.config.getoption("--verify-extra-vars"))
    return load_inventory(Path(path), extra_vars=extra or None)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``node`` over every node of every replica, ``replica`` over every replica."""
    path = metafunc.config.getoption("--inventory", default=None)
    if not path or not ({"node", "replica"} & set(metafunc.fixturenames)):
        return
    from vllm_provision.inventory import load_inventory

    inventory = load_inventory(Path(path))
    if "node" in metafunc.fixturenames:
        nodes = [(r.name, n.name) for r in inventory.replicas for n in r.nodes]
        metafunc.parametrize("node_key", nodes, ids=[f"{r}-{n}" for r, n in nodes],
                             scope="session")
    elif "replica" in metafunc.fixturenames:
        names = [r.name for r in inventory.replicas]
        metafunc.parametrize("replica_name", names, ids=names, scope="session")


@pytest.fixture(scope="session")
def node(verify_inventory: Inventory, node_key: tuple[str, str]) -> Node:
    """One node of a replica (parametrized)."""
    replica = next(r for r in verify_inventory.replicas if r.name == node_key[0])
    return next(n for n in replica.nodes if n.name == node_key[1])


@pytest.fixture(scope="session")
def replica(verify_inventory: Inventory, replica_name: str) -> Replica:
    """One replica (parametrized)."""
    return next(r for r in verify_inventory.replicas if r.name == replica_name)


@pytest.fixture(scope="session")
def api_routes() -> Iterator[Any]:
    """Factory ``api_route(replica) -> ApiRoute``: how the controller reaches rank 0's API
    (``vllm_api_via``, :func:`vllm_provision.transport.tunnel.route_for`); through SSH over a
    connection to rank 0 opened the way ``provision`` opens it (ProxyJump included)."""
    from vllm_provision.transport.base import ConnectionOptions
    from vllm_provision.transport.connection import HostConnection
    from vllm_provision.transport.tunnel import choice_for, route_for

    opened: dict[str, HostConnection] = {}

    def route(replica: Replica) -> Any:
        if choice_for(replica).via != "ssh":
            return route_for(replica)
        name = replica.master.name
        if name not in opened:
            opened[name] = HostConnection(replica.master.host, ConnectionOptions())
            opened[name].open()
        return route_for(replica, opened[name])

    yield route
    for connection in opened.values():
        connection.close()


@pytest.fixture(scope="session")
def connect() -> Iterator[Any]:
    """Factory ``connect(host) -> testinfra.host.Host`` with strict host-key checking."""
    import paramiko
    import testinfra.backend
    import testinfra.host

    clients: dict[str, Any] = {}

    def open_host(host: Host) -> Any:
        if host.name not in clients:
            client = paramiko.SSHClient()
            for known in (*DEFAULT_KNOWN_HOSTS, *host.known_hosts_files):
                if known.is_file():
                    client.load_host_keys(str(known))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(host.address, port=host.port, username=host.user,
                           key_filename=str(host.key_file) if host.key_file else None,
                           timeout=15)
            backend = testinfra.backend.get_backend(
                f"paramiko://{host.user or 'root'}@{host.address}:{host.port}",
                sudo=host.become, sudo_user=host.become_user if host.become else None)
            backend.client = client  # fills testinfra's cached_property with our strict client
            clients[host.name] = testinfra.host.Host(backend)
        return clients[host.name]

    yield open_host
    for host in clients.values():
        host.backend.client.close()
