"""Load and validate playbooks and roles into plain values, before any connection is opened.

Layout (Ansible's, docs "Roles", playbooks_reuse_roles.rst): ``roles/<name>/defaults/main.yml``,
``tasks/main.yml``, ``handlers/main.yml``, ``meta/main.yml``, ``templates/`` (the ``template``
module's sources) and ``files/`` (the ``copy`` module's). Roles are looked up in the playbook
folder's sibling ``roles/`` (``playbooks/../roles``), then beside the playbook, then in every
``--roles-path`` folder, then in each registered backend's ``roles_dir``.

Reuse, all of it static (resolved here, at load, as Ansible's ``import_*``; docs/engine.md):

- ``meta/main.yml`` ``dependencies: [name | {role: name, when: ...}]``: the roles that run
  before the role, depth first. A role runs once per play: a second entry of the same role with
  the same ``when`` (the engine's role parameters) is dropped, as Ansible drops a duplicate role
  with the same parameters. A dependency cycle is an error.
- a play list entry ``{import_playbook: file.yml}`` (relative to the importing playbook's
  folder) stands for that playbook's plays.
- a task list entry ``{import_tasks: file.yml}`` (``include_tasks`` is taken as its static
  twin: a literal file name, read at load) stands for that file's tasks, relative to the
  role's ``tasks/`` for a role's task, else to the playbook's folder; its ``when`` is added to
  each of them.

A backend's role may hold ``plays/<phase>.yml``: a play ``{name: ..., backend_plays: <phase>}``
is replaced by those plays of every registered backend (:func:`_backend_plays`).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from vllm_provision import backends
from vllm_provision.core.errors import ProvisionError
from vllm_provision.modules import BUILTIN_MODULES, find_module

TASK_KEYS = frozenset({
    "name", "when", "notify", "register", "changed_when", "failed_when", "run_once", "become",
    "delegate_to", "tags", "no_log", "check_mode", "ignore_errors",
})
HANDLER_KEYS = TASK_KEYS | {"listen", "scope", "order"}
PLAY_KEYS = frozenset({"name", "hosts", "serial", "vars", "roles", "tasks", "handlers",
                       "any_errors_fatal", "fatal_scope", "gather_facts", "tags"})
ROLE_ENTRY_KEYS = frozenset({"role", "when", "tags"})
META_KEYS = frozenset({"dependencies"})
IMPORT_PLAYBOOK_KEYS = frozenset({"import_playbook", "name"})
IMPORT_TASKS_KEYS = frozenset({"name", "when"})
IMPORT_TASKS_MODULES = ("import_tasks", "include_tasks")
# A play ``{name: ..., backend_plays: <phase>}`` stands for every backend's plays of that phase.
BACKEND_PLAYS_KEY = "backend_plays"
BACKEND_PLAY_HOSTS = ("vllm_replicas", "vllm_master", "vllm_followers")


@dataclass(frozen=True)
class Task:
    """One task (or handler) of a play.

    Attributes:
        name: a sentence shown in the output.
        module: the module key (``template``).
        args: the module's arguments: a mapping, or a string (``command: echo hi``).
        where: file and position, for messages (``roles/x/tasks/main.yml: [2]``).
        when: conditions, all must be true.
        notify: handler names or ``listen`` topics.
        scope: handlers only: ``host`` (default) or ``replica`` (every node of the notifying
            host's replica, in rank order).
        order: handlers with ``scope: replica``: ``followers_first`` (default) or
            ``master_first``.
        role_path: the role folder the task comes from (for ``templates/``), or None.
    """

    name: str
    module: str
    args: Any
    where: str
    when: tuple[Any, ...] = ()
    notify: tuple[str, ...] = ()
    register: str | None = None
    changed_when: Any = None
    failed_when: Any = None
    run_once: bool = False
    become: bool | None = None
    delegate_to: str | None = None
    tags: tuple[str, ...] = ()
    no_log: bool = False
    check_mode: bool | None = None
    ignore_errors: bool = False
    listen: tuple[str, ...] = ()
    scope: Literal["host", "replica"] = "host"
    order: Literal["followers_first", "master_first"] = "followers_first"
    role: str | None = None
    role_path: Path | None = None


@dataclass(frozen=True)
class Play:
    """One play: hosts pattern, variables, tasks (roles' first) and handlers.

    ``any_errors_fatal`` stops the run at a failed task; ``fatal_scope`` (an engine extension,
    docs/engine.md) says how far: ``play`` (Ansible's rule: every host) or ``replica`` (every
    node of the failed host's replica; other replicas go on).
    """

    name: str
    hosts: str
    where: str
    tasks: tuple[Task, ...]
    handlers: tuple[Task, ...] = ()
    serial: int | None = None
    vars: Mapping[str, Any] = field(default_factory=dict)
    role_defaults: Mapping[str, Any] = field(default_factory=dict)
    any_errors_fatal: bool = False
    template_dirs: tuple[Path, ...] = ()
    fatal_scope: Literal["play", "replica"] = "play"
    file_dirs: tuple[Path, ...] = ()


def _error(where: str, message: str, *, expected: str = "", actual: str = "",
           fix: str = "") -> ProvisionError:
    return ProvisionError.single(where, message, expected=expected, actual=actual, fix=fix)


# Parsed playbook and role files of this process, by (path, mtime, size): `provision up` loads
# up.yml and its roles several times (the run, the approval's dry run, the ownership guard, the
# state record). Callers get a deep copy: they may change what they get.
_PARSED: dict[tuple[str, int, int], Any] = {}
# libyaml's safe loader when PyYAML was built with it (the same YAML 1.1 safe types, several
# times faster); the pure-Python one otherwise.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> Any:
    """Read a YAML file (safe loader); raise ProvisionError (file, line, column) on syntax
    errors. A file already read by this process and unchanged since (same mtime and size) is
    not parsed again."""
    try:
        info = path.stat()
        key = (str(path.resolve()), info.st_mtime_ns, info.st_size)
        if key in _PARSED:
            return copy.deepcopy(_PARSED[key])
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _error(str(path), f"cannot read the file: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader
        _PARSED[key] = copy.deepcopy(data)
        return data
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        place = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise _error(place, f"YAML syntax error: {problem}") from None


def roles_search_path(playbook: Path, roles_paths: Sequence[Path] = ()) -> list[Path]:
    """Return the folders searched for roles, in order (see module docstring)."""
    folder = playbook.resolve().parent
    return [folder.parent / "roles", folder / "roles", *[Path(p) for p in roles_paths]]


def load_playbook(path: Path, roles_paths: Sequence[Path] = ()) -> list[Play]:
    """Load ``path`` (a list of plays and ``import_playbook`` entries) and its roles; validate
    every key, and every task's arguments against its module's declaration (docs/modules.md).

    Raises:
        ProvisionError: unreadable file, YAML syntax error, unknown key or module, missing role,
            a ``notify`` without a matching handler, an unknown, missing or wrongly typed module
            argument, an import that is missing or imports itself; one problem per message,
            naming the file, play, task and key.
    """
    search = roles_search_path(path, roles_paths)
    search += [b.roles_dir for b in map(backends.get, backends.names())
               if b.roles_dir is not None and b.roles_dir not in search]
    return _load_plays(path, search, ())


def _load_plays(path: Path, search: list[Path], importing: tuple[Path, ...]) -> list[Play]:
    data = load_yaml(path)
    if not isinstance(data, list) or not data:
        raise _error(str(path), "a playbook is a non-empty list of plays",
                     actual=type(data).__name__)
    plays: list[Play] = []
    for index, raw in enumerate(data):
        where = f"{path}: play[{index}]"
        if isinstance(raw, Mapping) and "import_playbook" in raw:
            _check_keys(raw, IMPORT_PLAYBOOK_KEYS, where, "import_playbook")
            target = _import_path(raw["import_playbook"], path.parent,
                                  f"{where}.import_playbook", (*importing, path.resolve()))
            plays.extend(_load_plays(target, search, (*importing, path.resolve())))
        elif isinstance(raw, Mapping) and BACKEND_PLAYS_KEY in raw:
            plays.extend(_backend_plays(raw, where, path, search))
        else:
            plays.append(_load_play(raw, where, path, search))
    return plays


def _import_path(value: Any, folder: Path, where: str, importing: Sequence[Path]) -> Path:
    """The file an ``import_playbook``/``import_tasks`` names, relative to ``folder``."""
    if not isinstance(value, str) or not value.strip() or "{{" in value or "{%" in value:
        raise _error(where, "must name a file", expected="a literal file name such as "
                     "'start.yml' (imports are read when the playbook loads)",
                     actual=repr(value))
    target = Path(value) if Path(value).is_absolute() else folder / value
    if not target.is_file():
        raise _error(where, f"file '{value}' not found", expected=f"a file in {folder}")
    if target.resolve() in importing:
        raise _error(where, f"'{value}' imports itself",
                     actual=" -> ".join(str(p) for p in (*importing, target.resolve())),
                     fix="remove the import that closes the loop")
    return target


def _backend_plays(raw: Mapping[str, Any], where: str, playbook: Path,
                   search: list[Path]) -> list[Play]:
    """Expand ``{name: ..., backend_plays: <phase>}`` into every registered backend's plays for
    that phase (``<backend role>/plays/<phase>.yml``, vllm_provision/backends), in registry
    order, each limited to the nodes of that backend's replicas: ``hosts: vllm_replicas`` becomes
    ``vllm_<backend>``, ``vllm_master`` becomes ``vllm_<backend>:&vllm_master`` (and
    ``vllm_followers`` likewise)."""
    _check_keys(raw, frozenset({"name", BACKEND_PLAYS_KEY}), where, "backend plays")
    phase = raw[BACKEND_PLAYS_KEY]
    if phase not in backends.PHASES:
        raise _error(f"{where}.{BACKEND_PLAYS_KEY}", "unknown phase",
                     expected="one of " + ", ".join(backends.PHASES), actual=repr(phase))
    plays: list[Play] = []
    for name in backends.names():
        backend = backends.get(name)
        role_dir = _find_role(backend.role, search, f"{where}: backend {name}")
        path = backend.plays_file(phase, role_dir)
        if path is None:
            continue
        data = _optional_list(path)
        for index, play in enumerate(data):
            play_where = f"{path}: play[{index}]"
            if not isinstance(play, Mapping):
                raise _error(play_where, "a play is a mapping", actual=type(play).__name__)
            hosts = play.get("hosts")
            if hosts not in BACKEND_PLAY_HOSTS:
                raise _error(f"{play_where}.hosts", "a backend's play runs on one group of its "
                             "replicas", expected="one of " + ", ".join(BACKEND_PLAY_HOSTS),
                             actual=repr(hosts))
            group = f"vllm_{name}"
            limited = group if hosts == "vllm_replicas" else f"{group}:&{hosts}"
            plays.append(_load_play({**play, "hosts": limited}, play_where, playbook, search))
    return plays


def _load_play(raw: Any, where: str, playbook: Path, search: list[Path]) -> Play:
    if not isinstance(raw, Mapping):
        raise _error(where, "a play is a mapping", actual=type(raw).__name__)
    _check_keys(raw, PLAY_KEYS, where, "play")
    hosts = raw.get("hosts")
    if not isinstance(hosts, str) or not hosts.strip():
        if isinstance(hosts, list) and all(isinstance(h, str) for h in hosts):
            hosts = ":".join(hosts)
        else:
            raise _error(f"{where}.hosts", "missing or invalid host pattern",
                         expected="a host pattern such as 'vllm_replicas'", actual=repr(hosts))
    name = str(raw.get("name") or hosts)
    serial = raw.get("serial")
    if serial is not None and (not isinstance(serial, int) or isinstance(serial, bool)
                               or serial < 1):
        raise _error(f"{where}.serial", "invalid batch size", expected="an integer >= 1",
                     actual=repr(serial))
    play_vars = raw.get("vars") or {}
    if not isinstance(play_vars, Mapping):
        raise _error(f"{where}.vars", "vars must be a mapping", actual=type(play_vars).__name__)
    tasks: list[Task] = []
    handlers: list[Task] = []
    defaults: dict[str, Any] = {}
    template_dirs: list[Path] = []
    file_dirs: list[Path] = []
    seen: set[tuple[str, tuple[Any, ...]]] = set()
    roles: list[tuple[str, Path, tuple[Any, ...]]] = []
    for index, entry in enumerate(_as_list(raw.get("roles"), f"{where}.roles")):
        role_where = f"{where}.roles[{index}]"
        role_name, role_when = _role_entry(entry, role_where)
        _expand_role(role_name, role_when, role_where, search, seen, roles, ())
    for role_name, role_dir, role_when in roles:
        template_dirs.append(role_dir / "templates")
        file_dirs.append(role_dir / "files")
        role_defaults = _optional_mapping(role_dir / "defaults" / "main.yml")
        defaults.update(role_defaults)
        for task in _load_tasks(role_dir / "tasks" / "main.yml", handler=False, role=role_name,
                                role_path=role_dir, play=name, importing=()):
            tasks.append(_with_when(task, role_when) if role_when else task)
        handlers.extend(_load_tasks(role_dir / "handlers" / "main.yml", handler=True,
                                    role=role_name, role_path=role_dir, play=name,
                                    importing=()))
    for index, t_raw in enumerate(_as_list(raw.get("tasks"), f"{where}.tasks")):
        tasks.extend(_load_task_entry(t_raw, f"{where}.tasks[{index}]", handler=False,
                                      folder=playbook.parent, play=name,
                                      importing=(playbook.resolve(),)))
    for index, h_raw in enumerate(_as_list(raw.get("handlers"), f"{where}.handlers")):
        handlers.extend(_load_task_entry(h_raw, f"{where}.handlers[{index}]", handler=True,
                                         folder=playbook.parent, play=name,
                                         importing=(playbook.resolve(),)))
    template_dirs.append(playbook.resolve().parent / "templates")
    file_dirs.append(playbook.resolve().parent / "files")
    _check_notify(tasks, handlers)
    fatal = raw.get("any_errors_fatal", False)
    if not isinstance(fatal, bool):
        raise _error(f"{where}.any_errors_fatal", "must be true or false", actual=repr(fatal))
    fatal_scope = raw.get("fatal_scope", "play")
    if fatal_scope not in ("play", "replica"):
        raise _error(f"{where}.fatal_scope", "invalid fatal scope", expected="play or replica",
                     actual=repr(fatal_scope))
    if fatal_scope == "replica" and not fatal:
        raise _error(f"{where}.fatal_scope", "fatal_scope only narrows any_errors_fatal",
                     actual="fatal_scope: replica without any_errors_fatal: true",
                     fix="add any_errors_fatal: true to the play, or remove fatal_scope")
    return Play(name=name, hosts=hosts.strip(), where=where, tasks=tuple(tasks),
                handlers=tuple(handlers), serial=serial, vars=dict(play_vars),
                role_defaults=defaults, any_errors_fatal=fatal,
                template_dirs=tuple(template_dirs), fatal_scope=fatal_scope,
                file_dirs=tuple(file_dirs))


def _role_entry(entry: Any, where: str) -> tuple[str, tuple[Any, ...]]:
    if isinstance(entry, str):
        return entry, ()
    if isinstance(entry, Mapping) and isinstance(entry.get("role"), str):
        _check_keys(entry, ROLE_ENTRY_KEYS, where, "role entry")
        return entry["role"], _when_tuple(entry.get("when"))
    raise _error(where, "a role entry is a name or {role: name, when: ...}", actual=repr(entry))


def _find_role(name: str, search: list[Path], where: str) -> Path:
    for folder in search:
        candidate = folder / name
        if candidate.is_dir():
            return candidate
    raise _error(where, f"role '{name}' not found",
                 expected="a folder in " + ", ".join(str(p) for p in search),
                 fix="check the role's name or pass --roles-path")


def _expand_role(name: str, when: tuple[Any, ...], where: str, search: list[Path],
                 seen: set[tuple[str, tuple[Any, ...]]],
                 out: list[tuple[str, Path, tuple[Any, ...]]], chain: tuple[str, ...]) -> None:
    """Append ``name``'s dependencies (``meta/main.yml``, depth first), then ``name`` itself, to
    ``out`` as ``(name, folder, when)``, skipping a role already in the play with the same
    ``when`` (Ansible runs a role once per play unless its parameters differ: docs "Roles",
    "Running role dependencies"). A dependency inherits its parent's ``when``.

    Raises:
        ProvisionError: a missing role, a malformed ``meta/main.yml``, a dependency cycle.
    """
    if name in chain:
        raise _error(where, f"role dependency cycle: {' -> '.join((*chain, name))}",
                     fix="remove one of the dependencies from the roles' meta/main.yml")
    role_dir = _find_role(name, search, where)
    meta_path = role_dir / "meta" / "main.yml"
    meta = _optional_mapping(meta_path, "a mapping such as {dependencies: [vllm_common]}")
    _check_keys(meta, META_KEYS, str(meta_path), "role meta")
    for index, entry in enumerate(_as_list(meta.get("dependencies"),
                                           f"{meta_path}: dependencies")):
        dep_where = f"{meta_path}: dependencies[{index}]"
        dep_name, dep_when = _role_entry(entry, dep_where)
        _expand_role(dep_name, (*when, *dep_when), dep_where, search, seen, out,
                     (*chain, name))
    key = (name, tuple(repr(w) for w in when))
    if key not in seen:
        seen.add(key)
        out.append((name, role_dir, when))


def _load_tasks(path: Path, *, handler: bool, role: str | None, role_path: Path | None,
                play: str, importing: tuple[Path, ...]) -> list[Task]:
    """The tasks (or handlers) of a task file, ``import_tasks`` entries expanded."""
    out: list[Task] = []
    for index, raw in enumerate(_optional_list(path)):
        out.extend(_load_task_entry(raw, f"{path}: [{index}]", handler=handler,
                                    folder=path.parent, role=role, role_path=role_path,
                                    play=play, importing=(*importing, path.resolve())))
    return out


def _load_task_entry(raw: Any, where: str, *, handler: bool, folder: Path,
                     role: str | None = None, role_path: Path | None = None, play: str = "",
                     importing: tuple[Path, ...] = ()) -> list[Task]:
    """One task list entry: a task, or an ``import_tasks``/``include_tasks`` of a file's."""
    keys = [k for k in IMPORT_TASKS_MODULES if isinstance(raw, Mapping) and k in raw]
    if not keys:
        return [_load_task(raw, where, handler=handler, role=role, role_path=role_path,
                           play=play)]
    assert isinstance(raw, Mapping)
    if len(keys) > 1:
        raise _error(where, "a task has exactly one module key", actual=", ".join(keys))
    key = keys[0]
    _check_keys({k: v for k, v in raw.items() if k != key}, IMPORT_TASKS_KEYS, where, key)
    target = _import_path(raw[key], folder, f"{where}.{key}", importing)
    when = _when_tuple(raw.get("when"))
    tasks = _load_tasks(target, handler=handler, role=role, role_path=role_path, play=play,
                        importing=importing)
    return [_with_when(task, when) for task in tasks] if when else tasks


def _optional_list(path: Path) -> list[Any]:
    if not path.exists():
        return []
    data = load_yaml(path)
    if data is None:
        return []
    if not isinstance(data, list):
        raise _error(str(path), "must be a list of tasks", actual=type(data).__name__)
    return data


def _optional_mapping(path: Path, what: str = "a mapping of variables") -> dict[str, Any]:
    if not path.exists():
        return {}
    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise _error(str(path), f"must be {what}", actual=type(data).__name__)
    return dict(data)


def _as_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _error(where, "must be a list", actual=type(value).__name__)
    return value


def _check_keys(raw: Mapping[str, Any], allowed: frozenset[str], where: str, what: str) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            raise _error(f"{where}.{key}", f"unknown {what} key",
                         expected="one of " + ", ".join(sorted(allowed)),
                         fix=f"did you mean '{close[0]}'?" if close else "")


def _when_tuple(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def _str_tuple(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in items):
        raise _error(where, "must be a string or a list of strings", actual=repr(value))
    return tuple(items)


def _load_task(raw: Any, where: str, *, handler: bool, role: str | None = None,
               role_path: Path | None = None, play: str = "") -> Task:
    if not isinstance(raw, Mapping):
        raise _error(where, "a task is a mapping", actual=type(raw).__name__)
    allowed = HANDLER_KEYS if handler else TASK_KEYS
    module_keys = [key for key in raw if key not in allowed]
    if len(module_keys) != 1:
        if not module_keys:
            raise _error(where, "the task names no module",
                         expected="exactly one of " + ", ".join(BUILTIN_MODULES))
        known = [k for k in module_keys if find_module(str(k)) is not None]
        if len(known) == 1:
            other = next(k for k in module_keys if k != known[0])
            close = difflib.get_close_matches(str(other), sorted(allowed), n=1)
            raise _error(f"{where}.{other}", "unknown task key",
                         expected="one of " + ", ".join(sorted(allowed)),
                         fix=f"did you mean '{close[0]}'?" if close else "")
        raise _error(where, "a task has exactly one module key",
                     actual=", ".join(str(k) for k in module_keys))
    module = str(module_keys[0])
    spec = find_module(module)
    if spec is None:
        close = difflib.get_close_matches(module, [*BUILTIN_MODULES, *sorted(allowed)], n=1)
        raise _error(f"{where}.{module}", "unknown module or task key",
                     expected="a module (" + ", ".join(BUILTIN_MODULES) + ") or a task key",
                     fix=f"did you mean '{close[0]}'?" if close else "")
    name = raw.get("name") or f"{module}"
    args = raw[module] if raw[module] is not None else {}
    if not isinstance(args, (Mapping, str)):
        raise _error(f"{where}.{module}", "module arguments must be a mapping or a string",
                     actual=type(args).__name__)
    if spec.arguments is not None:
        # the declared contract (modules/arguments.py): typos and literal values fail here,
        # before any connection; templated values are checked once rendered
        spec.arguments.check_declared(args, f"{where}.{module}", task=str(name), play=play)
    for key in ("run_once", "no_log", "ignore_errors"):
        if key in raw and not isinstance(raw[key], bool):
            raise _error(f"{where}.{key}", "must be true or false", actual=repr(raw[key]))
    for key in ("become", "check_mode"):
        if key in raw and raw[key] is not None and not isinstance(raw[key], bool):
            raise _error(f"{where}.{key}", "must be true or false", actual=repr(raw[key]))
    register = raw.get("register")
    if register is not None and (not isinstance(register, str) or not register.isidentifier()):
        raise _error(f"{where}.register", "must be a variable name", actual=repr(register))
    scope = raw.get("scope", "host")
    if scope not in ("host", "replica"):
        raise _error(f"{where}.scope", "invalid handler scope", expected="host or replica",
                     actual=repr(scope))
    order = raw.get("order", "followers_first")
    if order not in ("followers_first", "master_first"):
        raise _error(f"{where}.order", "invalid handler order",
                     expected="followers_first or master_first", actual=repr(order))
    delegate = raw.get("delegate_to")
    if delegate is not None and not isinstance(delegate, str):
        raise _error(f"{where}.delegate_to", "must be a host name", actual=repr(delegate))
    return Task(
        name=str(name), module=module, args=args, where=where,
        when=_when_tuple(raw.get("when")), notify=_str_tuple(raw.get("notify"), f"{where}.notify"),
        register=register, changed_when=raw.get("changed_when"),
        failed_when=raw.get("failed_when"), run_once=bool(raw.get("run_once", False)),
        become=raw.get("become"), delegate_to=delegate,
        tags=_str_tuple(raw.get("tags"), f"{where}.tags"), no_log=bool(raw.get("no_log", False)),
        check_mode=raw.get("check_mode"), ignore_errors=bool(raw.get("ignore_errors", False)),
        listen=_str_tuple(raw.get("listen"), f"{where}.listen"), scope=scope, order=order,
        role=role, role_path=role_path,
    )


def _with_when(task: Task, when: tuple[Any, ...]) -> Task:
    from dataclasses import replace

    return replace(task, when=(*when, *task.when))


def _check_notify(tasks: list[Task], handlers: list[Task]) -> None:
    names = {h.name for h in handlers} | {topic for h in handlers for topic in h.listen}
    for task in tasks:
        for target in task.notify:
            if target not in names:
                close = difflib.get_close_matches(target, sorted(names), n=1)
                raise _error(f"{task.where}.notify", f"no handler named '{target}' in this play",
                             expected="one of " + (", ".join(sorted(names)) or "(no handlers)"),
                             fix=f"did you mean '{close[0]}'?" if close else "")


def handlers_for(play: Play, target: str) -> list[Task]:
    """Return the play's handlers answering to ``target`` (their name or a ``listen`` topic)."""
    return [h for h in play.handlers if h.name == target or target in h.listen]
