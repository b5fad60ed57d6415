"""Pushing the stack to the nodes: probe, plan the wheels, push, build, switch (docs/stack.md).

Sync pushes the wheels a node lacks (stored by sha256, checked on arrival, :func:`push_file`),
installs them with ``--no-index --require-hashes`` into a new venv ``<vllm_venv>.stack-<id>``
and checks it (:func:`build_node`), then points ``vllm_venv`` (a symlink the units run through)
at it with one rename(2) (:func:`switch_node`). Each step runs ``node.py`` on the node
(:func:`run_node`). The previous stack is kept for rollback.

The pure parts (:func:`node_stack`, :func:`same_target`, :func:`disk_need`,
:func:`wheel_plan`, :func:`node_requirements`) have no host I/O; the lock itself is
:mod:`vllm_provision.stack.lock`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any

from vllm_provision.core import hostjson
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Replica
from vllm_provision.stack.lock import Lock, pip_platforms, platform_target

# A compressed wheel unpacks to about this many times its size in a venv (torch: 0.9 GB wheel,
# 2.5 GB installed; pure-Python wheels about 2-3x); the disk check counts this much per wheel.
UNPACK_FACTOR = 3
DISK_MARGIN_BYTES = 64 * 1024 * 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class NodeStack:
    """What the stack probe read on one node (``node.py probe``).

    Attributes:
        host: the node.
        target: uv platform target (:func:`platform_target`), or "" when unknown.
        python: the node's ``python3`` version (``3.11.2``), which builds new stacks.
        active: the folder ``vllm_venv`` resolves to ("" when absent).
        active_stack: its stack id when it is a stack of ours, else "".
        active_complete: the active folder holds a complete stack's marker.
        previous: the kept previous stack's folder, or "".
        wheels: sha256 -> size in bytes of the wheels in the node's store.
        free_bytes: free bytes on the venv's file system.
        disk_path: the folder whose file system that is.
        packages: the active venv's distributions (name -> version).
        error: why the probe failed, or "".
    """

    host: str
    target: str = ""
    python: str = ""
    active: str = ""
    active_stack: str = ""
    active_complete: bool = False
    previous: str = ""
    wheels: Mapping[str, int] = field(default_factory=dict)
    free_bytes: int = 0
    disk_path: str = ""
    packages: Mapping[str, str] = field(default_factory=dict)
    error: str = ""


def node_stack(host: str, raw: Mapping[str, Any]) -> NodeStack:
    """Build a :class:`NodeStack` from the probe's JSON (pure)."""
    if raw.get("error"):
        return NodeStack(host, error=str(raw["error"]))
    try:
        target = platform_target(str(raw.get("machine", "")), str(raw.get("libc", "")),
                                 str(raw.get("libc_version", "")))
    except ValueError as exc:
        target, problem = "", f"unsupported platform ({exc})"
    else:
        problem = ""
    return NodeStack(host, target, str(raw.get("python", "")), str(raw.get("active", "")),
                     str(raw.get("active_stack", "")), bool(raw.get("active_complete")),
                     str(raw.get("previous", "")),
                     {str(k): int(v) for k, v in (raw.get("wheels") or {}).items()},
                     int(raw.get("free_bytes") or 0), str(raw.get("disk_path", "")),
                     {str(k): str(v) for k, v in (raw.get("packages") or {}).items()},
                     problem or str(raw.get("packages_error") or ""))


def same_target(nodes: Sequence[NodeStack]) -> tuple[str, str]:
    """The one ``(platform target, python)`` of a replica's nodes (pure).

    Raises:
        ProvisionError: the nodes differ, naming each node and its value; a lock must be resolved
            for one platform and Python (Ray compares Python to the patch level, ray #50511).
    """
    seen: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        seen.setdefault((node.target, node.python), []).append(node.host)
    if len(seen) == 1:
        return next(iter(seen))
    detail = "; ".join(f"{', '.join(hosts)}: {target or 'unknown platform'}, Python "
                       f"{python or '?'}" for (target, python), hosts in seen.items())
    raise ProvisionError.single(
        ", ".join(n.host for n in nodes), "the replica's nodes differ in platform or Python, so "
        f"one lock cannot fit them all: {detail}",
        fix="install the same OS release and Python on every node of the replica (or split it)")


def disk_need(lock_wheels: Mapping[str, int], present: Iterable[str], stack_built: bool) -> int:
    """Bytes a sync needs free on a node (pure): the wheels it lacks, plus the new venv
    (:data:`UNPACK_FACTOR` times all the stack's wheels) unless it is built already, plus
    :data:`DISK_MARGIN_BYTES`. The kept old venv is on disk already.

    Args:
        lock_wheels: sha256 -> size of the wheel chosen for each locked package.
        present: sha256 digests already in the node's store.
        stack_built: the lock's stack is already complete on the node.
    """
    have = set(present)
    missing = sum(size for digest, size in lock_wheels.items() if digest not in have)
    venv = 0 if stack_built else UNPACK_FACTOR * sum(lock_wheels.values())
    return missing + venv + DISK_MARGIN_BYTES


@dataclass(frozen=True)
class Wheel:
    """A wheel of the wheelhouse chosen for a pin: its file, sha256 and size in bytes."""

    path: Path
    sha256: str
    size: int


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_plan(lock: Lock, files: Mapping[str, Path], where: str) -> dict[str, Wheel]:
    """Pick, for every pin, the wheel whose sha256 the lock lists (pure but for sizes).

    Args:
        lock: the lock.
        files: sha256 -> wheel file of the wheelhouse.
        where: the wheelhouse folder, for errors.

    Raises:
        ProvisionError: a pin without a matching wheel (naming it and the fix).
    """
    chosen: dict[str, Wheel] = {}
    problems = []
    for name, pin in lock.pins.items():
        digest = next((d for d in sorted(pin.hashes) if d in files), None)
        if digest is None:
            problems.append(Problem(where, f"no wheel of {name}=={pin.version} with a hash the "
                                    "lock lists", expected="a .whl file for the nodes' platform",
                                    fix="run `provision stack sync` without --wheelhouse so it "
                                        "downloads the wheels, or add the wheel to the folder"))
            continue
        path = files[digest]
        chosen[name] = Wheel(path, digest, path.stat().st_size)
    if problems:
        raise ProvisionError(problems)
    return chosen



# -- the controller's side ---------------------------------------------------------------------


def node_script() -> str:
    """The source of ``node.py``, from the installed package."""
    return importlib_resources.files("vllm_provision.stack").joinpath("node.py").read_text(
        encoding="utf-8")


def run_node(conn: Any, config: Mapping[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    """Run one action of ``node.py`` with the node's ``python3`` (script on stdin, the
    settings one quoted JSON word) and return its JSON answer.

    Raises:
        ProvisionError: no JSON came back, or the action reported an error (naming the host).
    """
    line = "python3 - " + shlex.quote(json.dumps(config, separators=(",", ":")))
    result = conn.run(line, stdin=node_script(), timeout_s=timeout_s)
    try:
        answer = hostjson.loads(result.stdout)
    except ValueError:
        raise ProvisionError.single(conn.name, f"the stack {config['action']} step printed no "
                                    f"JSON (exit {result.exit_code})",
                                    actual=(result.stderr or result.stdout).strip()[-800:],
                                    fix=f"install python3 on {conn.name}") from None
    if not isinstance(answer, dict):
        raise ProvisionError.single(conn.name, "the stack step printed no JSON object")
    if answer.get("error"):
        raise ProvisionError.single(conn.name, f"stack {config['action']}: {answer['error']}")
    return answer


def venv_of(replica: Replica) -> str:
    """The replica's ``vllm_venv`` (validated as a normalised absolute path at load)."""
    from vllm_provision.settings import replica_settings

    return str(replica_settings(replica)["vllm_venv"])


def probe_nodes(connections: Mapping[str, Any], venv: str) -> dict[str, NodeStack]:
    """Probe every connected node at once (one round trip each)."""
    def one(name: str) -> tuple[str, NodeStack]:
        try:
            raw = run_node(connections[name], {"action": "probe", "venv": venv}, timeout_s=180)
        except ProvisionError as exc:
            return name, NodeStack(name, error=exc.render())
        return name, node_stack(name, raw)

    with ThreadPoolExecutor(max_workers=max(1, len(connections))) as pool:
        return dict(pool.map(one, list(connections)))



def download_wheels(lock_file: Path, lock: Lock, folder: Path) -> None:
    """Fill ``folder`` with the lock's wheels for its platform and Python with ``pip download
    --only-binary=:all: --require-hashes --no-deps`` (pip docs, "pip download": ``--platform``,
    ``--python-version``, ``--implementation``, ``--abi``). Files already there are kept.

    Raises:
        ProvisionError: pip failed (its message).
    """
    major, minor = lock.python.split(".")[:2]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--require-hashes", "--dest", str(folder),
            "--python-version", f"{major}.{minor}", "--implementation", "cp",
            "--abi", f"cp{major}{minor}", "--abi", "abi3", "--abi", "none",
            "--requirement", str(lock_file)]
    for tag in pip_platforms(lock.platform):
        argv += ["--platform", tag]
    folder.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ProvisionError.single(str(folder), "pip download of the lock's wheels failed",
                                    actual=pip_errors(result.stderr or result.stdout),
                                    fix="check the network to the index, or pass --wheelhouse "
                                        "with a folder holding the wheels")


def pip_errors(output: str, limit: int = 2000) -> str:
    """pip's ``ERROR:`` lines from its output (its warnings, one per index location it skips,
    can run to hundreds of lines), else the output's last ``limit`` characters."""
    errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
    return ("\n".join(errors) if errors else output.strip())[-limit:]


def index_wheelhouse(folder: Path) -> dict[str, Path]:
    """sha256 -> path of every ``.whl`` in ``folder``."""
    return {file_sha256(path): path for path in sorted(folder.glob("*.whl"))}


def default_wheelhouse(lock: Lock) -> Path:
    """The controller's shared wheelhouse for the lock's target (``$XDG_CACHE_HOME`` or
    ``~/.cache``/vllm-provision/wheelhouse/<target>-py<python>): wheels are content-addressed, so
    replicas that share wheels download them once."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "vllm-provision" / "wheelhouse" / f"{lock.platform}-py{lock.python}"


@dataclass
class NodeResult:
    """What a sync did on one node.

    Attributes:
        host: the node.
        pushed: wheels sent; pushed_bytes: their bytes.
        installed: a new stack was built; switched: the venv now points at another stack.
        active: the active stack folder after the run; before: the one before.
        error: why it failed ("" when it did not).
        held: why it built but did not switch (another node of the replica failed), or "".
    """

    host: str
    pushed: int = 0
    pushed_bytes: int = 0
    installed: bool = False
    switched: bool = False
    active: str = ""
    before: str = ""
    error: str = ""
    held: str = ""

    @property
    def changed(self) -> bool:
        """True when anything was pushed, built or switched."""
        return bool(self.pushed or self.installed or self.switched)

    def line(self) -> str:
        """One line for the operator."""
        if self.error:
            return f"{self.host}: FAILED: {self.error}"
        if not self.changed:
            return f"{self.host}: unchanged ({self.active} active)"
        parts = []
        if self.pushed:
            parts.append(f"pushed {self.pushed} wheels ({self.pushed_bytes / MIB:.1f} MiB)")
        if self.installed:
            parts.append("built and checked the new venv")
        if self.switched:
            parts.append(f"switched {self.before or '(none)'} -> {self.active}"
                         + (f" ({self.held})" if self.held else ""))
        elif self.held:
            parts.append(f"not switched ({self.held}; {self.active or '(none)'} stays active)")
        return f"{self.host}: " + ", ".join(parts)


def push_file(conn: Any, source: Path, folder: str, name: str, digest: str) -> None:
    """Send ``source`` to ``folder/name`` through a temporary file, checked by its sha256 on
    arrival, then renamed into place (a killed push leaves only a ``.tmp-`` file that the next
    run removes).

    Raises:
        ProvisionError: the digest on arrival differs, or the write failed.
    """
    tmp = f"{folder}/.tmp-{name}"
    dest = f"{folder}/{name}"
    line = (f"mkdir -p -- {shlex.quote(folder)} && cat > {shlex.quote(tmp)} && "
            f"[ \"$(sha256sum < {shlex.quote(tmp)} | cut -d' ' -f1)\" = {shlex.quote(digest)} ] "
            f"&& mv -f -- {shlex.quote(tmp)} {shlex.quote(dest)} || "
            f"{{ rm -f -- {shlex.quote(tmp)}; echo 'sha256 differs on arrival' >&2; exit 3; }}")
    size = source.stat().st_size
    with source.open("rb") as handle:  # streamed: a CUDA wheel is several GB
        result = conn.run(line, stdin=handle, timeout_s=120 + size / (5 * MIB))
    if not result.ok:
        raise ProvisionError.single(conn.name, f"pushing {source.name} failed",
                                    actual=(result.stderr or result.stdout).strip()[-500:],
                                    fix="check the disk and the connection, then run sync again")


def _no_check() -> None:
    """No run lock to check (the default of :func:`build_node` and :func:`switch_node`)."""


def build_node(conn: Any, node: NodeStack, lock: Lock,
               wheels: Mapping[str, Wheel], venv: str,
               progress: Callable[[str], None] = lambda _line: None,
               held: Callable[[], None] = _no_check) -> NodeResult:
    """Clean up, push the wheels the node lacks, build and check the stack; switch nothing.

    Every step is safe to interrupt: the next run removes partial files and folders
    (``node.py cleanup``); a complete stack (its marker written last) is kept and reused.

    Args:
        conn: the node's connection; node: its probe; lock: the parsed lock (the node gets
        :func:`node_requirements`); wheels: the lock's wheels by name; venv: ``vllm_venv``;
        progress: a line printer; held: the run lock's check point, called before each step
        that writes on the node (raises when the run's lock on it was lost).

    Returns:
        A :class:`NodeResult` (``active`` still the old stack).

    Raises:
        ProvisionError: not enough disk, a push or the build failed, or the host was lost;
            RunLockLost (from ``held``): the run's lock on the node was lost.
    """
    result = NodeResult(conn.name, active=node.active, before=node.active)
    stack_id = lock.id
    target = f"{venv}.stack-{stack_id}"
    if node.active == target and node.active_complete:
        return result
    held()
    run_node(conn, {"action": "cleanup", "venv": venv})
    store = f"{venv}.wheels/sha256"
    need = disk_need({w.sha256: w.size for w in wheels.values()}, node.wheels, False)
    if need > node.free_bytes:
        push = sum(w.size for w in wheels.values() if w.sha256 not in node.wheels)
        venv_bytes = UNPACK_FACTOR * sum(w.size for w in wheels.values())
        raise ProvisionError.single(
            conn.name, f"not enough free disk on {node.disk_path} for the stack {stack_id}",
            expected=f">= {need / MIB:.0f} MiB (wheels to push {push / MIB:.0f} MiB + new venv "
                     f"~{venv_bytes / MIB:.0f} MiB + margin {DISK_MARGIN_BYTES / MIB:.0f} MiB; "
                     "the old venv is kept)",
            actual=f"{node.free_bytes / MIB:.0f} MiB free",
            fix=f"free space on {node.disk_path} on {conn.name}, then run sync again")
    for wheel in sorted(wheels.values(), key=lambda w: w.path.name):
        if wheel.sha256 in node.wheels:
            continue
        progress(f"{conn.name}: pushing {wheel.path.name}")
        held()
        push_file(conn, wheel.path, store, wheel.sha256, wheel.sha256)
        result.pushed += 1
        result.pushed_bytes += wheel.size
    pins_text = node_requirements(lock)
    lock_digest = hashlib.sha256(pins_text.encode()).hexdigest()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(pins_text)
    try:
        held()
        push_file(conn, Path(handle.name), f"{venv}.wheels", f"lock-{stack_id}.txt", lock_digest)
    finally:
        os.unlink(handle.name)
    progress(f"{conn.name}: building {target}")
    held()
    installed = run_node(conn, {
        "action": "install", "venv": venv, "stack": stack_id,
        "wheels": [[w.sha256, w.path.name] for w in wheels.values()],
        "lock": lock.versions(), "roots": [p.name for p in lock.pins.values() if p.root],
        "vllm": lock.pins["vllm"].version if "vllm" in lock.pins else "",
    }, timeout_s=3600)
    result.installed = bool(installed.get("installed"))
    return result


def node_requirements(lock: Lock) -> str:
    """The requirements file pip installs on a node: one ``name==version --hash=sha256:...``
    line per pin, sorted by name, with no index options (the node installs ``--no-index`` from
    the pushed wheels; a controller's ``--find-links /srv/wheels`` means nothing there) and no
    comments."""
    return "".join(f"{p.name}=={p.version} " + " ".join(f"--hash=sha256:{h}"
                                                        for h in sorted(p.hashes)) + "\n"
                   for p in sorted(lock.pins.values(), key=lambda p: p.name))


def switch_node(conn: Any, result: NodeResult, venv: str, stack_id: str,
                held: Callable[[], None] = _no_check, *, prune: bool = True) -> NodeResult:
    """Point the node's venv at the built stack ``stack_id`` (one rename(2)), then prune
    (unless ``prune`` is False: the caller prunes with :func:`prune_node` once every node of
    the replica switched, so that a switch can still be undone with :func:`undo_switch`).

    Args:
        conn: the node's connection; result: what :func:`build_node` returned for it (updated
        and returned); venv: ``vllm_venv``; stack_id: :func:`lock_id` of the lock; held: the
        run lock's check point, called before the switch and before the pruning.

    Raises:
        ProvisionError: the stack is not complete, or the host was lost; RunLockLost (from
            ``held``): the run's lock on the node was lost.
    """
    target = f"{venv}.stack-{stack_id}"
    if result.active == target:
        return result
    held()
    switched = run_node(conn, {"action": "switch", "venv": venv, "stack": stack_id})
    result.switched = bool(switched.get("switched"))
    result.active = str(switched.get("active", target))
    if prune:
        prune_node(conn, venv, held)
    return result


def prune_node(conn: Any, venv: str, held: Callable[[], None] = _no_check) -> None:
    """Remove the stacks neither active nor kept as the previous one (node.py ``cleanup``).

    Raises:
        ProvisionError: the host was lost; RunLockLost (from ``held``).
    """
    held()
    run_node(conn, {"action": "cleanup", "venv": venv, "keep_complete": False})


def undo_switch(conn: Any, result: NodeResult, venv: str) -> None:
    """Point the node's venv back at the stack it had before :func:`switch_node` (node.py's
    ``rollback`` swaps the active and the previous stack), so that a replica whose switch
    failed on another node is on one stack again; ``result`` says so.

    Raises:
        ProvisionError: the host was lost (the caller reports the node as left switched).
    """
    answer = run_node(conn, {"action": "rollback", "venv": venv})
    result.active = str(answer.get("active", result.before))
    result.switched = False


def check_target(lock: Lock, nodes: Mapping[str, NodeStack]) -> None:
    """Refuse a sync whose lock was resolved for another platform or Python than the nodes'.

    Raises:
        ProvisionError: naming the node, the lock's target and the node's.
    """
    problems = []
    for node in nodes.values():
        if (node.target, node.python) != (lock.platform, lock.python):
            problems.append(Problem(
                node.host, f"the lock {lock.path} is for another platform or Python",
                expected=f"{lock.platform or '?'}, Python {lock.python or '?'} (the lock)",
                actual=f"{node.target or '?'}, Python {node.python or '?'}",
                fix="run `provision stack lock` again for these nodes, review and sync"))
    if problems:
        raise ProvisionError(problems)

