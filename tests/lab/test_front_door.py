"""The front door (docs/front-door.md) on the lab, as an operator uses it.

The broker hands over the lab's two-node mp replica serving (held exclusively: the module stops
its vLLM unit and, at the end, takes it down). The module's inventory is the lab's mp inventory
plus the group ``vllm_gateways`` holding h1, whose ``vllm_gateway_wheelhouse`` is the lab's
download of vllm-router 0.1.17 and its pinned dependencies
(``vllm_provision_lab.router_wheels``; the hosts have no index). Then:

- ``provision up`` (the replica unchanged, so not restarted) sends the wheels, builds the
  router's venv on h1, installs and starts ``vllm-gateway.service`` and waits until the router
  reports the replica healthy; a completion sent to h1's gateway port is answered by the
  replica, and the router's ``/workers`` lists rank 0's API; a second ``up`` changes nothing;
- with the replica's rank-0 ``vllm.service`` stopped (watchdogs held), the router marks the
  worker unhealthy within 10 s (a check every 2 s, 2 failures) and answers a completion with
  503 (no healthy worker), itself still running; after ``provision restart`` (the operator's
  remedy, which ends once the router reports the worker healthy) the gateway serves again;
- ``provision status`` shows the router's view of the replica (``front door h1: healthy``);
- ``provision upgrade`` of the replica keeps it in the router (its only healthy worker: removed,
  the router would answer 503 to everything) and says so per gateway in ``--json``; a worker
  removed by hand (``POST /remove_worker``, as an upgrade cut short leaves it) is put back by
  the next ``provision up`` without restarting the router;
- ``provision down`` stops the front door with the replica (and disables it).

Cost: about 100 s on one lab instance alone (measured 89 s of tests, 2026-12-04: the first up
with the venv build on h1 and a second up 53 s, the stop and restart 24 s, down 11 s; plus the
broker's cold deploy of mp, 21 s; the status, upgrade and restore tests added 10.4 s, measured
2026-12-04 with h1's router venv already built: the module took 58 s then);
docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import lab_support
import pytest
import yaml

pytestmark = pytest.mark.lab

PORT = 30000  # vllm_gateway_port's default
UNIT = "vllm-gateway.service"


def _request(url: str, body: dict[str, Any] | None = None,
             timeout: float = 10) -> tuple[int, str]:
    """``(status, body text)`` of a GET (or a POST of ``body`` as JSON); status 0 when nothing
    answered."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (lab URL)
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def _complete(gateway: str) -> tuple[int, str]:
    return _request(f"{gateway}/v1/completions", {"model": "/srv/models/lab-model",
                                                  "prompt": "Hello", "max_tokens": 4})


def _until(what: str, check: Any, timeout: float) -> float:
    """Poll ``check()`` every 0.5 s until true; the seconds it took. AssertionError naming
    ``what`` and the last value after ``timeout``."""
    start = time.monotonic()
    last = None
    while time.monotonic() - start < timeout:
        last = check()
        if last is True or (isinstance(last, tuple) and last[0] is True):
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


@pytest.fixture(scope="module")
def front(lab: Any, replicas: Any, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict[str, Any]]:
    """The lab's mp replica serving, the module's inventory with the front door on h1, and the
    gateway's URL; takes the replica (and the gateway) down at the end."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    from vllm_provision_lab import router_wheels

    wheels = router_wheels.wheelhouse(fetch=True)
    folder = tmp_path_factory.mktemp("front-door")
    source = yaml.safe_load(lab.inventory_path("mp").read_text())
    source["all"]["children"]["vllm_gateways"] = {
        "vars": {"vllm_gateway_wheelhouse": str(wheels)}, "hosts": {"h1": {}}}
    inventory = folder / "front-door.yml"
    inventory.write_text(yaml.safe_dump(source, sort_keys=False))
    address = next(h.address for h in lab.hosts if h.name == "h1")
    with replicas.exclusive("mp", start="serving") as lease:
        state = lease.replica.state_home
        try:
            yield {"inventory": str(inventory), "state": state,
                   "gateway": f"http://{address}:{PORT}", "lab": lab, "lease": lease}
        finally:
            if lease.left != "down":  # a test failed before test_down_stops_the_front_door
                down = lab_support.provision("down", "-i", str(inventory), "--yes",
                                             state_home=state, timeout=300)
                assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
                lease.leave("down")


def test_up_installs_the_front_door_and_completions_pass_through_it(front):
    up = lab_support.provision("up", "-i", front["inventory"], "--yes", "--json",
                               state_home=front["state"], timeout=400)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    status, body = _complete(front["gateway"])
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"]
    status, body = _request(f"{front['gateway']}/workers")
    assert status == 200, body
    [worker] = json.loads(body)["workers"]
    address = front["gateway"].split("//")[1].rsplit(":", 1)[0]
    assert (worker["url"], worker["is_healthy"]) == (f"http://{address}:8000", True)
    again = lab_support.provision("up", "-i", front["inventory"], "--json",
                                  state_home=front["state"], timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert json.loads(again.stdout)["changed"] == 0, again.stdout[-2000:]


def test_status_shows_what_the_front_door_thinks_of_the_replica(front):
    run = lab_support.provision("status", "-i", front["inventory"], "--json",
                                state_home=front["state"], timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    document = json.loads(run.stdout)
    [info] = document["replicas"]
    assert info["front_door"]["h1"]["state"] == "healthy", info["front_door"]
    assert isinstance(info["front_door"]["h1"]["load"], int)
    assert document["gateways"]["h1"]["error"] is None
    text = lab_support.provision("status", "-i", front["inventory"],
                                 state_home=front["state"], timeout=120)
    assert "front door h1: healthy (load " in text.stdout, text.stdout[-2000:]


def test_upgrade_keeps_the_only_worker_in_and_up_puts_back_a_removed_one(front):
    # one replica: the router's only healthy worker is left in (removing it would answer
    # every request with 503 until it is back), and the upgrade goes on
    run = lab_support.provision("upgrade", "-i", front["inventory"], "--yes", "--json",
                                "--drain-timeout", "5", state_home=front["state"], timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [entry] = json.loads(run.stdout)["replicas"]
    assert entry["outcome"] == "upgraded", entry
    assert [(s["gateway"], s["phase"], s["action"]) for s in entry["front_door"]] == [
        ("h1", "drain", "kept")], entry["front_door"]
    assert "only healthy worker" in entry["front_door"][0]["detail"]
    # a drain cut short leaves the worker out of the running router; the next up puts it
    # back without restarting the router (module vllm_gateway_workers)
    worker = f"http://{front['gateway'].split('//')[1].rsplit(':', 1)[0]}:8000"
    pid = front["lab"].ssh("h1", f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    removed = urllib.request.Request(
        f"{front['gateway']}/remove_worker?url={urllib.parse.quote(worker, safe='')}",
        data=b"", method="POST")
    with urllib.request.urlopen(removed, timeout=10) as answer:  # noqa: S310 (lab URL)
        assert answer.status == 200
    assert json.loads(_request(f"{front['gateway']}/workers")[1])["workers"] == []
    up = lab_support.provision("up", "-i", front["inventory"], "--json",
                               state_home=front["state"], timeout=300)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    [back] = json.loads(_request(f"{front['gateway']}/workers")[1])["workers"]
    assert (back["url"], back["is_healthy"]) == (worker, True)
    assert front["lab"].ssh("h1", f"systemctl show -p MainPID --value {UNIT}"
                            ).stdout.strip() == pid  # the same router process


def test_a_stopped_replica_is_an_error_at_the_gateway_and_serves_after_restart(front):
    lab = front["lab"]
    lab_support.hold_watchdogs(lab, seconds=120)  # vLLM's and the router's own behaviour
    stopped = lab.ssh("h1", "systemctl stop vllm.service")
    assert stopped.returncode == 0, stopped.stderr
    seconds = _until("the router marks the worker unhealthy", lambda: (
        '"is_healthy":false' in _request(f"{front['gateway']}/workers")[1]), timeout=30)
    # 2 failed checks 2 s apart (vllm_gateway_health_check_interval_s, _failure_threshold)
    assert seconds < 10
    status, body = _complete(front["gateway"])
    assert status == 503, (status, body)
    assert lab.ssh("h1", f"systemctl is-active {UNIT}").stdout.strip() == "active"
    # the operator's remedy: restart the replica in order (it releases the watchdogs); its
    # start play waits until the router reports the worker healthy again
    restart = lab_support.provision("restart", "-i", front["inventory"], "--yes",
                                    state_home=front["state"], timeout=300)
    assert restart.returncode == 0, restart.stdout[-2000:] + restart.stderr[-2000:]
    status, body = _complete(front["gateway"])
    assert status == 200, (status, body)


def test_down_stops_the_front_door(front):
    down = lab_support.provision("down", "-i", front["inventory"], "--yes",
                                 state_home=front["state"], timeout=300)
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    front["lease"].leave("down")
    state = front["lab"].ssh("h1", f"systemctl is-active {UNIT}; systemctl is-enabled {UNIT}")
    assert state.stdout.split() == ["inactive", "disabled"], state.stdout
    assert _complete(front["gateway"])[0] == 0
