"""A host reached through a real OpenSSH jump host (ProxyJump in ``~/.ssh/config``).

On the lab, h1 is the bastion for h2: the controller's ``~/.ssh/config`` (a fresh ``$HOME``)
says ``Host <h2> / ProxyJump <h1>`` and gives h1 its user and key. The jump host's key is
checked like any host's (docs/engine.md, Connections): unknown under ``strict`` is refused naming
the jump host and the host it leads to; ``accept-new`` learns it once into the inventory's
known_hosts file; a changed key is refused even under ``accept-new``. h2's sshd log proves the
session came from h1.

Cost: about 7 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from lab_support import provision

pytestmark = pytest.mark.lab

PLAYBOOK = """\
- name: Reach the host
  hosts: all
  tasks:
    - name: Read the hostname
      command: cat /etc/hostname
      changed_when: false
"""


def address(lab: Any, host: str) -> str:
    return str(next(h.address for h in lab.hosts if h.name == host))


@pytest.fixture
def through_h1(lab: Any, tmp_path: Path) -> dict[str, Path]:
    """A fresh ``$HOME`` whose ssh config reaches h2 through h1, an inventory copy whose
    known_hosts file holds h2's key only, and a one-task playbook."""
    h1, h2 = address(lab, "h1"), address(lab, "h2")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    # as with `ssh -J`, the jump host's user and key come from its own Host block
    (home / ".ssh" / "config").write_text(
        f"Host {h2}\n    ProxyJump {h1}\n"
        f"Host {h1}\n    User root\n    IdentityFile {lab.key_file}\n")
    known = tmp_path / "known_hosts"
    lines = Path(lab.known_hosts).read_text().splitlines()
    # the lab writes "h2,10.213.0.12 ssh-ed25519 KEY": keep h2's key under its address only
    known.write_text("".join(f"{h2} {line.split(' ', 1)[1]}\n" for line in lines
                             if h2 in line.split(" ", 1)[0].split(",")))
    assert known.read_text(), f"the lab's known_hosts has no line for {h2}"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(Path(lab.inventory_path("mp")).read_text()
                         .replace(str(lab.known_hosts), str(known)))
    playbook = tmp_path / "reach.yml"
    playbook.write_text(PLAYBOOK)
    return {"home": home, "known": known, "inventory": inventory, "playbook": playbook}


def reach_h2(paths: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """``provision play`` of the one-task playbook on h2 only, with the fresh ``$HOME``."""
    return provision("play", "-i", str(paths["inventory"]), str(paths["playbook"]), "-l", "h2",
                     "--json", *args, timeout=120, env={"HOME": str(paths["home"])})


def test_unknown_jump_host_key_is_refused_then_learned_once_and_used(
        lab: Any, through_h1: dict[str, Path]) -> None:
    h1 = address(lab, "h1")
    refused = reach_h2(through_h1)
    assert refused.returncode != 0, refused.stdout
    out = refused.stdout + refused.stderr
    assert f"{h1}, the jump host (ProxyJump) for h2" in out, out
    assert "Traceback" not in out
    assert h1 not in through_h1["known"].read_text(), "strict must not learn a key"

    marker = lab.ssh("h2", "date +%s").stdout.strip()
    learned = reach_h2(through_h1, "--host-key-policy", "accept-new")
    assert learned.returncode == 0, learned.stdout + learned.stderr
    summary = json.loads(learned.stdout)
    assert [(t["host"], t["status"]) for t in summary["tasks"]] == [("h2", "ok")], summary
    jump_lines = [line for line in through_h1["known"].read_text().splitlines()
                  if line.split(" ", 1)[0] in (h1, f"[{h1}]:22")]
    assert len(jump_lines) == 1, through_h1["known"].read_text()
    # The session on h2 came from h1 (the jump host), not from the controller.
    log = lab.ssh("h2", f"journalctl -u ssh.service --since @{marker} --no-pager -o cat").stdout
    assert f"Accepted publickey for root from {h1}" in log, log

    again = reach_h2(through_h1)  # strict now passes: the jump host's key is known
    assert again.returncode == 0, again.stdout + again.stderr
    assert through_h1["known"].read_text().splitlines().count(jump_lines[0]) == 1


def test_changed_jump_host_key_is_refused_even_with_accept_new(
        lab: Any, through_h1: dict[str, Path]) -> None:
    h1 = address(lab, "h1")
    known = through_h1["known"]
    h2_line = known.read_text().splitlines()[0]
    # h1 "presents" a different key than the one on record: record h2's key under h1's name.
    known.write_text(known.read_text() + h2_line.replace(h2_line.split(" ", 1)[0], h1, 1) + "\n")
    before = known.read_text()
    proc = reach_h2(through_h1, "--host-key-policy", "accept-new")
    assert proc.returncode != 0, proc.stdout
    out = proc.stdout + proc.stderr
    assert "the jump host (ProxyJump) for h2" in out and h1 in out, out
    assert "Traceback" not in out
    assert known.read_text() == before, "a changed key must never be rewritten"
