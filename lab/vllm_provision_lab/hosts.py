"""Lifecycle of one lab host on the main machine: overlay root, identity, boot loop, stop."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from vllm_provision_lab import cgroups, network
from vllm_provision_lab.base import DEPLOY_USER
from vllm_provision_lab.bootloop import write_pid
from vllm_provision_lab.config import LabConfig
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.keys import make_host_key
from vllm_provision_lab.system import run

log = logging.getLogger(__name__)

BOOTLOOP = Path(__file__).with_name("bootloop.py")


def host_run_dir(config: LabConfig, host: str) -> Path:
    """The host's dir: ``upper``/``work``/``root`` of its overlay, pid files, ``console.log``."""
    return config.run_dir / host


def mount_root(config: LabConfig, host: str, base_dir: Path) -> Path:
    """Mount the host's overlay (read-only ``base_dir`` below, its own upper dir) and return the
    merged root. The upper dir is kept across reboots and removed by :func:`remove_host`.

    ``redirect_dir=on`` lets a folder of the base move, as it can on a server's ext4 or xfs
    (kernel docs, ``filesystems/overlayfs.rst``, "Redirect dir"): without it rename(2) of
    such a folder fails with EXDEV, and ``provision stack sync`` could not swap the base's
    ``/opt/vllm`` folder for its symlink."""
    run_dir = host_run_dir(config, host)
    for name in ("upper", "work", "root"):
        (run_dir / name).mkdir(parents=True, exist_ok=True)
    root = run_dir / "root"
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={base_dir},upperdir={run_dir / 'upper'},workdir={run_dir / 'work'},"
         "redirect_dir=on",
         str(root)])
    return root


def write_identity(config: LabConfig, root: Path, host: str, all_hosts: Sequence[str],
                   public_key: str) -> str:
    """Give the host its own hostname, machine-id, ssh host key, /etc/hosts and authorized keys
    (root and ``deploy``); all land in its upper dir (probe gotcha 8).

    Returns:
        the host's public ssh host key line (``"ssh-ed25519 AAAA..."``).
    """
    (root / "etc/hostname").write_text(f"{host}\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{host}",  # as Debian's installer writes it
             "::1\tlocalhost ip6-localhost ip6-loopback", f"{config.bridge_address}\tmain"]
    lines += [f"{config.address(name)}\t{name}" for name in all_hosts]
    (root / "etc/hosts").write_text("\n".join(lines) + "\n")
    uid, gid, home = _passwd_entry(root, DEPLOY_USER)
    homes = ((root / "root/.ssh", (0, 0)), (root / home.lstrip("/") / ".ssh", (uid, gid)))
    for directory, owner in homes:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        keys = directory / "authorized_keys"
        keys.write_text(public_key)
        keys.chmod(0o600)
        for path in (directory, keys):
            os.chown(path, *owner)
    return make_host_key(root)


def _passwd_entry(root: Path, user: str) -> tuple[int, int, str]:
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3]), fields[5]
    raise LabError.single(str(root / "etc/passwd"), f"the base has no user {user}",
                          fix="remove the cached base tarball and run lab up again")


def start_boot_loop(config: LabConfig, host: str) -> None:
    """Start the host's boot loop (:mod:`vllm_provision_lab.bootloop`) in its own session, at
    the instance's niceness (``config.nice``)."""
    run_dir = host_run_dir(config, host)
    (run_dir / "stop").unlink(missing_ok=True)
    cgroup_dirs = [str(root / config.cgroup_subtree / host) for root in cgroups.hierarchy_roots()]
    argv = [sys.executable, "-I", str(BOOTLOOP), "--run-dir", str(run_dir),
            "--machine", config.netns(host), "--hostname", host, "--netns", config.netns(host)]
    for directory in cgroup_dirs:
        argv += ["--cgroup", directory]
    if config.nice:
        argv += ["--nice", str(config.nice)]
    with open(run_dir / "console.log", "ab") as console:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    # atomic, as the boot loop writes it: wait_ready() reads it meanwhile (a truncated file read
    # as "no boot loop" made a booting host look dead)
    write_pid(run_dir / "boot.pid", process.pid)


def boot_loop_alive(config: LabConfig, host: str) -> bool:
    """True while the host's boot loop process runs."""
    return _alive(host_run_dir(config, host) / "boot.pid", "bootloop.py")


def nspawn_pid(config: LabConfig, host: str) -> int | None:
    """The pid of the host's running systemd-nspawn, or None."""
    pid_file = host_run_dir(config, host) / "nspawn.pid"
    return _read_pid(pid_file) if _alive(pid_file, "systemd-nspawn") else None


def console_tail(config: LabConfig, host: str, lines: int = 20) -> str:
    """The last ``lines`` lines of the host's console log (for error messages); when the log is
    empty or gone, what the pid files say of the boot loop and nspawn instead."""
    path = host_run_dir(config, host) / "console.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    if text.strip():
        return "\n".join(text.splitlines()[-lines:])
    facts = [f"{path}: {'empty' if path.exists() else 'missing'}"]
    for name in ("boot.pid", "nspawn.pid"):
        pid = _read_pid(host_run_dir(config, host) / name)
        state = "no pid"
        if pid is not None:
            try:
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
                state = next((line for line in status if line.startswith("State:")), "?")
                state += " cmdline " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(
                    b"\0", b" ").decode(errors="replace")[:160]
            except OSError:
                state = "no such process"
        facts.append(f"{name}: {pid} ({state})")
    return "\n".join(facts)


def request_poweroff(config: LabConfig, host: str) -> None:
    """Ask the guest to power off (SIGTERM to nspawn: an orderly shutdown) and not reboot."""
    run_dir = host_run_dir(config, host)
    if run_dir.is_dir():
        (run_dir / "stop").touch()
    pid = nspawn_pid(config, host)
    if pid is not None:
        _signal(pid, 15)


def remove_host(config: LabConfig, host: str, timeout_s: float = 15.0) -> None:
    """Stop the host and remove everything of it: processes (its cgroup, incl. a delayer),
    mounts, netns and veth, cgroups and its run dir. Safe on half-made or already-gone hosts
    and after nspawn was SIGKILLed (the guest's processes are then killed through cgroup.kill).
    """
    run_dir = host_run_dir(config, host)
    network.stop_delayer(run_dir)
    request_poweroff(config, host)
    deadline = time.monotonic() + timeout_s
    while boot_loop_alive(config, host) and time.monotonic() < deadline:
        time.sleep(0.1)
    if cgroups.pids(config.cgroup_subtree, host):
        log.info("%s: killing leftover processes through cgroup.kill", host)
        cgroups.kill(config.cgroup_subtree, host)
    unmount_under(run_dir)
    network.remove_host_network(config, host)
    cgroups.remove(config.cgroup_subtree, host)
    shutil.rmtree(run_dir, ignore_errors=True)


def unmount_under(directory: Path) -> None:
    """Unmount every mount point at or below ``directory``, deepest first (lazily if busy)."""
    prefix = str(directory).rstrip("/")
    for point in sorted(mounts_under(directory), key=len, reverse=True):
        if point == prefix or point.startswith(prefix + "/"):
            if run(["umount", point], check=False).returncode != 0:
                run(["umount", "-l", point], check=False)


def mounts_under(directory: Path) -> list[str]:
    """Return the mount points (main machine's mount namespace) at or below ``directory``."""
    prefix = str(directory).rstrip("/")
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4].replace("\\040", " ") for line in handle]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


EXEC_WINDOW_S = 10.0


def _alive(pid_file: Path, marker: str) -> bool:
    """True when the pid in ``pid_file`` runs a command line holding ``marker``.

    A process in the middle of execve(2) has an empty command line: the kernel closes the
    parent's close-on-exec pipe (so ``subprocess.Popen`` has returned) before it sets up the new
    image's arguments (fs/binfmt_elf.c: ``begin_new_exec`` comes before ``create_elf_tables``),
    and on a loaded machine that window lasts. An empty command line of a live process is
    therefore read again until it shows one (at most :data:`EXEC_WINDOW_S` seconds); a zombie,
    a gone process or another command line is not alive.
    """
    pid = _read_pid(pid_file)
    if pid is None:
        return False
    deadline = time.monotonic() + EXEC_WINDOW_S
    while True:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        if cmdline or "\nState:\tZ" in status or time.monotonic() > deadline:
            return marker in cmdline.decode(errors="replace")
        time.sleep(0.05)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
