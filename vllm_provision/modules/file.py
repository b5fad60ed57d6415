"""Make sure a path is a file, a directory, or absent, with the given owner, group and mode.

``state: file`` only fixes the attributes of a file that exists; ``directory`` creates it with
its parents (like ``mkdir -p``); ``touch`` creates an empty file if it is missing; ``absent``
removes it recursively.

One round trip when nothing changes (one ``stat``), two when something does. Example::

    - name: Create the state folder
      file: {path: /var/lib/vllm, state: directory, owner: vllm, mode: "0750"}
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, parse_mode, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext, path_read_command, with_notify

STATES = ("file", "directory", "touch", "absent")
ARGUMENT_SPEC = ArgumentSpec("file", (
    Argument("path", "str", "absolute path on the host (not /)", required=True),
    Argument("state", "str", "what the path must be", default="file", choices=STATES),
    Argument("owner", "str", "owner's user name (unchanged when absent)"),
    Argument("group", "str", "group name (unchanged when absent)"),
    Argument("mode", ("str", "int"), "octal mode such as \"0755\" (unchanged when absent)"),
))


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Bring ``path`` to ``state``; see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    path, state = values["path"], values["state"]
    if not posixpath.isabs(path) or posixpath.normpath(path) == "/":
        raise ProvisionError.single("file: path", "must be an absolute path other than /",
                                    actual=path)
    owner, group = values["owner"], values["group"]
    mode = parse_mode(values["mode"], "file")
    quoted = quote(path)
    read = ctx.conn.run(_stat_command(path))
    line = read.stdout.strip()
    exists = line != "ABSENT" and "|" in line
    kind, cur_owner, cur_group, cur_mode = (line.split("|") + ["", "", "", ""])[:4] \
        if exists else ("", "", "", "")
    changes: list[str] = []
    commands: list[str] = []
    if state == "absent":
        if exists:
            changes.append(f"removed {kind}")
            commands.append(f"rm -rf -- {quoted}")
    else:
        if state == "file" and not exists:
            return ModuleResult(Status.FAILED, f"{path} does not exist (state: file only "
                                               "changes attributes; use touch or template)")
        if exists and state == "directory" and kind != "directory":
            return ModuleResult(Status.FAILED, f"{path} exists and is a {kind}, not a directory")
        if exists and state in ("file", "touch") and kind == "directory":
            return ModuleResult(Status.FAILED, f"{path} is a directory, not a file")
        if not exists:
            changes.append(f"created {state if state == 'directory' else 'file'}")
            commands.append(f"mkdir -p -- {quoted}" if state == "directory"
                            else f"touch -- {quoted}")
        owner_spec = ""
        if owner is not None and cur_owner != owner:
            owner_spec += owner
            if exists:
                changes.append(f"owner {cur_owner} -> {owner}")
        if group is not None and cur_group != group:
            owner_spec += f":{group}"
            if exists:
                changes.append(f"group {cur_group} -> {group}")
        if owner_spec:
            commands.append(f"chown {quote(owner_spec)} {quoted}")
        if mode is not None and (not exists or int(cur_mode or "0", 8) != mode):
            if exists:
                changes.append(f"mode 0{cur_mode} -> 0{mode:o}")
            commands.append(f"chmod {mode:04o} {quoted}")
    if not commands:
        return ModuleResult(Status.OK, "", data={"path": path, "state": state})
    diff = f"--- {path}\n+++ {path}\n" + "".join(f"~ {c}\n" for c in changes)
    if ctx.check_mode:
        return ModuleResult(Status.CHANGED, "would change: " + ", ".join(changes), diff,
                            {"path": path, "state": state})
    script = " && ".join(commands)
    script, notified = with_notify(ctx, script)
    result = ctx.conn.run(script)
    if not result.ok:
        return ModuleResult(Status.FAILED, f"changing {path} failed: "
                                           f"{(result.stderr or result.stdout).strip()[-1000:]}")
    return ModuleResult(Status.CHANGED, ", ".join(changes), diff,
                        {"path": path, "state": state}, persisted_notify=notified)


def _stat_command(path: str) -> str:
    return f"stat -c '%F|%U|%G|%a' {quote(path)} 2>/dev/null || echo ABSENT"


# The read-only ``stat`` command :func:`run` sends first (None when ``path`` is not usable);
# the runner batches it (runner/prefetch.py).
read_command = path_read_command("path", _stat_command)
