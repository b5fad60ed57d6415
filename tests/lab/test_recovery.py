"""Self-healing replica: faults injected while serving, recovery with no operator action.

The mp tests run on both lab tiers: the stand-in vLLM (``provision lab up``, inventory ``lab-mp``)
and real vLLM 0.32.0 on CPU (``provision lab up --vllm real``, inventory ``lab-real``, marker
``real_vllm``); the parameter whose vLLM the running lab does not have is skipped. The Ray tests
run on the stand-in tier (the real tier is mp only: docs/real-vllm.md).

Each test injects one fault on the lab (kill -9, systemctl stop/restart, raylet killed, reboot, a
headless node frozen with SIGSTOP: only rank 0's completion probe sees that one), then polls rank 0
from the controller every 0.5 s: ``GET /health`` and, when it says 200, one real completion. It
records the seconds from the fault to the first successful completion served by the *new* group
(rank 0's vLLM InvocationID changed: every mp fault restarts rank 0), asserts a generous bound
stated in the test for each tier (no timing goal: the stand-in loads in ``load_s`` = 5 s, real vLLM
on the lab's CPUs in 60-90 s), and:

* mp: rank 0 never reports healthy while it cannot serve: every ``/health`` 200 after the
  detection window (``DETECT_S``: the watchdog polls every second) comes with a successful
  completion (not for a frozen node: /health stays 200 until the probe's detection time);
* no unit of ours hits its start limit (``Result`` never ``start-limit-hit``) and every unit is
  active again at the end.

The CLI runs as a subprocess against the lab's generated inventories; unit state comes from
``systemctl show`` over the lab's SSH. Timings measured are printed (``pytest -s``) and
recorded in docs/recovery.md.

Cost: about 616 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lab_support
import pytest

pytestmark = pytest.mark.lab

DETECT_S = 3.0  # the watchdog polls every 1 s; a peer's unit state is read within 2 polls
UNITS = {"mp": {"h1": ["vllm.service", "vllm-watchdog.service"],
                "h2": ["vllm.service", "vllm-watchdog.service"]},
         "ray": {"h1": ["ray-head.service", "vllm.service", "vllm-watchdog.service"],
                 "h2": ["ray-worker.service", "vllm-watchdog.service"]}}


@dataclass
class Sample:
    """One poll: seconds since the fault, /health status (None: refused), completion ok."""

    t: float
    health: int | None
    served: bool


@dataclass
class Recovery:
    """What one fault looked like from the controller."""

    name: str
    seconds: float | None
    samples: list[Sample] = field(default_factory=list)

    def healthy_but_failing(self, after_s: float) -> list[Sample]:
        """Samples after ``after_s`` where /health said 200 but the completion failed."""
        return [s for s in self.samples if s.t >= after_s and s.health == 200 and not s.served]


@dataclass
class Replica:
    """A replica deployed on the lab by ``provision up`` (one backend)."""

    lab: Any
    backend: str
    kind: str = "standin"

    @property
    def inventory(self) -> str:
        """The lab's inventory for this backend and vLLM ("real" is the mp real-vLLM one)."""
        return str(self.lab.inventory_path("real" if self.kind == "real" else self.backend))

    @property
    def model(self) -> str:
        """The served model name of the inventory (what a client puts in ``model``)."""
        text = Path(self.inventory).read_text()
        match = re.search(r"vllm_served_model_name: (\S+)", text) or \
            re.search(r"vllm_model: (\S+)", text)
        assert match, f"{self.inventory} names no model"
        return match.group(1)

    def bound(self, standin_s: float, real_s: float) -> float:
        """The test's bound in seconds for this tier."""
        return real_s if self.kind == "real" else standin_s

    @property
    def base_url(self) -> str:
        return f"http://{self.address('h1')}:8000"

    def address(self, host: str) -> str:
        return str(next(h.address for h in self.lab.hosts if h.name == host))

    def ssh(self, host: str, command: str, timeout_s: float = 60) -> str:
        result = self.lab.ssh(host, command, timeout_s=timeout_s)
        assert result.returncode == 0, f"{host}: {command}: {result.stderr}"
        return str(result.stdout)

    def show(self, host: str, unit: str, *props: str) -> dict[str, str]:
        out = self.ssh(host, f"systemctl show -p {','.join(props)} {unit}")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def invocation(self) -> str:
        """rank 0's vLLM InvocationID ("" while it is not running or h1 does not answer)."""
        result = self.lab.ssh("h1", "systemctl show -p InvocationID,SubState vllm.service",
                              timeout_s=10)
        values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        return values.get("InvocationID", "") if values.get("SubState") == "running" else ""

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError):
            return None

    def complete(self) -> bool:
        return lab_support.complete(self.base_url, self.model)

    def watch(self, since: float, until_s: float) -> list[Sample]:
        """Poll ``/health`` (and a completion when it says 200) every 0.5 s until ``until_s``
        seconds after ``since`` (monotonic); the samples, timed from ``since``."""
        samples = []
        while time.monotonic() - since < until_s:
            health = self.health()
            samples.append(Sample(round(time.monotonic() - since, 2), health,
                                  health == 200 and self.complete()))
            time.sleep(0.5)
        return samples

    def recover(self, name: str, fault: Callable[[], None], bound_s: float,
                new_group: bool = True, serving_before: bool = True) -> Recovery:
        """Inject ``fault`` and poll until a completion succeeds (on a new rank 0 invocation
        when ``new_group``), or ``bound_s`` seconds passed."""
        if serving_before:
            assert self.complete(), "the replica must serve before the fault"
        before = self.invocation()
        started = time.monotonic()
        fault()
        recovery = Recovery(name, None)
        while time.monotonic() - started < bound_s:
            # Read the invocation first: a completion served by the old group just before the
            # watchdog restarted rank 0 does not count as recovered.
            current = self.invocation() if new_group else ""
            # the sample's time is when /health answered: a completion that then hangs until
            # its timeout must not move a 200 read right after the fault past DETECT_S
            now = time.monotonic() - started
            health = self.health()
            served = health == 200 and self.complete()
            recovery.samples.append(Sample(round(now, 2), health, served))
            if served and (not new_group or current not in ("", before)):
                recovery.seconds = round(now, 2)
                break
            time.sleep(0.5)
        print(f"\nrecovery [{self.kind}] {name}: {recovery.seconds} s (bound {bound_s:g} s)")
        return recovery

    def serve_again_if_broken(self) -> None:
        """Each test starts from a serving replica: when the one before it failed and left it
        broken (a unit stopped, failed or frozen), ``provision up`` puts it back, so that one
        failure does not fail the tests after it."""
        if self.complete():
            return
        print(f"\n[{self.kind}] {self.backend}: not serving at the start; provision up")
        self.lab.ssh("h2", "systemctl kill -s CONT vllm.service", timeout_s=30)
        result = lab_support.provision("up", "-i", self.inventory, timeout=900)
        assert result.returncode == 0, result.stdout + result.stderr
        deadline = time.monotonic() + self.bound(120, 420)
        while not self.complete():
            assert time.monotonic() < deadline, "provision up did not bring the replica back"
            time.sleep(1)

    def assert_no_start_limit_and_all_active(self) -> None:
        """Every unit of ours is active (running) and none hit its start limit."""
        deadline = time.monotonic() + 60
        while True:
            states = {(host, unit): self.show(host, unit, "ActiveState", "SubState", "Result",
                                              "NRestarts")
                      for host, units in UNITS[self.backend].items() for unit in units}
            assert not [k for k, v in states.items() if v["Result"] == "start-limit-hit"], states
            if all(v["SubState"] == "running" for v in states.values()):
                return
            assert time.monotonic() < deadline, f"not all units running: {states}"
            time.sleep(1)


def _deploy(lab: Any, backend: str, kind: str) -> Iterator[Replica]:
    if lab.vllm != kind:
        pytest.skip(f"the lab runs the {lab.vllm} vLLM; this needs `provision lab up --vllm "
                    f"{kind}`")
    replica = Replica(lab, backend, kind)
    # Every inventory uses vllm.service: another one's replica is purged first (it owns the
    # hosts; a refused purge changes nothing). This one's own is not: `up` converges it, and
    # when it already serves (on the real tier test_real_vllm leaves it so) that `up` changes
    # nothing instead of paying for a cold install and a real vLLM start.
    for other in {"mp", "ray", "real"} - {"real" if kind == "real" else backend}:
        lab_support.provision("down", "-i", str(lab.inventory_path(other)), "--purge")
    result = lab_support.provision("up", "-i", replica.inventory, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield replica
    finally:
        down = lab_support.provision("down", "-i", replica.inventory, "--purge")
        assert down.returncode == 0, down.stdout + down.stderr


KINDS = [pytest.param("standin", id="standin"),
         pytest.param("real", id="real", marks=pytest.mark.real_vllm)]


@pytest.fixture(scope="class", params=KINDS)
def mp(request: pytest.FixtureRequest, lab: Any) -> Iterator[Replica]:
    """An mp replica (h1 rank 0, h2 headless) serving on the lab's vLLM; purged at the end."""
    yield from _deploy(lab, "mp", str(request.param))


@pytest.fixture(scope="class")
def ray(lab: Any) -> Iterator[Replica]:
    """A Ray replica (head h1 with vLLM, worker h2) on the stand-in; purged at the end."""
    yield from _deploy(lab, "ray", "standin")


def _kill_main(replica: Replica, host: str, unit: str = "vllm.service") -> Callable[[], None]:
    return lambda: replica.ssh(host, f"kill -9 $(systemctl show -p MainPID --value {unit})")


class TestMp:
    """mp replica: h1 is rank 0 (HTTP), h2 runs --headless."""

    @pytest.fixture(autouse=True)
    def _serving(self, mp: Replica) -> None:
        mp.serve_again_if_broken()

    def test_kill_9_of_the_headless_node_recovers_and_rank0_never_lies(self, mp: Replica
                                                                       ) -> None:
        # Bound: detection (~1 s) + the orphaned worker's SIGKILL after TimeoutStopSec (15 s)
        # + RestartSec (5 s) + load (stand-in 5 s, real 60-90 s); 90 s / 360 s are generous.
        recovery = mp.recover("kill -9 headless", _kill_main(mp, "h2"),
                              bound_s=mp.bound(90, 360))
        assert recovery.seconds is not None, recovery.samples[-5:]
        assert not recovery.healthy_but_failing(DETECT_S), recovery.samples
        # rank 0 stopped serving at some point: the group was rebuilt, not patched.
        assert any(s.health is None for s in recovery.samples)
        mp.assert_no_start_limit_and_all_active()

    def test_kill_9_of_rank0_recovers_the_headless_node_too(self, mp: Replica) -> None:
        before = mp.show("h2", "vllm.service", "InvocationID")["InvocationID"]
        # Bound: rank 0's leftover processes stopped (up to TimeoutStopSec, 15 s) + RestartSec
        # (5 s) + load (stand-in 5 s, real 60-90 s); 60 s / 360 s are generous.
        recovery = mp.recover("kill -9 rank 0", _kill_main(mp, "h1"), bound_s=mp.bound(60, 360))
        assert recovery.seconds is not None, recovery.samples[-5:]
        assert not recovery.healthy_but_failing(DETECT_S), recovery.samples
        # Real vLLM's follower stays up forever after rank 0 died: the watchdog restarted it.
        assert mp.show("h2", "vllm.service", "InvocationID")["InvocationID"] != before
        mp.assert_no_start_limit_and_all_active()

    def test_stop_of_the_headless_unit_then_start(self, mp: Replica) -> None:
        stopped_at = time.monotonic()
        mp.ssh("h2", "systemctl stop vllm.service")
        samples = mp.watch(stopped_at, 15)  # the follower stays stopped for 15 s
        assert not Recovery("stop", None, samples).healthy_but_failing(DETECT_S), samples
        assert all(s.health != 200 for s in samples if s.t >= DETECT_S), samples
        # An operator's stop is respected: the watchdog never starts a stopped unit.
        assert mp.show("h2", "vllm.service", "ActiveState")["ActiveState"] == "inactive"
        # Bound: rank 0 already waits for its peer; the follower joins and both load
        # (stand-in 5 s, real 60-90 s); 60 s / 300 s.
        recovery = mp.recover("systemctl start headless",
                              lambda: mp.ssh("h2", "systemctl start vllm.service"),
                              bound_s=mp.bound(60, 300), new_group=False, serving_before=False)
        assert recovery.seconds is not None, recovery.samples[-5:]
        mp.assert_no_start_limit_and_all_active()

    def test_partition_of_the_headless_host_status_reports_it_then_the_replica_heals(
            self, mp: Replica) -> None:
        """The headless host's traffic is dropped for 20 s: rank 0 stops reporting healthy
        once the watchdog's grace (5 s) passed, ``provision status`` reports the node
        unreachable (exit 1, verdict not serving) instead of aborting, and after the heal the
        replica serves again with no operator action."""
        assert mp.complete(), "the replica must serve before the fault"
        grace_s = 5.0  # vllm_watchdog_grace_s: a peer's watchdog silent this long is lost
        cut_at = time.monotonic()
        mp.lab.cut("h2")
        try:
            samples = mp.watch(cut_at, 12)
            assert not Recovery("cut", None, samples).healthy_but_failing(grace_s + DETECT_S), \
                samples
            status = lab_support.provision("status", "-i", mp.inventory, "--json", "--timeout",
                                           "5", timeout=120)
            assert status.returncode == 1, status.stdout + status.stderr
            (info,) = json.loads(status.stdout)["replicas"]
            assert set(info["unreachable"]) == {"h2"}, info
            assert mp.address("h2") in info["unreachable"]["h2"], info
            assert info["whole"] is False and info["verdict"] != "serving", info
            assert "Traceback" not in status.stderr
            time.sleep(max(0.0, 20 - (time.monotonic() - cut_at)))  # a 20 s partition
        finally:
            mp.lab.heal("h2")
        # Bound: the follower retries its master until the heal (or restarts after its init
        # timeout), joins, both load; 120 s / 420 s.
        recovery = mp.recover("partition of the headless host healed", lambda: None,
                              bound_s=mp.bound(120, 420), new_group=False, serving_before=False)
        assert recovery.seconds is not None, recovery.samples[-5:]
        mp.assert_no_start_limit_and_all_active()

    def test_frozen_headless_node_is_restarted_by_the_completion_probe(self, mp: Replica
                                                                         ) -> None:
        """``systemctl kill -s STOP`` of the headless unit: every unit stays running and rank 0's
        /health stays 200 while its completions hang, so only rank 0's completion probe can
        notice; it restarts rank 0 and the follower's watchdog restarts the follower. Short
        probe settings for this test only (``-e``), which restart the watchdogs, not vLLM."""
        short = ["-e", "vllm_watchdog_probe_interval_s=3", "-e", "vllm_watchdog_probe_timeout_s=5",
                 "-e", "vllm_watchdog_probe_failures=2"]
        journal = ("journalctl -u vllm-watchdog.service -b --no-pager -o cat | "
                   "grep -c 'probe: restarting vllm.service' || true")

        def invocations() -> dict[str, str]:
            return {h: mp.show(h, "vllm.service", "InvocationID")["InvocationID"]
                    for h in ("h1", "h2")}

        def probe_state() -> dict[str, Any]:
            text = mp.lab.ssh("h1", "cat /run/vllm-provision/watchdog.json", timeout_s=10).stdout
            try:
                return dict(json.loads(text).get("probe") or {})
            except ValueError:
                return {}

        before = invocations()
        up = lab_support.provision("up", "-i", mp.inventory, *short, timeout=900)
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            assert invocations() == before, "new probe settings must restart no vLLM unit"
            config = json.loads(mp.ssh("h1", "cat /etc/vllm-provision/watchdog.json"))
            assert config["settings"]["probe_failures"] == 2, config["settings"]
            assert mp.ssh("h1", "stat -c %a /etc/vllm-provision/watchdog.json").strip() == "600"
            deadline = time.monotonic() + 30
            while not (probe_state().get("armed") and probe_state().get("last_result") == "ok"):
                assert time.monotonic() < deadline, probe_state()
                time.sleep(1)
            restarts_before = int(mp.ssh("h1", journal).strip() or 0)
            # Bound: detection <= interval 3 s + 2 x (timeout 5 s + 1 s poll) = 15 s; rank 0's
            # stop (up to TimeoutStopSec 15 s if its hung engine ignores SIGTERM) + RestartSec 5 s;
            # the follower restarted by its watchdog (SIGTERM, then systemd's SIGCONT; up to 15 s
            # + RestartSec 5 s); load (stand-in 5 s, real 60-90 s). About 60 s / 145 s at worst;
            # 90 s / 360 s as for the other mp faults on the lab's 2 shared CPUs.
            recovery = mp.recover("SIGSTOP headless",
                                  lambda: mp.ssh("h2", "systemctl kill -s STOP vllm.service"),
                                  bound_s=mp.bound(90, 360))
            assert recovery.seconds is not None, recovery.samples[-5:]
            # The fault is the one the rules cannot see: /health 200 while a completion hangs.
            assert recovery.healthy_but_failing(0.0), recovery.samples[:5]
            assert int(mp.ssh("h1", journal).strip() or 0) > restarts_before, \
                mp.ssh("h1", "journalctl -u vllm-watchdog.service -b --no-pager -n 30")
            assert probe_state().get("restarts", 0) >= 1, probe_state()
            assert invocations()["h2"] != before["h2"], "the follower was restarted too"
            mp.assert_no_start_limit_and_all_active()
        finally:
            # a failed test must not leave h2 frozen (harmless when nothing is stopped)
            mp.lab.ssh("h2", "systemctl kill -s CONT vllm.service", timeout_s=30)
            reset = lab_support.provision("up", "-i", mp.inventory, timeout=900)
            assert reset.returncode == 0, reset.stdout + reset.stderr

    def test_reboot_of_the_headless_host(self, mp: Replica) -> None:
        # Bound: reboot (~10-20 s in the lab) + start at boot + rendezvous + load; 180 s / 420 s.
        recovery = mp.recover("reboot headless host", lambda: mp.lab.reboot("h2"),
                              bound_s=mp.bound(180, 420))
        assert recovery.seconds is not None, recovery.samples[-5:]
        assert not recovery.healthy_but_failing(DETECT_S), recovery.samples
        mp.assert_no_start_limit_and_all_active()

    def test_reboot_of_both_hosts(self, mp: Replica) -> None:
        def reboot_both() -> None:
            threads = [threading.Thread(target=mp.lab.reboot, args=(h,)) for h in ("h1", "h2")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        # Bound: both reboots + start at boot + the follower's retries until rank 0 listens +
        # load; 240 s / 480 s.
        recovery = mp.recover("reboot both hosts", reboot_both, bound_s=mp.bound(240, 480))
        assert recovery.seconds is not None, recovery.samples[-5:]
        mp.assert_no_start_limit_and_all_active()


class TestRay:
    """Ray replica: h1 runs the Ray head and vLLM, h2 a Ray worker."""

    @pytest.fixture(autouse=True)
    def _serving(self, ray: Replica) -> None:
        ray.serve_again_if_broken()

    def test_kill_9_of_the_workers_raylet(self, ray: Replica) -> None:
        # Bound: the raylet's death ends `ray start --block` (Restart=always, 5 s) and the vLLM
        # actor on h2 (vLLM exits 1, restarts, waits for the placement group); 180 s.
        recovery = ray.recover("kill -9 worker raylet",
                               lambda: ray.ssh("h2", "kill -9 $(pgrep -x raylet)"), bound_s=180)
        assert recovery.seconds is not None, recovery.samples[-5:]
        ray.assert_no_start_limit_and_all_active()

    def test_restart_of_the_head_unit(self, ray: Replica) -> None:
        # Bound: the watchdogs restart the worker and vLLM after the head; 180 s.
        recovery = ray.recover("systemctl restart ray-head",
                               lambda: ray.ssh("h1", "systemctl restart ray-head.service"),
                               bound_s=180)
        assert recovery.seconds is not None, recovery.samples[-5:]
        ray.assert_no_start_limit_and_all_active()

    def test_kill_9_of_vllm_on_the_head(self, ray: Replica) -> None:
        # Bound: RestartSec (5 s) + ray.init + placement + load; 120 s.
        recovery = ray.recover("kill -9 vLLM on the head", _kill_main(ray, "h1"), bound_s=120)
        assert recovery.seconds is not None, recovery.samples[-5:]
        ray.assert_no_start_limit_and_all_active()

    def test_reboot_of_the_worker_host(self, ray: Replica) -> None:
        recovery = ray.recover("reboot Ray worker host", lambda: ray.lab.reboot("h2"),
                               bound_s=240)
        assert recovery.seconds is not None, recovery.samples[-5:]
        ray.assert_no_start_limit_and_all_active()
