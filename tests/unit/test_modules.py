"""Modules run through the runner against fake hosts whose commands run locally."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from test_runner import run, statuses, write_play
from test_runner_support import make_inventory

from vllm_provision.modules.systemd import parse_show
from vllm_provision.transport.hostkeys import fingerprint_sha256, known_hosts_name


def test_template_validate_failure_leaves_the_file_unchanged(tmp_path: Path) -> None:
    (tmp_path / "h1" / "conf").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "h1" / "conf").write_text("old\n")
    playbook = write_play(tmp_path, "h1", """
    - name: Install a config that fails validation
      template: {src: conf.j2, dest: "{{ root }}/conf", validate: "grep -q valid %s"}
""")
    (tmp_path / "playbooks" / "templates").mkdir()
    (tmp_path / "playbooks" / "templates" / "conf.j2").write_text("broken\n")
    runner, summary = run(make_inventory(tmp_path, ("h1",)), playbook)
    assert statuses(runner, "Install a config that fails validation") == {"h1": "failed"}
    assert (tmp_path / "h1" / "conf").read_text() == "old\n"
    assert not [p for p in (tmp_path / "h1").iterdir() if p.name.startswith(".conf")]


def test_template_keeps_the_previous_version(tmp_path: Path) -> None:
    (tmp_path / "h1").mkdir(exist_ok=True)
    (tmp_path / "h1" / "conf").write_text("old\n")
    playbook = write_play(tmp_path, "h1", """
    - name: Install
      template: {src: conf.j2, dest: "{{ root }}/conf"}
""")
    (tmp_path / "playbooks" / "templates").mkdir()
    (tmp_path / "playbooks" / "templates" / "conf.j2").write_text("new\n")
    run(make_inventory(tmp_path, ("h1",)), playbook)
    assert (tmp_path / "h1" / "conf").read_text() == "new\n"
    assert (tmp_path / "h1" / "conf.prev").read_text() == "old\n"


def test_file_directory_then_absent(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "h1", """
    - name: Make the folder
      file: {path: "{{ root }}/d", state: directory, mode: "0750"}
""")
    inventory = make_inventory(tmp_path, ("h1",))
    runner, _ = run(inventory, playbook)
    assert statuses(runner, "Make the folder") == {"h1": "changed"}
    assert oct((tmp_path / "h1" / "d").stat().st_mode & 0o777) == "0o750"
    runner, _ = run(inventory, playbook)
    assert statuses(runner, "Make the folder") == {"h1": "ok"}
    gone = write_play(tmp_path, "h1", """
    - name: Remove it
      file: {path: "{{ root }}/d", state: absent}
""", "gone.yml")
    runner, _ = run(inventory, gone, check=True)
    assert statuses(runner, "Remove it") == {"h1": "changed"}
    assert (tmp_path / "h1" / "d").exists()
    run(inventory, gone)
    assert not (tmp_path / "h1" / "d").exists()


def test_command_creates_makes_it_idempotent(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "h1", """
    - name: Make a marker once
      command: {cmd: "echo x >> {{ root }}/m", creates: "{{ root }}/m"}
""")
    inventory = make_inventory(tmp_path, ("h1",))
    assert statuses(run(inventory, playbook)[0], "Make a marker once") == {"h1": "changed"}
    assert statuses(run(inventory, playbook)[0], "Make a marker once") == {"h1": "ok"}
    assert (tmp_path / "h1" / "m").read_text() == "x\n"


def test_values_with_shell_metacharacters_are_quoted(tmp_path: Path) -> None:
    playbook = write_play(tmp_path, "h1", """
    - name: Odd name
      file: {path: "{{ root }}/a b;touch {{ root }}/pwned", state: directory}
""")
    run(make_inventory(tmp_path, ("h1",)), playbook)
    root = tmp_path / "h1"
    assert Path(f"{root}/a b;touch {root}/pwned").is_dir()
    assert not (tmp_path / "h1" / "pwned").exists()


def test_parse_show_reads_key_values_and_skips_noise() -> None:
    assert parse_show("ActiveState=active\nnoise\nNeedDaemonReload=yes\n") == {
        "ActiveState": "active", "NeedDaemonReload": "yes"}


def test_fingerprint_matches_openssh_format() -> None:
    blob = b"\x00\x00\x00\x0bssh-ed25519" + bytes(36)
    expected = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    assert fingerprint_sha256(blob) == f"SHA256:{expected}"
    assert known_hosts_name("10.0.0.1", 22) == "10.0.0.1"
    assert known_hosts_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"
