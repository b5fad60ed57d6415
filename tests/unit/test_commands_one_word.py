"""Every shell command of every playbook and role keeps each value one word: rendered with
hostile values, split with shlex, and run under /bin/sh with stub programs that record argv."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jinja2.meta
import pytest
from render_support import command_tasks

from vllm_provision.modules import wait_for
from vllm_provision.runner.templating import Templar, make_environment

# No '/' (the value also lands as a relative file name in cwd) and no control character
# (refused at load); everything a shell treats specially otherwise.
HOSTILE = "v-{name} ;touch vp-marker' \"$(touch vp-marker)\" `touch vp-marker` |&><*?~#!{{x}}"
NUMBERS = {"vllm_ready_timeout_s": 60}
TASKS = list(command_tasks())
PROGRAMS = ("systemctl", "id", "useradd", "mkdir", "rm", "date", "touch", "readlink")


def _render(command: str) -> tuple[str, dict[str, str]]:
    env = make_environment()
    names = jinja2.meta.find_undeclared_variables(env.parse(command))
    values: dict[str, Any] = {}
    for name in names - {"node"}:
        values[name] = NUMBERS.get(name, HOSTILE.format(name=name))
    templar = Templar(env, values, "test", {"node": SimpleNamespace(rank=0)})
    rendered = templar.render(command, "command")
    # the values the command uses (a conditional expression may use only one of two)
    strings = {k: v for k, v in values.items() if isinstance(v, str) and f"v-{k} " in rendered}
    return rendered, strings


def test_there_are_command_tasks_to_check() -> None:
    # the restart handlers use the systemd module (argv words); the hold and release commands
    # are written once, in playbooks/hold.yml and start.yml (imported by up and restart)
    assert {where.split(":")[0] for where, _ in TASKS} >= {
        "playbooks/hold.yml", "playbooks/start.yml", "roles/vllm_common/tasks/main.yml"}
    assert not [where for where, cmd in TASKS if "sh -c" in cmd or "bash -c" in cmd]


@pytest.mark.parametrize(("where", "command"), TASKS, ids=[w for w, _ in TASKS])
def test_each_value_is_one_shlex_word(where: str, command: str) -> None:
    rendered, values = _render(command)
    words = shlex.split(rendered)
    for name, value in values.items():
        assert value in words, f"{where}: {name} is not one word in {rendered!r}"


@pytest.fixture()
def stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in PROGRAMS:
        script = bin_dir / program
        extra = {"systemctl": 'case "$1" in is-active) echo active;; esac\n', "id": "exit 1\n",
                 "date": "echo 0\n"}.get(program, "")
        script.write_text(f'#!/bin/sh\nprintf "%s\\0" {program} "$@" >> "$ARGV_LOG"\n'
                          f'printf "\\n" >> "$ARGV_LOG"\n{extra}')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


@pytest.mark.parametrize(("where", "command"), TASKS, ids=[w for w, _ in TASKS])
def test_each_value_is_one_argv_word_when_run(where: str, command: str, stubs: Path,
                                              tmp_path: Path) -> None:
    rendered, values = _render(command)
    log = tmp_path / "argv.log"
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": str(stubs), "ARGV_LOG": str(log), "HOME": str(tmp_path)}
    subprocess.run(["/bin/sh", "-c", rendered], cwd=work, env=env, timeout=10,
                   capture_output=True, check=False)
    calls = [line.split("\0") for line in log.read_text().split("\0\n") if line] \
        if log.exists() else []
    argv_words = {word for call in calls for word in call}
    assert not any(call[0] == "touch" for call in calls), f"{where} ran a value: {calls}"
    assert not (work / "vp-marker").exists()
    for name, value in values.items():
        if "hold_file" not in name:
            assert value in argv_words, f"{where}: {name} did not arrive as one word: {calls}"
    if any("hold_file" in name for name in values):  # a redirection target: one file name
        assert [p.name for p in work.iterdir()] == [values["vllm_watchdog_hold_file"]] or \
            "rm -f" in command


def test_wait_for_passes_the_address_as_its_own_word(tmp_path: Path) -> None:
    scripts: list[str] = []

    class Conn:
        def run(self, script: str, **_: Any) -> Any:
            scripts.append(script)
            return SimpleNamespace(ok=True, exit_code=0, stdout="", stderr="")

    ctx = SimpleNamespace(host=SimpleNamespace(address="10.0.0.1"), conn=Conn(), check_mode=False)
    wait_for.run(ctx, {"port": 29501, "host": "fe80::1%eth0", "timeout": 1})
    words = shlex.split(scripts[0])
    inner = words[words.index("-c") + 1]
    assert "fe80" not in inner and "$1" in inner
    assert words[words.index("-c") + 3] == "fe80::1%eth0"


@pytest.mark.parametrize("address", ["10.0.0.1';touch /tmp/x;'", "$(id)", "a b", "-x",
                                     "fe80::1%$(id)"])
def test_wait_for_refuses_an_address_that_is_not_one(address: str) -> None:
    from vllm_provision.core.errors import ProvisionError

    ctx = SimpleNamespace(host=SimpleNamespace(address="10.0.0.1"), conn=None, check_mode=False)
    with pytest.raises(ProvisionError, match="invalid address"):
        wait_for.run(ctx, {"port": 29501, "host": address, "timeout": 1})


def test_the_wait_for_script_runs_under_sh() -> None:
    scripts: list[str] = []

    class Conn:
        def run(self, script: str, **_: Any) -> Any:
            scripts.append(script)
            result = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                                    timeout=20, env={"PATH": os.environ["PATH"]})
            return SimpleNamespace(ok=result.returncode == 0, exit_code=result.returncode,
                                   stdout=result.stdout, stderr=result.stderr)

    ctx = SimpleNamespace(host=SimpleNamespace(address="127.0.0.1"), conn=Conn(),
                          check_mode=False)
    result = wait_for.run(ctx, {"port": 9, "host": "127.0.0.1", "state": "stopped",
                                "timeout": 2})
    assert str(result.status) in ("ok", "Status.OK"), result.message
