"""A host's state record is data (docs/security.md, "A host's record is data"): before
``up``'s prune, ``down --purge`` or ``--take-over`` stops, disables or removes what a record
lists, every path must lie in a folder we write and every unit (and listed unit file) must
begin with our marker line; otherwise the host is refused whole and nothing there is touched.

The host side runs for real: :func:`vllm_provision.state.prune.state_script` under bash, with a
stand-in ``systemctl`` on PATH whose ``show -p FragmentPath`` names files in a temporary
folder (a unit of ours, a distribution's ``ssh.service``, an absent unit)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_runner_support import make_inventory

from vllm_provision.checks.ownership import conflict
from vllm_provision.core.errors import ProvisionError
from vllm_provision.facts.model import HostOwner
from vllm_provision.operations import takeover
from vllm_provision.state import prune

OURS = "# managed by vllm-provision, role vllm_mp: do not edit here\n[Unit]\n"
SSHD = "[Unit]\nDescription=OpenBSD Secure Shell server\n"


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    """A fake host: unit files in ``units/``, a ``systemctl`` stand-in that reports them."""
    units = tmp_path / "units"
    units.mkdir()
    (units / "vllm.service").write_text(OURS)
    (units / "ssh.service").write_text(SSHD)
    (units / "llm.service").write_text("# managed by vllm-provision, role vllm_mp\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"""#!/bin/bash
# systemctl show -p PROP --value -- UNIT
prop=$3; unit=$6
case $prop in
  FragmentPath) [ -e {units}/$unit ] && echo {units}/$unit || echo "";;
  ActiveState) [ -e {units}/$unit ] && echo active || echo inactive;;
  UnitFileState) [ -e {units}/$unit ] && echo enabled || echo "";;
esac
""")
    systemctl.chmod(0o755)
    return {"units": units, "path": f"{bin_dir}:{os.environ['PATH']}"}


class Shell:
    """A connection that runs each command under bash with the stand-in on PATH, and records
    it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.commands: list[str] = []

    def run(self, command: str, **_: Any) -> Any:
        self.commands.append(command)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              env={**os.environ, "PATH": self.path}, timeout=30, check=False)

        class Result:
            ok = done.returncode == 0
            stdout, stderr, exit_code = done.stdout, done.stderr, done.returncode
        return Result()


def test_the_state_script_names_units_and_unit_files_without_our_marker(host: dict) -> None:
    u = host["units"]
    script = prune.state_script(["vllm.service", "ssh.service", "gone.service"],
                                [f"{u}/vllm.service", f"{u}/ssh.service", f"{u}/nope.service",
                                 str(u / "vllm.service") + ".d"])
    out = Shell(host["path"]).run(script).stdout
    assert prune.foreign(out) == ["ssh.service", f"{u}/ssh.service"]
    units, files = prune.parse_state(out)
    assert units["vllm.service"] == ("active", "enabled")
    assert files == {f"{u}/vllm.service", f"{u}/ssh.service"}


@pytest.mark.parametrize("name", ["ssh.service", "a b.service", "$(id).service"])
def test_a_unit_name_is_only_ever_a_quoted_word(host: dict, name: str) -> None:
    out = Shell(host["path"]).run(prune.state_script([name], [])).stdout
    assert ("@@foreign ssh.service" in out) is (name == "ssh.service")
    assert "uid=" not in out


def _owner(files: dict[str, str]) -> HostOwner:
    return HostOwner(inventory="/old/inv.yml", replica="old", host="h1", files=files,
                     replica_id="old@0000000000000000")


def _take(tmp_path: Path, files: dict[str, str]) -> tuple[Any, takeover.TakeOver]:
    inventory = make_inventory(tmp_path)
    item = conflict(inventory.replicas[0], "h1", _owner(files), "/new/inv.yml")
    assert item is not None
    return inventory, takeover.plan_take_over(item, ["/etc/vllm-provision/vllm.env"])


def test_take_over_vets_a_record_of_ours(tmp_path: Path, host: dict) -> None:
    u = host["units"]
    inventory, take = _take(tmp_path, {f"{u}/llm.service": "1"})
    shell = Shell(host["path"])
    assert takeover.vet(inventory, take, [f"{u}/vllm.service"], shell) is None, take
    assert len(shell.commands) == 1  # one read, nothing else


@pytest.mark.parametrize(("listed", "named"), [
    ({"/etc/passwd": "1"}, "/etc/passwd"),
    ({"/etc/systemd/system/../../root/.ssh/authorized_keys": "1"}, "authorized_keys"),
    ({"/root/x.service": "1"}, "/root/x.service"),
])
def test_take_over_refuses_paths_outside_our_folders(tmp_path: Path, host: dict,
                                                     listed: dict[str, str], named: str) -> None:
    inventory, take = _take(tmp_path, listed)
    problem = takeover.vet(inventory, take, [], Shell(host["path"]))
    assert problem is not None and named in problem.message and "nothing on h1" in problem.message


def test_take_over_refuses_a_unit_file_that_is_not_ours(tmp_path: Path, host: dict) -> None:
    u = host["units"]
    inventory, take = _take(tmp_path, {f"{u}/ssh.service": "1", f"{u}/llm.service": "2"})
    shell = Shell(host["path"])
    problem = takeover.vet(inventory, take, [f"{u}/vllm.service"], shell)
    assert problem is not None
    assert "ssh.service" in problem.message and "llm.service" not in (problem.actual or "")
    assert not any("disable" in c or "rm -f" in c for c in shell.commands)


class RecordHost(Shell):
    """The bash host above, answering the state record read with ``record``."""

    def __init__(self, path: str, record: dict[str, Any]) -> None:
        super().__init__(path)
        self.record = record

    def run(self, command: str, **options: Any) -> Any:
        if "state.json" in command and "cat" in command:
            import json

            class Result:
                ok, stdout, stderr, exit_code = True, json.dumps(self.record), "", 0
            return Result()
        return super().run(command, **options)


def test_the_guard_removes_nothing_anywhere_when_one_host_s_record_is_not_ours(
        tmp_path: Path, host: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    u = host["units"]
    inventory = make_inventory(tmp_path)
    owners = {"h1": _owner({f"{u}/llm.service": "1"}),
              "h2": _owner({f"{u}/ssh.service": "1"})}
    import vllm_provision.state as state_module

    monkeypatch.setattr(state_module, "read_host_record",
                        lambda conn, path=None: {"host": conn.name})
    monkeypatch.setattr(takeover, "parse_owner",
                        lambda name, raw, problems: owners[name])
    shells = {name: Shell(host["path"]) for name in ("h1", "h2")}
    for name, shell in shells.items():
        shell.name = name  # type: ignore[attr-defined]
    lines: list[str] = []
    with pytest.raises(ProvisionError) as raised:
        takeover.guard(inventory, ["h1", "h2"], {}, shells, command="up", take_over=True,
                       check_mode=False, echo=lines.append)
    assert "h2" in raised.value.render() and "ssh.service" in raised.value.render()
    for shell in shells.values():
        assert not any("disable --now" in c or "rm -f" in c for c in shell.commands)
