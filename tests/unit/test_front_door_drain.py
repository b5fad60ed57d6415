"""The upgrade's drain at the front door (vllm_provision/operations/front_door.py) against a
stand-in of vllm-router 0.1.17's worker routes (tests/unit/router_support.py): removed where
another worker is healthy, kept where it is the only healthy one, put back and waited for,
one failing gateway recorded without stopping the others; the records fit upgrade.json."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from inventory_support import llama_yaml, write_inventory
from router_support import FakeRouter, ForwardingConnection, serving

from vllm_provision.cli import json_schemas
from vllm_provision.core.errors import ProvisionError
from vllm_provision.inventory import load_inventory
from vllm_provision.operations import fleet, front_door
from vllm_provision.transport import router

A, B = "http://10.0.0.11:8000", "http://10.0.0.13:8000"
GATEWAYS = """\
    vllm_gateways:
      vars: {vllm_gateway_wheelhouse: wheels}
      hosts:
        h3: {ansible_host: 10.0.0.13}
        h4: {ansible_host: 10.0.0.14}
"""


@pytest.fixture
def gateways(tmp_path: Path) -> list[router.Gateway]:
    return router.front_doors(load_inventory(write_inventory(tmp_path,
                                                             llama_yaml("mp") + GATEWAYS)))


def _doors(gateways: list[router.Gateway], conns: dict[str, Any]) -> front_door.FrontDoors:
    def connect(host: str) -> Any:
        if conns[host] is None:
            raise ProvisionError.single(host, f"{host}: cannot connect to 10.0.0.14:22")
        return conns[host]
    return front_door.FrontDoors(gateways, connect)


@contextmanager
def _one_door(gateways: list[router.Gateway],
              workers: dict[str, bool]) -> Iterator[tuple[FakeRouter, front_door.FrontDoors]]:
    """The first gateway's router, serving ``workers`` (url -> healthy), and its front door."""
    with serving(FakeRouter(workers)) as fake:
        yield fake, _doors(gateways[:1], {"h3": ForwardingConnection(fake.port)})


def _actions(steps: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [(s["gateway"], s["action"], s["ok"]) for s in steps]


def test_drain_removes_where_another_worker_serves_and_undrain_puts_it_back(
        gateways: list[router.Gateway]) -> None:
    with _one_door(gateways, {A: True, B: True}) as (fake, doors):
        drained = doors.drain(A)
        assert _actions(drained) == [("h3", "removed", True)]
        assert list(fake.workers) == [B]
        undrained = doors.undrain(A, drained, timeout_s=5)
        assert _actions(undrained) == [("h3", "added", True)]
        assert fake.workers == {B: True, A: True}
    assert fake.calls == [("/remove_worker", A), ("/add_worker", A)]


def test_the_only_healthy_worker_is_kept_and_not_added_back(
        gateways: list[router.Gateway]) -> None:
    with _one_door(gateways, {A: True, B: False}) as (fake, doors):
        drained = doors.drain(A)
        assert _actions(drained) == [("h3", "kept", True)]
        assert "only healthy worker" in drained[0]["detail"]
        assert doors.undrain(A, drained, timeout_s=5) == []
        assert doors.drain("http://10.0.0.99:8000")[0]["action"] == "absent"
    assert fake.calls == [] and set(fake.workers) == {A, B}


def test_one_failing_gateway_is_recorded_and_the_other_still_drains(
        gateways: list[router.Gateway]) -> None:
    with serving(FakeRouter({A: True, B: True})) as fake:
        doors = _doors(gateways, {"h3": ForwardingConnection(fake.port), "h4": None})
        drained = doors.drain(A)
        assert _actions(drained) == [("h3", "removed", True), ("h4", "failed", False)]
        assert "h4" in drained[1]["detail"]
        fake.unhealthy_add.add(A)  # the router never sees it healthy: a refusal, recorded
        undrained = doors.undrain(A, drained, timeout_s=5)
    assert _actions(undrained) == [("h3", "failed", False)]
    assert "HTTP 400" in undrained[0]["detail"]


def test_replica_records_with_front_door_steps_fit_the_upgrade_schema(
        gateways: list[router.Gateway]) -> None:
    with _one_door(gateways, {A: True, B: True}) as (fake, doors):
        entry = fleet.ReplicaOutcome("llama", 1, A, outcome=fleet.UPGRADED)
        entry.front_door += doors.drain(A)
        entry.front_door += doors.undrain(A, entry.front_door, timeout_s=5)
    schema = json.loads(Path(json_schemas.path_of("upgrade")).read_text())
    item = schema["anyOf"][1]["properties"]["replicas"]["items"]
    record = json.loads(json.dumps(entry.to_json()))
    jsonschema.validate(record, item)
    assert [s["phase"] for s in record["front_door"]] == ["drain", "undrain"]
    record["front_door"][0]["action"] = "drained"
    with pytest.raises(jsonschema.ValidationError, match="drained"):
        jsonschema.validate(record, item)


# --- vllm_gateway_workers: the next up puts back what a cut-short drain left out -------------

def _module(check_mode: bool, url: str, workers: list[str]) -> Any:
    from types import SimpleNamespace

    from vllm_provision.modules import vllm_gateway_workers
    from vllm_provision.transport.local import LocalConnection

    ctx = SimpleNamespace(conn=LocalConnection(), check_mode=check_mode,
                          host=SimpleNamespace(name="h3"))
    return vllm_gateway_workers.run(ctx, {"url": url, "workers": workers, "timeout": 5,
                                          "wait": 1})


def test_up_puts_back_the_workers_the_running_router_lacks() -> None:
    with serving(FakeRouter({B: True})) as fake:
        url = f"http://127.0.0.1:{fake.port}"
        would = _module(True, url, [A, B])
        assert (would.status.value, would.data["missing"]) == ("changed", [A])
        assert fake.calls == []  # check mode sends nothing
        done = _module(False, url, [A, B])
        assert (done.status.value, done.data["added"]) == ("changed", [A])
        assert set(fake.workers) == {A, B}
        assert _module(False, url, [A, B]).status.value == "ok"
        fake.workers.pop(A)
        fake.unhealthy_add.add(A)  # not healthy in time: named, not a failure
        late = _module(False, url, [A, B])
        assert late.status.value == "ok" and "not added" in late.message
        assert "HTTP 400" in late.data["not_added"][A]
    dead = _module(False, url, [A])
    assert dead.status.value == "failed" and "did not answer GET /workers" in dead.message
    assert _module(True, url, [A]).status.value == "skipped"
