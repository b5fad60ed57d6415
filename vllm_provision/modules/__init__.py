"""Idempotent task types (one file each) and what they share: results, lookup, quoting, diffs.

A module is ``vllm_provision/modules/<name>.py`` defining ``run(ctx, args) -> ModuleResult``
(``ctx``: a :class:`~vllm_provision.modules.context.ModuleContext`) and ``ARGUMENT_SPEC``, the
declaration of its arguments (:mod:`vllm_provision.modules.arguments`; the reference in
docs/modules.md is generated from it). See docs/runner-contract.md. A module may set
``RUNS_ON = "controller"``: the runner then calls it once per play batch (not once per host) and
it may return per-host results in ``ModuleResult.host_results``. Modules are imported on first
use, so unused ones cost nothing.

A module whose ``run`` first only READS the host may define ``read_command(ctx, args) -> str |
None`` returning exactly that first command string; the runner then runs it ahead of time,
batched with the play's other reads in one round trip per host (``runner/prefetch.py``).
A module whose ``run`` always sends one known command first, read or not (``command``), may
define ``lead_command(ctx, args) -> str | None`` returning exactly that command string: when
its task is the first of the play (or of a refill) to send anything, the runner runs it at the
head of the batch, once, so the reads of the tasks after it (which would run after it anyway)
share its round trip; ``run`` then gets its answer. Return None when ``run`` may not send it
first (check mode, standard input, its own timeout).
A module whose ``run`` first READS other hosts through ``ctx.connections`` (``vllm_wait_ready``
reads every node of the replica from the master) may define ``peer_read_commands(ctx, args) ->
Mapping[str, str]``: host name -> exactly the first command it sends there. A host that is not
in the task's play gets its command in the batch that carries the reads of the plays ahead
(``runner/prefetch.py``), so ``run`` finds the answer there. Its own host's command comes from
``read_command`` as usual.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.paths import STATE_DIR
from vllm_provision.core.quoting import quote
from vllm_provision.core.results import Status
from vllm_provision.modules.arguments import ArgumentSpec

if TYPE_CHECKING:
    from vllm_provision.modules.context import ModuleContext

__all__ = ["BUILTIN_MODULES", "DAEMON_RELOAD_MARKER", "STATE_DIR", "UNAFFECTED_KEY",
           "UNAFFECTED_NOTE", "UNIT_DIRS",
           "ArgumentSpec", "ModuleResult", "ModuleSpec", "file_module_names", "find_module",
           "is_module_name", "is_unit_path", "parse_mode", "quote", "register_module",
           "run_or_fail", "unified_diff"]

# Where the engine keeps its own state on a host (pending notifications, reload markers):
# STATE_DIR, from vllm_provision.core.paths.
# Written in the same round trip as a unit-file change; removed by the next daemon-reload.
DAEMON_RELOAD_MARKER = f"{STATE_DIR}/daemon-reload-needed"
# ModuleResult.data key: the change needs none of the task's handlers (a file restored to what
# the running process already started from, modules/template.py); the runner notifies nothing.
UNAFFECTED_KEY = "running_process_unaffected"
# ... and the words the report shows for it (also under no_log: they hold no value).
UNAFFECTED_NOTE = "file restored; running process unaffected"
# Directories systemd loads unit files from (systemd.unit(5), "UNIT FILE LOAD PATH").
UNIT_DIRS = ("/etc/systemd/system/", "/run/systemd/system/", "/usr/lib/systemd/system/",
             "/lib/systemd/system/", "/usr/local/lib/systemd/system/")

BUILTIN_MODULES = ("template", "copy", "file", "systemd", "command", "wait_for", "http")

ModuleFunction = Callable[["ModuleContext", Any], "ModuleResult"]

_REGISTERED: dict[str, ModuleSpec] = {}


@dataclass
class ModuleResult:
    """What a module did on one host.

    Attributes:
        status: ok / changed / failed / skipped (``unreachable`` comes from the runner).
        message: short human text, secrets not yet masked (the runner masks).
        diff: unified diff (diff mode), secrets not yet masked.
        data: JSON-serialisable values, available to ``register`` and ``--json``.
        host_results: controller modules only: one result per host name.
        persisted_notify: the module already ran ``ctx.on_change_script()`` in its change round
            trip, so the runner need not persist notifications separately.
    """

    status: Status
    message: str = ""
    diff: str = ""
    data: dict[str, Any] | None = None
    host_results: Mapping[str, ModuleResult] | None = None
    persisted_notify: bool = False

    @classmethod
    def ok(cls, message: str = "", **data: Any) -> ModuleResult:
        """An ``ok`` result carrying ``data``."""
        return cls(Status.OK, message, data=data or None)

    @classmethod
    def failed(cls, message: str, **data: Any) -> ModuleResult:
        """A ``failed`` result carrying ``data``."""
        return cls(Status.FAILED, message, data=data or None)


@dataclass(frozen=True)
class ModuleSpec:
    """A module found by name.

    Attributes:
        name: the task key. run: its ``run`` function. runs_on: ``host`` or ``controller``.
        arguments: its declared arguments (checked at load and after rendering); None for a
            module registered without a declaration (its arguments are not checked).
        read_command: its read-only first command, for batching (module docstring).
        lead_command: the command its ``run`` always sends first, for the head of a batch
            (module docstring).
        peer_read_commands: the first read it sends to each other host, for their batches
            (module docstring).
    """

    name: str
    run: ModuleFunction
    runs_on: str = "host"
    arguments: ArgumentSpec | None = field(default=None)
    read_command: Callable[..., str | None] | None = field(default=None)
    lead_command: Callable[..., str | None] | None = field(default=None)
    peer_read_commands: Callable[..., Mapping[str, str]] | None = field(default=None)


def register_module(name: str, run: ModuleFunction, *, runs_on: str = "host",
                    arguments: ArgumentSpec | None = None,
                    read_command: Callable[..., str | None] | None = None,
                    peer_read_commands: Callable[..., Mapping[str, str]] | None = None,
                    ) -> None:
    """Make ``run`` available as task key ``name`` (tests, plugins); overrides a file module.

    Args:
        name: the task key. run: ``run(ctx, args) -> ModuleResult``.
        runs_on: ``host`` (once per host) or ``controller`` (once per play batch).
        arguments: the declaration its arguments are checked against; None: not checked.
        read_command, peer_read_commands: its reads for batching (module docstring).
    """
    _REGISTERED[name] = ModuleSpec(name, run, runs_on, arguments, read_command,
                                   peer_read_commands=peer_read_commands)
    _SPEC_CACHE.pop(name, None)


_SPEC_CACHE: dict[str, ModuleSpec] = {}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def find_module(name: str) -> ModuleSpec | None:
    """Return the module for task key ``name``, importing ``vllm_provision.modules.<name>``
    on first use; None when there is no such module."""
    if name in _SPEC_CACHE:
        return _SPEC_CACHE[name]
    if name in _REGISTERED:
        spec = _REGISTERED[name]
    else:
        if not _NAME_RE.match(name) or importlib.util.find_spec(
                f"vllm_provision.modules.{name}") is None:
            return None
        module = importlib.import_module(f"vllm_provision.modules.{name}")
        run = getattr(module, "run", None)
        if run is None:
            return None
        spec = ModuleSpec(name, run, getattr(module, "RUNS_ON", "host"),
                          getattr(module, "ARGUMENT_SPEC", None),
                          getattr(module, "read_command", None),
                          getattr(module, "lead_command", None),
                          getattr(module, "peer_read_commands", None))
    _SPEC_CACHE[name] = spec
    return spec


def file_module_names() -> list[str]:
    """The names of the modules shipped in this package (files defining ``run``), sorted."""
    names = []
    for info in pkgutil.iter_modules(__path__):
        if _NAME_RE.match(info.name) and find_module(info.name) is not None:
            names.append(info.name)
    return sorted(names)


def is_module_name(name: str) -> bool:
    """True when ``name`` names a module (registered or a file in this package)."""
    return find_module(name) is not None


def parse_mode(value: object, module: str) -> int | None:
    """Parse a file mode (``"0644"``, ``"644"`` or the int 0o644) into an int; None stays None.

    YAML reads an unquoted ``0644`` as the octal int 420, so ints are taken as they are.

    Raises:
        ProvisionError: not an octal mode in 0..0o7777.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        mode = value
    elif isinstance(value, str) and re.fullmatch(r"0?[0-7]{3,4}", value):
        mode = int(value, 8)
    else:
        raise ProvisionError.single(f"{module}: mode", "invalid file mode",
                                    expected="an octal string such as '0644'", actual=repr(value))
    if not 0 <= mode <= 0o7777:
        raise ProvisionError.single(f"{module}: mode", "file mode out of range",
                                    expected="0000-7777 (octal)", actual=oct(mode))
    return mode


def run_or_fail(conn: Any, command: str, *, where: str, message: str, expected: str,
                fix: str, timeout_s: float = 60) -> Any:
    """Run ``command`` through ``conn`` and return its result; a non-zero exit raises.

    Raises:
        ProvisionError: at ``where`` with ``message``, ``expected`` and ``fix``; ``actual``
            is the last 300 characters of what the command said (stderr, else stdout, else
            its exit status).
    """
    result = conn.run(command, timeout_s=timeout_s)
    if result.exit_code != 0:
        raise ProvisionError.single(
            where, message, expected=expected,
            actual=(result.stderr or result.stdout or f"exit {result.exit_code}")[-300:],
            fix=fix)
    return result


def unified_diff(before: str, after: str, path: str) -> str:
    """Return a unified diff of two texts labelled with ``path`` (``""`` when equal)."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 fromfile=f"{path} (before)", tofile=f"{path} (after)")
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)
    return text


def is_unit_path(path: str) -> bool:
    """True when ``path`` lies in a systemd unit directory (a change needs a daemon-reload)."""
    return path.startswith(UNIT_DIRS)
