"""Ownership and restarts that matter, on one deployed mp replica (the lab's mp inventory).

In order, on one deployment: a hand edit of an env file that the running process never read
is reverted by `up` without restarting anything; a second inventory naming the same hosts
(replica `llm`, its own unit name: another replica id) is refused by `check` and `up`, naming
both replica ids, the lab inventory's path and this controller, then accepted with
`--take-over`, after which no unit of the old replica is left. The deployment is the session's
mp replica, held exclusively (the ``replicas`` broker's: reused when it knows it serving, else
deployed), brought up once more so that its state record names the processes running now.
The module ends with `down --purge` and tells the broker the hosts are purged.

Cost: about 91 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_support import provision

pytestmark = pytest.mark.lab

ENV_FILE = "/etc/vllm-provision/vllm.env"
NODES = ("h1", "h2")


@pytest.fixture(scope="module")
def deployed(replicas: Any, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[dict[str, Path]]:
    """The lab's mp replica after one good `up`, and a second inventory for the same hosts:
    replica `llm` with the unit `llm.service`. Ends with `down --purge` of whichever owns
    the hosts then."""
    with replicas.exclusive("mp") as lease:
        yield from _deployed(lease, tmp_path_factory.mktemp("ownership"))


def _deployed(lease: Any, folder: Path) -> Iterator[dict[str, Path]]:
    mine = Path(lease.replica.inventory)
    data = yaml.safe_load(mine.read_text())
    replicas = data["all"]["children"]["vllm_replicas"]["children"]
    group = replicas.pop("lab")
    group["vars"]["vllm_unit_name"] = "llm.service"
    replicas["llm"] = group
    other = folder / "llm.yml"
    other.write_text(yaml.safe_dump(data, sort_keys=False))
    paths = {"mine": mine, "other": other, "state": lease.replica.state_home}
    # The broker hands over a serving replica, but a module before this one may have restarted
    # its units since the last `up` (a heal, a fault): the state record then names processes
    # that no longer run, and `up` rightly restarts what it cannot prove read the restored file.
    # One `up` first makes the record describe the processes running now (no restart: nothing
    # changed), which is what the first test's claim is about.
    up = provision("up", "-i", str(mine), state_home=paths["state"])
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield paths
    finally:
        down = provision("down", "-i", str(other), "--purge", state_home=paths["state"])
        if down.returncode != 0:
            down = provision("down", "-i", str(mine), "--purge", state_home=paths["state"])
        assert down.returncode == 0, down.stdout + down.stderr
        lease.leave("purged")


def invocations(lab_host: Any, unit: str = "vllm.service") -> dict[str, str]:
    """InvocationID of ``unit`` on each node (systemd gives every start a new one)."""
    return {name: lab_host(name).check_output(f"systemctl show -p InvocationID --value {unit}")
            for name in NODES}


def test_reverted_hand_edit_the_process_never_read_restarts_nothing(
        deployed: dict[str, Path], lab_host: Any) -> None:
    h1 = lab_host("h1")
    before = invocations(lab_host)
    assert all(before.values()), before
    digest = h1.file(ENV_FILE).sha256sum
    h1.check_output(f"echo NCCL_DEBUG=INFO >> {ENV_FILE}")
    assert h1.file(ENV_FILE).sha256sum != digest
    up = provision("up", "-i", str(deployed["mine"]), state_home=deployed["state"])
    assert up.returncode == 0, up.stdout + up.stderr
    assert "file restored; running process unaffected" in up.stdout
    assert h1.file(ENV_FILE).sha256sum == digest
    assert invocations(lab_host) == before


def replica_id(inventory: str, name: str) -> str:
    """The owner id of replica ``name`` (``provision inventory --list``)."""
    listed = provision("inventory", "-i", inventory, "--list")
    assert listed.returncode == 0, listed.stderr
    return str(json.loads(listed.stdout)["_vllm_provision"]["replicas"][name]["replica_id"])


def test_second_inventory_is_refused_by_check_and_up(deployed: dict[str, Path],
                                                     lab_host: Any) -> None:
    # another replica name is another derived replica id (docs/deploy.md, "Who owns a host")
    mine, other = str(deployed["mine"].resolve()), str(deployed["other"].resolve())
    old_id, new_id = replica_id(mine, "lab"), replica_id(other, "llm")
    assert old_id != new_id
    old_owner = f"replica 'lab' (id {old_id}) of {mine} on {socket.gethostname()}"
    before = invocations(lab_host)
    check = provision("check", "-i", other, "--json", state_home=deployed["state"])
    assert check.returncode == 1, check.stdout + check.stderr
    errors = [f for f in json.loads(check.stdout)["findings"]
              if f["check"] == "ownership" and f["severity"] == "error"]
    assert sorted(f["host"] for f in errors) == list(NODES)
    assert all(old_owner == f["actual"] and "--take-over" in f["fix"]
               for f in errors), errors
    up = provision("up", "-i", other, state_home=deployed["state"])
    assert up.returncode == 1, up.stdout + up.stderr
    flat = " ".join(up.stderr.split())
    for name in NODES:
        assert (f"{name} belongs to {old_owner}, not to replica 'llm' (id {new_id}) of {other}"
                in flat), up.stderr
    assert invocations(lab_host) == before
    assert not lab_host("h1").file("/etc/systemd/system/llm.service").exists


def test_take_over_leaves_no_unit_of_the_old_replica(deployed: dict[str, Path],
                                                     lab_host: Any) -> None:
    up = provision("up", "-i", str(deployed["other"]), "--take-over",
                   state_home=deployed["state"])
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.count("removed unit vllm.service (stopped and disabled)") == 2, up.stdout
    for name in NODES:
        host = lab_host(name)
        assert not host.file("/etc/systemd/system/vllm.service").exists
        assert not host.service("vllm.service").is_running
        assert host.service("llm.service").is_running
        old = host.run("grep -l 'replica lab' /etc/systemd/system/*.service")
        assert old.rc == 1 and old.stdout == "", old.stdout
