"""What a module sees of the run: ``TaskContext`` (docs/runner-contract.md, "Module interface")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host, Inventory, Node, Replica
from vllm_provision.runner.templating import Templar
from vllm_provision.transport.base import Connection


@dataclass
class TaskContext:
    """One task on one host.

    Attributes:
        host: the target host.
        conn: its connection (``delegate_to`` and ``become`` already applied).
        connections: every open connection of the run, by host name (controller modules).
        inventory: the loaded inventory.
        replica / node: the host's replica and node, or None outside ``vllm_replicas``.
        vars: the host's merged variables, rendered (role defaults < inventory < play vars <
            registered < extra vars).
        check_mode: report what would change, change nothing.
        diff_mode: return a unified diff of what changes.
        role_path: the role folder of the task (``templates/`` and ``files/`` live there), or
            None.
        template_dirs: folders searched for a relative template ``src``, in order.
        file_dirs: folders searched for a relative ``copy`` ``src`` after the role's
            ``files/``, in order (the play's roles' ``files/``, then the playbook's).
        host_state: per-host, per-run scratch space shared by modules (e.g. the systemd module
            learns that a unit file would change in check mode).
        run_state: every host's ``host_state`` by host name (a controller module writes what
            it would do on each host, e.g. vllm_prune's units stopped in check mode).
        notify_script: shell commands persisting this task's notifications (``""`` if none or in
            check mode); a module appends it to its change command via :meth:`on_change_script`.
        task_name: the task's name, for messages.
        no_log: hide the task's output and diff.
        facts: gathered facts by host name (filled by preflight modules), shared by the run.
    """

    host: Host
    conn: Connection
    connections: Mapping[str, Connection]
    inventory: Inventory
    replica: Replica | None
    node: Node | None
    vars: Mapping[str, Any]
    check_mode: bool
    diff_mode: bool
    templar: Templar
    role_path: Path | None = None
    template_dirs: tuple[Path, ...] = ()
    file_dirs: tuple[Path, ...] = ()
    host_state: dict[str, Any] = field(default_factory=dict)
    run_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    notify_script: str = ""
    task_name: str = ""
    no_log: bool = False
    facts: dict[str, Any] = field(default_factory=dict)
    notify_used: bool = False

    def render(self, template_text: str) -> str:
        """Render Jinja2 text with this host's variables (StrictUndefined).

        Raises:
            ProvisionError: undefined variable or syntax error.
        """
        return self.templar.render(template_text, self.task_name or "template")

    def evaluate(self, expression: str, extra: Mapping[str, Any] | None = None) -> Any:
        """Evaluate a Jinja2 expression, with ``extra`` names on top of the host's variables."""
        templar = self.templar.with_vars(extra) if extra else self.templar
        return templar.evaluate(expression, self.task_name or "expression")

    def test(self, expression: str | list[str], extra: Mapping[str, Any] | None = None) -> bool:
        """Return the truth of a condition (a list means all), like ``when``."""
        templar = self.templar.with_vars(extra) if extra else self.templar
        return templar.test(expression, self.task_name or "condition")

    def on_change_script(self) -> str:
        """Return shell commands to append to the module's change command (persisted
        notifications), and remember they were used; ``""`` when there is nothing to persist."""
        if self.notify_script:
            self.notify_used = True
        return self.notify_script

    def find_template(self, src: str) -> Path:
        """Locate a template: an absolute path, else the role's ``templates/``, else the
        play's other ``templates/`` folders (its roles', then the playbook's).

        Raises:
            ProvisionError: not found.
        """
        own = [self.role_path / "templates"] if self.role_path else []
        return _find(src, [*own, *self.template_dirs], f"{self.task_name}: template.src",
                     "template")

    def find_file(self, src: str) -> Path:
        """Locate a ``copy`` source as Ansible does (docs "Roles", "files"): an absolute path,
        else the role's ``files/``, else the play's other ``files/`` folders (its roles', then
        the playbook's).

        Raises:
            ProvisionError: not found.
        """
        own = [self.role_path / "files"] if self.role_path else []
        return _find(src, [*own, *self.file_dirs], f"{self.task_name}: copy.src", "file")


def _find(src: str, folders: list[Path], where: str, what: str) -> Path:
    path = Path(src)
    candidates = [path] if path.is_absolute() else [folder / src for folder in folders]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ProvisionError.single(
        where, f"{what} '{src}' not found",
        expected="a file in " + ", ".join(str(c.parent) for c in candidates) if candidates
        else "an existing file")
