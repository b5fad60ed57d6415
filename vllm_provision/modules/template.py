"""Render a Jinja2 template locally and install it on the host atomically, only if it differs.

``validate`` is Ansible's: a command run on the rendered temp file before it is moved into
place. ``validate_unit`` runs ``systemd-analyze verify`` on the rendered file, placed under its
REAL unit name in a temp folder (ansible/ansible#19232); ANY output counts as failure, because
the tool exits 0 on warnings (systemd/systemd#11651).

Round trips: one when nothing changed (sha256 and owner/group/mode read on the host), a second
to write when it did (plus one to read the old text in diff mode). Example::

    - name: Install the vLLM unit
      template: {src: vllm.service.j2, dest: /etc/systemd/system/vllm.service, mode: "0644",
                 validate_unit: true}
      notify: Restart vLLM
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.paths import UNIT_MARKER
from vllm_provision.core.results import Status
from vllm_provision.modules import (
    DAEMON_RELOAD_MARKER,
    UNAFFECTED_KEY,
    UNAFFECTED_NOTE,
    ModuleResult,
    is_unit_path,
    parse_mode,
    quote,
    unified_diff,
)
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext, path_read_command, with_notify

ARGUMENT_SPEC = ArgumentSpec("template", (
    Argument("src", "str", "template file: relative to the role's templates/ (then the "
             "playbook's), or absolute", required=True),
    Argument("dest", "str", "absolute path on the host", required=True),
    Argument("owner", "str", "owner's user name (unchanged when absent)"),
    Argument("group", "str", "group name (unchanged when absent)"),
    Argument("mode", ("str", "int"), "octal mode such as \"0644\" (unchanged when absent)"),
    Argument("backup", "bool", "keep the replaced file as <dest>.prev", default=True),
    Argument("validate", "str", "command run on the rendered temp file; %s is its path"),
    Argument("validate_unit", "bool", "systemd-analyze verify the rendered unit file",
             default=False),
))
_VALIDATE_FAILED = 97


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Install the rendered ``src`` at ``dest``; see the module docstring.

    Raises:
        ProvisionError: bad arguments, template missing or failing to render.
        UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    template_path = ctx.find_template(values["src"])
    content = ctx.render(template_path.read_text(encoding="utf-8"))
    return install(ctx, values, content, "template")


def install(ctx: ModuleContext, values: Mapping[str, Any], content: str,
            module: str) -> ModuleResult:
    """Install ``content`` at ``values["dest"]`` atomically, only if it differs; shared by the
    ``template`` and ``copy`` modules (docs/modules.md).

    Args:
        ctx: the task context. values: the validated arguments (``dest``, ``owner``, ``group``,
            ``mode``, ``backup``, ``validate``, ``validate_unit``). content: the file's text.
        module: the module's name, for messages.

    Raises:
        ProvisionError: a relative ``dest``, a bad mode, a ``validate`` without ``%s``.
        UnreachableError: the connection failed.
    """
    dest = values["dest"]
    if not posixpath.isabs(dest):
        raise ProvisionError.single(f"{module}: dest", "must be an absolute path", actual=dest)
    owner, group = values["owner"], values["group"]
    mode = parse_mode(values["mode"], module)
    backup, validate, validate_unit = values["backup"], values["validate"], values["validate_unit"]
    if validate is not None and "%s" not in validate:
        raise ProvisionError.single(f"{module}: validate", "the command must contain %s",
                                    actual=validate, fix="e.g. 'visudo -cf %s'")
    unit_file = is_unit_path(dest)
    if unit_file:
        content = stamped(content, module)
    wanted_hash = hashlib.sha256(content.encode()).hexdigest()

    current = _read_state(ctx, dest)
    changes: list[str] = []
    content_changed = current["hash"] != wanted_hash
    if current["hash"] is None:
        changes.append("created")
    elif content_changed:
        changes.append("content")
    if owner is not None and current["owner"] != owner:
        changes.append(f"owner {current['owner']} -> {owner}" if current["hash"] else "owner")
    if group is not None and current["group"] != group:
        changes.append(f"group {current['group']} -> {group}" if current["hash"] else "group")
    if mode is not None and current["mode"] != mode:
        changes.append(f"mode {_oct(current['mode'])} -> {_oct(mode)}" if current["hash"]
                       else "mode")
    if not changes:
        return ModuleResult(Status.OK, "", data={"dest": dest, "checksum": wanted_hash})
    if unit_file and content_changed:
        ctx.host_state["daemon_reload_needed"] = True
    diff = ""
    if ctx.diff_mode and content_changed:
        before = _read_text(ctx, dest) if current["hash"] is not None else ""
        diff = unified_diff(before, content, dest)
    message = ", ".join(changes)
    data: dict[str, Any] = {"dest": dest, "checksum": wanted_hash}
    unaffected = (content_changed and current["hash"] is not None
                  and restores_running(ctx.facts.get(ctx.host.name), dest, wanted_hash))
    if unaffected:
        message = f"{message}; {RESTORED}"
        data[UNAFFECTED_KEY] = True
    if ctx.check_mode:
        return ModuleResult(Status.CHANGED, f"would change: {message}", diff, data)
    script = _write_script(dest, owner, group, mode, backup, validate,
                           validate_unit, content_changed, unit_file)
    script, notified = (script, False) if unaffected else with_notify(ctx, script)
    result = ctx.conn.run(script, stdin=content if content_changed else None)
    if result.exit_code == _VALIDATE_FAILED:
        detail = (result.stderr.strip() or result.stdout.strip())[-3000:]
        return ModuleResult(Status.FAILED, f"validation of {dest} failed; file left unchanged:\n"
                                           f"{detail}", diff, data)
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip())[-2000:]
        return ModuleResult(Status.FAILED, f"writing {dest} failed (exit {result.exit_code}): "
                                           f"{detail}", diff, data)
    return ModuleResult(Status.CHANGED, message, diff, data,
                        persisted_notify=notified or unaffected)


RESTORED = UNAFFECTED_NOTE


def stamped(content: str, module: str) -> str:
    """``content`` of a unit file, with :data:`~vllm_provision.core.paths.UNIT_MARKER` as its
    first line when none of its first 3 lines carries it.

    Every unit file an ``up`` installs must carry the marker: ``down --purge`` and
    ``--take-over`` touch no unit file without it (vllm_provision/state/prune.py,
    docs/security.md "A host's record is data"). The roles' templates begin with it; a plugin
    backend's template need not (docs/architecture.md, "Adding a backend").

    Args:
        content: the rendered text. module: ``"template"`` or ``"copy"``, named in the line.
    """
    if any(UNIT_MARKER in line for line in content.splitlines()[:3]):
        return content
    return (f"{UNIT_MARKER} (the {module} module): do not edit here; change the inventory and "
            f"run `provision up`.\n{content}")


def restores_running(facts: Any, dest: str, wanted_hash: str) -> bool:
    """True when writing ``wanted_hash`` at ``dest`` gives no running process anything new
    (pure), so the task's handlers (restarts) need not run.

    That holds when the host's state record (``HostFacts.owner``, read by preflight's probe)
    says which units' processes read ``dest`` when they started, every one of them still runs
    with the InvocationID recorded then (systemd gives each start a new one, systemd.exec(5)),
    and each started from exactly ``wanted_hash``: the file was changed on disk after the start
    and is now being put back. Without facts, record or snapshot of ``dest``: False (the
    handlers run, as before).

    Args:
        facts: the host's ``HostFacts`` (or None). dest: the file. wanted_hash: sha256 hex.
    """
    owner = getattr(facts, "owner", None)
    if owner is None:
        return False
    readers = [start for start in owner.started.values() if dest in start.files]
    return bool(readers) and all(start.same_process and start.files[dest] == wanted_hash
                                 for start in readers)


def _oct(mode: int | None) -> str:
    return "none" if mode is None else f"0{mode:o}"


def _state_command(dest: str) -> str:
    path = quote(dest)
    # one round trip: hash computed ON the host, then owner, group, octal mode
    return (f"if [ -f {path} ]; then sha256sum < {path} | cut -d' ' -f1 && "
            f"stat -c '%U %G %a' {path}; else echo ABSENT; fi")


# The read-only command :func:`run` sends first, sha256 and owner/group/mode of ``dest`` (None
# when ``dest`` is not usable); the runner batches it (runner/prefetch.py).
read_command = path_read_command("dest", _state_command)


def _read_state(ctx: ModuleContext, dest: str) -> dict[str, Any]:
    result = ctx.conn.run(_state_command(dest))
    lines = result.stdout.split()
    if not result.ok:
        raise ProvisionError.single(ctx.host.name, f"cannot read {dest}",
                                    actual=result.stderr.strip()[-500:])
    if not lines or lines[0] == "ABSENT":
        return {"hash": None, "owner": None, "group": None, "mode": None}
    if len(lines) < 4:
        raise ProvisionError.single(ctx.host.name, f"unexpected stat output for {dest}",
                                    actual=result.stdout[-200:])
    return {"hash": lines[0], "owner": lines[1], "group": lines[2], "mode": int(lines[3], 8)}


def _read_text(ctx: ModuleContext, dest: str) -> str:
    result = ctx.conn.run(f"cat {quote(dest)}")
    return result.stdout if result.ok else ""


def _write_script(dest: str, owner: str | None, group: str | None, mode: int | None,
                  backup: bool, validate: str | None, validate_unit: bool,
                  content_changed: bool, unit_file: bool) -> str:
    """Shell for the change: new content goes to a temp file in the same folder (so rename is
    atomic, rename(2)), is fsynced, validated, given owner/mode, then renamed over ``dest``."""
    path = quote(dest)
    folder = quote(posixpath.dirname(dest) or "/")
    base = posixpath.basename(dest)
    owner_spec = (owner or "") + (f":{group}" if group else "")
    steps: list[str] = ["set -e"]
    if content_changed:
        steps += [
            f"mkdir -p {folder}",
            f"tmp=$(mktemp {quote(posixpath.join(posixpath.dirname(dest), '.' + base))}.XXXXXX)",
            "trap 'rm -f \"$tmp\"' EXIT",
            'cat > "$tmp"',
            'sync "$tmp" 2>/dev/null || sync',
        ]
        if validate_unit:
            steps += [
                "vdir=$(mktemp -d)",
                f'cp "$tmp" "$vdir"/{quote(base)}',
                f'out=$(cd "$vdir" && systemd-analyze verify "$vdir"/{quote(base)} 2>&1) '
                '|| out="${out:-systemd-analyze verify failed}"',
                'rm -rf "$vdir"',
                f'if [ -n "$out" ]; then printf "%s\\n" "$out" >&2; exit {_VALIDATE_FAILED}; fi',
            ]
        if validate:
            command = validate.replace("%s", '"$tmp"')
            steps.append(f"vout=$({command} 2>&1) || {{ printf '%s\\n' \"$vout\" >&2; "
                         f"exit {_VALIDATE_FAILED}; }}")
        # keep the current owner/mode unless told otherwise
        steps.append(f'if [ -e {path} ]; then chown --reference={path} "$tmp"; '
                     f'chmod --reference={path} "$tmp"; else chmod 0644 "$tmp"; fi')
        if owner_spec:
            steps.append(f'chown {quote(owner_spec)} "$tmp"')
        if mode is not None:
            steps.append(f'chmod {mode:04o} "$tmp"')
        if backup:
            steps.append(f"if [ -e {path} ]; then cp -p {path} {quote(dest + '.prev')}; fi")
        steps.append(f'mv -f "$tmp" {path}')
        steps.append("trap - EXIT")
        steps.append(f"sync {folder} 2>/dev/null || true")
        if unit_file:
            marker = quote(DAEMON_RELOAD_MARKER)
            steps.append(f"mkdir -p $(dirname {marker}) && touch {marker}")
    else:
        if owner_spec:
            steps.append(f"chown {quote(owner_spec)} {path}")
        if mode is not None:
            steps.append(f"chmod {mode:04o} {path}")
    return "{ " + "; ".join(steps) + "; }"
