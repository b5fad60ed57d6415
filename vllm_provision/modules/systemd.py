"""Control a systemd unit: daemon-reload, enabled, started/stopped/restarted.

Arguments:
    name: the unit (``vllm.service``); optional when only ``daemon_reload`` is asked.
    state: ``started`` / ``stopped`` (idempotent) or ``restarted`` (always bounces; use it in
        handlers).
    if_running: with ``state: restarted``, restart only a unit that runs (``active``,
        ``activating`` (a restart after a crash is pending) or ``reloading``); a stopped unit is
        left stopped and reported ``ok``. ``systemctl try-restart`` semantics, plus the
        auto-restart wait. In check mode the unit's state is read, so the result says truly
        whether a restart would happen (``would restart``) or not.
    enabled: true/false.
    daemon_reload: run ``systemctl daemon-reload`` first, reported as ``changed`` ONLY when a unit
        file changed since the last reload (unlike Ansible, ansible/ansible#77606): the unit's
        ``NeedDaemonReload=yes`` (systemctl show), or the marker the template module writes in
        the same round trip as a unit-file change, or (check mode) a unit file that would change
        earlier in this run. In check mode a reload this run would already have done counts as
        done: a later reload task is reported only when a unit file would change after it, as
        in the real run. A restart after editing a unit without a reload would use the old
        definition (systemd/systemd#5478).

The current state is read with ONE ``systemctl show`` call; changes are made with one more.
On a failed start the last journal lines of the unit are included in the message. Example::

    - name: Start the vLLM unit
      systemd: {name: vllm.service, state: started, enabled: true, daemon_reload: true}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status
from vllm_provision.modules import DAEMON_RELOAD_MARKER, ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext, with_notify

STATES = ("started", "stopped", "restarted")
ARGUMENT_SPEC = ArgumentSpec("systemd", (
    Argument("name", "str", "the unit (vllm.service); required with state or enabled"),
    Argument("state", "str", "the wanted state", choices=STATES),
    Argument("enabled", "bool", "started at boot or not"),
    Argument("daemon_reload", "bool", "systemctl daemon-reload first, when a unit file changed",
             default=False),
    Argument("if_running", "bool", "with state: restarted, restart only a unit that is active, "
             "activating or reloading (try-restart); a stopped unit stays stopped", default=False),
))
PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState", "NeedDaemonReload",
              "ExecMainStartTimestamp")
# systemd.unit(5): unit names are [A-Za-z0-9:_.\-@] plus a type suffix.
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|timer|mount|path|slice)$")
_RUNNING = ("active", "activating", "reloading")
_JOURNAL_LINES = 30
# host_state key: units an earlier task of a dry run would stop (vllm_prune); later tasks of the
# dry run read them as stopped, so the plan shows what the real run would do.
STOPPED_IN_CHECK = "units_stopped_in_check"


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Bring a unit to the wanted state; see the module docstring.

    Raises:
        ProvisionError: bad arguments. UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    name, state, enabled = values["name"], values["state"], values["enabled"]
    daemon_reload = values["daemon_reload"]
    if_running = values["if_running"]
    if if_running and state != "restarted":
        raise ProvisionError.single("systemd: if_running", "only applies to state: restarted",
                                    actual=str(state), fix="add state: restarted or remove "
                                                           "if_running")
    if name is None and (state is not None or enabled is not None):
        raise ProvisionError.single("systemd: name", "required with state or enabled")
    if name is not None and not _UNIT_RE.match(name):
        raise ProvisionError.single("systemd: name", "not a unit name",
                                    expected="e.g. vllm.service (systemd.unit(5))", actual=name)
    marker = quote(DAEMON_RELOAD_MARKER)
    result = ctx.conn.run(_show_command(name))
    if not result.ok:
        raise ProvisionError.single(ctx.host.name, "systemctl show failed",
                                    actual=(result.stderr or result.stdout).strip()[-500:])
    props = parse_show(result.stdout)
    actions: list[str] = []
    commands: list[str] = []
    reload_needed = (props.get("Marker") == "yes" or props.get("NeedDaemonReload") == "yes"
                     or bool(ctx.host_state.get("daemon_reload_needed")))
    if ctx.check_mode and ctx.host_state.get("daemon_reload_simulated"):
        # an earlier reload task of this dry run "did" the reload the host still asks for: only
        # a unit file that would change since then needs another one
        reload_needed = bool(ctx.host_state.get("daemon_reload_needed"))
    if daemon_reload and reload_needed:
        actions.append("daemon-reload")
        commands.append(f"systemctl daemon-reload && rm -f {marker}")
    missing = props.get("LoadState") == "not-found"
    if enabled is not None:
        file_state = props.get("UnitFileState", "")
        if enabled and file_state not in ("enabled", "enabled-runtime", "static", "alias",
                                          "indirect", "generated"):
            actions.append("enable")
            commands.append(f"systemctl enable -- {quote(name or '')}")
        elif not enabled and file_state in ("enabled", "enabled-runtime"):
            actions.append("disable")
            commands.append(f"systemctl disable -- {quote(name or '')}")
    active = props.get("ActiveState", "")
    if ctx.check_mode and name in ctx.host_state.get(STOPPED_IN_CHECK, ()):
        active = "inactive"  # an earlier task of this dry run would have stopped it
    if state == "started" and active not in _RUNNING:
        actions.append("start")
        commands.append(f"systemctl start -- {quote(name or '')}")
    elif state == "stopped" and active in _RUNNING:
        actions.append("stop")
        commands.append(f"systemctl stop -- {quote(name or '')}")
    elif state == "restarted" and (not if_running or active in _RUNNING):
        actions.append("restart")
        commands.append(f"systemctl restart -- {quote(name or '')}")
    data = {"name": name, "active_state": active, "unit_file_state":
            props.get("UnitFileState", ""), "exec_main_start_timestamp":
            props.get("ExecMainStartTimestamp", "")}
    if not commands:
        left = "not running: left stopped" if if_running and state == "restarted" else ""
        return ModuleResult(Status.OK, left, data=data)
    if ctx.check_mode:
        if "daemon-reload" in actions:
            ctx.host_state["daemon_reload_needed"] = False
            ctx.host_state["daemon_reload_simulated"] = True
        suffix = " (unit not installed yet)" if missing and name else ""
        return ModuleResult(Status.CHANGED, "would " + ", ".join(actions) + suffix, data=data)
    if missing and name and "daemon-reload" not in actions and not daemon_reload:
        return ModuleResult(Status.FAILED, f"unit {name} not found on the host",
                            data=data)
    script = " && ".join(commands)
    script, notified = with_notify(ctx, script)
    done = ctx.conn.run(script, timeout_s=max(ctx_timeout(ctx), 120.0))
    if "daemon-reload" in actions:
        ctx.host_state["daemon_reload_needed"] = False
    if not done.ok:
        detail = (done.stderr or done.stdout).strip()[-1500:]
        if name:
            journal = ctx.conn.run(f"journalctl -u {quote(name)} -n {_JOURNAL_LINES} "
                                   "--no-pager -o cat 2>&1 || true")
            detail += f"\nlast {_JOURNAL_LINES} journal lines of {name}:\n" + \
                journal.stdout.strip()[-3000:]
        return ModuleResult(Status.FAILED, f"{', '.join(actions)} failed: {detail}", data=data)
    return ModuleResult(Status.CHANGED, ", ".join(actions), data=data,
                        persisted_notify=notified)


def read_command(ctx: ModuleContext, args: Mapping[str, Any]) -> str | None:
    """Return the read-only ``systemctl show`` command :func:`run` sends first, or None when
    ``name`` is not a unit name; the runner batches it (runner/prefetch.py).

    Args:
        ctx: the task context (unused; part of the module read protocol).
        args: the task's rendered arguments.
    """
    name = args.get("name") if isinstance(args, Mapping) else None
    if name is not None and (not isinstance(name, str) or not _UNIT_RE.match(name)):
        return None
    return _show_command(name)


def _show_command(name: str | None) -> str:
    read = f"if [ -e {quote(DAEMON_RELOAD_MARKER)} ]; then echo Marker=yes; fi"
    if name is not None:
        read = f"systemctl show -p {','.join(PROPERTIES)} -- {quote(name)}; " + read
    return read


def ctx_timeout(ctx: ModuleContext) -> float:
    """The run's per-command timeout, in seconds (starting a unit may take longer)."""
    options = getattr(getattr(ctx.conn, "options", None), "command_timeout_s", None)
    return float(options) if options else 30.0


def parse_show(text: str) -> dict[str, str]:
    """Parse ``systemctl show`` output (``Key=value`` lines); other lines are skipped."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key.isidentifier():
            props.setdefault(key, value)
    return props
