"""Keep one lab host booted: run systemd-nspawn, boot it again when the guest reboots.

Started by :mod:`vllm_provision_lab.hosts` under ``setsid`` (so it outlives the calling shell,
probe gotcha 14) and run by path with ``python3 -I``: standard library only. It first moves
itself into the host's own cgroups (probe gotcha 2), then loops:

- exit status 133 means the guest ran ``reboot`` (systemd-nspawn(1), "--boot"; the
  ``systemd-nspawn@.service`` unit restarts on it too): boot again;
- anything else (guest ``poweroff``, SIGTERM from ``lab down``), or a ``stop`` file in the run
  dir: stop.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

REBOOT_EXIT_STATUS = 133


def join_cgroups(cgroup_dirs: list[str]) -> None:
    """Move this process into each of ``cgroup_dirs`` (created if absent)."""
    for directory in cgroup_dirs:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")


def nspawn_command(root: str, machine: str, hostname: str, netns: str) -> list[str]:
    """Return the systemd-nspawn command line that boots the guest in ``root``.

    ``--register=no --keep-unit``: there is no systemd/D-Bus on the main machine (gotcha 1);
    ``--capability=CAP_NET_ADMIN``: not granted with ``--network-namespace-path`` (gotcha 5).
    ``machine`` is unique per lab instance (nspawn keys its /run state by it); the guest's
    hostname is the plain host name.
    """
    return ["systemd-nspawn", "--quiet", "--directory", root, "--machine", machine,
            f"--hostname={hostname}", "--boot", "--register=no", "--keep-unit",
            "--capability=CAP_NET_ADMIN", f"--network-namespace-path=/run/netns/{netns}",
            "--console=read-only", "--resolv-conf=off", "--timezone=off", "--link-journal=no"]


def write_pid(path: Path, pid: int) -> None:
    """Write ``pid`` to ``path`` atomically (a temporary file renamed over it): the lab polls
    these files while the host boots, and must never read one half-written or truncated."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(f"{pid}\n")
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, join the cgroups, boot the guest until it stops for good."""
    parser = argparse.ArgumentParser(description="boot one lab host, again on reboot")
    parser.add_argument("--run-dir", required=True, help="host dir: root/, pid files, stop file")
    parser.add_argument("--machine", required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--netns", required=True)
    parser.add_argument("--cgroup", action="append", default=[], help="cgroup dir to join")
    parser.add_argument("--nice", type=int, default=0,
                        help="niceness for the guest's processes (inherited through nspawn)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    join_cgroups(args.cgroup)
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    write_pid(run_dir / "boot.pid", os.getpid())
    # the guest sees a pure cgroup2 tree, as a real bookworm host does (gotcha 3)
    env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1")
    child: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        (run_dir / "stop").touch()
        if child:
            child[0].send_signal(signum)  # nspawn turns SIGTERM into an orderly poweroff

    signal.signal(signal.SIGTERM, forward)
    status = 0
    while not (run_dir / "stop").exists():
        process = subprocess.Popen(
            nspawn_command(str(run_dir / "root"), args.machine, args.hostname, args.netns),
            env=env, stdin=subprocess.DEVNULL)
        child[:] = [process]
        write_pid(run_dir / "nspawn.pid", process.pid)
        status = process.wait()
        print(f"--- systemd-nspawn exited with status {status} ---", flush=True)
        if status != REBOOT_EXIT_STATUS:
            break
        print("--- guest rebooted: booting it again ---", flush=True)
    return 0 if status in (0, REBOOT_EXIT_STATUS) else status


if __name__ == "__main__":
    sys.exit(main())
