"""Running commands inside a base image being built: bind mounts for pip and a clean env.

Shared by the stand-in base (lab/vllm_provision_lab/base.py) and the real-vLLM base
(lab/vllm_provision_lab/real.py). Why the clean env and the CA bundle: docs/measured.md, "Real vLLM
on CPU in the lab".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from vllm_provision_lab.errors import LabError
from vllm_provision_lab.system import run

# The venv every lab host has (the inventories' vllm_venv).
VENV = "/opt/vllm"

# (source on the main machine, target inside the build root, read-only)
_CHROOT_BINDS = (("/dev", "dev", False), ("/etc/resolv.conf", "etc/resolv.conf", True),
                 # pip in the chroot must verify TLS with the main machine's CA bundle (probe G2)
                 ("/etc/ssl/certs/ca-certificates.crt", "etc/ssl/certs/ca-certificates.crt", True))


@contextlib.contextmanager
def chroot_mounts(root: Path, extra_binds: tuple[tuple[str, str], ...] = ()) -> Iterator[None]:
    """Mount /proc, /dev, the resolver and the CA bundle into ``root`` for pip (probe G2).

    Args:
        root: a build root.
        extra_binds: more (source dir on the main machine, target relative to ``root``) pairs,
            bind-mounted read-only (e.g. a local wheel folder).

    Raises:
        LabError: a mount failed (what was mounted is unmounted again).
    """
    mounted: list[Path] = []
    try:
        target = root / "proc"
        run(["mount", "-t", "proc", "proc", str(target)])
        mounted.append(target)
        binds = [*_CHROOT_BINDS, *((src, rel, True) for src, rel in extra_binds)]
        for source, relative, read_only in binds:
            target = root / relative
            if Path(source).is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif not target.exists():
                target.touch()
            run(["mount", "--bind", source, str(target)])
            mounted.append(target)
            if read_only:
                run(["mount", "-o", "remount,bind,ro", str(target)])
        yield
    finally:
        for target in reversed(mounted):
            run(["umount", "-l", str(target)], check=False)


# env -i: the main machine's PIP_* variables point at its own paths (probe G1)
CHROOT_ENV = ("env", "-i", "HOME=/root", "LANG=C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK=1",
              "PIP_DEFAULT_TIMEOUT=180", "PIP_NO_CACHE_DIR=1",
              "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def run_in_chroot(root: Path, argv: list[str], log_file: Path, fix: str,
                  timeout_s: float = 900) -> None:
    """Run ``argv`` inside ``root`` with a clean environment, appending its output to ``log_file``.

    Raises:
        LabError: it exited non-zero (the last stderr lines and ``fix`` are in the message).
    """
    proc = run([*CHROOT_ENV, "chroot", str(root), *argv], check=False, timeout_s=timeout_s)
    with open(log_file, "a") as handle:
        handle.write(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        raise LabError.single(" ".join(argv), f"failed in the base (log: {log_file})",
                              actual="\n".join(proc.stderr.strip().splitlines()[-5:]), fix=fix)


