"""The front door's HTTP API from the controller (vllm_provision/transport/router.py): the
worker list parsed, what each front door thinks of a replica, the only-healthy-worker rule,
and the client's reads and changes through the gateway host's SSH channel (a stand-in router,
tests/unit/router_support.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inventory_support import llama_yaml, write_inventory
from router_support import FakeRouter, ForwardingConnection, serving

from vllm_provision.core.errors import ProvisionError
from vllm_provision.inventory import load_inventory
from vllm_provision.transport import router

A, B = "http://10.0.0.11:8000", "http://10.0.0.13:8000"

GATEWAYS = """\
    vllm_gateways:
      vars:
        vllm_gateway_wheelhouse: wheels
      hosts:
        h3: {ansible_host: 10.0.0.13}
        h4: {ansible_host: 10.0.0.14, vllm_gateway_port: 31000}
"""


def _gateways(tmp_path: Path) -> list[router.Gateway]:
    inventory = load_inventory(write_inventory(tmp_path, llama_yaml("mp") + GATEWAYS))
    return router.front_doors(inventory)


def test_parse_workers_keeps_url_health_and_load() -> None:
    body = json.dumps({"workers": [
        {"url": A, "model_id": "unknown", "is_healthy": True, "load": 3},
        {"url": B, "is_healthy": False, "load": "x"}], "total": 2})
    assert router.parse_workers(body) == {A: router.WorkerView(A, True, 3),
                                          B: router.WorkerView(B, False, None)}
    for bad in ('{"total": 0}', '[]', '{"workers": [{"load": 1}]}', "503 Service Unavailable"):
        with pytest.raises(ValueError):
            router.parse_workers(bad)


def test_replica_view_per_gateway_healthy_unhealthy_absent_unknown() -> None:
    reads = {"h3": router.GatewayRead("h3", "u", {A: router.WorkerView(A, True, 2),
                                                  B: router.WorkerView(B, False, 0)}),
             "h4": router.GatewayRead("h4", "u", None, "h4: no connection")}
    assert router.replica_view(A, reads) == {
        "h3": {"state": "healthy", "load": 2, "error": None},
        "h4": {"state": "unknown", "load": None, "error": "h4: no connection"}}
    assert router.replica_view(B, reads)["h3"]["state"] == "unhealthy"
    assert router.replica_view("http://10.0.0.99:8000", reads)["h3"] == {
        "state": "absent", "load": None, "error": None}
    assert router.describe_view("h3", router.replica_view(A, reads)["h3"]) == (
        "front door h3: healthy (load 2)")
    assert router.describe_view("h4", router.replica_view(A, reads)["h4"]) == (
        "front door h4: unknown (h4: no connection)")


def test_only_healthy_counts_the_other_healthy_workers() -> None:
    assert router.only_healthy(A, {A: router.WorkerView(A, True, 0)})
    assert router.only_healthy(A, {A: router.WorkerView(A, True, 0),
                                   B: router.WorkerView(B, False, 0)})
    assert not router.only_healthy(A, {A: router.WorkerView(A, True, 0),
                                       B: router.WorkerView(B, True, 0)})
    assert router.only_healthy(A, {})


def test_front_doors_follow_the_inventory(tmp_path: Path) -> None:
    gateways = _gateways(tmp_path)
    assert [(g.host, g.local_host, g.port) for g in gateways] == [
        ("h3", "127.0.0.1", 30000), ("h4", "127.0.0.1", 31000)]
    assert gateways[0].workers == (A,)


def test_client_reads_removes_and_adds_through_the_host_channel(tmp_path: Path) -> None:
    gateway = _gateways(tmp_path)[0]
    with serving(FakeRouter({A: True, B: True})) as fake:
        conn = ForwardingConnection(fake.port)
        client = router.RouterClient(gateway, conn)
        assert set(client.workers()) == {A, B}
        assert client.remove(A) == f"Successfully removed worker: {A}"
        assert set(client.workers()) == {B}
        assert client.add(A, timeout_s=5) == f"Successfully added worker: {A}"
        assert client.add(A, timeout_s=5) == f"Worker {A} already exists"  # no error
        fake.unhealthy_add.add("http://10.0.0.99:8000")
        with pytest.raises(ProvisionError, match=r"h3 answered POST /add_worker\?url="
                                                 r"http://10.0.0.99:8000 with HTTP 400"):
            client.add("http://10.0.0.99:8000", timeout_s=5)
    # the URL travels as a query value, percent-encoded by the client and decoded intact
    assert fake.calls[:2] == [("/remove_worker", A), ("/add_worker", A)]
    # every request went through the gateway host's connection, to the router's own address
    assert set(conn.forwards) == {("127.0.0.1", 30000)}


def test_read_front_doors_one_bad_gateway_does_not_spoil_the_others(tmp_path: Path) -> None:
    gateways = _gateways(tmp_path)
    with serving(FakeRouter({A: True})) as fake:
        reads = router.read_front_doors(
            gateways, {"h3": ForwardingConnection(fake.port),
                       "h4": ForwardingConnection(fake.port, broken=True)}, timeout_s=5)
        alone = router.read_front_doors(gateways, {"h3": ForwardingConnection(fake.port)},
                                        {"h4": "h4: cannot connect to 10.0.0.14:22"})
    assert reads["h3"].workers == {A: router.WorkerView(A, True, 0)} and reads["h3"].error is None
    assert reads["h4"].workers is None
    assert "h4" in (reads["h4"].error or "") and "lost" in (reads["h4"].error or "")
    assert alone["h4"].error == "h4: cannot connect to 10.0.0.14:22"
    assert alone["h3"].to_json() == {"url": "http://127.0.0.1:30000", "error": None,
                                     "workers": [{"url": A, "is_healthy": True, "load": 0}]}
