"""Declared module contracts: every module's declaration, refusals at playbook load (before any
connection) and after rendering, the generated reference in docs/, results found by register."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_runner_support import FakeHost, make_inventory

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.modules import file_module_names, find_module
from vllm_provision.modules import reference as module_reference
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.operations.deploy import serving_summary
from vllm_provision.runner import Runner, RunOptions, load_playbook
from vllm_provision.runner.engine import Notifier

REPO = Path(__file__).resolve().parents[2]

# What each shipped module accepts: a declaration that loses or renames one fails here.
DECLARED = {
    "command": ("cmd", "creates", "removes", "chdir", "stdin", "timeout", "read_only",
                "unless"),
    "copy": ("src", "dest", "owner", "group", "mode", "backup", "validate", "validate_unit"),
    "file": ("path", "state", "owner", "group", "mode"),
    "http": ("url", "method", "body", "body_format", "headers", "timeout", "status_code",
             "body_contains", "until", "retries", "delay", "from"),
    "package": ("name", "state"),
    "ray_wait_cluster": ("timeout_s", "poll_s", "gpus_per_node"),
    "systemd": ("name", "state", "enabled", "daemon_reload", "if_running"),
    "template": ("src", "dest", "owner", "group", "mode", "backup", "validate", "validate_unit"),
    "vllm_fresh_followers": (),
    "vllm_gang_start": ("timeout_s", "poll_s"),
    "vllm_gateway_venv": ("venv", "state", "wheelhouse", "requirement", "constraints", "python",
                          "import_check", "timeout"),
    "vllm_gateway_workers": ("url", "workers", "timeout", "wait"),
    "vllm_preflight": ("skip_checks",),
    "vllm_prune": ("purge",),
    "vllm_verify": ("prompt", "max_tokens", "expect_version"),
    "vllm_wait_ready": ("timeout_s", "poll_s"),
    "wait_for": ("port", "host", "state", "timeout", "delay", "connect_timeout", "from"),
}
REQUIRED = {"command": {"cmd"}, "copy": {"src", "dest"}, "file": {"path"}, "http": {"url"},
            "package": {"name"},
            "template": {"src", "dest"}, "wait_for": {"port"}, "vllm_gateway_venv": {"venv"},
            "vllm_gateway_workers": {"url", "workers"}}


def write_playbook(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "playbooks"
    folder.mkdir(exist_ok=True)
    path = folder / "play.yml"
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ProvisionError) as caught:
        load_playbook(write_playbook(tmp_path, text))
    return caught.value.render()


def test_every_shipped_module_declares_its_arguments() -> None:
    assert file_module_names() == sorted(DECLARED)
    for name, names in DECLARED.items():
        spec = find_module(name)
        assert spec is not None and spec.arguments is not None, name
        assert spec.arguments.module == name
        assert spec.arguments.names == names
        assert {a.name for a in spec.arguments.arguments if a.required} == REQUIRED.get(name, set())
        for argument in spec.arguments.arguments:
            assert argument.help, f"{name}.{argument.name} has no help line"
            assert argument.default is None or not argument.default_text, (name, argument.name)
            if argument.default is not None:  # a declared default is itself a valid value
                assert spec.arguments.validate(
                    {**_required_values(spec.arguments), argument.name: argument.default}
                )[argument.name] == argument.default


def _required_values(spec: ArgumentSpec) -> dict[str, Any]:
    samples = {"str": "/x", "int": 1, "float": 1.0, "list": ["/x"]}
    return {a.name: samples[a.kinds[0]] for a in spec.arguments if a.required}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_validating_twice_gives_the_same_values(name: str) -> None:
    spec = find_module(name)
    assert spec is not None and spec.arguments is not None
    once = spec.arguments.validate(_required_values(spec.arguments))
    assert set(once) == set(DECLARED[name])
    assert spec.arguments.validate(once) == once


def test_the_old_undeclared_names_are_gone() -> None:
    import vllm_provision.modules as modules
    from vllm_provision.modules import ModuleSpec

    assert "argument_names" not in ModuleSpec.__dataclass_fields__
    for name in DECLARED:
        module = __import__(f"vllm_provision.modules.{name}", fromlist=["x"])
        assert not hasattr(module, "ARGUMENTS"), name
    assert not hasattr(modules, "check_arguments")


def test_a_misspelt_argument_is_refused_at_load_with_file_play_task_and_fix(
        tmp_path: Path) -> None:
    text = load_error(tmp_path, """
- name: Prove it
  hosts: all
  tasks:
    - name: Send one completion
      vllm_verify: {promt: hi}
""")
    assert "play.yml: play[0].tasks[0].vllm_verify.promt: unknown argument" in text
    assert "task 'Send one completion', play 'Prove it'" in text
    assert "expected one of prompt, max_tokens, expect_version" in text
    assert "did you mean 'prompt'?" in text and "docs/modules.md" in text


def test_a_value_of_the_wrong_kind_is_refused_at_load_not_an_internal_error(
        tmp_path: Path) -> None:
    text = load_error(tmp_path, """
- hosts: all
  tasks:
    - name: Wait until rank 0 serves
      vllm_wait_ready: {poll_s: often}
""")
    assert "play[0].tasks[0].vllm_wait_ready.poll_s: wrong argument type" in text
    assert "expected a number, got 'often'" in text
    assert "fix: give a number >= 0.05" in text


@pytest.mark.parametrize(("task", "words"), [
    ("wait_for: {}", "wait_for.port: required argument missing"),
    ("wait_for: {port: 70000}", "wait_for.port: out of range"),
    ("wait_for: {port: 22, from: somewhere}", "wait_for.from: invalid value"),
    ("systemd: {name: vllm.service, state: start}",
     "systemd.state: invalid value (task 'T', play 'all') (expected one of started, stopped, "
     "restarted, got 'start')"),
    ("systemd: {name: vllm.service, enabled: 'yes'}", "systemd.enabled: wrong argument type"),
    ("systemd: vllm.service", "systemd takes a mapping of arguments"),
    ("template: {src: a.j2, dest: /etc/a, backup: 1}", "template.backup: wrong argument type"),
    ("http: {url: 'http://x', status_code: [200, 204], headers: [a]}",
     "http.headers: wrong argument type"),
])
def test_refusals_at_load(tmp_path: Path, task: str, words: str) -> None:
    text = load_error(tmp_path, f"""
- hosts: all
  tasks:
    - name: T
      {task}
""")
    assert words in text


def test_a_role_task_names_the_role_file_and_the_play(tmp_path: Path) -> None:
    tasks = tmp_path / "roles" / "demo" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text("- name: Wait\n  wait_for: {port: 22, timout: 5}\n")
    text = load_error(tmp_path, "- name: Deploy\n  hosts: all\n  roles: [demo]\n")
    assert "roles/demo/tasks/main.yml: [0].wait_for.timout: unknown argument" in text
    assert "play 'Deploy'" in text and "did you mean 'timeout'?" in text


def test_templates_wait_for_rendering_and_valid_forms_load(tmp_path: Path) -> None:
    plays = load_playbook(write_playbook(tmp_path, """
- hosts: all
  tasks:
    - name: Templated values are checked once rendered
      vllm_wait_ready: {poll_s: "{{ poll }}", timeout_s: "60"}
    - name: A free-form command
      command: echo hi
    - name: A mapping command
      command: {cmd: echo hi, timeout: 5}
    - name: Numbers as strings, as in Ansible
      wait_for: {port: "22", timeout: "1.5"}
"""))
    assert [t.module for t in plays[0].tasks] == ["vllm_wait_ready", "command", "command",
                                                  "wait_for"]


def test_a_rendered_value_of_the_wrong_kind_fails_the_task_with_its_place(
        tmp_path: Path) -> None:
    playbook = write_playbook(tmp_path, """
- hosts: h1
  vars: {port: often}
  tasks:
    - name: Wait for a port
      wait_for: {port: "{{ port }}", timeout: 1}
""")
    inventory = make_inventory(tmp_path, ("h1",))
    fakes: dict[str, FakeHost] = {}

    def factory(host: Host) -> FakeHost:
        fakes[host.name] = FakeHost(host)
        return fakes[host.name]

    outcome = Runner(inventory, RunOptions(), connection_factory=factory).run_playbook(playbook)
    (result,) = [r for r in outcome.results if r.task == "Wait for a port"]
    assert result.status is Status.FAILED
    assert "play[0].tasks[0].wait_for.port: wrong argument type" in result.message
    assert "expected an integer, got 'often'" in result.message
    assert not any("/dev/tcp" in c for c in fakes["h1"].commands)  # nothing was sent for it


def test_conversions_follow_the_declared_kind() -> None:
    spec = ArgumentSpec("demo", (
        Argument("n", "int", "n"), Argument("x", "float", "x"), Argument("b", "bool", "b"),
        Argument("m", ("str", "int"), "m"), Argument("l", "list", "l"),
    ))
    assert spec.validate({"n": "30", "x": "1.5", "m": 420, "l": ("a",)}) == {
        "n": 30, "x": 1.5, "b": None, "m": 420, "l": ["a"]}
    for bad in ({"n": True}, {"n": "3.5"}, {"x": "nan"}, {"x": False}, {"b": "yes"},
                {"l": "a"}, {"m": 1.5}):
        with pytest.raises(ProvisionError, match="wrong argument type"):
            spec.validate(bad)
    with pytest.raises(ValueError):
        ArgumentSpec("demo", (Argument("a", "str", "a"), Argument("a", "int", "a")))
    with pytest.raises(ValueError):
        ArgumentSpec("demo", (Argument("a", "str", "a"),), free_form="b")


def test_the_module_reference_in_docs_is_current() -> None:
    current = (REPO / "docs" / "modules.md").read_text(encoding="utf-8")
    assert current == module_reference.render(), (
        f"docs/modules.md is stale; run: {module_reference.REGENERATE}")
    for name, names in DECLARED.items():
        assert f"## `{name}`" in current
        assert all(f"| `{argument}` |" in current for argument in names)


def test_the_reference_check_command_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "modules.md"
    stale.write_text("# Module reference\n")
    command = [sys.executable, "-m", "vllm_provision.modules.reference"]
    failed = subprocess.run([*command, "--check", str(stale)], capture_output=True, text=True,
                            timeout=60)
    assert failed.returncode == 1 and "stale" in failed.stderr
    subprocess.run([*command, "--write", str(stale)], check=True, timeout=60)
    assert stale.read_text(encoding="utf-8") == module_reference.render()
    assert subprocess.run([*command, "--check", str(stale)], timeout=60).returncode == 0


def test_up_finds_the_completion_by_register_not_by_task_name() -> None:
    results = [
        TaskResult("h1", "Renamed readiness wait", Status.OK,
                   data={"start_to_serving_s": 12.5, "already_serving": False, "other": 1},
                   register="vllm_ready"),
        TaskResult("h1", "Wait until rank 0 serves the model", Status.OK,
                   data={"completion": "not me"}, register=None),
        TaskResult("h1", "Renamed completion", Status.OK,
                   data={"completion": "hi", "served_model": "m", "ttft_s": 0.1},
                   register="vllm_verified"),
    ]
    assert serving_summary(results) == {"start_to_serving_s": 12.5, "already_serving": False,
                                        "completion": "hi", "served_model": "m", "ttft_s": 0.1}
    assert serving_summary(results[1:2]) == {}


def test_the_packaged_playbooks_register_what_up_reads() -> None:
    from vllm_provision import resources
    from vllm_provision.operations.deploy import SERVING_REGISTERS

    for name in ("up", "restart"):
        plays = load_playbook(resources.playbook(name))
        registers = {t.register: t.module for p in plays for t in p.tasks if t.register}
        assert {r: registers.get(r) for r in SERVING_REGISTERS} == {
            "vllm_ready": "vllm_wait_ready", "vllm_verified": "vllm_verify"}


def test_a_handler_note_comes_from_the_notifier_not_from_message_text() -> None:
    assert Notifier("an earlier run of mine").note == ""  # a task named like the note
    assert Notifier("Install the unit", earlier_run=True).note == (
        "notified by an earlier run (Install the unit)")
    assert Notifier("", earlier_run=True).note == "notified by an earlier run"


def test_connection_imports_no_module() -> None:
    """The connection layer sits below the modules: importing it loads none of them."""
    code = ("import sys, vllm_provision.transport.connection; "
            "print(sorted(m for m in sys.modules if m.startswith('vllm_provision.modules')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"


def test_no_product_file_points_to_documents_outside_the_repository() -> None:
    """Users get the package and this repository's docs/, nothing else: no issue numbers, no
    notes of the people who built it."""
    pattern = re.compile(r"shared/docs|\bissue [0-9]|lab-probe\.md|domain\.md|research-"
                         r"(anchors|vllm)")
    found = []
    for folder in ("vllm_provision", "roles", "playbooks", "docs"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".yml", ".j2", ".md", ".json", ".sh"):
                for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                    if pattern.search(line):
                        found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []
