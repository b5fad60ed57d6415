"""`provision up/down/restart/status` on the lab, mp and Ray backends.

One deployment per backend is shared by the read-only tests of its class (class-scoped
fixture: the hosts, held exclusively from the session's ``replicas`` broker, purged of our
replicas, which the broker does unless it knows them purged; then one real first ``provision
up``); tests that change the replica put it back as they found it, so the tests are
order-independent. At the end the mp class leaves its replica serving for the broker's next
user when none of its tests failed (else the broker is told it does not know the state); the Ray
class takes its replica down. The CLI runs as a subprocess, as an operator would run it; unit
states come from ``systemctl show`` over the lab's SSH and from pytest-testinfra.

Cost: about 758 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lab_support
import pytest

pytestmark = pytest.mark.lab

MODEL = "/srv/models/lab-model"
# Properties that change whenever systemd starts the unit's main process again.
START_PROPS = ("ExecMainStartTimestamp", "ExecMainStartTimestampMonotonic", "InvocationID",
               "MainPID", "NRestarts", "ActiveState")
# host -> our units on it, per backend (playbooks/up.yml; roles' default unit names).
UNITS = {"mp": {"h1": ["vllm.service"], "h2": ["vllm.service"]},
         "ray": {"h1": ["ray-head.service", "vllm.service"], "h2": ["ray-worker.service"]}}
ALL_UNITS = ("vllm.service", "ray-head.service", "ray-worker.service")
# (host, unit) -> its START_PROPS, as Deployment.units reads them
Units = dict[tuple[str, str], dict[str, str]]

# Run on the Ray head as the service user: each placement group with its bundles' node IPs,
# and each node's GPUs (Ray's API: ray.nodes(), placement_group_table()).
PG_SCRIPT = """
import json, sys
import ray
from ray.util import placement_group_table
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
gpus = {n["NodeManagerAddress"]: n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]}
groups = [{"state": pg["state"], "bundles": len(pg["bundles"]),
           "nodes": [ips.get(n) for n in pg.get("bundles_to_node_id", {}).values()]}
          for pg in placement_group_table().values()]
print("RAY " + json.dumps({"gpus": gpus, "groups": groups}))
"""


@dataclass
class Run:
    """One ``provision`` run: exit code, output and wall time (seconds)."""

    code: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.stdout))


@dataclass
class Deployment:
    """A replica deployed by one real first ``provision up`` (``first``) on the lab, its
    controller records in ``state_home``."""

    lab: Any
    backend: str
    state_home: Path
    first: Run = field(init=False)  # set by the fixture right after construction

    @property
    def inventory(self) -> str:
        return str(self.lab.inventory_path(self.backend))

    def provision(self, *args: str, timeout_s: float = 900) -> Run:
        """Run ``provision ARGS`` (:func:`lab_support.provision`); return its :class:`Run`.

        ``timeout_s`` only guards against a hang: it is longer than the product's own bounds
        (``ray_cluster_timeout_s`` 300 s, then the readiness wait), so that a slow start under
        the full suite's load ends with the product's own error, never the test's kill."""
        started = time.monotonic()
        proc = lab_support.provision(*args, state_home=self.state_home, timeout=timeout_s)
        return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    def up(self, *args: str, timeout_s: float = 900) -> Run:
        return self.provision("up", "-i", self.inventory, *args, timeout_s=timeout_s)

    def down(self, *args: str) -> Run:
        return self.provision("down", "-i", self.inventory, *args)

    def status(self) -> Run:
        return self.provision("status", "-i", self.inventory, "--json", timeout_s=120)

    def ssh(self, host: str, command: str, timeout_s: float = 60) -> str:
        result = self.lab.ssh(host, command, timeout_s=timeout_s)
        assert result.returncode == 0, f"{host}: {command}: {result.stderr}"
        return str(result.stdout)

    def address(self, host: str) -> str:
        return str(next(h.address for h in self.lab.hosts if h.name == host))

    def units(self) -> Units:
        """(host, unit) -> the :data:`START_PROPS` of every unit of this backend."""
        found = {}
        for host, units in UNITS[self.backend].items():
            for unit in units:
                out = self.ssh(host, f"systemctl show -p {','.join(START_PROPS)} {unit}")
                found[host, unit] = dict(line.split("=", 1) for line in out.splitlines()
                                         if "=" in line)
        return found

    def starts_since(self, host: str, unit: str, since: int) -> int:
        """How many times systemd logged ``Started`` for ``unit`` since ``since`` (epoch s)."""
        out = self.ssh(host, f"journalctl -u {unit} --since @{since} -o cat --no-pager")
        return sum(1 for line in out.splitlines() if line.startswith("Started "))


def wait_a_second() -> int:
    """Sleep past the current second (journal ``--since`` and timestamps have 1 s resolution)."""
    time.sleep(1.1)
    return int(time.time())


@pytest.fixture(scope="class")
def deployed(request: pytest.FixtureRequest, lab: Any,
             replicas: lab_support.ReplicaBroker) -> Iterator[Deployment]:
    """The class's backend (``backend`` class attribute) deployed once from nothing (the broker
    purges the hosts unless it knows them purged); mp is left serving when no test failed, Ray
    is taken down."""
    backend = request.cls.backend
    failed = request.session.testsfailed
    with replicas.exclusive(backend, start="purged") as lease:
        deployment = Deployment(lab, backend, lease.replica.state_home)
        deployment.first = first = deployment.up()
        assert first.code == 0, first.output
        yield deployment
        if backend == "mp":
            # every test put the replica back as it found it: serving, the inventory's arguments
            lease.leave("serving" if request.session.testsfailed == failed else "unknown")
        else:
            lease.leave("down" if deployment.down().code == 0 else "unknown")


def assert_serving_output(run: Run) -> None:
    """The recap prints the completion, the served model and the start-to-serving time."""
    assert run.code == 0, run.output
    assert re.search(rf"completion from {re.escape(MODEL)}: '.+'", run.stdout), run.stdout
    assert re.search(r"start to serving: \d+(\.\d+)? s", run.stdout), run.stdout


def second_up_summary(deployed: Deployment) -> dict[str, Any]:
    """``up --json`` on the deployed replica: it exits 0, changes and fails nothing and
    restarts no unit; return its summary."""
    before = deployed.units()
    run = deployed.up("--json")
    assert run.code == 0, run.output
    summary = run.json()
    assert summary["changed"] == 0 and summary["failed"] == 0
    assert deployed.units() == before
    return summary


def serving_replica(deployed: Deployment) -> dict[str, Any]:
    """``status --json`` exits 0 and its only replica is serving; return that replica."""
    run = deployed.status()
    assert run.code == 0, run.output
    (replica,) = run.json()["replicas"]
    assert replica["verdict"] == "serving"
    return dict(replica)


def assert_status_down(deployed: Deployment) -> None:
    """``status --json`` exits 3 and says the replica is down."""
    status = deployed.status()
    assert status.code == 3, status.output
    assert status.json()["replicas"][0]["verdict"] == "down"


def down_and_assert_stopped(deployed: Deployment, lab_host: Any) -> None:
    """``down`` exits 0, no unit of the replica runs on h1 or h2, and ``status`` says down."""
    run = deployed.down()
    assert run.code == 0, run.output
    for name in ("h1", "h2"):
        for unit in ALL_UNITS:
            assert not lab_host(name).service(unit).is_running, f"{name}:{unit}"
    assert_status_down(deployed)


@contextmanager
def max_model_len_changed(deployed: Deployment) -> Iterator[tuple[Units, Units, int]]:
    """``up -e vllm_max_model_len=4096`` (it must serve); yield the units before and after it
    and the second it started from; at the end ``up`` again, back to the inventory's
    arguments."""
    before = deployed.units()
    since = wait_a_second()
    try:
        run = deployed.up("-e", "vllm_max_model_len=4096")
        assert_serving_output(run)
        yield before, deployed.units(), since
    finally:
        assert_serving_output(deployed.up())


class TestMp:
    """mp backend: one vllm.service per node, rank 1 headless."""

    backend = "mp"

    def test_first_up_installs_and_prints_completion_and_start_to_serving(
            self, deployed: Deployment) -> None:
        assert_serving_output(deployed.first)
        assert re.search(r"changed=[1-9]\d* ok=\d+ failed=0 unreachable=0", deployed.first.stdout)
        assert "(already serving)" not in deployed.first.stdout

    def test_units_run_with_0600_env_file_and_rank_0_listens(
            self, deployed: Deployment, lab_host: Any) -> None:
        for name in ("h1", "h2"):
            host = lab_host(name)
            assert host.service("vllm.service").is_running
            assert host.service("vllm.service").is_enabled
            env = host.file("/etc/vllm-provision/vllm.env")
            assert env.mode == 0o600 and env.user == "root"
            assert re.search(rf'^VLLM_HOST_IP="?{re.escape(deployed.address(name))}"?$',
                             env.content_string, re.MULTILINE), env.content_string
        assert lab_host("h1").socket("tcp://0.0.0.0:8000").is_listening
        assert not lab_host("h2").socket("tcp://0.0.0.0:8000").is_listening  # headless

    def test_second_up_changes_nothing_and_restarts_nothing(self, deployed: Deployment) -> None:
        summary = second_up_summary(deployed)
        assert summary["already_serving"] is True

    def test_up_json_has_completion_served_model_and_timings(
            self, deployed: Deployment) -> None:
        summary = deployed.up("--json").json()
        assert summary["served_model"] == MODEL
        assert summary["completion"].strip()
        assert 0 < summary["ttft_s"] < 5
        assert summary["start_to_serving_s"] > 0
        assert summary["vllm_version"] == "0.33.0"

    def test_status_says_serving_and_exits_0(self, deployed: Deployment) -> None:
        replica = serving_replica(deployed)
        assert replica["health"] == 200
        assert {(u["host"], u["state"]) for u in replica["units"]} == {
            ("h1", "active (running)"), ("h2", "active (running)")}

    def test_check_diff_on_deployed_replica_exits_0(self, deployed: Deployment) -> None:
        run = deployed.up("--check", "--diff")
        assert run.code == 0, run.output

    def test_check_diff_on_changed_argument_exits_2_and_changes_nothing(
            self, deployed: Deployment) -> None:
        before = deployed.units()
        unit_file = deployed.ssh("h1", "cat /etc/systemd/system/vllm.service")
        run = deployed.up("--check", "--diff", "-e", "vllm_max_model_len=4096")
        assert run.code == 2, run.output
        assert "--max-model-len" in run.stdout and "4096" in run.stdout  # the diff
        assert deployed.ssh("h1", "cat /etc/systemd/system/vllm.service") == unit_file
        assert deployed.units() == before

    def test_changed_engine_argument_restarts_each_node_once(self, deployed: Deployment) -> None:
        with max_model_len_changed(deployed) as (before, after, since):
            for host in ("h1", "h2"):
                assert "--max-model-len 4096" in deployed.ssh(
                    host, "cat /etc/systemd/system/vllm.service")
                assert deployed.starts_since(host, "vllm.service", since) == 1
                old, new = before[host, "vllm.service"], after[host, "vllm.service"]
                assert new["InvocationID"] != old["InvocationID"]
                assert new["NRestarts"] == old["NRestarts"]  # stopped and started, no crash

    def test_changed_argument_after_rank0_restarted_alone_serves_with_it_on_both_nodes(
            self, deployed: Deployment) -> None:
        """rank 0 restarted on its own while the watchdogs are held (as a crash-looping unit
        auto-restarts after the fixing ``up``'s daemon-reload) waits with its rendezvous open;
        the old follower stays in its orphaned group. The ``up`` that changes an argument
        restarts the master first, so the follower joins the new rank 0, not the one the
        handler restarts away (docs/deploy.md, "A restart after a crash loop"); followers first,
        it would wait here until its readiness timeout."""
        lab_support.hold_watchdogs(deployed.lab, 300)
        deployed.ssh("h1", "systemctl restart vllm.service")
        try:
            run = deployed.up("-e", "vllm_max_model_len=4096", "-e", "vllm_ready_timeout_s=120")
            assert_serving_output(run)
            for host in ("h1", "h2"):
                command = deployed.ssh(host, "ps -o args= -p $(systemctl show -p MainPID "
                                             "--value vllm.service)")
                assert "--max-model-len 4096" in command, (host, command)
        finally:
            assert_serving_output(deployed.up())  # back to the inventory's arguments

    def test_restart_restarts_each_node_once_and_serves(self, deployed: Deployment) -> None:
        before = deployed.units()
        since = wait_a_second()
        run = deployed.provision("restart", "-i", deployed.inventory)
        assert_serving_output(run)
        after = deployed.units()
        for host in ("h1", "h2"):
            assert deployed.starts_since(host, "vllm.service", since) == 1
            assert after[host, "vllm.service"]["InvocationID"] != \
                before[host, "vllm.service"]["InvocationID"]

    def test_down_stops_everything_status_says_down_then_up_serves(
            self, deployed: Deployment, lab_host: Any) -> None:
        try:
            down_and_assert_stopped(deployed, lab_host)
            for name in ("h1", "h2"):
                host = lab_host(name)
                assert not host.service("vllm.service").is_enabled
                assert host.file("/etc/systemd/system/vllm.service").exists  # no --purge
        finally:
            again = deployed.up()
        assert_serving_output(again)
        assert "(already serving)" not in again.stdout
        # the last recorded start had the inventory's arguments too: the compile cache is there
        assert "(warm start)" in again.stdout, again.stdout
        replica = deployed.status().json()["replicas"][0]
        assert replica["verdict"] == "serving"
        assert set(replica["starts"]) == {"cold", "warm"}, replica["starts"]
        assert set(replica["starts"]["warm"]["phase_s"]) == {"h1", "h2"}, replica["starts"]

    def test_unit_crashing_at_start_ends_wait_within_seconds_with_journal(
            self, deployed: Deployment) -> None:
        try:
            # an option the release has (preflight passes it) with a value that fails at start:
            # a local tokenizer folder that is not there
            run = deployed.up("-e", "vllm_extra_args=[--tokenizer, /srv/models/no-such-tok]",
                              "-e", "vllm_ready_timeout_s=300")
            assert run.code == 1, run.output
            assert run.elapsed_s < 60  # not the 300 s timeout
            assert "Wait until rank 0 serves" in run.stdout
            assert "Incorrect path_or_model_id: '/srv/models/no-such-tok'" in run.output  # journal
            assert "Traceback" not in run.output
        finally:
            # stop the crash loop before the restoring up: units in auto-restart start by
            # themselves with the restored unit after the install's daemon-reload, and one that
            # starts between two steps of the handler's ordered restart joins a group the handler
            # then breaks (docs/testing.md, "A restore that did not serve")
            assert deployed.down().code == 0
            assert_serving_output(deployed.up())


# The lab's Ray replica takes a token (vllm_ray_auth: token, the default): a Ray driver of our
# own names the token file as the product's drivers do (docs/security.md).
RAY_AUTH = "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/var/lib/vllm/ray_auth_token"


class TestRay:
    """Ray backend: ray-head + vllm.service on rank 0, ray-worker on rank 1."""

    backend = "ray"

    def ray_state(self, deployed: Deployment) -> dict[str, Any]:
        """GPUs per node and placement groups, from Ray's API on the head."""
        script = base64.b64encode(PG_SCRIPT.encode()).decode()
        address = f"{deployed.address('h1')}:6379"
        out = deployed.ssh("h1", f"echo {script} | base64 -d > /tmp/vp-pg.py && runuser -u vllm "
                                 "-- env HOME=/var/lib/vllm RAY_USAGE_STATS_ENABLED=0 "
                                 f"{RAY_AUTH} "
                                 f"/opt/vllm/bin/python /tmp/vp-pg.py {address}", timeout_s=120)
        line = next(x for x in out.splitlines() if x.startswith("RAY "))
        return dict(json.loads(line[4:]))

    def test_first_up_installs_and_prints_completion_and_start_to_serving(
            self, deployed: Deployment) -> None:
        assert_serving_output(deployed.first)
        assert "(already serving)" not in deployed.first.stdout

    def test_units_run_where_they_belong(self, deployed: Deployment, lab_host: Any) -> None:
        h1, h2 = lab_host("h1"), lab_host("h2")
        assert h1.service("ray-head.service").is_running
        assert h1.service("vllm.service").is_running
        assert h2.service("ray-worker.service").is_running
        assert not h2.service("vllm.service").is_running  # vLLM runs on the head only
        assert h1.socket("tcp://0.0.0.0:8000").is_listening
        for host in (h1, h2):
            env = host.file("/etc/vllm-provision/ray.env")
            assert env.mode == 0o600
            assert re.search(r'^RAY_memory_monitor_refresh_ms="?0"?$', env.content_string,
                             re.MULTILINE), env.content_string

    def test_cluster_has_two_nodes_of_four_gpus_and_eight_bundles_four_per_node(
            self, deployed: Deployment) -> None:
        state = self.ray_state(deployed)
        ips = [deployed.address("h1"), deployed.address("h2")]
        assert state["gpus"] == {ip: 4.0 for ip in ips}
        placed = [g for g in state["groups"] if g["state"] == "CREATED"]
        assert len(placed) == 1, state["groups"]
        assert placed[0]["bundles"] == 8
        assert sorted(placed[0]["nodes"]) == sorted(ips * 4)

    def test_second_up_changes_nothing_and_restarts_nothing(self, deployed: Deployment) -> None:
        summary = second_up_summary(deployed)
        assert summary["completion"].strip() and summary["served_model"] == MODEL

    def test_drift_finds_nothing_right_after_up(self, deployed: Deployment) -> None:
        # its dry run renders the Ray units with the facts (--num-gpus), as up does
        run = deployed.provision("drift", "--json", "-i", str(deployed.inventory))
        assert run.code == 0, run.output
        assert run.json()["changes"] == [], run.output

    def test_status_says_serving_with_ray_nodes_and_gpus(self, deployed: Deployment) -> None:
        replica = serving_replica(deployed)
        assert sorted(replica["ray"]["nodes"]) == sorted(
            [deployed.address("h1"), deployed.address("h2")])
        assert replica["ray"]["gpus"] == 8

    def test_changed_engine_argument_restarts_only_vllm_once(self, deployed: Deployment) -> None:
        with max_model_len_changed(deployed) as (before, after, since):
            assert deployed.starts_since("h1", "vllm.service", since) == 1
            assert after["h1", "vllm.service"]["InvocationID"] != \
                before["h1", "vllm.service"]["InvocationID"]
            for key in (("h1", "ray-head.service"), ("h2", "ray-worker.service")):
                assert after[key] == before[key], key  # the Ray cluster is left alone

    def test_vllm_host_ip_in_vllm_env_is_refused_before_any_host_changes(
            self, deployed: Deployment) -> None:
        # VLLM_HOST_IP follows from vllm_host_ip (Ray's --node-ip-address too, docs/security.md):
        # an override in vllm_env is refused when the inventory loads, so no unit restarts.
        before = deployed.units()
        wrong = deployed.address("h1").rsplit(".", 1)[0] + ".99"
        run = deployed.up("-e", f"vllm_env={{VLLM_HOST_IP: {wrong}}}")
        assert run.code == 1, run.output
        assert "vllm_env" in run.output and "VLLM_HOST_IP" in run.output, run.output
        assert "set that variable instead" in run.output and "Traceback" not in run.output
        assert "PLAY RECAP" not in run.output, run.output
        assert deployed.units() == before

    def test_down_stops_every_unit_and_status_says_down(
            self, deployed: Deployment, lab_host: Any) -> None:
        try:
            down_and_assert_stopped(deployed, lab_host)
        finally:
            again = deployed.up()
        assert_serving_output(again)
