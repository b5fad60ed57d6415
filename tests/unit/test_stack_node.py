"""The node side of `provision stack` on a local folder: the first switch swaps a plain venv
folder for a symlink (RENAME_EXCHANGE), later switches rename a new symlink over the old one,
rollback swaps back, cleanup removes partial stacks and keeps the active and previous ones; and
the controller refuses a sync that does not fit on the disk, with the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.stack import lock as stack_lock
from vllm_provision.stack import sync as stack_sync
from vllm_provision.transport.base import CommandResult


def node(action: str, venv: Path, **config: Any) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-", json.dumps({"action": action, "venv": str(venv),
                                                           **config})],
                         input=stack_sync.node_script(), capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def complete_stack(venv: Path, stack_id: str) -> Path:
    folder = Path(f"{venv}.stack-{stack_id}")
    (folder / "bin").mkdir(parents=True)
    (folder / ".vllm-provision-stack.json").write_text(json.dumps({"stack": stack_id}))
    return folder


def test_switch_rollback_and_cleanup_on_a_folder(tmp_path: Path) -> None:
    venv = tmp_path / "vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "hand-made").write_text("")
    a = complete_stack(venv, "aaa")
    answer = node("switch", venv, stack="aaa")
    assert answer["switched"] and venv.is_symlink() and venv.resolve() == a
    assert (tmp_path / "vllm.stack-original" / "hand-made").exists()
    assert Path(f"{venv}.previous").resolve() == tmp_path / "vllm.stack-original"
    assert node("switch", venv, stack="aaa") == {"switched": False, "active": str(a)}
    b = complete_stack(venv, "bbb")
    node("switch", venv, stack="bbb")
    assert venv.resolve() == b and Path(f"{venv}.previous").resolve() == a
    back = node("rollback", venv)
    assert back["active"] == str(a) and venv.resolve() == a
    assert Path(f"{venv}.previous").resolve() == b
    partial = Path(f"{venv}.stack-ccc")
    partial.mkdir()
    removed = node("cleanup", venv, keep_complete=False)["removed"]
    assert sorted(Path(p).name for p in removed) == ["vllm.stack-ccc", "vllm.stack-original"]
    assert a.exists() and b.exists()


def test_switch_refuses_a_stack_without_its_marker(tmp_path: Path) -> None:
    venv = tmp_path / "vllm"
    Path(f"{venv}.stack-ddd").mkdir(parents=True)
    assert "not a complete stack" in node("switch", venv, stack="ddd")["error"]
    assert not venv.exists()


def test_probe_reads_the_platform_and_the_active_stack(tmp_path: Path) -> None:
    venv = tmp_path / "vllm"
    complete_stack(venv, "eee")
    node("switch", venv, stack="eee")
    raw = node("probe", venv)
    probed = stack_sync.node_stack("h1", raw)
    assert probed.active_stack == "eee" and probed.active_complete
    assert probed.python == ".".join(map(str, sys.version_info[:3]))
    assert probed.free_bytes > 0


class FakeConnection:
    """Answers every stack step with an empty success; records the commands."""

    name = "h2"

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, **_kwargs: Any) -> CommandResult:
        self.commands.append(command)
        return CommandResult(0, json.dumps({"removed": []}), "")


def test_sync_refuses_with_the_numbers_when_the_disk_is_too_small(tmp_path: Path) -> None:
    wheel = tmp_path / "six-1.17.0-py2.py3-none-any.whl"
    wheel.write_bytes(b"x" * (200 * stack_sync.MIB // 100))
    lock = stack_lock.parse_lock(f"six==1.17.0 --hash=sha256:{'a' * 64}\n")
    wheels = {"six": stack_sync.Wheel(wheel, "a" * 64, 200 * stack_sync.MIB)}
    conn = FakeConnection()
    small = stack_sync.NodeStack("h2", free_bytes=500 * stack_sync.MIB, disk_path="/opt")
    with pytest.raises(ProvisionError) as caught:
        stack_sync.build_node(conn, small, lock, wheels, "/opt/vllm")
    text = caught.value.render()
    assert "not enough free disk on /opt" in text and "500 MiB free" in text
    assert ">= 864 MiB (wheels to push 200 MiB + new venv ~600 MiB + margin 64 MiB" in text
    assert not any("cat >" in c for c in conn.commands)  # nothing was pushed


def _stack_with(venv: Path, stack_id: str, version: str, pin: bool) -> Path:
    """A real venv ``<venv>.stack-<id>`` holding modules ``a`` and ``b`` at ``version``."""
    from vllm_provision.stack import node as stack_node

    folder = Path(f"{venv}.stack-{stack_id}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    (site,) = folder.glob("lib/python3*/site-packages")
    for name in ("a", "b"):
        (site / f"{name}.py").write_text(f"V = {version!r}\n")
    if pin:
        assert stack_node.write_pin(str(folder)) == ""
    return folder


@pytest.mark.parametrize("pin", [True, False], ids=["pinned", "unpinned"])
def test_a_process_started_before_a_switch_imports_from_one_stack_only(tmp_path: Path,
                                                                       pin: bool) -> None:
    """The switch repoints the venv symlink while a Python started through it is running: with
    the pin (written by every install) it goes on importing from the folder it started in; without
    it, its later imports come from the new stack (what the pin exists to prevent)."""
    venv = tmp_path / "vllm"
    old = _stack_with(venv, "old", "1", pin)
    new = _stack_with(venv, "new", "2", pin)
    venv.symlink_to(old.name)
    code = ("import sys, a; print('ready', flush=True); sys.stdin.readline(); import b; "
            "print(a.V, b.V)")
    proc = subprocess.Popen([str(venv / "bin" / "python"), "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    link = tmp_path / "link.tmp"
    link.symlink_to(new.name)
    link.replace(venv)  # what switch does: rename(2) of a new symlink over the old one
    out, _ = proc.communicate("\n", timeout=60)
    assert out.split() == (["1", "1"] if pin else ["1", "2"])
    started = subprocess.run([str(venv / "bin" / "python"), "-c", "import a, b, sys; "
                              "print(a.V, b.V, sys.prefix)"], capture_output=True, text=True,
                             check=True)
    assert started.stdout.split()[:2] == ["2", "2"]  # a process started after sees the new one
    if pin:
        assert started.stdout.split()[2] == str(new)


@pytest.fixture
def overlay(tmp_path: Path) -> Any:
    """``overlay(options) -> merged dir`` of a real overlayfs whose lower layer holds a venv
    folder ``vllm`` (needs root and mount(8), as the lab does; unmounted at the end)."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8)")
    mounted: list[Path] = []

    def mount(options: str = "") -> Path:
        top = tmp_path / f"ovl{len(mounted)}"
        for name in ("lower/vllm/bin", "upper", "work", "merged"):
            (top / name).mkdir(parents=True)
        (top / "lower/vllm/hand-made").write_text("")
        opts = f"lowerdir={top / 'lower'},upperdir={top / 'upper'},workdir={top / 'work'}"
        done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                               opts + (f",{options}" if options else ""), str(top / "merged")],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount an overlay here: {done.stderr.strip()}")
        mounted.append(top / "merged")
        return top / "merged"

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def test_a_first_switch_the_file_system_refuses_changes_nothing(overlay: Any) -> None:
    """overlayfs without redirect_dir refuses to move a folder of its lower layer (EXDEV): the
    first switch says what to do once by hand and leaves the venv folder, no .previous and no
    link behind; cleanup keeps the folder."""
    merged = overlay()
    venv = merged / "vllm"
    complete_stack(venv, "aaa")
    answer = node("switch", venv, stack="aaa")
    assert "EXDEV" in answer["error"] and "Nothing was switched" in answer["error"]
    assert f"cp -a {venv} {venv}.stack-original" in answer["error"]
    assert venv.is_dir() and not venv.is_symlink() and (venv / "hand-made").exists()
    assert not Path(f"{venv}.previous").exists() and not Path(f"{venv}.previous").is_symlink()
    # (.vllm.stack-lock is the lock that serialises the steps on a node)
    assert sorted(p.name for p in merged.iterdir()) == [".vllm.stack-lock", "vllm",
                                                        "vllm.stack-aaa"]
    node("cleanup", venv)
    assert (venv / "hand-made").exists()


def test_a_first_switch_on_an_overlay_with_redirect_dir_swaps(overlay: Any) -> None:
    """With redirect_dir=on (as the lab mounts its hosts: a disk where a folder can move, like
    ext4 or xfs) the same first switch swaps the folder for the link."""
    merged = overlay("redirect_dir=on")
    venv = merged / "vllm"
    a = complete_stack(venv, "aaa")
    answer = node("switch", venv, stack="aaa")
    assert answer["switched"] and venv.resolve() == a, answer
    assert (merged / "vllm.stack-original" / "hand-made").exists()
