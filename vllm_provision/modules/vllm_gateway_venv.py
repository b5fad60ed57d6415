"""Install a Python program into a venv on the host from wheels the controller sends (no index).

The front door's router (role ``vllm_gateway``, docs/front-door.md) reaches the gateway hosts
this way, as ``provision stack sync`` sends a replica's wheels (docs/stack.md): each wheel of
the controller's folder ``wheelhouse`` the host lacks (by sha256) is sent over the run's SSH
connection into ``<venv>.wheels/``, checked by its sha256 on arrival and renamed into place
(``stack.sync.push_file``); then a new venv ``<venv>.<id>`` is built with the host's
``python`` and ``pip install --no-index --find-links <venv>.wheels -c <constraints>
<requirement>``, ``import_check`` is imported with it, a marker is written last, and the link
``venv`` is switched to it atomically (``ln -s`` to a temporary name, then ``mv -T``: rename(2)).
The old venv stays until the next switch, so a running process keeps its files.

``id`` is a digest of the requirement, the constraints' text and every wheel's name and sha256:
a second run with the same wheels finds the link on the built venv and changes nothing (one
round trip). ``changed`` notifies the task's handlers (the router restarts on the new venv).
In check mode nothing is sent: ``changed`` with what would be built. Example::

    - name: Install the router
      vllm_gateway_venv:
        wheelhouse: "{{ gateway.wheelhouse }}"
        requirement: vllm-router==0.1.17
        constraints: router-constraints.txt
        venv: /opt/vllm-router
        import_check: vllm_router.router
      notify: Restart the front door
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext, with_notify
from vllm_provision.settings.kinds import check_path
from vllm_provision.stack.sync import file_sha256, push_file

ARGUMENT_SPEC = ArgumentSpec("vllm_gateway_venv", (
    Argument("venv", "str", "absolute path of the link on the host", required=True),
    Argument("state", "str", "present: built and linked; absent: the link, every venv this "
             "module built beside it and the sent wheels removed", default="present",
             choices=("present", "absent")),
    Argument("wheelhouse", "str", "folder on the controller holding the wheels (*.whl); "
             "required with state present"),
    Argument("requirement", "str", "what pip installs, pinned (name==version); required with "
             "state present"),
    Argument("constraints", "str", "a pip constraints file (one name==version a line): the "
             "role's files/ or absolute, on the controller; sent as text; required with state "
             "present"),
    Argument("python", "str", "the host's interpreter that builds the venv",
             default="python3"),
    Argument("import_check", "str", "a module the new venv must import before the switch"),
    Argument("timeout", "float", "seconds the build may take", default=900.0, minimum=1),
))
MARKER = ".vllm-provision-venv"


def _wheels(folder: Path, task: str) -> dict[str, str]:
    """The wheels of ``folder`` by file name -> sha256.

    Raises:
        ProvisionError: the folder is missing, unreadable or holds no wheel.
    """
    try:
        files = sorted(p for p in folder.iterdir() if p.name.endswith(".whl") and p.is_file())
    except OSError as exc:
        raise ProvisionError.single(f"{task}: wheelhouse", f"cannot read {folder}: "
                                    f"{exc.strerror}", expected="a folder of wheels",
                                    fix="fill it as docs/front-door.md, \"Wheels\", says") \
            from None
    if not files:
        raise ProvisionError.single(f"{task}: wheelhouse", f"{folder} holds no wheel (*.whl)",
                                    fix="fill it as docs/front-door.md, \"Wheels\", says")
    for path in files:
        if not path.name.replace("-", "").replace("_", "").replace(".", "").replace(
                "+", "").isalnum():
            raise ProvisionError.single(f"{task}: wheelhouse", f"a wheel's name has characters "
                                        f"a wheel name never has: {path.name[:200]!r}",
                                        fix="remove that file from the wheelhouse")
    return {path.name: file_sha256(path) for path in files}


def build_id(requirement: str, constraints: str, wheels: Mapping[str, str]) -> str:
    """12 hex digits naming one build: the requirement, the constraints and every wheel."""
    digest = hashlib.sha256()
    for part in (requirement, constraints, *(f"{n} {d}" for n, d in sorted(wheels.items()))):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:12]


def _state_command(venv: str, build: str) -> str:
    """One read: CURRENT (the link names ``build`` and its marker is there), NOTLINK
    (``venv`` exists and is no link: not ours), else STALE; then ``sha256sum`` of the wheels
    already on the host."""
    wheels = quote(f"{venv}.wheels")
    return (f"if [ \"$(readlink -- {quote(venv)})\" = {quote(build)} ] && "
            f"[ -f {quote(build + '/' + MARKER)} ]; then echo CURRENT; "
            f"elif [ -e {quote(venv)} ] && [ ! -L {quote(venv)} ]; then echo NOTLINK; "
            f"else echo STALE; fi; "
            f"[ -d {wheels} ] && (cd {wheels} && sha256sum -- *.whl 2>/dev/null) || true")


def _build_script(values: Mapping[str, Any], build: str, constraints_file: str) -> str:
    """Build ``build`` from the pushed wheels, check it, mark it (the last step)."""
    b, py = quote(build), quote(values["python"])
    lines = [
        "set -e",
        f"rm -rf -- {b}",
        f"{py} -m venv -- {b}",
        f"{b}/bin/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check "
        f"--find-links {quote(values['venv'] + '.wheels')} -c {quote(constraints_file)} "
        f"{quote(values['requirement'])}",
    ]
    if values["import_check"]:
        lines.append(f"{b}/bin/python -c {quote('import ' + values['import_check'])}")
    marker = quote(f"{build}/{MARKER}")
    lines.append(f"printf '%s\\n' {quote(posixpath.basename(build))} > {marker}")
    return "\n".join(lines)


def _switch_script(venv: str, build: str) -> str:
    """Point ``venv`` at ``build`` with one rename, then remove the builds other than it and
    the one the link named before (kept for running processes)."""
    v, b = quote(venv), quote(build)
    tmp = quote(f"{venv}.link-tmp")
    return (f"prev=$(readlink -- {v} || true); rm -f -- {tmp} && ln -s -- {b} {tmp} && "
            f"mv -T -f -- {tmp} {v} && "
            f"for d in {v}.*/; do d=${{d%/}}; case \"$d\" in {b}|\"$prev\"|{v}.wheels) ;; "
            f"*) [ -f \"$d/{MARKER}\" ] && rm -rf -- \"$d\" ;; esac; done; true")


def _remove(ctx: ModuleContext, venv: str) -> ModuleResult:
    """Remove the link ``venv`` (only a link), every ``<venv>.<id>`` holding this module's
    marker, and ``<venv>.wheels``; ``ok`` when none was there."""
    v = quote(venv)
    listing = (f"[ -L {v} ] && echo {v}; for d in {v}.*/; do d=${{d%/}}; "
               f"[ -f \"$d/{MARKER}\" ] && echo \"$d\"; done; "
               f"[ -d {v}.wheels ] && echo {v}.wheels; true")
    found = [line for line in ctx.conn.run(listing).stdout.splitlines() if line.strip()]
    if not found:
        return ModuleResult(Status.OK, "", data={"venv": venv, "removed": []})
    if ctx.check_mode:
        return ModuleResult(Status.CHANGED, "would remove " + ", ".join(found),
                            data={"venv": venv, "removed": found})
    result = ctx.conn.run("rm -rf -- " + " ".join(quote(path) for path in found))
    if not result.ok:
        return ModuleResult(Status.FAILED, f"removing {venv} failed: "
                            f"{(result.stderr or result.stdout).strip()[-500:]}")
    return ModuleResult(Status.CHANGED, "removed " + ", ".join(found),
                        data={"venv": venv, "removed": found})


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Install ``requirement`` from ``wheelhouse`` into a new venv and switch ``venv`` to it;
    see the module docstring.

    Args:
        ctx: the task context (``find_file`` locates ``constraints``). args: the arguments.

    Returns:
        ok (the link already names this build), changed (sent, built and switched; ``data``:
        ``build``, ``pushed``), or failed (a pip, import or switch error, with its output).

    Raises:
        ProvisionError: bad arguments, an unreadable or empty wheelhouse, a constraints file
            that cannot be read, a push whose sha256 differs on arrival.
        UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    venv = values["venv"]
    wrong = check_path(venv)
    if wrong or venv == "/":
        raise ProvisionError.single(f"{ctx.task_name}: venv", "not a usable path",
                                    expected=wrong or "a path other than /", actual=venv)
    if values["state"] == "absent":
        return _remove(ctx, venv)
    for name in ("wheelhouse", "requirement", "constraints"):
        if not values[name]:
            raise ProvisionError.single(f"{ctx.task_name}: {name}", "missing",
                                        expected=f"{name} with state present")
    try:
        constraints = ctx.find_file(values["constraints"]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError.single(f"{ctx.task_name}: constraints", "cannot read it",
                                    actual=str(exc)) from None
    wheels = _wheels(Path(values["wheelhouse"]), ctx.task_name)
    build = f"{venv}.{build_id(values['requirement'], constraints, wheels)}"
    read = ctx.conn.run(_state_command(venv, build))
    lines = read.stdout.splitlines()
    state = lines[0].strip() if lines else ""
    data = {"venv": venv, "build": build}
    if state == "CURRENT":
        return ModuleResult(Status.OK, "", data=data)
    if state == "NOTLINK":
        return ModuleResult(Status.FAILED, f"{venv} exists and is not a link: not a venv this "
                            "module built; move it away or set another path", data=data)
    present = {parts[1].lstrip("*"): parts[0] for parts in (line.split(None, 1)
               for line in lines[1:]) if len(parts) == 2}
    missing = [name for name, digest in wheels.items() if present.get(name) != digest]
    data["pushed"] = len(missing)
    if ctx.check_mode:
        return ModuleResult(Status.CHANGED, f"would send {len(missing)} wheels, build {build} "
                            f"and switch {venv} to it", data=data)
    folder = Path(values["wheelhouse"])
    for name in missing:
        push_file(ctx.conn, folder / name, f"{venv}.wheels", name, wheels[name])
    constraints_file = f"{venv}.wheels/constraints-{posixpath.basename(build)}.txt"
    write = ctx.conn.run(f"cat > {quote(constraints_file)}", stdin=constraints)
    if not write.ok:
        return ModuleResult(Status.FAILED, f"writing {constraints_file} failed: "
                            f"{(write.stderr or write.stdout).strip()[-500:]}", data=data)
    built = ctx.conn.run(_build_script(values, build, constraints_file),
                         timeout_s=values["timeout"])
    if not built.ok:
        return ModuleResult(Status.FAILED, f"building {build} failed: "
                            f"{(built.stderr or built.stdout).strip()[-1500:]}", data=data)
    script, notified = with_notify(ctx, _switch_script(venv, build))
    switched = ctx.conn.run(script)
    if not switched.ok:
        return ModuleResult(Status.FAILED, f"switching {venv} to {build} failed: "
                            f"{(switched.stderr or switched.stdout).strip()[-500:]}", data=data)
    return ModuleResult(Status.CHANGED, f"sent {len(missing)} wheels, built {build}, switched "
                        f"{venv} to it", data=data, persisted_notify=notified)
