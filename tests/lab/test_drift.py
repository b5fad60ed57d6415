"""`provision drift` on the lab: clean after a good `up`, then one kind of drift per test
(a changed NCCL on h2, a hand-edited unit on h1, an inventory edit through -e), and no record
at all. The tests read the session's mp replica (the ``replicas`` broker's, deployed only when
the broker does not know it serving) and each undoes its own change, so it is left serving.

Cost: about 103 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lab_support import provision

pytestmark = pytest.mark.lab

UNIT = "/etc/systemd/system/vllm.service"


@pytest.fixture(scope="module")
def deployed(replicas: Any) -> tuple[str, Path]:
    """The serving mp replica after a good `provision up` (its record in the broker's private
    XDG_STATE_HOME for it)."""
    replica = replicas.serving("mp")
    return replica.inventory, replica.state_home


def drift(deployed: tuple[str, Path], *extra: str) -> tuple[int, dict[str, Any]]:
    inventory, state_home = deployed
    result = provision("drift", "-i", inventory, "--json", *extra, state_home=state_home,
                       timeout=300)
    return result.returncode, json.loads(result.stdout)


def test_no_drift_right_after_up(deployed: tuple[str, Path]) -> None:
    code, outcome = drift(deployed)
    assert (code, outcome["drift"], outcome["changes"], outcome["errors"]) == (0, False, [], {})
    assert outcome["record"]["source"].startswith(str(deployed[1]))


def test_changed_nccl_on_h2_is_facts_drift(lab: Any, deployed: tuple[str, Path]) -> None:
    inventory, state_home = deployed
    assert provision("lab", "set", "h2", "nccl=2.27.3", state_home=state_home).returncode == 0
    try:
        code, outcome = drift(deployed)
        human = provision("drift", "-i", inventory, state_home=state_home, timeout=300)
    finally:
        provision("lab", "set", "h2", "nccl=default", state_home=state_home)
    assert code == 2
    assert {"host": "h2", "item": "NCCL", "recorded": "2.28.9", "current": "2.27.3",
            "kind": "facts"} in outcome["changes"]
    assert human.returncode == 2
    assert "~ h2  NCCL  2.28.9 -> 2.27.3" in human.stdout


def test_hand_edited_unit_on_h1_is_config_drift(lab: Any, deployed: tuple[str, Path]) -> None:
    edit = lab.ssh("h1", f"cp {UNIT} /root/vllm.service.orig && echo '# hand edit' >> {UNIT}")
    assert edit.returncode == 0, edit.stderr
    try:
        code, outcome = drift(deployed)
    finally:
        lab.ssh("h1", f"mv /root/vllm.service.orig {UNIT}")
    assert code == 2
    assert [(c["host"], c["item"], c["kind"]) for c in outcome["changes"]] == [
        ("h1", UNIT, "config")]
    assert outcome["changes"][0]["current"].startswith("would change")
    assert drift(deployed)[0] == 0


def test_inventory_edit_shows_in_both_units(deployed: tuple[str, Path]) -> None:
    code, outcome = drift(deployed, "-e", "vllm_max_model_len=1024")
    assert code == 2
    items = {(c["host"], c["item"]) for c in outcome["changes"]}
    assert ("h1", UNIT) in items and ("h2", UNIT) in items
    assert any(c["item"].startswith("engine max_model_len") and c["current"] == "1024"
               for c in outcome["changes"])


def test_no_record_anywhere_is_an_error(lab: Any, deployed: tuple[str, Path],
                                        tmp_path: Path) -> None:
    inventory, _ = deployed
    for host in ("h1", "h2"):
        lab.ssh(host, "mv /var/lib/vllm-provision/state.json /root/state.json.saved")
    try:
        result = provision("drift", "-i", inventory, state_home=tmp_path, timeout=300)
    finally:
        for host in ("h1", "h2"):
            lab.ssh(host, "mv /root/state.json.saved /var/lib/vllm-provision/state.json")
    assert result.returncode == 1
    assert "no record of a good `provision up`; run it first" in result.stderr
    assert "Traceback" not in result.stderr


def test_host_record_is_used_when_the_controller_has_none(deployed: tuple[str, Path],
                                                          tmp_path: Path) -> None:
    inventory, _ = deployed
    result = provision("drift", "-i", inventory, "--json", state_home=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["record"]["source"].endswith(
        ":/var/lib/vllm-provision/state.json")
