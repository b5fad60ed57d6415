"""A start that stalls (docs/deploy.md, "A start that stalls"): the stand-in vLLM of h2 stops in
one phase for ever (``provision lab set h2 stall=load``: after ``Starting to load model``, the
line real vLLM prints there, and nothing more; docs/lab-standin.md), and ``up`` with
``vllm_stall_timeout_s=10`` must end long before its readiness timeout (900 s here), exit 1,
name h2, its phase (loading weights) and the remedy of that phase, and leave the replica
stopped in reverse start order (mp: rank 0 h1, then h2), as its message says. The loading
phase's budget is set to 3 s: h2 goes over it before the stall ends the wait, and ``up`` warns
once for it (docs/deploy.md, "Phase budgets").

The elapsed bound is a hang detector, not a timing goal: without the stall rule the run would
wait out ``vllm_ready_timeout_s``. The stand-in's stall code is the guest package written at
``lab up``: a lab set up from an older checkout serves instead (the test then fails at the exit
code).

Through the broker's exclusive lease on the mp replica, handed over stopped; the stall is
cleared (``stall=default``) and the replica taken down (watchdogs too) before the lease is left
``down``.

Cost: about 110 s on one lab instance alone as first estimated (measured alone on 2026-12-04: 60 s):
the broker's down (10 s),
this up (preflight and install about 30 s, the stall found about 15 s after the start, the stop
about 30 s: both vLLM units ignore SIGTERM while loading and end at TimeoutStopSec), the down
after it (10 s); stand-in tier; docs/testing.md, "Per module".
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from lab_support import ReplicaBroker, provision

from vllm_provision.transport.api import parse_timestamp

pytestmark = pytest.mark.lab

STALL_S = 10
READY_TIMEOUT_S = 900
BOUND_S = 420  # far below READY_TIMEOUT_S: a hang detector, not a timing goal


def inactive_since(lab: Any, host: str) -> float | None:
    """When ``vllm.service`` on ``host`` last became inactive (its host's wall clock, s)."""
    shown = lab.ssh(host, "TZ=UTC systemctl show -p InactiveEnterTimestamp --value "
                          "vllm.service").stdout.strip()
    return parse_timestamp(shown)


def test_a_stalled_start_ends_at_the_stall_timeout_naming_the_node_and_phase(
        replicas: ReplicaBroker, lab: Any) -> None:
    with replicas.exclusive("mp", start="stopped") as lease:
        replica = lease.replica
        set_stall = provision("lab", "set", "h2", "stall=load", timeout=120)
        assert set_stall.returncode == 0, set_stall.stderr
        try:
            started = time.monotonic()
            run = replica.provision("up", "-i", replica.inventory,
                                    "-e", f"vllm_stall_timeout_s={STALL_S}",
                                    "-e", f"vllm_ready_timeout_s={READY_TIMEOUT_S}",
                                    "-e", '{"vllm_phase_budgets_s": {"loading weights": 3}}',
                                    timeout=READY_TIMEOUT_S + 300)
            elapsed = time.monotonic() - started
        finally:
            cleared = provision("lab", "set", "h2", "stall=default", timeout=120)
        assert cleared.returncode == 0, cleared.stderr
        output = run.stdout + run.stderr
        assert run.returncode == 1, output[-3000:]
        assert elapsed < BOUND_S, (elapsed, output[-3000:])
        assert "the start stalled" in output, output[-3000:]
        assert "h2:vllm.service" in output
        silent = re.search(r"progressed for ([0-9.]+) s \(vllm_stall_timeout_s 10\)", output)
        assert silent is not None and STALL_S <= float(silent.group(1)) < STALL_S + 60, output
        assert "phase 'loading weights'" in output
        # before the stall ended it, the phase went over the 3 s budget: one warning, per node
        budget = re.findall(r"warning: \S+: (h\d) has been in phase 'loading weights' for "
                            r"\d+ s, over its budget of 3 s \(vllm_phase_budgets_s\)", output)
        assert "h2" in budget and len(budget) == len(set(budget)), output[-3000:]
        assert "slow mount" in output  # the remedy of that phase
        assert "Starting to load model" in output  # h2's last journal lines
        assert ("stopped the replica in reverse start order: h1 vllm.service, h2 vllm.service"
                in output)
        for host in ("h1", "h2"):
            state = lab.ssh(host, "systemctl is-active vllm.service").stdout.strip()
            assert state in ("inactive", "failed"), (host, state)
        h1, h2 = inactive_since(lab, "h1"), inactive_since(lab, "h2")
        assert h1 is not None and h2 is not None and h1 <= h2  # rank 0 first
        down = replica.provision("down", "-i", replica.inventory, timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        lease.leave("down")
