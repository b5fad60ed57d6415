"""The node side of ``provision stack``: fed on stdin to the node's ``python3 -``, one action per
run, its settings one JSON argument, its answer one JSON object on stdout.

Runs on the node's own Python 3.9+ with the standard library only (the lab's guests and air-gapped
servers have nothing else). Actions (``action`` key of the settings):

- ``probe``: platform (machine, glibc), base Python, the active stack, the kept previous one,
  the wheels in the store, free disk, and the active venv's distributions.
- ``install``: build the stack ``stack-<id>`` beside the venv from the pushed wheels
  (``python3 -m venv`` then ``pip install --no-index --require-hashes``) and check it (versions
  against the lock, imports, ``vllm --version``). A complete stack holds a marker file, written
  last; a folder without it is a partial install and is removed by the next run.
- ``switch``: point the venv path at the stack with rename(2) of a new symlink over the old one
  (the first time, when the venv is still a plain folder, RENAME_EXCHANGE swaps them), after
  recording the active stack as the previous one.
- ``rollback``: switch back to the previous stack.
- ``cleanup``: remove partial stacks, temporary links and files, and stacks other than the
  active and previous ones.

Layout beside ``vllm_venv`` (``/opt/vllm``): ``/opt/vllm.stack-<id>/`` (venvs),
``/opt/vllm.previous`` (a symlink naming the previous stack), ``/opt/vllm.wheels/sha256/<hex>``
(wheels by content), ``/opt/vllm.wheels/links-<id>/`` (hard links with the wheels' names, for one
install).
"""

import ctypes
import errno
import json
import os
import platform
import shutil
import subprocess
import sys
import time

MARKER = ".vllm-provision-stack.json"
PIN_MODULE = "_vllm_provision_pin"
PIN_PTH = "00-vllm-provision-pin.pth"
# Run by site.py at start-up, before any other .pth file (site.addsitedir processes them sorted by
# name) and before any import from site-packages. The venv path is a symlink that a switch may
# repoint at any moment; a process that went on resolving it would import some modules from the
# old stack and the rest from the new one. This pins the process to the folder the link names
# now: sys.prefix, sys.exec_prefix, sys.executable (multiprocessing's spawn starts children with
# it) and the sys.path entries under the venv path.
PIN_SOURCE = '''"""Pins this Python process to the stack folder its venv path names at start-up.

Written by vllm-provision's `provision stack sync` (docs/stack.md, "The switch").
"""
import os
import sys


def _pin():
    link = sys.prefix
    real = os.path.realpath(link)
    if real == link:
        return
    head = link + os.sep

    def moved(path):
        if path == link or path.startswith(head):
            return real + path[len(link):]
        return path

    sys.path[:] = [moved(entry) for entry in sys.path]
    sys.prefix = moved(sys.prefix)
    sys.exec_prefix = moved(sys.exec_prefix)
    if sys.executable:
        sys.executable = moved(sys.executable)


_pin()
'''
ORIGINAL = "original"
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def paths(venv):
    parent, base = os.path.split(venv)
    return {
        "parent": parent or "/",
        "base": base,
        "store": venv + ".wheels",
        "sha": os.path.join(venv + ".wheels", "sha256"),
        "previous": venv + ".previous",
    }


def stack_dir(venv, stack_id):
    return f"{venv}.stack-{stack_id}"


def read_marker(folder):
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def stack_of(venv, target):
    """The stack id of a resolved venv folder, or "" when it is no stack of ours."""
    prefix = os.path.basename(venv) + ".stack-"
    name = os.path.basename(target)
    return name[len(prefix):] if name.startswith(prefix) else ""


def distributions(python):
    code = ("import importlib.metadata as m, json; print(json.dumps(sorted({(d.metadata['Name'] "
            "or '', d.version) for d in m.distributions()})))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if out.returncode != 0:
        return None, out.stderr.strip()[-500:]
    return {name: version for name, version in json.loads(out.stdout) if name}, ""


def probe(config):
    venv = config["venv"]
    p = paths(venv)
    libc, libc_version = platform.libc_ver()
    active = os.path.realpath(venv) if os.path.lexists(venv) else ""
    previous = os.path.realpath(p["previous"]) if os.path.islink(p["previous"]) else ""
    wheels = {}
    try:
        for name in os.listdir(p["sha"]):
            if len(name) == 64:
                wheels[name] = os.path.getsize(os.path.join(p["sha"], name))
    except OSError:
        pass
    folder = p["parent"]
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    disk = os.statvfs(folder)
    packages, error = ({}, "")
    if active and os.path.exists(os.path.join(active, "bin", "python")):
        packages, error = distributions(os.path.join(active, "bin", "python"))
    return {
        "machine": platform.machine(),
        "libc": libc,
        "libc_version": libc_version,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "venv_is_link": os.path.islink(venv),
        "active": active,
        "active_stack": stack_of(venv, active) if active else "",
        "active_complete": bool(active and read_marker(active)),
        "previous": previous if previous and os.path.isdir(previous) else "",
        "wheels": wheels,
        "free_bytes": disk.f_bavail * disk.f_frsize,
        "disk_path": folder,
        "packages": packages,
        "packages_error": error,
    }


def check(python, folder, lock, roots, vllm):
    """Versions against the lock, imports of the roots' top-level modules, vllm --version."""
    problems = []
    found, error = distributions(python)
    if found is None:
        return [f"reading the installed distributions failed: {error}"]
    norm = dict((normalise(name), version) for name, version in found.items())
    for name, version in sorted(lock.items()):
        got = norm.get(normalise(name))
        if got != version:
            problems.append(f"{name}: the lock says {version}, the new venv has {got}")
    code = ("import importlib, importlib.metadata as m, sys\n"
            "bad = []\n"
            "for dist in sys.argv[1:]:\n"
            "    d = m.distribution(dist)\n"
            "    top = (d.read_text('top_level.txt') or '').split()\n"
            "    if not top:\n"
            "        top = sorted({str(f).split('/')[0].split('.')[0] for f in (d.files or ())\n"
            "                      if not str(f).split('/')[0].endswith(('.dist-info', '.data'))\n"
            "                      and (str(f).endswith('.py') or '/' in str(f))\n"
            "                      and not str(f).startswith(('..', '__pycache__'))}) \n"
            "    for mod in top:\n"
            "        if mod.startswith('_') or not mod.isidentifier():\n"
            "            continue\n"
            "        try:\n"
            "            importlib.import_module(mod)\n"
            "        except Exception as exc:\n"
            "            bad.append('import %s (%s): %s' % (mod, dist, exc))\n"
            "print('\\n'.join(bad))\n")
    out = subprocess.run([python, "-c", code] + list(roots), capture_output=True, text=True,
                         timeout=900, cwd=folder)
    if out.returncode != 0:
        problems.append(f"imports failed: {out.stderr.strip()[-500:]}")
    problems += [line for line in out.stdout.splitlines() if line.strip()]
    if vllm:
        out = subprocess.run([os.path.join(folder, "bin", "vllm"), "--version"],
                             capture_output=True, text=True, timeout=900, cwd=folder)
        if out.returncode != 0 or vllm not in out.stdout:
            got = out.stdout.strip()[-200:] + out.stderr.strip()[-300:]
            problems.append(f"vllm --version: wanted {vllm}, got {got}")
    return problems


def normalise(name):
    out = []
    for ch in name.lower():
        out.append("-" if ch in "_." else ch)
    text = "".join(out)
    while "--" in text:
        text = text.replace("--", "-")
    return text


def remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def install(config):
    venv, stack_id = config["venv"], config["stack"]
    p = paths(venv)
    folder = stack_dir(venv, stack_id)
    if read_marker(folder):
        return {"installed": False, "stack": folder}
    if os.path.realpath(venv) == folder:
        return {"error": f"{folder} is active but has no marker; roll back or remove it"}
    remove(folder)
    links = os.path.join(p["store"], "links-" + stack_id)
    remove(links)
    os.makedirs(links)
    for digest, filename in config["wheels"]:
        os.link(os.path.join(p["sha"], digest), os.path.join(links, filename))
    lock_file = os.path.join(p["store"], f"lock-{stack_id}.txt")
    started = time.time()
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    python = config.get("python") or sys.executable
    pip_wheel = bundled_pip()
    if pip_wheel:
        # pip runs from the wheel ensurepip would unpack (pip docs: a wheel is importable), so
        # the venv holds only the lock, and building it takes a second instead of ten.
        steps = [[python, "-m", "venv", "--without-pip", folder],
                 [os.path.join(folder, "bin", "python"), os.path.join(pip_wheel, "pip")]]
    else:
        steps = [[python, "-m", "venv", folder], [os.path.join(folder, "bin", "python"), "-m",
                                                  "pip"]]
    # --no-deps: the lock is the whole resolved set (uv resolved it, with its excludes and
    # overrides); pip installs exactly its pins and resolves nothing again (it would ask for a
    # package the lock excludes). --require-hashes still checks every file.
    steps[1] += ["install", "--no-index", "--no-deps", "--require-hashes", "--no-cache-dir",
                 "--quiet", "--find-links", links, "--requirement", lock_file]
    for argv in steps:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
        if out.returncode != 0:
            remove(links)
            text = out.stderr.strip() or out.stdout.strip()
            # pip's ERROR lines, not its warnings (as stack.pip_errors on the controller; this
            # script runs alone on the node and imports nothing of ours)
            errors = [line for line in text.splitlines() if line.startswith("ERROR:")]
            detail = ("\n".join(errors) if errors else text)[-1500:]
            return {"error": f"{' '.join(argv[:4])} failed (exit {out.returncode}): {detail}"}
    remove(links)
    error = write_pin(folder)
    if error:
        return {"error": error}
    problems = check(os.path.join(folder, "bin", "python"), folder, config["lock"],
                     config.get("roots") or [], config.get("vllm") or "")
    if problems:
        return {"error": "the new venv {} failed its check: {}".format(folder, "; ".join(problems))}
    marker = os.path.join(folder, MARKER)
    with open(marker + ".tmp", "w", encoding="utf-8") as handle:
        json.dump({"stack": stack_id, "packages": config["lock"],
                   "installed_s": round(time.time() - started, 3)}, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(marker + ".tmp", marker)
    fsync_dir(folder)
    return {"installed": True, "stack": folder}


def write_pin(folder):
    """Write the pin module and its .pth into the new venv's site-packages ("" or an error)."""
    import glob

    found = glob.glob(os.path.join(folder, "lib", "python3*", "site-packages"))
    if len(found) != 1:
        return f"{folder}: expected one lib/python3*/site-packages, found {len(found)}"
    for name, text in ((PIN_MODULE + ".py", PIN_SOURCE), (PIN_PTH, f"import {PIN_MODULE}\n")):
        path = os.path.join(found[0], name)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(path + ".tmp", path)
    return ""


def bundled_pip():
    """The pip wheel that ensurepip ships (CPython's _bundled, or Debian's python-wheels)."""
    import glob

    try:
        import ensurepip

        places = [os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")]
    except ImportError:
        places = []
    places.append("/usr/share/python-wheels")
    for place in places:
        found = sorted(glob.glob(os.path.join(place, "pip-*-py3-none-any.whl")))
        if found:
            return found[-1]
    return ""


def fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exchange(a, b):
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE, Linux 3.15)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), a)


def point(venv, target):
    """Make ``venv`` a symlink to ``target`` (a sibling) in one rename(2)."""
    p = paths(venv)
    tmp = os.path.join(p["parent"], f".{p['base']}.link-{os.getpid()}")
    remove(tmp)
    os.symlink(os.path.basename(target), tmp)
    if os.path.isdir(venv) and not os.path.islink(venv):
        # The first switch: the venv is a plain folder. Swap it with the link, then keep the old
        # folder as the stack "original" (rollback returns to it).
        try:
            exchange(tmp, venv)
        except OSError:
            remove(tmp)
            raise
        try:
            os.rename(tmp, stack_dir(venv, ORIGINAL))
        except OSError:
            exchange(tmp, venv)  # back: the folder is the venv again, tmp the link
            remove(tmp)
            raise
    else:
        os.replace(tmp, venv)
    fsync_dir(p["parent"])


def switch(config):
    venv, stack_id = config["venv"], config["stack"]
    p = paths(venv)
    target = stack_dir(venv, stack_id)
    if not read_marker(target):
        return {"error": f"{target} is not a complete stack"}
    if os.path.realpath(venv) == target:
        return {"switched": False, "active": target}
    before = os.path.realpath(venv) if os.path.lexists(venv) else ""
    first = bool(before) and os.path.isdir(venv) and not os.path.islink(venv)
    if before and os.path.isdir(before):
        if first:
            before = stack_dir(venv, ORIGINAL)
        tmp = p["previous"] + ".tmp"
        remove(tmp)
        os.symlink(os.path.basename(before), tmp)
        os.replace(tmp, p["previous"])
    try:
        point(venv, target)
    except OSError as exc:
        if first:  # .previous named the original, which only the switch would have made
            remove(p["previous"])
        if exc.errno != errno.EXDEV or not first:
            raise
        return {"error": (
            f"cannot make {venv} a symlink to the new stack: the file system refuses to move "
            f"the folder {venv} (EXDEV; overlayfs does this for a folder of its lower layer "
            f"unless mounted with redirect_dir=on). Nothing was switched: {venv} stays active. "
            f"Once, with the replica stopped (provision down), run on this host: cp -a {venv} "
            f"{stack_dir(venv, ORIGINAL)} && rm -rf {venv} && ln -s "
            f"{os.path.basename(stack_dir(venv, ORIGINAL))} {venv}; then sync again")}
    return {"switched": True, "active": target, "before": before}


def rollback(config):
    venv = config["venv"]
    p = paths(venv)
    if not os.path.islink(p["previous"]):
        return {"error": f"no previous stack is kept beside {venv}"}
    previous = os.path.realpath(p["previous"])
    if not os.path.isdir(previous):
        return {"error": f"the previous stack {previous} is gone"}
    active = os.path.realpath(venv)
    tmp = p["previous"] + ".tmp"
    remove(tmp)
    os.symlink(os.path.basename(active), tmp)
    point(venv, previous)
    os.replace(tmp, p["previous"])
    return {"switched": True, "active": previous, "before": active}


def cleanup(config):
    venv = config["venv"]
    p = paths(venv)
    keep = {os.path.realpath(venv), os.path.realpath(p["previous"])}
    removed = []
    prefix = p["base"] + ".stack-"
    for name in sorted(os.listdir(p["parent"])):
        path = os.path.join(p["parent"], name)
        # only a link: a folder of that name would be an old venv a failed swap left there
        stale_link = name.startswith(".{}.link-".format(p["base"])) and os.path.islink(path)
        stale_stack = (name.startswith(prefix) and path not in keep
                       and (not read_marker(path) or not config.get("keep_complete", True)))
        if stale_link or stale_stack or name == os.path.basename(p["previous"]) + ".tmp":
            remove(path)
            removed.append(path)
    for folder in (p["sha"], p["store"]):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.startswith(".tmp-") or name.startswith("links-"):
                remove(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
    return {"removed": removed}


ACTIONS = {"probe": probe, "install": install, "switch": switch, "rollback": rollback,
           "cleanup": cleanup}


def main():
    config = json.loads(sys.argv[1])
    try:
        if config["action"] == "probe":
            result = probe(config)
        else:
            # One changing action at a time per venv: a run whose controller was killed may still
            # be installing when the next run starts; the next one waits for it.
            import fcntl

            p = paths(config["venv"])
            with open(os.path.join(p["parent"], ".{}.stack-lock".format(p["base"])), "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                result = ACTIONS[config["action"]](config)
    except Exception as exc:  # one JSON answer, whatever happened
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
