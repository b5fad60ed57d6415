"""The Debian packages the lab needs on the main machine: find the missing ones, install them."""

from __future__ import annotations

import os
import shutil

from vllm_provision_lab.errors import LabError
from vllm_provision_lab.system import run

# command the lab runs -> Debian package that ships it
REQUIRED_COMMANDS: dict[str, str] = {
    "mmdebstrap": "mmdebstrap",
    "systemd-nspawn": "systemd-container",
    "zstd": "zstd",
    "iptables": "iptables",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "mount": "mount",
    "setsid": "util-linux",
}

MERGED_USR_HOOK = "/usr/share/mmdebstrap/hooks/merged-usr"


def missing_packages() -> list[str]:
    """Return the Debian packages (sorted, unique) whose commands are not on PATH."""
    missing = {package for command, package in REQUIRED_COMMANDS.items()
               if shutil.which(command) is None}
    if shutil.which("mmdebstrap") is not None and not os.path.isdir(MERGED_USR_HOOK):
        missing.add("mmdebstrap")
    return sorted(missing)


def ensure_packages(install: bool) -> None:
    """Make sure the lab's packages are present; install them with apt-get when ``install``.

    Raises:
        LabError: packages are missing and ``install`` is False (the message names them), or
            apt-get failed.
    """
    missing = missing_packages()
    if not missing:
        return
    if not install:
        raise LabError.single(
            "lab", "Debian packages the lab needs are missing", actual=", ".join(missing),
            fix=f"run `provision lab up --install-deps` or `apt-get install {' '.join(missing)}`")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-q"], timeout_s=300, env=env)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        timeout_s=600, env=env)
    still = missing_packages()
    if still:
        raise LabError.single("apt-get install", "packages are still missing after install",
                              actual=", ".join(still))
