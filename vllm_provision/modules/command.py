"""Run a shell command on the host.

The arguments are a string (the command, ``cmd``) or a mapping. The command line is run by the
remote user's shell: quote interpolated values with the ``quote`` filter (``{{ path | quote }}``).

A command reports ``changed`` when it ran and exited 0, ``failed`` otherwise; use the task keys
``changed_when`` / ``failed_when`` to say what it really did (Ansible's command module, whose
"always changed" results are its best-known idempotency complaint). In check mode the
command is not run (``skipped``) unless the task sets ``check_mode: false`` (a read-only probe).
The registered value has ``rc``, ``stdout``, ``stderr``, ``stdout_lines``. Example::

    - name: Read the driver version
      command: nvidia-smi --query-gpu=driver_version --format=csv,noheader
      register: driver
      changed_when: false
      check_mode: false

Two arguments let the runner batch a command with the play's reads (docs/engine.md "Round
trips"), because they say what the runner cannot know from a shell line:

- ``read_only: true``: the command changes nothing on the host. It is then sent in the play's
  read batch and may be answered from it; it reports ``ok``, never ``changed``.
- ``unless: <command>``: run ``cmd`` only when this read-only command exits non-zero (Puppet's
  ``exec`` resource, attribute ``unless``; Chef's ``not_if``). The ``unless`` command is batched
  with the reads; when it exits 0 the task is ``ok`` and ``cmd`` is never sent. In check mode
  it still runs and tells ``ok`` from "would run".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext

ARGUMENT_SPEC = ArgumentSpec("command", (
    Argument("cmd", "str", "the command line, run by the remote user's shell", required=True),
    Argument("creates", "str", "skip (ok) when this path exists"),
    Argument("removes", "str", "skip (ok) when this path does not exist"),
    Argument("chdir", "str", "folder to run in"),
    Argument("stdin", "str", "text fed to the command's standard input"),
    Argument("timeout", "float", "seconds the command may run",
             default_text="the run's --timeout", minimum=0),
    Argument("read_only", "bool", "the command changes nothing on the host (batched with the "
             "play's reads; reports ok)", default=False),
    Argument("unless", "str", "a read-only command; run cmd only when it exits non-zero"),
), free_form="cmd")
_SKIP = "__vllm_provision_skip__"


def read_command(ctx: ModuleContext, args: Mapping[str, Any] | str) -> str | None:
    """The read-only command :func:`run` sends first, for the play's read batch
    (vllm_provision.modules, "read_command"): the ``unless`` probe, or the command itself when
    it is ``read_only``; None otherwise, and with ``stdin``, ``timeout`` or a script of several
    lines, which are sent as they are.

    Raises:
        ProvisionError: bad arguments (the runner then leaves the task to run live).
    """
    values = ARGUMENT_SPEC.validate(args)
    if values["stdin"] is not None or values["timeout"]:
        return None
    if values["unless"]:
        return str(values["unless"])
    if values["read_only"] and not ctx.check_mode:
        script = _script(values)
        return None if "\n" in script else script
    return None


def lead_command(ctx: ModuleContext, args: Mapping[str, Any] | str) -> str | None:
    """The script :func:`run` sends first, for the head of the play's batch (vllm_provision.
    modules, "lead_command"); None in check mode and with ``stdin`` or ``timeout``, where
    :func:`run` sends something else or sends it differently, and for a script of several
    lines (``creates``, ``removes``, ``chdir``).

    Raises:
        ProvisionError: bad arguments (the runner then leaves the task to run live).
    """
    values = ARGUMENT_SPEC.validate(args)
    if (ctx.check_mode or values["stdin"] is not None or values["timeout"] or values["unless"]
            or values["read_only"]):
        return None
    script = _script(values)
    return None if "\n" in script else script  # a batch is one line (runner/prefetch.py)


def _script(values: Mapping[str, Any]) -> str:
    """The shell script of the command with its ``creates``/``removes`` guards and ``chdir``."""
    cmd = values["cmd"]
    if not cmd.strip():
        raise ProvisionError.single("command: cmd", "the command is empty")
    creates, removes, chdir = values["creates"], values["removes"], values["chdir"]
    guards = _guards(creates, removes)
    body = f"cd {quote(chdir)} && {{ {cmd}\n}}" if chdir else cmd
    # a guard's ``exit 0`` ends the whole script before the command runs
    return "; ".join(guards) + f"\n{body}" if guards else body


def _guards(creates: str | None, removes: str | None) -> list[str]:
    guards: list[str] = []
    if creates:
        guards.append(f"if [ -e {quote(creates)} ]; then echo {_SKIP} {quote(creates)} exists; "
                      "exit 0; fi")
    if removes:
        guards.append(f"if [ ! -e {quote(removes)} ]; then echo {_SKIP} {quote(removes)} "
                      "does not exist; exit 0; fi")
    return guards


def run(ctx: ModuleContext, args: Mapping[str, Any] | str) -> ModuleResult:
    """Run the command unless ``creates``/``removes`` say it is done; see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    cmd = values["cmd"]
    if not cmd.strip():
        raise ProvisionError.single("command: cmd", "the command is empty")
    creates, removes = values["creates"], values["removes"]
    stdin, timeout = values["stdin"], values["timeout"]
    guards = _guards(creates, removes)
    if values["unless"]:
        probe = ctx.conn.run(str(values["unless"]))
        if probe.ok:
            return ModuleResult(Status.OK, "unless: exited 0, not run",
                                data={"rc": 0, "stdout": "", "stderr": "", "stdout_lines": []})
    if ctx.check_mode:
        if guards:  # the guard alone is read-only: tell ok from "would run"
            probe = ctx.conn.run("; ".join([*guards, "echo would-run"]))
            if probe.stdout.startswith(_SKIP):
                return ModuleResult(Status.OK, probe.stdout[len(_SKIP):].strip())
        return ModuleResult(Status.SKIPPED, "not run in check mode (set check_mode: false on "
                                            "the task if it only reads)")
    script = _script(values)
    result = ctx.conn.run(script, stdin=stdin, timeout_s=float(timeout) if timeout else None)
    if result.stdout.startswith(_SKIP):
        return ModuleResult(Status.OK, result.stdout[len(_SKIP):].strip(),
                            data={"rc": 0, "stdout": "", "stderr": "", "stdout_lines": []})
    data = {"rc": result.exit_code, "stdout": result.stdout.rstrip("\n"),
            "stderr": result.stderr.rstrip("\n"),
            "stdout_lines": result.stdout.splitlines()}
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip())[-1500:]
        return ModuleResult(Status.FAILED, f"exit status {result.exit_code}: {detail}", data=data)
    return ModuleResult(Status.OK if values["read_only"] else Status.CHANGED, "", data=data)
