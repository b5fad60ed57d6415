"""What a task module may use of the run: the :class:`ModuleContext` protocol.

The runner passes its ``runner.context.TaskContext`` (a dataclass that satisfies this protocol);
tests may pass any object with the members a module reads. Modules depend on this protocol, not
on the runner (docs/runner-contract.md, "Module interface").
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from vllm_provision.core.models import Host, Inventory, Node, Replica
from vllm_provision.transport.base import Connection


class ModuleContext(Protocol):
    """One task on one host, as a module sees it.

    Members (read-only for modules, except the two shared scratch mappings):
        host: the target host. conn: its connection (``delegate_to`` and ``become`` applied).
        connections: every open connection of the run, by host name (controller modules).
        inventory: the loaded inventory. replica / node: the host's, or None outside a replica.
        vars: the host's merged variables (docs/runner-contract.md for the precedence).
        check_mode / diff_mode: ``--check`` / ``--diff`` as they apply to this task.
        host_state: per-host scratch shared by the modules of one run (written).
        run_state: every host's ``host_state`` by host name (controller modules; written).
        facts: gathered facts by host name, shared by the run (written by preflight).
        task_name: the task's name, for messages.
    """

    @property
    def host(self) -> Host: ...
    @property
    def conn(self) -> Connection: ...
    @property
    def connections(self) -> Mapping[str, Connection]: ...
    @property
    def inventory(self) -> Inventory: ...
    @property
    def replica(self) -> Replica | None: ...
    @property
    def node(self) -> Node | None: ...
    @property
    def vars(self) -> Mapping[str, Any]: ...
    @property
    def check_mode(self) -> bool: ...
    @property
    def diff_mode(self) -> bool: ...
    @property
    def host_state(self) -> dict[str, Any]: ...
    @property
    def run_state(self) -> dict[str, dict[str, Any]]: ...
    @property
    def facts(self) -> dict[str, Any]: ...
    @property
    def task_name(self) -> str: ...

    def render(self, template_text: str) -> str:
        """Render Jinja2 text with the host's variables.

        Raises:
            ProvisionError: an undefined variable or a syntax error."""

    def test(self, expression: str | list[str], extra: Mapping[str, Any] | None = None) -> bool:
        """The truth of a condition (a list: all), with ``extra`` names on top, as ``when``."""

    def on_change_script(self) -> str:
        """Shell to append to the module's change command (persisted notifications), or ``""``."""

    def find_template(self, src: str) -> Path:
        """The template file ``src``: absolute, else in the role's, then the playbook's
        ``templates/``.

        Raises:
            ProvisionError: not found."""

    def find_file(self, src: str) -> Path:
        """The ``copy`` source ``src``: absolute, else in the role's, then the play's other
        ``files/`` folders.

        Raises:
            ProvisionError: not found."""


def absolute_path_argument(args: Mapping[str, Any], key: str) -> str | None:
    """The argument ``key`` when it is an absolute path, else None: what a module's
    ``read_command`` may read before its arguments are validated (``args`` may be anything).

    Args:
        args: the task's rendered arguments.
        key: the argument that names the path on the host (``path``, ``dest``).
    """
    value = args.get(key) if isinstance(args, Mapping) else None
    return value if isinstance(value, str) and posixpath.isabs(value) else None


def with_notify(ctx: ModuleContext, script: str) -> tuple[str, bool]:
    """``script`` with the host's persisted notifications appended
    (:meth:`ModuleContext.on_change_script`), so they are recorded in the change's own round
    trip, and whether any were: the module's ``ModuleResult.persisted_notify``."""
    notify = ctx.on_change_script()
    return (f"{script} && {{ {notify}; }}" if notify else script), bool(notify)


def path_read_command(key: str, command: Callable[[str], str]
                      ) -> Callable[[ModuleContext, Mapping[str, Any]], str | None]:
    """A module's ``read_command`` (the module read protocol, docs/runner-contract.md; the
    runner batches it, runner/prefetch.py) for a module whose first command only reads the
    path its argument ``key`` names: ``command(path)``, or None when that argument is not an
    absolute path (:func:`absolute_path_argument`; the arguments are not validated yet).

    Args:
        key: the argument that names the path on the host (``path``, ``dest``).
        command: the path -> the read-only shell command (the path quoted inside it).

    Returns:
        ``read_command(ctx, args) -> str | None``; ``ctx`` is unused.
    """
    def read_command(ctx: ModuleContext, args: Mapping[str, Any]) -> str | None:
        path = absolute_path_argument(args, key)
        return None if path is None else command(path)

    read_command.__doc__ = (f"The read-only first command of ``run`` for the path in ``{key}`` "
                            f"(:func:`vllm_provision.modules.context.path_read_command`).")
    return read_command
