"""Roles as Ansible has them: the ``copy`` module and role ``files/``, ``meta/main.yml``
dependencies, ``import_playbook`` and ``import_tasks`` (runner/playbook.py, modules/copy.py,
docs/engine.md "Reuse"). Hosts are fakes whose commands run locally in a temp folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_runner import run, statuses
from test_runner_support import make_inventory, rendered_error, write_file

from vllm_provision.core.errors import ProvisionError
from vllm_provision.runner import load_playbook, managed

REPO = Path(__file__).resolve().parents[2]


def make_role(root: Path, name: str, *, tasks: str = "", meta: str | None = None,
              files: dict[str, str] | None = None, handlers: str = "") -> Path:
    role = root / "roles" / name
    (role / "tasks").mkdir(parents=True, exist_ok=True)
    (role / "tasks" / "main.yml").write_text(tasks or f"- name: {name} runs\n  command: "
                                                      f"echo {name}\n")
    if handlers:
        (role / "handlers").mkdir(exist_ok=True)
        (role / "handlers" / "main.yml").write_text(handlers)
    if meta is not None:
        (role / "meta").mkdir(exist_ok=True)
        (role / "meta" / "main.yml").write_text(meta)
    for rel, text in (files or {}).items():
        (role / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (role / "files" / rel).write_text(text)
    return role


def write(root: Path, rel: str, text: str) -> Path:
    return write_file(root / rel, text)


def error_of(path: Path) -> str:
    return rendered_error(ProvisionError, load_playbook, path)


# --- copy and files/ ----------------------------------------------------------------------------

COPY_ROLE_TASKS = """
- name: Install the program
  copy: {src: prog.py, dest: "{{ root }}/lib/prog.py", mode: "0755"}
  notify: Restart the program
"""
COPY_HANDLERS = "- name: Restart the program\n  command: echo restarted\n"
# Jinja markers stay as they are: copy never renders.
PROGRAM = "#!/usr/bin/python3\nprint('{{ not a template }}')\n"


def _copy_setup(tmp_path: Path) -> Path:
    make_role(tmp_path, "prog", tasks=COPY_ROLE_TASKS, handlers=COPY_HANDLERS,
              files={"prog.py": PROGRAM})
    return write(tmp_path, "playbooks/play.yml", "- hosts: h1\n  roles: [prog]\n")


def test_copy_installs_the_roles_file_as_it_is_then_is_ok_and_notifies_only_on_change(
        tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path, ("h1",))
    playbook = _copy_setup(tmp_path)
    dest = tmp_path / "h1" / "lib" / "prog.py"
    runner, _ = run(inventory, playbook)
    assert dest.read_text() == PROGRAM
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o755
    assert statuses(runner, "Install the program") == {"h1": "changed"}
    assert statuses(runner, "Restart the program") == {"h1": "changed"}
    runner, _ = run(inventory, playbook)
    assert statuses(runner, "Install the program") == {"h1": "ok"}
    assert statuses(runner, "Restart the program") == {}
    os.chmod(dest, 0o600)  # a mode change alone is a change
    runner, _ = run(inventory, playbook)
    assert statuses(runner, "Install the program") == {"h1": "changed"}
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o755


def test_copy_in_check_mode_changes_nothing_and_diffs_the_text(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path, ("h1",))
    playbook = _copy_setup(tmp_path)
    dest = tmp_path / "h1" / "lib" / "prog.py"
    dest.parent.mkdir(parents=True)
    dest.write_text("old\n")
    runner, _ = run(inventory, playbook, check=True, diff=True)
    assert dest.read_text() == "old\n"
    result = next(r for r in runner.outcome.results if r.task == "Install the program")
    assert result.status.value == "changed" and result.message.startswith("would change")
    assert "-old" in result.diff and "+print('{{ not a template }}')" in result.diff


def test_copy_src_missing_names_the_folders_searched(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path, ("h1",))
    playbook = _copy_setup(tmp_path)
    (tmp_path / "roles" / "prog" / "files" / "prog.py").unlink()
    runner, _ = run(inventory, playbook)
    result = next(r for r in runner.outcome.results if r.task == "Install the program")
    assert result.status.value == "failed"
    assert "file 'prog.py' not found" in result.message
    assert str(tmp_path / "roles" / "prog" / "files") in result.message


def test_copy_arguments_are_checked_at_load(tmp_path: Path) -> None:
    playbook = write(tmp_path, "playbooks/play.yml",
                     "- hosts: h1\n  tasks:\n    - copy: {src: a, dest: /x, mod: '0644'}\n")
    message = error_of(playbook)
    assert "play.yml: play[0].tasks[0].copy" in message and "mode" in message


def test_the_watchdog_is_copied_and_its_files_are_hashed_in_the_state_record() -> None:
    plays = load_playbook(REPO / "playbooks" / "up.yml")
    for name in ("vllm_watchdog_rules.py", "vllm_watchdog.py"):  # the program imports the rules
        task = next(t for p in plays for t in p.tasks
                    if t.module == "copy" and t.args.get("src") == name)
        assert task.role == "vllm_watchdog"
        assert task.role_path is not None and (task.role_path / "files" / name).is_file()
        assert any(task in p.tasks for p in managed.install_plays(plays))


# --- meta/main.yml dependencies -----------------------------------------------------------------

def test_dependencies_run_before_the_role_once_per_play_and_inherit_its_when(
        tmp_path: Path) -> None:
    make_role(tmp_path, "base")
    make_role(tmp_path, "fw", meta="dependencies: [base]\n")
    make_role(tmp_path, "app", meta="dependencies: [base, {role: fw, when: use_fw}]\n")
    make_role(tmp_path, "dog", meta="dependencies: [base]\n")
    playbook = write(tmp_path, "playbooks/play.yml",
                     "- hosts: all\n  roles: [app, dog, {role: base, when: later}]\n")
    play = load_playbook(playbook)[0]
    order = [(t.role, t.when) for t in play.tasks]
    # base once (unconditional), fw's own base under fw's when, then app, dog; base again only
    # under a different when (Ansible: a role with different parameters runs again)
    assert order == [("base", ()), ("base", ("use_fw",)), ("fw", ("use_fw",)), ("app", ()),
                     ("dog", ()), ("base", ("later",))]
    assert play.file_dirs[0] == tmp_path / "roles" / "base" / "files"


def test_the_install_plays_keep_their_role_order_through_dependencies() -> None:
    plays = load_playbook(REPO / "playbooks" / "up.yml")

    def roles(hosts: str) -> list[str]:
        play = next(p for p in plays if p.hosts == hosts and p.name.startswith("Install"))
        return list(dict.fromkeys(t.role for t in play.tasks))

    assert roles("vllm_mp") == ["vllm_common", "vllm_firewall", "vllm_monitoring", "vllm_mp",
                                "vllm_watchdog"]
    assert roles("vllm_ray") == ["vllm_common", "vllm_firewall", "vllm_monitoring", "ray",
                                 "vllm_ray", "vllm_watchdog"]


def test_a_dependency_cycle_and_a_bad_meta_key_are_located_errors(tmp_path: Path) -> None:
    make_role(tmp_path, "a", meta="dependencies: [b]\n")
    make_role(tmp_path, "b", meta="dependencies: [a]\n")
    playbook = write(tmp_path, "playbooks/play.yml", "- hosts: all\n  roles: [a]\n")
    message = error_of(playbook)
    assert "role dependency cycle: a -> b -> a" in message
    assert "roles/b/meta/main.yml: dependencies[0]" in message
    make_role(tmp_path, "b", meta="dependencie: [c]\n")
    message = error_of(playbook)
    assert "roles/b/meta/main.yml.dependencie" in message and "unknown role meta key" in message


# --- import_playbook and import_tasks -----------------------------------------------------------

def test_up_and_restart_share_the_hold_and_start_plays() -> None:
    up = load_playbook(REPO / "playbooks" / "up.yml")
    restart = load_playbook(REPO / "playbooks" / "restart.yml")
    start = load_playbook(REPO / "playbooks" / "start.yml")
    hold = load_playbook(REPO / "playbooks" / "hold.yml")
    assert [p.name for p in up[1:2]] == [p.name for p in hold] == [p.name for p in restart[:1]]
    assert up[-len(start):] == start == restart[-len(start):]
    assert up[0].tasks[0].module == "vllm_preflight" and up[0].tasks[0].role == "preflight"
    names = [p.name for p in restart]
    assert names.index("Stop vLLM on the master first (mp)") < names.index("Start the master (mp)")


def test_import_tasks_expands_at_load_with_its_when(tmp_path: Path) -> None:
    write(tmp_path, "playbooks/more.yml", "- name: imported\n  command: echo hi\n"
                                          "- import_tasks: deeper.yml\n")
    write(tmp_path, "playbooks/deeper.yml", "- name: deeper\n  command: echo deep\n")
    make_role(tmp_path, "r", tasks="- import_tasks: extra.yml\n  when: flag\n")
    write(tmp_path, "roles/r/tasks/extra.yml", "- name: from the role\n  command: echo r\n")
    playbook = write(tmp_path, "playbooks/play.yml",
                     "- hosts: all\n  roles: [r]\n  tasks:\n    - include_tasks: more.yml\n"
                     "      when: other\n")
    play = load_playbook(playbook)[0]
    assert [(t.name, t.when, t.role) for t in play.tasks] == [
        ("from the role", ("flag",), "r"), ("imported", ("other",), None),
        ("deeper", ("other",), None)]
    assert play.tasks[0].where.endswith("roles/r/tasks/extra.yml: [0]")


@pytest.mark.parametrize(("text", "expected"), [
    ("- import_playbook: absent.yml\n", "play.yml: play[0].import_playbook"),
    ("- import_playbook: play.yml\n", "'play.yml' imports itself"),
    ("- import_playbook: '{{ x }}.yml'\n", "a literal file name"),
    ("- import_playbook: a.yml\n  hosts: all\n", "unknown import_playbook key"),
    ("- hosts: all\n  tasks:\n    - import_tasks: absent.yml\n",
     "play.yml: play[0].tasks[0].import_tasks"),
    ("- hosts: all\n  tasks:\n    - import_tasks: a.yml\n      notify: x\n",
     "unknown import_tasks key"),
])
def test_bad_imports_are_errors_naming_file_play_and_task(tmp_path: Path, text: str,
                                                           expected: str) -> None:
    write(tmp_path, "playbooks/a.yml", "- hosts: all\n  tasks: []\n")
    assert expected in error_of(write(tmp_path, "playbooks/play.yml", text))


def test_an_error_inside_an_imported_playbook_names_that_file(tmp_path: Path) -> None:
    write(tmp_path, "playbooks/inner.yml", "- hosts: all\n  tasks:\n    - command: {cmd: x, "
                                           "timeot: 3}\n")
    message = error_of(write(tmp_path, "playbooks/play.yml", "- import_playbook: inner.yml\n"))
    assert "inner.yml: play[0].tasks[0].command" in message and "timeot" in message
