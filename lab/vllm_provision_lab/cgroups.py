"""One cgroup per lab host, so nspawn guests do not share the caller's cgroup (probe gotcha 2).

With ``--keep-unit`` systemd-nspawn creates ``supervisor``/``payload`` under the cgroup of the
process that started it; here that is the hierarchy root, so every guest would share one
``payload``. Each boot loop joins ``<subtree>/<host>`` first (in the ``name=systemd`` and the
unified hierarchy), which also gives ``down`` a precise ``cgroup.kill`` (kernel >= 5.14,
Documentation/admin-guide/cgroup-v2.rst) for guests whose nspawn was SIGKILLed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def hierarchy_roots() -> list[Path]:
    """Return the hierarchies a host cgroup is made in: the cgroup2 root, or, on a v1 hybrid,
    the ``systemd`` and ``unified`` mounts (whichever exist)."""
    if _is_cgroup2(CGROUP_ROOT):
        return [CGROUP_ROOT]
    return [CGROUP_ROOT / name for name in ("systemd", "unified") if (CGROUP_ROOT / name).is_dir()]


def unified_root() -> Path | None:
    """Return the cgroup2 hierarchy (where ``cgroup.kill`` exists), or None if there is none."""
    if _is_cgroup2(CGROUP_ROOT):
        return CGROUP_ROOT
    unified = CGROUP_ROOT / "unified"
    return unified if unified.is_dir() else None


def _is_cgroup2(path: Path) -> bool:
    return (path / "cgroup.controllers").exists()


def join(subtree: str, host: str, pid: int) -> None:
    """Move process ``pid`` into ``<subtree>/<host>`` of every hierarchy (created if absent)."""
    for root in hierarchy_roots():
        directory = root / subtree / host
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.procs").write_text(f"{pid}\n")


def pids(subtree: str, host: str | None = None) -> list[int]:
    """Return every process in ``<subtree>/<host>`` (or the whole subtree), recursively."""
    found: set[int] = set()
    for root in hierarchy_roots():
        base = root / subtree if host is None else root / subtree / host
        for procs in base.rglob("cgroup.procs") if base.is_dir() else ():
            try:
                found.update(int(line) for line in procs.read_text().split())
            except OSError:
                continue  # the cgroup went away while we read it
    return sorted(found)


def kill(subtree: str, host: str | None = None, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in ``<subtree>/<host>`` (or the subtree) and wait until it is empty.

    Uses ``cgroup.kill`` on the unified hierarchy, then kill(2) for anything seen only in v1.
    """
    unified = unified_root()
    if unified is not None:
        target = unified / subtree if host is None else unified / subtree / host
        if (target / "cgroup.kill").exists():
            try:
                (target / "cgroup.kill").write_text("1\n")
            except OSError:
                pass  # empty or already removed
    deadline = time.monotonic() + timeout_s
    while (left := pids(subtree, host)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def remove(subtree: str, host: str | None = None) -> None:
    """Remove the (empty) cgroup dirs of ``<subtree>/<host>`` (or the subtree), deepest first."""
    for root in hierarchy_roots():
        base = root / subtree if host is None else root / subtree / host
        if not base.is_dir():
            continue
        # os.walk, not Path.rglob: a guest's systemd removes its own cgroups while it stops,
        # and a folder gone mid-walk is skipped instead of raising (rglob raised
        # FileNotFoundError, and `lab down` ended in an internal error); bottom-up order
        for folder, children, _files in os.walk(base, topdown=False):
            for child in children:
                _rmdir(Path(folder) / child)
        _rmdir(base)
    if host is not None:
        for root in hierarchy_roots():
            _rmdir(root / subtree)  # only succeeds once the last host is gone


def host_cgroups(subtree: str) -> list[str]:
    """Return the host names that still have a cgroup under ``subtree`` in any hierarchy."""
    names: set[str] = set()
    for root in hierarchy_roots():
        if (root / subtree).is_dir():
            names.update(p.name for p in (root / subtree).iterdir() if p.is_dir())
    return sorted(names)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        # a cgroup dir that still holds a process cannot go; the caller killed them first
        time.sleep(0.2)
        try:
            path.rmdir()
        except OSError:
            pass
