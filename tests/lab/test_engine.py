"""The engine against the lab: real SSH, real systemd.

Cost: about 125 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lab_support import provision

from vllm_provision.core.results import Status, TaskResult
from vllm_provision.transport.base import ConnectionOptions, HostKeyError
from vllm_provision.transport.connection import HostConnection

pytestmark = pytest.mark.lab

PLAYBOOK = Path(__file__).resolve().parents[1] / "data" / "playbooks" / "engine_lab" / \
    "demo-unit.yml"


def play(lab: Any, *args: str, timeout: float = 180) -> tuple[int, dict[str, Any]]:
    """Run ``provision play --json`` on the lab's mp inventory; return (exit code, JSON)."""
    proc = provision("play", "-i", str(lab.inventory_path("mp")), str(PLAYBOOK), "--json", *args,
                     timeout=timeout)
    return proc.returncode, json.loads(proc.stdout)


def show(lab: Any, host: str, prop: str) -> str:
    return lab.ssh(host, f"systemctl show -p {prop} --value vp-demo.service").stdout.strip()


def tasks(summary: dict[str, Any], name: str) -> dict[str, str]:
    return {t["host"]: t["status"] for t in summary["tasks"] if t["task"] == name}


@pytest.fixture
def converged(lab: Any) -> Any:
    """The demo unit installed and running with the default variables."""
    code, _ = play(lab)
    assert code == 0
    return lab


def test_first_run_changes_second_run_changes_nothing(lab: Any) -> None:
    for host in ("h1", "h2"):
        lab.ssh(host, "systemctl disable --now vp-demo.service; rm -f /etc/vp-demo.env "
                      "/etc/systemd/system/vp-demo.service; systemctl daemon-reload; "
                      "rm -rf /var/lib/vllm-provision/pending")
    code, first = play(lab)
    assert code == 0 and first["changed"] > 0
    assert tasks(first, "Install the demo unit") == {"h1": "changed", "h2": "changed"}
    started = show(lab, "h1", "ExecMainStartTimestamp")
    code, second = play(lab)
    assert code == 0 and second["changed"] == 0 and second["failed"] == 0
    assert show(lab, "h1", "ExecMainStartTimestamp") == started


def test_changed_variable_changes_that_file_and_restarts_once(converged: Any) -> None:
    lab = converged
    before = {h: show(lab, h, "ExecMainStartTimestamp") for h in ("h1", "h2")}
    unit_mtime = lab.ssh("h1", "stat -c %Y /etc/systemd/system/vp-demo.service").stdout
    time.sleep(1.1)  # timestamps have one-second resolution
    since = lab.ssh("h1", "date +%s").stdout.strip()
    code, summary = play(lab, "-e", "demo_message=changed", "--limit", "h1")
    try:
        assert code == 0
        changed = [t["task"] for t in summary["tasks"] if t["status"] == "changed"]
        assert changed == ["Install the demo environment file", "Restart the demo unit"]
        assert "DEMO_MESSAGE=changed" in lab.ssh("h1", "cat /etc/vp-demo.env").stdout
        assert lab.ssh("h1", "stat -c %Y /etc/systemd/system/vp-demo.service").stdout == \
            unit_mtime
        assert show(lab, "h1", "ExecMainStartTimestamp") != before["h1"]
        assert show(lab, "h2", "ExecMainStartTimestamp") == before["h2"]
        restarts = lab.ssh("h1", f"journalctl -u vp-demo.service --since @{since} -o cat | "
                                 "grep -c '^Started' || true").stdout.strip()
        assert restarts == "1"
    finally:
        play(lab)


def test_check_diff_shows_the_diff_changes_nothing_and_exits_2(converged: Any) -> None:
    lab = converged
    before = lab.ssh("h1", "sha256sum /etc/vp-demo.env").stdout
    started = show(lab, "h1", "ExecMainStartTimestamp")
    code, summary = play(lab, "--check", "--diff", "-e", "demo_message=dry")
    assert code == 2
    diffs = [t["diff"] for t in summary["tasks"] if t["diff"]]
    assert any("-DEMO_MESSAGE=hello" in d and "+DEMO_MESSAGE=dry" in d for d in diffs)
    assert lab.ssh("h1", "sha256sum /etc/vp-demo.env").stdout == before
    assert show(lab, "h1", "ExecMainStartTimestamp") == started
    assert summary["check_mode"] is True
    assert play(lab, "--check")[0] == 0


def test_unknown_host_key_is_refused_and_accept_new_learns_it_once(lab: Any,
                                                                   tmp_path: Path) -> None:
    from vllm_provision.inventory import load_inventory

    host = load_inventory(lab.inventory_path("mp")).hosts["h1"]
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = dataclasses.replace(host, known_hosts_files=(known,))
    with pytest.raises(HostKeyError) as refused:
        HostConnection(host, ConnectionOptions(connect_attempts=1)).open()
    text = refused.value.render()
    assert host.address in text and "SHA256:" in text and "accept-new" in text
    conn = HostConnection(host, ConnectionOptions(host_key_policy="accept-new"))
    conn.open()
    assert conn.run("echo hi").stdout == "hi\n"
    conn.close()
    assert len(known.read_text().splitlines()) == 1
    again = HostConnection(host, ConnectionOptions(host_key_policy="accept-new"))
    again.open()
    again.close()
    assert len(known.read_text().splitlines()) == 1
    strict = HostConnection(host, ConnectionOptions())
    strict.open()
    strict.close()


def test_changed_host_key_is_always_refused(lab: Any, tmp_path: Path) -> None:
    from vllm_provision.inventory import load_inventory

    host = load_inventory(lab.inventory_path("mp")).hosts["h1"]
    other = lab.ssh("h2", "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{host.address} {other[0]} {other[1]}\n")
    host = dataclasses.replace(host, known_hosts_files=(known,))
    with pytest.raises(HostKeyError, match="CHANGED"):
        HostConnection(host, ConnectionOptions(host_key_policy="accept-new")).open()


def test_cut_mid_run_is_unreachable_and_rerun_runs_pending_handler(converged: Any) -> None:
    from vllm_provision.inventory import load_inventory
    from vllm_provision.runner import Runner, RunOptions

    lab = converged
    inventory = load_inventory(lab.inventory_path("mp"),
                               {"demo_message": "cut", "demo_pause_s": "20"})

    class CutAfterChange:
        def __init__(self) -> None:
            self.results: list[TaskResult] = []

        def play_started(self, name: str, hosts: Any) -> None: ...

        def task_started(self, name: str, *, handler: bool = False) -> None: ...

        def task_result(self, result: TaskResult) -> None:
            self.results.append(result)
            if result.host == "h1" and result.task == "Install the demo environment file":
                threading.Thread(target=lab.cut, args=("h1",)).start()

    timeout_s = 8.0
    runner = Runner(inventory, RunOptions(limit="h1", connection=ConnectionOptions(
        connect_timeout_s=timeout_s, command_timeout_s=timeout_s, connect_attempts=1)),
        CutAfterChange())
    started = time.monotonic()
    try:
        outcome = runner.run_playbook(PLAYBOOK)
    finally:
        lab.heal("h1")
    elapsed = time.monotonic() - started
    by_task = {r.task: r.status for r in outcome.results}
    assert by_task["Install the demo environment file"] is Status.CHANGED
    assert Status.UNREACHABLE in by_task.values()
    assert elapsed < 20 + 3 * timeout_s
    assert lab.ssh("h1", "ls /var/lib/vllm-provision/pending").stdout.strip()
    before = show(lab, "h1", "ExecMainStartTimestamp")
    code, summary = play(lab, "-e", "demo_message=cut", "--limit", "h1")
    assert code == 0
    restart = [t for t in summary["tasks"] if t["task"] == "Restart the demo unit"]
    assert [t["status"] for t in restart] == ["changed"]
    assert "earlier run" in restart[0]["message"]
    assert show(lab, "h1", "ExecMainStartTimestamp") != before
    code, summary = play(lab, "-e", "demo_message=cut", "--limit", "h1")
    assert summary["changed"] == 0
    play(lab)


def test_same_playbook_as_deploy_user_with_become(converged: Any, tmp_path: Path) -> None:
    lab = converged
    inventory = tmp_path / "deploy.yml"
    text = lab.inventory_path("mp").read_text().replace("ansible_user: root",
                                                        "ansible_user: deploy\n"
                                                        "    ansible_become: true")
    inventory.write_text(text)
    proc = provision("play", "-i", str(inventory), str(PLAYBOOK), "--json", "-e",
                     "demo_message=deploy", timeout=180)
    summary = json.loads(proc.stdout)
    assert proc.returncode == 0, summary
    assert tasks(summary, "Install the demo environment file") == {"h1": "changed",
                                                                   "h2": "changed"}
    assert lab.ssh("h1", "stat -c '%U %a' /etc/vp-demo.env").stdout.strip() == "root 600"
    play(lab)
