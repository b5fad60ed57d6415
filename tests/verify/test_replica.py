"""Verify a deployed replica the way an operator would: units, files, sockets, HTTP.

The same suite runs on the lab (tests/lab/test_verify_suite.py) and on real servers
(``pytest tests/verify --inventory INVENTORY``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from vllm_provision import settings as resolver
from vllm_provision.core.models import Node, Replica
from vllm_provision.transport.api import Endpoint


def settings(replica: Replica) -> dict[str, Any]:
    """The replica's variables over the variables table's and roles' defaults
    (:func:`vllm_provision.settings.replica_settings`, the chain every command uses)."""
    return resolver.replica_settings(replica)


def _units_of(replica: Replica, node: Node) -> list[str]:
    return replica.backend_type.node_units(replica, node, settings(replica))


def _replica_of(node: Node, inventory: Any) -> Replica:
    replica = inventory.replica_of(node.name)
    assert replica is not None
    return replica


def test_units_are_enabled_and_running(node: Node, verify_inventory: Any, connect: Any) -> None:
    host = connect(node.host)
    for unit in _units_of(_replica_of(node, verify_inventory), node):
        service = host.service(unit)
        assert service.is_enabled, f"{node.name}: {unit} is not enabled (lost on reboot)"
        assert service.is_running, f"{node.name}: {unit} is not running"


def test_environment_file_is_root_only(node: Node, verify_inventory: Any, connect: Any) -> None:
    replica = _replica_of(node, verify_inventory)
    values = settings(replica)
    path = values[replica.backend_type.env_file_variable(node)]
    env_file = connect(node.host).file(path)
    assert env_file.exists and env_file.user == "root" and env_file.mode == 0o600
    assert re.search(rf'^VLLM_HOST_IP="?{re.escape(node.host_ip)}"?$', env_file.content_string,
                     re.MULTILINE), f"{node.name}: VLLM_HOST_IP is not {node.host_ip} in {path}"
    if node.gpus is not None:  # vllm_gpus: the node's processes see those GPUs only
        visible = ",".join(map(str, node.gpus))
        assert re.search(rf'^CUDA_VISIBLE_DEVICES="?{visible}"?$', env_file.content_string,
                         re.MULTILINE), f"{node.name}: CUDA_VISIBLE_DEVICES is not {visible} " \
                                        f"(vllm_gpus) in {path}"


def test_unit_runs_as_the_system_user(node: Node, verify_inventory: Any, connect: Any) -> None:
    replica = _replica_of(node, verify_inventory)
    values = settings(replica)
    user = connect(node.host).user(values["vllm_service_user"])
    assert user.exists and user.uid < 1000, "the service user must be a system user (vllm #54259)"


def test_master_listens_on_the_api_port(replica: Replica, connect: Any) -> None:
    host = connect(replica.master.host)
    port = replica.engine.api_port
    assert any(host.socket(f"tcp://{address}:{port}").is_listening
               for address in ("0.0.0.0", replica.engine.api_host, replica.master.host_ip))


def test_every_api_server_of_a_hybrid_replica_listens(node: Node, verify_inventory: Any,
                                                      connect: Any) -> None:
    """A hybrid data-parallel replica serves an API on every node (docs/serving.md); the
    others serve from rank 0 alone (rank 0's own test above)."""
    replica = _replica_of(node, verify_inventory)
    if not replica.hybrid or node.rank == 0:
        pytest.skip("one API server, rank 0's (tested above)")
    host = connect(node.host)
    port = replica.engine.api_port
    assert any(host.socket(f"tcp://{address}:{port}").is_listening
               for address in ("0.0.0.0", replica.engine.api_host, node.host_ip)), \
        f"{node.name}: its API server does not listen on port {port}"


def test_master_is_healthy_and_serves_the_model(replica: Replica, api_routes: Any) -> None:
    """``/health`` 200 and the model in ``/v1/models``, on the path ``provision`` uses
    (``vllm_api_via``: direct, or through rank 0's SSH connection)."""
    route = api_routes(replica)
    headers = ({"Authorization": f"Bearer {replica.engine.api_key}"}
               if replica.engine.api_key else {})
    with route.client(10) as client:
        assert client.get(f"{route.base_url}/health").status_code == 200, route.describe
        answer = client.get(f"{route.base_url}/v1/models", headers=headers)
        served = [m["id"] for m in json.loads(answer.content)["data"]]
    assert (replica.engine.served_model_name or replica.engine.model) in served


def test_master_serves_a_completion(replica: Replica, api_routes: Any) -> None:
    """One real streamed completion through rank 0's API (what `provision up` proves last)."""
    endpoint = Endpoint.for_replica(replica, timeout_s=60, route=api_routes(replica))
    completion = endpoint.complete(replica.engine.served_model_name or replica.engine.model,
                                   max_tokens=4)
    assert completion.text, f"{replica.name}: the completion returned no text"


def test_peer_watchdog_guards_the_node(node: Node, verify_inventory: Any, connect: Any) -> None:
    """The peer watchdog (docs/recovery.md) runs, listens, is released and bound to every peer;
    on rank 0 its completion probe has seen no failure since it armed."""
    values = settings(_replica_of(node, verify_inventory))
    host = connect(node.host)
    service = host.service(values["vllm_watchdog_unit_name"])
    assert service.is_enabled and service.is_running, \
        f"{node.name}: {values['vllm_watchdog_unit_name']} is not enabled and running"
    config = host.file(values["vllm_watchdog_config"])
    assert config.user == "root" and config.mode == 0o600, \
        f"{node.name}: {values['vllm_watchdog_config']} must be root 0600 (it may hold the API key)"
    port = int(values["vllm_watchdog_port"])
    assert host.socket(f"tcp://{node.host_ip}:{port}").is_listening, \
        f"{node.name}: the watchdog does not listen on {node.host_ip}:{port}"
    state = json.loads(host.file(values["vllm_watchdog_state_file"]).content_string)
    assert state["held_until"] is None, f"{node.name}: the watchdog is still held: {state}"
    assert state["whole"] is True, f"{node.name}: the watchdog is not bound to every peer: {state}"
    probe = state.get("probe") or {}
    if probe.get("enabled"):
        assert probe["consecutive_failures"] == 0 and probe["last_result"] in (None, "ok"), \
            f"{node.name}: the completion probe fails: {probe}"
