"""A real Prometheus for the lab's tests: Debian's ``prometheus`` package, unpacked on the
controller (never installed: its maintainer scripts would start a server on port 9090).

``python -m vllm_provision_lab.prometheus`` fetches it once (``scripts/setup.sh`` does) and
prints the folder of its ``prometheus`` and ``promtool`` binaries; :func:`binaries` finds them
again. Debian 12 ships Prometheus 2.42 (``apt-cache show prometheus``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path("/var/cache/vllm-provision-lab/prometheus")
PACKAGE = "prometheus"


def _unpacked(cache: Path) -> Path | None:
    found = cache / "usr" / "bin"
    return found if (found / "prometheus").is_file() and (found / "promtool").is_file() else None


def binaries(cache: Path = CACHE, fetch: bool = False) -> Path | None:
    """The folder holding ``prometheus`` and ``promtool``: PATH's when both are there, else the
    unpacked package under ``cache``; with ``fetch``, downloads and unpacks it first when
    missing (``apt-get download`` and ``dpkg-deb -x``; ``apt-get update`` once when apt does
    not know the package). None when neither is found (and nothing was fetched).

    Raises:
        RuntimeError: ``fetch`` and apt cannot download the package (the message has apt's).
    """
    on_path = [shutil.which(name) for name in ("prometheus", "promtool")]
    if all(on_path) and Path(on_path[0]).parent == Path(on_path[1]).parent:  # type: ignore[arg-type]
        return Path(on_path[0]).parent  # type: ignore[arg-type]
    found = _unpacked(cache)
    if found is not None or not fetch:
        return found
    with tempfile.TemporaryDirectory() as tmp:
        download = ["apt-get", "download", "-q", PACKAGE]
        proc = subprocess.run(download, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True)
            proc = subprocess.run(download, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"apt-get download {PACKAGE} failed: {proc.stderr.strip()}")
        [deb] = Path(tmp).glob("*.deb")
        partial = Path(tempfile.mkdtemp(prefix="prometheus-", dir=cache.parent
                                        if cache.parent.exists() else None))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(partial)], check=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(cache, ignore_errors=True)
        partial.rename(cache)
    return _unpacked(cache)


if __name__ == "__main__":
    try:
        print(binaries(fetch=True))
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
