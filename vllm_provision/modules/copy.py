"""Install a file from the role's ``files/`` folder on the host as it is, atomically, only if it
differs: Ansible's ``copy`` (ansible.builtin.copy), for text files.

``src`` is looked up as Ansible does (docs "Roles": a relative path in the role's ``files/``,
then in the play's other roles' ``files/``, then in the playbook folder's ``files/``), or is an
absolute path on the controller. The file is sent as it is: unlike ``template`` it is never
rendered, so it can be a real program that is linted and tested as one (the peer watchdog,
``roles/vllm_watchdog/files/vllm_watchdog.py``). What a host needs goes in a file the role
renders next to it (``template``), not into the copied file.

Everything after reading the source is the ``template`` module's (one code path): owner, group
and mode, the ``.prev`` backup, ``validate``/``validate_unit``, the atomic write (temp file in the
same folder, fsync, rename(2)), check and diff modes, and the task's handlers notified only when
something changed. Round trips: one when nothing changed, a second to write. Example::

    - name: Install the watchdog program
      copy: {src: vllm_watchdog.py, dest: /usr/local/lib/vllm-provision/vllm_watchdog.py,
             owner: root, group: root, mode: "0755"}
      notify: Restart the watchdog
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.modules import ModuleResult
from vllm_provision.modules import template as _template
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext

ARGUMENT_SPEC = ArgumentSpec("copy", (
    Argument("src", "str", "file to send as it is (UTF-8 text, never rendered): relative to "
             "the role's files/ (then the play's other roles', then the playbook's), or "
             "absolute", required=True),
    *(argument for argument in _template.ARGUMENT_SPEC.arguments if argument.name != "src"),
))


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Install the file ``src`` at ``dest`` unchanged; see the module docstring.

    Args:
        ctx: the task context (``find_file`` locates ``src``). args: the rendered arguments.

    Raises:
        ProvisionError: bad arguments, ``src`` missing or not UTF-8 text.
        UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    path = ctx.find_file(values["src"])
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProvisionError.single(f"{ctx.task_name}: copy.src", f"{path} is not UTF-8 text",
                                    expected="a text file",
                                    fix="copy sends text files only") from None
    except OSError as exc:
        raise ProvisionError.single(f"{ctx.task_name}: copy.src",
                                    f"cannot read {path}: {exc.strerror}") from None
    return _template.install(ctx, values, content, "copy")


def read_command(ctx: ModuleContext, args: Mapping[str, Any]) -> str | None:
    """The read-only first command of :func:`run` (the ``template`` module's: sha256 and
    owner/group/mode of ``dest``), for batching (runner/prefetch.py); None when ``dest`` is not
    usable.

    Args:
        ctx: the task context (unused). args: the task's rendered arguments.
    """
    return _template.read_command(ctx, args)
