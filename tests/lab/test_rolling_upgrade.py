"""A rolling upgrade of a fleet: 4 two-node mp replicas on 8 lab hosts (stand-in GPUs).

One ``up`` of the fleet, then, in order: ``upgrade --serial 1`` with a changed engine argument
(every replica upgraded, the capacity probe never below 3 of 4); an upgrade whose third replica's
new version has an argument the stand-in rejects at start, with a drain hook (r1 and r2 upgraded,
r3 rolled back to the unit it had and serving, r4 untouched, the hook called before and after
each replica it touched with the name and endpoint); a drain hook that fails (the upgrade stops
before the first replica is touched). The module adds the hosts the lab lacks of h1-h8 to the
running lab (``Lab.add_hosts``: the booted ones keep running), takes the fleet down at the end
(``down``: every host is free again) and removes the hosts it added.

Cost: about 289 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import lab_support
import pytest
import yaml

pytestmark = pytest.mark.lab

HOSTS = tuple(f"h{i}" for i in range(1, 9))
REPLICAS = ("r1", "r2", "r3", "r4")
MASTERS = {"r1": "h1", "r2": "h3", "r3": "h5", "r4": "h7"}
UNIT = "/etc/systemd/system/vllm.service"
MODEL = "/srv/models/lab-model"

HOOK = """\
import os, sys
phase, name, endpoint = sys.argv[-3:]
with open(sys.argv[1], "a") as log:
    log.write(" ".join([phase, name, endpoint, os.environ["VLLM_PROVISION_REPLICA"]]) + "\\n")
sys.exit(1 if os.environ.get("FAIL_HOOK") else 0)
"""


@pytest.fixture(scope="module")
def fleet(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The fleet's inventory, its first ``up`` and the helpers; taken down after the module."""
    if lab.vllm != "standin":
        pytest.skip("needs the GPU stand-in lab (`provision lab up`)")
    from vllm_provision_lab.inventories import fleet_inventory_text

    added = [name for name in HOSTS if name not in {host.name for host in lab.hosts}]
    lab.add_hosts(added)
    folder = tmp_path_factory.mktemp("fleet")
    inventory = folder / "fleet.yml"
    base = yaml.safe_load(fleet_inventory_text(lab.config, HOSTS))
    (folder / "hook.py").write_text(HOOK)

    def write(extra: list[str] | None = None, per_replica: dict[str, list[str]] | None = None
              ) -> None:
        data = json.loads(json.dumps(base))
        replicas = data["all"]["children"]["vllm_replicas"]
        if extra:
            replicas["vars"]["vllm_extra_args"] = extra
        for name, args in (per_replica or {}).items():
            replicas["children"][name]["vars"] = {"vllm_extra_args": args}
        inventory.write_text(yaml.safe_dump(data, sort_keys=False))

    def run(*args: str, **env: str) -> tuple[int, dict[str, Any], str]:
        import os

        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            done = lab_support.provision(*args, "-i", str(inventory), "--json",
                                         state_home=folder / "state")
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout), done.stderr

    write()
    code, up, err = run("up")
    try:
        assert code == 0, err[-3000:]
        assert [r["name"] for r in up["replicas"] if r["served"]] == list(REPLICAS)
        yield {"write": write, "run": run, "folder": folder, "lab": lab}
    finally:
        down = lab_support.provision("down", "-i", str(inventory), "--yes",
                                     state_home=folder / "state")
        lab.remove_hosts(added)
        assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]


def _unit(lab_host: Any, host: str) -> str:
    return str(lab_host(host).file(UNIT).content_string)


def _serves(lab: Any, replica: str) -> bool:
    return lab_support.complete(f"http://{lab.config.address(MASTERS[replica])}:8000", MODEL)


def test_serial_1_upgrades_every_replica_and_keeps_3_of_4_serving(fleet, lab_host):
    fleet["write"](["--max-num-seqs", "64"])
    code, summary, err = fleet["run"]("upgrade", "--serial", "1")
    assert code == 0, err[-3000:]
    assert summary["recap"]["upgraded"] == list(REPLICAS)
    assert summary["batches"] == [[name] for name in REPLICAS]
    assert all(r["restarted"] and r["serving"] for r in summary["replicas"])
    capacity = summary["capacity"]
    assert len(capacity["samples"]) >= 10
    assert capacity["min_serving"] >= len(REPLICAS) - 1
    assert all(s["serving"] >= 3 for s in capacity["samples"])
    assert any(s["serving"] == 3 for s in capacity["samples"])  # each restart was seen
    for host in HOSTS:
        assert "--max-num-seqs 64" in _unit(lab_host, host)
    # the upgrade recorded what it left, as a verified up does: drift finds nothing
    assert summary.get("state_record"), summary.get("state_record_error")
    code, drift, err = fleet["run"]("drift")
    assert code == 0, (drift, err[-2000:])


def test_a_bad_third_replica_is_rolled_back_and_stops_the_upgrade(fleet, lab_host):
    log = fleet["folder"] / "hook.log"
    hook = shlex.join([sys.executable, str(fleet["folder"] / "hook.py"), str(log)])
    # r3's new arguments pass preflight (the release has --tokenizer) and fail at start
    fleet["write"](["--max-num-seqs", "32"], {"r3": ["--tokenizer", "/srv/models/no-such-tok"]})
    code, summary, err = fleet["run"]("upgrade", "--serial", "1", "--drain-hook", hook)
    assert code == 1, err[-3000:]
    assert summary["recap"] == {"upgraded": ["r1", "r2"], "rolled back": ["r3"],
                                "rollback failed": [], "not upgraded": [],
                                "untouched": ["r4"]}
    r3 = next(r for r in summary["replicas"] if r["name"] == "r3")
    assert r3["serving"] and "new version failed" in r3["reason"]
    for host in ("h1", "h2", "h3", "h4"):
        assert "--max-num-seqs 32" in _unit(lab_host, host)
    for host in ("h5", "h6", "h7", "h8"):  # r3 back on its unit, r4 never touched
        unit = _unit(lab_host, host)
        assert "--max-num-seqs 64" in unit and "no-such-tok" not in unit
    assert all(_serves(fleet["lab"], name) for name in REPLICAS)
    calls = [line.split() for line in log.read_text().splitlines()]
    expected = [[phase, name, f"http://{fleet['lab'].config.address(MASTERS[name])}:8000", name]
                for name in ("r1", "r2", "r3") for phase in ("drain", "undrain")]
    assert calls == expected


def test_a_failing_drain_hook_stops_before_the_replica_is_touched(fleet, lab_host):
    log = fleet["folder"] / "failing-hook.log"
    hook = shlex.join([sys.executable, str(fleet["folder"] / "hook.py"), str(log)])
    before = _unit(lab_host, "h1")
    fleet["write"](["--max-num-seqs", "16"])
    code, summary, err = fleet["run"]("upgrade", "--drain-hook", hook, FAIL_HOOK="1")
    assert code == 1, err[-3000:]
    assert summary["recap"]["not upgraded"] == ["r1"]
    assert summary["recap"]["untouched"] == ["r2", "r3", "r4"]
    assert "drain hook failed" in summary["replicas"][0]["reason"]
    assert _unit(lab_host, "h1") == before
    assert [line.split()[:2] for line in log.read_text().splitlines()] == [["drain", "r1"]]
    fleet["write"](["--max-num-seqs", "32"])  # the inventory matches the hosts again
