"""The front door's wheelhouse for the lab: vllm-router 0.1.17 and its dependencies as wheels for
the lab hosts (Debian 12, CPython 3.11, x86_64), downloaded once on the controller.

The lab hosts have no index, as the gateway hosts of docs/front-door.md: ``provision up`` sends
these wheels (``vllm_gateway_wheelhouse``) and installs them with no index. The pins are the
product's (``roles/vllm_gateway/files/router-constraints.txt``), so the lab proves the set an
operator downloads with the same command.

``python -m vllm_provision_lab.router_wheels`` fetches them once (``scripts/setup.sh`` does) and
prints the folder; :func:`wheelhouse` finds it again.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vllm_provision import resources
from vllm_provision.inventory.gateways import ROUTER_DISTRIBUTION, ROUTER_VERSION

PYTHON = "3.11"  # the lab base's python3 (Debian 12: 3.11.2)
CACHE = Path(f"/var/cache/vllm-provision-lab/router-wheels-{ROUTER_VERSION}-cp311")
MARKER = ".complete"
# manylinux tags a glibc 2.36 host accepts, newest first (pip download does not expand them)
PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")


def constraints() -> Path:
    """The product's pins (``roles/vllm_gateway/files/router-constraints.txt``)."""
    return resources.role_file("vllm_gateway", "files", "router-constraints.txt")


def wheelhouse(cache: Path = CACHE, fetch: bool = False) -> Path | None:
    """The folder of wheels, complete (its marker written last); with ``fetch``, downloads it
    first when missing (``pip download --only-binary=:all:`` for the lab hosts' platform, into a
    temporary folder beside it, renamed into place when complete). None when missing and not
    fetched.

    Raises:
        RuntimeError: ``fetch`` and pip cannot download the set (the message has pip's).
    """
    if (cache / MARKER).is_file():
        return cache
    if not fetch:
        return None
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
    try:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                "--no-cache-dir", "--python-version", PYTHON, "--implementation", "cp",
                *(word for platform in PLATFORMS for word in ("--platform", platform)),
                "-d", str(partial), "-c", str(constraints()),
                f"{ROUTER_DISTRIBUTION}=={ROUTER_VERSION}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pip download of {ROUTER_DISTRIBUTION}=={ROUTER_VERSION} "
                               f"failed: {(done.stderr or done.stdout).strip()[-2000:]}")
        (partial / MARKER).write_text(f"{ROUTER_DISTRIBUTION}=={ROUTER_VERSION}\n")
        if cache.exists():
            shutil.rmtree(cache)  # an incomplete earlier download (no marker)
        partial.rename(cache)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    return cache


def main() -> int:
    """Fetch the wheelhouse if missing and print its folder; exit 1 with pip's error."""
    try:
        print(wheelhouse(fetch=True))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
