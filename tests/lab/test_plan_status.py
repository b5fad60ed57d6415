"""The dry run's plan, masked env-file diffs and `status` after `down`, on one mp replica.

The module holds the session's mp replica exclusively (the ``replicas`` broker's), deployed
with an API key: the broker reuses it when it knows it serving so, else runs its `up`. The tests
run in file order and the last one takes the replica down (the fixture's `down` then finds
nothing to do); the broker is told it is down.

Cost: about 98 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lab_support
import pytest

pytestmark = pytest.mark.lab

KEY = "sk-plan-lab-0123456789"
ENV_FILE = "/etc/vllm-provision/vllm.env"
RESTART = "Restart the replica's vLLM units"


WITH_KEY = ("-e", f"vllm_api_key={KEY}")


def provision(*args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with the API key (``options`` as there)."""
    return lab_support.provision(*args, *WITH_KEY, **options)


@pytest.fixture(scope="module")
def deployed(replicas: Any) -> Iterator[tuple[str, Path]]:
    """The mp replica after a good `up` with the API key (its record, with the start to
    serving, kept in the broker's private XDG_STATE_HOME for it)."""
    with replicas.exclusive("mp", WITH_KEY) as lease:
        inventory, state_home = lease.replica.inventory, lease.replica.state_home
        try:
            yield inventory, state_home
        finally:
            down = provision("down", "-i", inventory, state_home=state_home)
            assert down.returncode == 0, down.stdout + down.stderr
            lease.leave("down")


def check_json(deployed: tuple[str, Path], *extra: str) -> tuple[int, dict[str, Any], str]:
    inventory, state_home = deployed
    run = provision("up", "-i", inventory, "--check", "--json", *extra, state_home=state_home)
    assert KEY not in run.stdout + run.stderr
    return run.returncode, json.loads(run.stdout), run.stderr


def test_engine_change_plans_the_restart_in_order_with_the_outage(
        deployed: tuple[str, Path]) -> None:
    inventory, state_home = deployed
    record = next((state_home / "vllm-provision").glob("lab-mp-*.json"))
    last = json.loads(record.read_text())["replicas"]["lab"]["start_to_serving_s"]
    assert isinstance(last, float) and last > 0
    code, summary, stderr = check_json(deployed, "-e", "vllm_max_model_len=2048")
    assert code == 2, stderr
    plan = summary["plan"]
    steps = {step["handler"]: step for step in plan["steps"]}
    assert list(steps) == [RESTART], plan  # the watchdog's config does not change
    assert steps[RESTART]["hosts"] == ["h1", "h2"]  # the master first (docs/deploy.md)
    assert steps[RESTART]["replicas"] == ["lab"]
    assert plan["replicas"] == [{"replica": "lab", "unavailable": True, "stopped": False,
                                 "last_start_s": last}]
    assert plan["summary"] == (f"{plan['changes']} to change, 2 restarts, replica 'lab' would be "
                               f"unavailable (last start {last:.1f} s)")
    assert plan["summary"] in stderr  # the human plan, on stderr with --json
    # one daemon-reload per host, as the real run does (not one more for the watchdog's role)
    reloads = [t["host"] for t in summary["tasks"] if t["task"] == "Reload systemd if a unit "
               "file changed" and t["status"] == "changed"]
    assert sorted(reloads) == ["h1", "h2"]


def test_a_restart_of_the_serving_replica_needs_approval(lab: Any,
                                                        deployed: tuple[str, Path]) -> None:
    inventory, state_home = deployed

    def host_state() -> list[str]:
        return [lab.ssh(h, f"sha256sum {ENV_FILE}; systemctl show -p InvocationID vllm.service"
                        ).stdout for h in ("h1", "h2")]

    before = host_state()
    change = ("up", "-i", inventory, "-e", "vllm_max_model_len=2048")
    refused = provision(*change, state_home=state_home, approve=False,
                        stdin=subprocess.DEVNULL)  # no terminal, no --yes
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "approval needed" in refused.stderr and "--yes" in refused.stderr, refused.stderr
    assert "replica 'lab' would be unavailable" in refused.stdout  # the plan is shown
    master, slave = pty.openpty()  # a terminal that answers "no"
    try:
        os.write(master, b"no\n")
        declined = provision(*change, state_home=state_home, approve=False, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    assert declined.returncode == 1, declined.stdout + declined.stderr
    assert "Only 'yes' will be accepted" in declined.stdout + declined.stderr
    assert "up cancelled: nothing was changed." in declined.stdout + declined.stderr
    assert host_state() == before  # neither the env files nor the running vLLM changed


def test_no_change_plans_no_restart(deployed: tuple[str, Path]) -> None:
    code, summary, stderr = check_json(deployed)
    assert code == 0, stderr
    assert summary["plan"]["steps"] == [] and summary["plan"]["restarts"] == 0
    assert summary["plan"]["summary"] == "0 to change, 0 restarts, replica 'lab' keeps serving"


def test_env_file_hand_edit_is_a_line_diff_with_the_key_masked(lab: Any,
                                                               deployed: tuple[str, Path]) -> None:
    inventory, state_home = deployed
    edit = lab.ssh("h1", f"cp -p {ENV_FILE} /root/vllm.env.orig && "
                         f"echo NCCL_DEBUG=INFO >> {ENV_FILE}")
    assert edit.returncode == 0, edit.stderr
    try:
        drift = provision("drift", "-i", inventory, "--json", "--diff", state_home=state_home,
                          timeout=300)
        code, summary, _ = check_json(deployed, "--diff")
    finally:
        lab.ssh("h1", f"mv /root/vllm.env.orig {ENV_FILE}")
    assert KEY not in drift.stdout + drift.stderr
    (diff,) = [d["diff"] for d in json.loads(drift.stdout)["diffs"] if d["host"] == "h1"]
    (task,) = [t for t in summary["tasks"]
               if t["host"] == "h1" and t["task"].startswith("Install the vLLM environment")]
    for shown in (diff, task["diff"]):
        assert "-NCCL_DEBUG=INFO" in shown.splitlines(), shown
        assert ' VLLM_API_KEY="********"' in shown.splitlines() or \
            " VLLM_API_KEY=********" in shown.splitlines(), shown
    # the running vLLM started before the edit: `up` would restore the file and restart nothing
    # (docs/deploy.md, "Restarts only when they matter")
    assert code == 2 and "running process unaffected" in task["message"], task
    assert summary["plan"]["steps"] == [], summary["plan"]


def test_status_after_down_says_down_and_nothing_else(deployed: tuple[str, Path]) -> None:
    inventory, state_home = deployed
    planned = provision("down", "-i", inventory, "--check", "--json", state_home=state_home)
    plan = json.loads(planned.stdout)["plan"]
    assert [(s["action"], s["hosts"]) for s in plan["steps"]] == [("stop", ["h1", "h2"])]
    assert plan["summary"].endswith("replica 'lab' would stop serving"), plan
    down = provision("down", "-i", inventory, state_home=state_home)
    assert down.returncode == 0, down.stdout + down.stderr
    status = provision("status", "-i", inventory, state_home=state_home, timeout=120)
    assert (status.returncode, status.stdout) == (3, "lab: down\n"), status.stdout + status.stderr
    (info,) = json.loads(provision("status", "-i", inventory, "--json",
                                   state_home=state_home, timeout=120).stdout)["replicas"]
    assert info["down"] is True and info["whole"] is None
    assert all(not w["running"] and w["probe"] is None for w in info["watchdogs"].values())
