"""Run a shell command on the host.

Arguments: a string (the command), or a mapping:
    cmd: the command line (run by the remote user's shell; quote interpolated values with the
        ``quote`` filter: ``{{ path | quote }}``).
    creates: skip (``ok``) when this path exists. removes: skip when this path does NOT exist.
    chdir: folder to run in. stdin: text fed to the command. timeout: seconds (default: the
        run's ``--timeout``).

A command reports ``changed`` when it ran and exited 0, ``failed`` otherwise; use the task keys
``changed_when`` / ``failed_when`` to say what it really did (Ansible's command module; its
"always changed" is the top idempotency complaint, research-anchors 1.3.4). In check mode the
command is not run (``skipped``) unless the task sets ``check_mode: false`` (a read-only probe).
The registered value has ``rc``, ``stdout``, ``stderr``, ``stdout_lines``. Example::

    - name: Read the driver version
      command: nvidia-smi --query-gpu=driver_version --format=csv,noheader
      register: driver
      changed_when: false
      check_mode: false
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_provision.errors import ProvisionError
from vllm_provision.modules import ModuleResult, check_arguments, check_type, quote
from vllm_provision.results import Status

ARGUMENTS = ("cmd", "creates", "removes", "chdir", "stdin", "timeout")
_SKIP = "__vllm_provision_skip__"


def run(ctx: Any, args: Mapping[str, Any] | str) -> ModuleResult:
    """Run the command unless ``creates``/``removes`` say it is done; see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed.
    """
    if isinstance(args, str):
        args = {"cmd": args}
    check_arguments(args, ARGUMENTS, "command")
    cmd = check_type(args, "cmd", "command", str)
    if not cmd or not cmd.strip():
        raise ProvisionError.single("command: cmd", "the command is empty")
    creates = check_type(args, "creates", "command", str)
    removes = check_type(args, "removes", "command", str)
    chdir = check_type(args, "chdir", "command", str)
    stdin = check_type(args, "stdin", "command", str)
    timeout = check_type(args, "timeout", "command", (int, float))
    guards: list[str] = []
    if creates:
        guards.append(f"if [ -e {quote(creates)} ]; then echo {_SKIP} {quote(creates)} exists; "
                      "exit 0; fi")
    if removes:
        guards.append(f"if [ ! -e {quote(removes)} ]; then echo {_SKIP} {quote(removes)} "
                      "does not exist; exit 0; fi")
    if ctx.check_mode:
        if guards:  # the guard alone is read-only: tell ok from "would run"
            probe = ctx.conn.run("; ".join([*guards, "echo would-run"]))
            if probe.stdout.startswith(_SKIP):
                return ModuleResult(Status.OK, probe.stdout[len(_SKIP):].strip())
        return ModuleResult(Status.SKIPPED, "not run in check mode (set check_mode: false on "
                                            "the task if it only reads)")
    body = f"cd {quote(chdir)} && {{ {cmd}\n}}" if chdir else cmd
    # a guard's ``exit 0`` ends the whole script before the command runs
    script = "; ".join(guards) + f"\n{body}" if guards else body
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
    return ModuleResult(Status.CHANGED, "", data=data)
