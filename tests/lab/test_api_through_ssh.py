"""Rank 0's API reached however the network allows (``vllm_api_via``, docs/deploy.md).

(a) The API bound to rank 0's loopback (``-e vllm_api_host=127.0.0.1``): ``check`` names the
path ``ssh via h1`` without trying the address, ``up`` waits and verifies through rank 0's SSH
connection, ``status`` reads ``/health`` and the verify suite passes, all through the tunnel.

(b) A bastion: the controller's packets to h1 are dropped (iptables in h1's network namespace,
source the lab bridge's address), so h1 is reached only through h2 (ProxyJump in a fresh
``$HOME``'s ``~/.ssh/config``, as tests/lab/test_jump_host.py does) and its API port not at all.
The API binds all interfaces again: ``check`` tries the address, sees no answer and chooses
``ssh via h1``; ``up`` restarts vLLM and waits through the tunnel; ``status``, a tiny
``bench`` and a ``fault`` (kill h2's vLLM unit, streams in flight) work the same way. h1's sshd
log proves the sessions came from h2, never from the controller.

Two deploys (one ``up`` each), through the broker's exclusive lease.

Cost: about 143 s on one lab worker alone (145 s after test_deploy left its replica), stand-in
tier; docs/testing.md, "Per module".
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_support import ReplicaBroker

pytestmark = pytest.mark.lab

LOOPBACK = ("-e", "vllm_api_host=127.0.0.1")


def api_path(replica: Any, *extra: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``provision check --json``'s ``api_path`` of the lab's replica."""
    run = replica.provision("check", "-i", replica.inventory, "--json", *extra, timeout=180,
                            env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    (entry,) = json.loads(run.stdout)["replicas"]
    return dict(entry["api_path"])


def test_api_on_rank_0_loopback_is_reached_through_ssh(replicas: ReplicaBroker) -> None:
    with replicas.exclusive("mp", LOOPBACK, start="stopped") as lease:
        replica = lease.replica
        path = api_path(replica, *LOOPBACK)
        assert (path["via"], path["path"]) == ("ssh", "ssh via h1"), path
        assert "loopback" in path["reason"], path

        up = replica.provision("up", "-i", replica.inventory, *LOOPBACK, timeout=600)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "API path: ssh via h1" in up.stdout, up.stdout[-3000:]
        status = replica.provision("status", "-i", replica.inventory, "--json", *LOOPBACK,
                                   timeout=120)
        assert status.returncode == 0, status.stdout + status.stderr
        (info,) = json.loads(status.stdout)["replicas"]
        assert (info["health"], info["api_path"], info["verdict"]) == (200, "ssh via h1",
                                                                      "serving"), info
        # vLLM listens on h1's loopback only: the controller's own direct try finds nothing
        listening = replicas.lab.ssh("h1", "ss -Htln 'sport = :8000'").stdout
        assert "127.0.0.1:8000" in listening and "0.0.0.0:8000" not in listening, listening
        verify = replica.provision("verify", "-i", replica.inventory, *LOOPBACK, timeout=300)
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
        lease.leave("serving")


@contextlib.contextmanager
def bastion(lab: Any, folder: Path) -> Iterator[dict[str, str]]:
    """h1 behind h2: the controller's packets to h1 dropped, a ``$HOME`` whose ssh config
    reaches h1 through h2. Yields the environment for ``provision``; lifts the block after
    (before the broker's lease ends: the broker reaches h1 directly)."""
    h1, h2 = lab.config.address("h1"), lab.config.address("h2")
    home = folder / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host {h1}\n    ProxyJump {h2}\n"
        f"Host {h2}\n    User root\n    IdentityFile {lab.key_file}\n")
    rule = ["-s", lab.config.bridge_address, "-j", "DROP"]
    iptables = ["ip", "netns", "exec", lab.config.netns("h1"), "iptables", "-w"]
    subprocess.run([*iptables, "-I", "INPUT", *rule], check=True, timeout=30)
    try:
        cut = subprocess.run(["ssh", "-F", str(lab.ssh_config), "-o", "ConnectTimeout=3", "h1",
                              "true"], capture_output=True, timeout=30, check=False)
        assert cut.returncode != 0, "the controller still reaches h1 directly"
        yield {"HOME": str(home)}
    finally:
        subprocess.run([*iptables, "-D", "INPUT", *rule], check=True, timeout=30)


def test_behind_a_bastion_up_status_bench_and_fault_go_through_ssh(
        replicas: ReplicaBroker, tmp_path: Path) -> None:
    lab = replicas.lab
    marker = lab.ssh("h1", "date +%s").stdout.strip()
    with replicas.exclusive("mp", start="any") as lease:
        replica = lease.replica
        with bastion(lab, tmp_path) as env:
            path = api_path(replica, env=env)
            assert (path["via"], path["path"], path["setting"]) == ("ssh", "ssh via h1", "auto")
            assert "not reachable from the controller" in path["reason"], path

            up = replica.provision("up", "-i", replica.inventory, "--json", timeout=600,
                                   env=env)
            assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
            (served,) = json.loads(up.stdout)["replicas"]
            assert served["served"] and served["api_path"]["path"] == "ssh via h1", served
            status = replica.provision("status", "-i", replica.inventory, "--json",
                                       timeout=120, env=env)
            assert status.returncode == 0, status.stdout + status.stderr
            (info,) = json.loads(status.stdout)["replicas"]
            assert (info["health"], info["api_path"]) == (200, "ssh via h1"), info

            bench = replica.provision("bench", "-i", replica.inventory, "--requests", "6",
                                      "--concurrency", "3", "--max-tokens", "8",
                                      "--prompt-tokens", "4", "--json", timeout=300, env=env)
            assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
            result = json.loads(bench.stdout)
            assert result["client"]["completed"] == 6, result["client"]
            assert result["conditions"]["api_path"] == "ssh via h1", result["conditions"]

            fault = replica.provision("fault", "-i", replica.inventory, "--kill", "h2",
                                      "--streams", "2", "--max-tokens", "200", "--bound", "150",
                                      timeout=400, env=env)
            assert fault.returncode == 0, fault.stdout[-3000:] + fault.stderr[-3000:]
            assert "serving again" in fault.stdout, fault.stdout
        lease.leave("serving")  # serving with the lab inventory's own values
    # while blocked, every session on h1 came from h2 (the jump host); the last line is this
    # read's own session, from the controller again
    journal = lab.ssh("h1", f"journalctl -u ssh.service --since @{marker} --no-pager -o cat")
    accepted = [line for line in journal.stdout.splitlines() if "Accepted publickey" in line]
    h2 = lab.config.address("h2")
    during = [line for line in accepted if f"from {lab.config.bridge_address} " not in line]
    assert during and all(f"from {h2} " in line for line in during), accepted
