"""Ownership of hosts (checks.ownership, takeover) and restores that restart nothing
(state.started_from, modules/template.py), without hosts."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from test_runner import statuses, write_playbook
from test_runner_support import FakeHost, RecordHost, make_inventory

from vllm_provision import state
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.ownership import check_ownership, conflict
from vllm_provision.core.errors import ProvisionError
from vllm_provision.facts.gather import parse_owner
from vllm_provision.facts.model import HostFacts, HostOwner, UnitStart
from vllm_provision.operations import takeover
from vllm_provision.runner import Runner, RunOptions

RUNNING = {"vllm.service": UnitStart("vllm.service", "inv-1", {}, "active", "inv-1")}
STOPPED = {"vllm.service": UnitStart("vllm.service", "inv-1", {}, "inactive", "")}


def owner(inventory: str, replica: str, started: Any = None, **files: str) -> HostOwner:
    return HostOwner(inventory, replica, "h1", files, RUNNING if started is None else started)


def test_an_older_record_of_another_inventory_or_replica_is_an_error_naming_both(
        tmp_path: Path) -> None:
    # records without a replica id (an earlier version's) are matched by path and replica name
    replica = make_inventory(tmp_path).replicas[0]
    mine = str(tmp_path / "inventory.yml")
    findings = check_ownership(replica, {"h1": owner("/other/inv.yml", "lab"),
                                         "h2": owner(mine, "other")}, mine)
    assert [(f.host, f.severity) for f in findings] == [("h1", Severity.ERROR),
                                                        ("h2", Severity.ERROR)]
    assert findings[0].actual == "replica 'lab' (no replica id: an older record) of /other/inv.yml"
    assert findings[0].expected == f"replica 'llama' (id {replica.replica_id}), or no owner"
    assert "--take-over" in findings[0].fix and "/other/inv.yml" in findings[0].fix
    assert findings[1].actual == f"replica 'other' (no replica id: an older record) of {mine}"


def test_own_hosts_unrecorded_hosts_and_hosts_of_a_down_replica_pass(tmp_path: Path) -> None:
    replica = make_inventory(tmp_path).replicas[0]
    mine = str(tmp_path / "inventory.yml")
    found = check_ownership(replica, {"h1": owner(mine, "llama"), "h2": None}, mine)
    assert [f.severity for f in found] == [Severity.OK, Severity.OK]
    down = owner("/other/inv.yml", "lab", STOPPED)
    assert conflict(replica, "h1", down, mine) is None
    assert "free" in check_ownership(replica, {"h1": down}, mine)[0].actual
    # a record without started units (older records) is taken as running: refused
    assert conflict(replica, "h1", owner("/other/inv.yml", "lab", {}), mine) is not None
    # the owner's vLLM is stopped; the shared watchdog unit runs, but a later run started it
    # (another InvocationID): that is not the owner's process, so the host is free
    restarted = {"vllm.service": STOPPED["vllm.service"],
                 "vllm-watchdog.service": UnitStart("vllm-watchdog.service", "inv-2", {},
                                                    "active", "inv-9")}
    assert conflict(replica, "h1", owner("/other/inv.yml", "lab", restarted), mine) is None
    still = {**restarted, "vllm-watchdog.service": UnitStart("vllm-watchdog.service", "inv-2",
                                                             {}, "active", "inv-2")}
    assert conflict(replica, "h1", owner("/other/inv.yml", "lab", still), mine) is not None


def test_the_identity_resolves_symlinks_and_relative_paths(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    real = tmp_path / "inv.yml"
    real.write_text("all: {}\n")
    (tmp_path / "link.yml").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    assert state.inventory_identity("link.yml") == state.inventory_identity(real) == str(real)


def test_parse_owner_reads_the_copy_s_own_entry_and_the_units_now() -> None:
    record = {"inventory": "/a.yml", "host": "gpu-a",
              "hosts": {"gpu-a": {"replica": "lab", "files": {"/etc/x": "1"},
                                  "started_from": {"vllm.service": {
                                      "invocation": "abc", "files": {"/etc/x": "1"}}}},
                        "h1": {"replica": "wrong"}}}
    got = parse_owner("h1", {"record": record, "invocations": {
        "vllm.service": {"active": "active", "invocation": "abc"}}}, [])
    assert got is not None
    assert (got.inventory, got.replica, got.host, dict(got.files)) == (
        "/a.yml", "lab", "gpu-a", {"/etc/x": "1"})
    assert got.started["vllm.service"].same_process and got.running
    assert parse_owner("h1", {"record": None}, []) is None
    problems: list[str] = []
    assert parse_owner("h1", {"record": {"hosts": []}}, problems) is None and problems


def test_started_from_keeps_what_a_still_running_process_started_from() -> None:
    previous = {"vllm.service": {"invocation": "old", "files": {"/e": "before"}}}
    kept = state.started_from({"/e": "edited"}, {"vllm.service": "old", "w.service": ""},
                              previous)
    assert kept == {"vllm.service": {"invocation": "old", "files": {"/e": "before"}}}
    fresh = state.started_from({"/e": "now"}, {"vllm.service": "new"}, previous)
    assert fresh == {"vllm.service": {"invocation": "new", "files": {"/e": "now"}}}
    out = "x\n@@unit vllm.service abc\n@@unit w.service\n"
    assert state.parse_invocations(out) == {"vllm.service": "abc", "w.service": ""}
    assert state.unit_names(["/etc/systemd/system/a.service", "/etc/x.env"]) == ["a.service"]


def test_take_over_removes_only_what_the_new_plan_lacks_as_quoted_words(tmp_path: Path) -> None:
    item = conflict(make_inventory(tmp_path).replicas[0], "h1",
                    owner("/a.yml", "lab", None, **{
                        "/etc/systemd/system/vllm.service": "1", "/etc/odd name;rm": "2",
                        "/etc/vllm-provision/vllm.env": "3"}), "/b.yml")
    assert item is not None
    take = takeover.plan_take_over(item, ["/etc/vllm-provision/vllm.env"])
    assert take.remove == ("/etc/odd name;rm", "/etc/systemd/system/vllm.service")
    assert take.units == ("vllm.service",)
    script = takeover.removal_script(take)
    assert "systemctl disable --now -- vllm.service" in script
    assert shlex.quote("/etc/odd name;rm") in script and "daemon-reload" in script
    assert any("removed unit vllm.service" in line for line in take.lines(False))
    assert take.to_json()["from_inventory"] == "/a.yml"
    nothing = takeover.plan_take_over(item, list(item.owner.files))
    assert takeover.removal_script(nothing) == "true"


def _record(name: str) -> dict[str, Any]:
    return {"schema": 1, "inventory": "/a.yml", "host": name, "hosts": {name: {
        "replica": "lab", "files": {"/etc/systemd/system/vllm.service": "1"},
        "started_from": {"vllm.service": {"invocation": "inv-1", "files": {}}}}}}


def test_guard_refuses_without_take_over_and_changes_nothing(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    hosts = {name: RecordHost(_record(name)) for name in ("h1", "h2")}
    with pytest.raises(ProvisionError) as raised:
        takeover.guard(inventory, ["h1", "h2"], {}, hosts, command="up", take_over=False,
                       check_mode=False, echo=lambda line: None)
    text = raised.value.render()
    assert ("h1 belongs to replica 'lab' (no replica id: an older record) of /a.yml, not to "
            f"replica 'llama' (id {inventory.replicas[0].replica_id}) of ") in text
    assert "nothing was changed" in text and "--take-over" in text
    assert not [c for h in hosts.values() for c in h.commands if "rm -f" in c]


def test_guard_takes_over_removing_the_old_units_and_check_mode_removes_nothing(
        tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    lines: list[str] = []
    dry = {name: RecordHost(_record(name)) for name in ("h1", "h2")}
    takeover.guard(inventory, ["h1", "h2"], {}, dry, command="up", take_over=True,
                   check_mode=True, echo=lines.append)
    assert not [c for h in dry.values() for c in h.commands if "rm -f" in c]
    assert "  would remove unit vllm.service (stopped and disabled)" in lines
    real = {name: RecordHost(_record(name)) for name in ("h1", "h2")}
    taken = takeover.guard(inventory, ["h1", "h2"], {}, real, command="up", take_over=True,
                           check_mode=False, echo=lines.append)
    assert [t.conflict.host for t in taken] == ["h1", "h2"]
    assert all(any("disable --now -- vllm.service" in c for c in h.commands)
               for h in real.values())
    down = {name: RecordHost(_record(name), active="inactive") for name in ("h1", "h2")}
    assert takeover.guard(inventory, ["h1", "h2"], {}, down, command="up", take_over=False,
                          check_mode=False, echo=lines.append) == []


def test_guard_uses_the_records_the_run_lock_read_and_reads_no_record_itself(
        tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    # the hosts' files say nothing; the lock's answer holds the records (h2: none)
    hosts = {name: RecordHost(None) for name in ("h1", "h2")}
    records = {"h1": json.dumps(_record("h1")), "h2": None}
    with pytest.raises(ProvisionError) as raised:
        takeover.guard(inventory, ["h1", "h2"], {}, hosts, command="up", take_over=False,
                       check_mode=False, echo=lambda line: None, records=records)
    text = raised.value.render()
    assert "h1 belongs to replica 'lab'" in text and "h2 belongs" not in text
    assert not [c for h in hosts.values() for c in h.commands if "state.json" in c]


RESTORE_PLAY = """
- hosts: h1
  tasks:
    - name: Install the env file
      template: {src: env.j2, dest: "{{ root }}/vllm.env"}
      notify: Restart
  handlers:
    - name: Restart
      command: echo restarted
"""


def _restore_run(tmp_path: Path, invocation_now: str) -> tuple[Runner, Path]:
    inventory = make_inventory(tmp_path, ("h1",))
    playbook = write_playbook(tmp_path, RESTORE_PLAY)
    (tmp_path / "playbooks" / "templates").mkdir(exist_ok=True)
    (tmp_path / "playbooks" / "templates" / "env.j2").write_text("A=1\n")
    dest = tmp_path / "h1" / "vllm.env"
    dest.write_text("A=1\nNCCL_DEBUG=INFO\n")  # a hand edit made after the start
    wanted = hashlib.sha256(b"A=1\n").hexdigest()
    start = UnitStart("vllm.service", "inv-1", {str(dest): wanted}, "active", invocation_now)
    runner = Runner(inventory, RunOptions(pending_dir=str(tmp_path / "pending")),
                    connection_factory=lambda host: FakeHost(host))
    runner.facts["h1"] = HostFacts("h1", owner=HostOwner("/a.yml", "llama", "h1", {},
                                                         {"vllm.service": start}))
    runner.run_playbook(playbook)
    return runner, dest


def test_a_restored_file_the_running_process_started_from_restarts_nothing(
        tmp_path: Path) -> None:
    runner, dest = _restore_run(tmp_path, "inv-1")
    assert dest.read_text() == "A=1\n"
    assert statuses(runner, "Install the env file") == {"h1": "changed"}
    result = next(r for r in runner.outcome.results if r.task == "Install the env file")
    assert "file restored; running process unaffected" in result.message
    assert statuses(runner, "Restart") == {}


def test_a_restored_file_restarts_when_the_process_started_since(tmp_path: Path) -> None:
    runner, dest = _restore_run(tmp_path, "inv-2")
    assert dest.read_text() == "A=1\n"
    assert statuses(runner, "Restart") == {"h1": "changed"}
