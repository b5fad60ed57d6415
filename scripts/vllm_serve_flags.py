"""Regenerate ``vllm_provision/settings/vllm_cli/serve_flags.json`` from vLLM's released sources.

For every final release of ``vllm`` on the package index from 0.10.0 on, this script downloads
the release's sdist (or, where the index has none, its wheel), reads the files that build
``vllm serve``'s parser with :mod:`ast` (vLLM is never imported) and writes one table of every
option per release (``vllm_provision/settings/vllm_cli/__init__.py`` documents the format and
``README.md`` beside it how the table is made).

What is read, per release (paths in https://github.com/vllm-project/vllm):

* ``vllm/entrypoints/cli/serve.py`` (``ServeSubcommand.subparser_init``) and the
  ``make_arg_parser`` it calls (``vllm/entrypoints/openai/cli_args.py``, later
  ``vllm/entrypoints/common/cli_args.py``), ``FrontendArgs.add_cli_args``,
  ``EngineArgs.add_cli_args`` and ``AsyncEngineArgs.add_cli_args``
  (``vllm/engine/arg_utils.py``): a small interpreter walks these bodies and records every
  ``add_argument`` call, following calls into other functions that add arguments;
* ``get_kwargs``/``_compute_kwargs`` (``vllm/engine/arg_utils.py``): the type rules that turn a
  config dataclass field's annotation into argparse keywords, mirrored by :func:`field_props`;
* the config dataclasses (``vllm/config.py``, later ``vllm/config/*.py``) and the modules they
  import names from, for field annotations and type aliases (``Literal`` choices);
* ``vllm/utils/__init__.py`` or ``vllm/utils/argparse_utils.py``: ``FlexibleArgumentParser``
  (whether it passes ``allow_abbrev=False``; whether ``BooleanOptionalAction`` is replaced by
  an action that adds ``--disable-x`` for ``--enable-x``);
* ``vllm/envs.py``: the ``environment_variables`` dict, for variables that became options.

Usage::

    python scripts/vllm_serve_flags.py [--cache DIR] [--out FILE] [--releases 0.11.0,0.12.0]
                                       [--offline]
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import re
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_CACHE = "/var/cache/vllm-provision/vllm-sdists"
DEFAULT_OUT = (Path(__file__).resolve().parent.parent
               / "vllm_provision/settings/vllm_cli/serve_flags.json")
DEFAULT_INDEX = "https://pypi.org/simple"
OLDEST = (0, 10, 0)
_FINAL_RE = re.compile(r"^\d+(\.\d+){1,3}$")
_BUILTIN_SCALARS = {"int", "float", "str", "bool", "bytes"}
_COLLECTIONS = {"list": "list", "List": "list", "tuple": "tuple", "Tuple": "tuple",
                "set": "set", "Set": "set", "frozenset": "set", "Sequence": "list",
                "dict": "dict", "Dict": "dict", "Mapping": "dict", "MutableMapping": "dict"}


# ---------------------------------------------------------------------------------------------
# The package index and the archives


def index_url() -> str:
    """The index ``pip`` is configured with: ``PIP_INDEX_URL``, else the first ``index-url`` in
    ``PIP_CONFIG_FILE``, the user's and the site's pip.conf, else PyPI's simple API."""
    env = os.environ.get("PIP_INDEX_URL")
    if env:
        return env.rstrip("/")
    confs = [os.environ.get("PIP_CONFIG_FILE", ""), os.path.expanduser("~/.config/pip/pip.conf"),
             os.path.expanduser("~/.pip/pip.conf"), "/etc/pip.conf", "/etc/xdg/pip/pip.conf"]
    for conf in filter(None, confs):
        try:
            text = Path(conf).read_text()
        except OSError:
            continue
        match = re.search(r"^\s*index-url\s*=\s*(\S+)", text, re.M)
        if match:
            return match[1].rstrip("/")
    return DEFAULT_INDEX


def parse_version(text: str) -> tuple[int, ...] | None:
    """``0.10.1.1`` -> ``(0, 10, 1, 1)``; None for a pre-, post- or dev release."""
    if not _FINAL_RE.match(text):
        return None
    return tuple(int(p) for p in text.split("."))


def archive_choices(files: Iterable[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """From the simple API's JSON ``files`` (PEP 691), each final release >= 0.10.0 ->
    ``(filename, url)`` of its sdist, else of its wheel (the x86_64 one where there are
    several; a build tag like ``-1`` is skipped in favour of the plain wheel)."""
    sdists: dict[str, tuple[str, str]] = {}
    wheels: dict[str, tuple[str, str]] = {}
    for entry in files:
        name, url = entry["filename"], entry["url"].split("#")[0]
        if entry.get("yanked"):
            continue
        if name.endswith(".tar.gz"):
            version = name[len("vllm-"):-len(".tar.gz")]
            target = sdists
        elif name.endswith(".whl"):
            parts = name[:-4].split("-")
            if len(parts) != 5:  # a build tag: vllm-0.20.1-1-cp38-...
                continue
            version = parts[1]
            target = wheels
        else:
            continue
        key = parse_version(version)
        if key is None or key < OLDEST:
            continue
        current = target.get(version)
        # the Python files are the same in every wheel of a release: keep the x86_64 one
        if current is None or (target is wheels and "x86_64" in name
                               and "x86_64" not in current[0]):
            target[version] = (name, url)
    chosen = dict(wheels)
    chosen.update(sdists)
    return dict(sorted(chosen.items(), key=lambda kv: parse_version(kv[0]) or ()))


def list_archives(index: str) -> dict[str, tuple[str, str]]:
    """Ask ``index``'s simple API (JSON, PEP 691) for vllm's files; see
    :func:`archive_choices`."""
    request = urllib.request.Request(f"{index}/vllm/", headers={
        "Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        data = json.load(response)
    return archive_choices(data["files"])


def cached_archives(cache: Path) -> dict[str, tuple[str, str]]:
    """The archives already under ``cache`` (``--offline``), as :func:`archive_choices`."""
    files = [{"filename": p.name, "url": ""} for p in sorted(cache.iterdir())
             if p.is_file() and not p.name.endswith(".part")]
    return archive_choices(files)


def fetch(url: str, path: Path) -> None:
    """Download ``url`` to ``path`` (through a ``.part`` file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    with urllib.request.urlopen(url, timeout=600) as response, open(part, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    part.rename(path)


def wanted(member: str) -> bool:
    """The archive members read: every ``vllm/**.py`` (imports are followed lazily)."""
    return member.endswith(".py") and "/vllm/" in "/" + member and "/tests/" not in member


def read_sources(path: Path) -> dict[str, str]:
    """The ``vllm/**.py`` files of an sdist (``.tar.gz``) or wheel (zip), in memory, keyed by
    their path from ``vllm/`` on (``vllm/engine/arg_utils.py``)."""
    out: dict[str, str] = {}

    def key(member: str) -> str:
        return member[member.index("vllm/"):] if not member.startswith("vllm/") else member

    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if name.startswith("vllm/") and wanted(name):
                    out[key(name)] = archive.read(name).decode("utf-8", "replace")
        return out
    with tarfile.open(path, "r:gz") as archive:
        for member in archive:
            parts = member.name.split("/", 1)
            if member.isfile() and len(parts) == 2 and parts[1].startswith("vllm/") \
                    and wanted(parts[1]):
                handle = archive.extractfile(member)
                if handle is not None:
                    out[parts[1]] = handle.read().decode("utf-8", "replace")
    return out


# ---------------------------------------------------------------------------------------------
# The sources as modules, classes and type aliases


@dataclass
class ClassInfo:
    """A class found in the sources: its bases' names, fields (name -> annotation, in order,
    with the ``flags`` metadata if any), methods, and whether it is a dataclass."""

    name: str
    module: str
    bases: list[str]
    fields: dict[str, ast.expr]
    methods: dict[str, ast.FunctionDef]
    is_dataclass: bool
    is_enum: bool


@dataclass
class Sources:
    """The files of one release, parsed on demand.

    ``files`` maps ``vllm/x/y.py`` to its text; :meth:`module` parses a module by dotted name
    (``vllm.config.parallel``), :meth:`lookup` finds a module-level name (alias, class,
    function) following ``from ... import`` lines."""

    files: dict[str, str]
    _trees: dict[str, ast.Module | None] = field(default_factory=dict)
    _classes: dict[tuple[str, str], ClassInfo] = field(default_factory=dict)

    def path_of(self, module: str) -> str | None:
        """The file that defines dotted ``module`` (``pkg/__init__.py`` or ``pkg.py``)."""
        base = module.replace(".", "/")
        for candidate in (base + ".py", base + "/__init__.py"):
            if candidate in self.files:
                return candidate
        return None

    def module(self, module: str) -> ast.Module | None:
        """The parsed module, or None when it is not in the release."""
        if module not in self._trees:
            path = self.path_of(module)
            tree = None
            if path is not None:
                try:
                    tree = ast.parse(self.files[path])
                except SyntaxError:
                    tree = None
            self._trees[module] = tree
        return self._trees[module]

    def find(self, suffix: str) -> str | None:
        """The dotted module whose path ends with ``suffix`` (``entrypoints/cli/serve.py``)."""
        hits = sorted(p for p in self.files if p.endswith(suffix))
        if not hits:
            return None
        path = hits[0]
        path = path[:-len("/__init__.py")] if path.endswith("/__init__.py") else path[:-3]
        return path.replace("/", ".")

    def lookup(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """Where ``name`` is defined as seen from ``module``: ``(module, node)`` with node an
        ``ast.ClassDef``, ``ast.FunctionDef`` or the value expression of an alias
        assignment; follows ``from x import name [as y]`` (absolute and relative)."""
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        for node in _module_level(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return module, node.value
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and node.target.id == name and node.value is not None:
                return module, node.value
            if type(node).__name__ == "TypeAlias" and getattr(node, "name", None) is not None \
                    and node.name.id == name:  # type: ignore[attr-defined]
                return module, node.value  # type: ignore[attr-defined]
        for node in _module_level(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":  # from .types import *
                        source = _absolute(module, node, self.path_of(module) or "")
                        found = self.lookup(source, name, depth + 1)
                        if found is not None:
                            return found
                        continue
                    if (alias.asname or alias.name) != name:
                        continue
                    source = _absolute(module, node, self.path_of(module) or "")
                    found = self.lookup(source, alias.name, depth + 1)
                    if found is None and self.path_of(f"{source}.{alias.name}"):
                        return None
                    if found is not None:
                        return found
        return None

    def class_info(self, module: str, node: ast.ClassDef) -> ClassInfo:
        """The :class:`ClassInfo` of ``node`` in ``module`` (cached)."""
        key = (module, node.name)
        if key not in self._classes:
            decorators = {_dotted(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
                          for d in node.decorator_list}
            bases = [_dotted(b.value if isinstance(b, ast.Subscript) else b)  # dict[str, X]
                     for b in node.bases]
            fields: dict[str, ast.expr] = {}
            methods: dict[str, ast.FunctionDef] = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if _dotted(item.annotation).split(".")[-1] == "ClassVar" or (
                            isinstance(item.annotation, ast.Subscript)
                            and _dotted(item.annotation.value).endswith("ClassVar")):
                        continue
                    fields[item.target.id] = item.annotation
                elif isinstance(item, ast.FunctionDef):
                    methods[item.name] = item
            is_dc = bool(decorators & {"dataclass", "config"}) or any(
                b.split(".")[-1] in {"BaseModel"} for b in bases)
            is_enum = any(b.split(".")[-1] in {"Enum", "IntEnum", "StrEnum"} for b in bases)
            self._classes[key] = ClassInfo(node.name, module, bases, fields, methods, is_dc,
                                           is_enum)
        return self._classes[key]

    def resolve_class(self, module: str, name: str) -> ClassInfo | None:
        """The class ``name`` (dotted allowed: its last part) seen from ``module``."""
        found = self.lookup(module, name.split(".")[-1])
        if found is not None and isinstance(found[1], ast.ClassDef):
            return self.class_info(found[0], found[1])
        return None

    def mro(self, info: ClassInfo) -> list[ClassInfo]:
        """``info`` and the bases found in the sources, depth first (enough for vLLM's
        single-inheritance config classes)."""
        out = [info]
        for base in info.bases:
            parent = self.resolve_class(info.module, base)
            if parent is not None and parent not in out:
                out.extend(p for p in self.mro(parent) if p not in out)
        return out

    def all_fields(self, info: ClassInfo) -> dict[str, tuple[str, ast.expr]]:
        """Every dataclass field of ``info`` with its bases' first (``dataclasses.fields``
        order): name -> (module that annotates it, annotation)."""
        out: dict[str, tuple[str, ast.expr]] = {}
        for cls in reversed(self.mro(info)):
            for name, annotation in cls.fields.items():
                out[name] = (cls.module, annotation)
        return out


def _module_level(tree: ast.Module) -> Iterable[ast.stmt]:
    """Top-level statements, including those under ``if``/``try`` (TYPE_CHECKING imports)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        yield node
        if isinstance(node, ast.If):
            stack.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body + [s for h in node.handlers for s in h.body])


def _absolute(module: str, node: ast.ImportFrom, path: str) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not path.endswith("__init__.py"):
        parts = parts[:-1]
    parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
    return ".".join(parts + ([node.module] if node.module else []))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return ""


# ---------------------------------------------------------------------------------------------
# Annotations -> type hints -> option properties (vllm/engine/arg_utils.py, _compute_kwargs)


@dataclass(frozen=True)
class Hint:
    """One member of a field's flattened type hints (``get_type_hints`` in arg_utils.py).

    ``kind``: ``int``/``float``/``str``/``bool``/``none``/``literal``/``list``/``tuple``/
    ``set``/``dict``/``dataclass``/``class`` (not builtin: an enum, a TypedDict, a callable)/
    ``builtin`` (another builtin, e.g. ``type``)/``unknown`` (a name not found statically);
    ``args``: Literal values or the element hints of a collection."""

    kind: str
    args: tuple[Any, ...] = ()


def type_hints(sources: Sources, module: str, node: ast.expr | None,
               depth: int = 0) -> frozenset[Hint]:
    """Flatten an annotation as vLLM's ``get_type_hints`` does (Annotated -> its type, Union
    and ``X | Y`` and Optional -> their members), resolving aliases through ``sources``."""
    if node is None or depth > 12:
        return frozenset({Hint("unknown")})
    rec = lambda n, m=module: type_hints(sources, m, n, depth + 1)  # noqa: E731
    if isinstance(node, ast.Constant):
        if node.value is None:
            return frozenset({Hint("none")})
        if isinstance(node.value, str):
            try:
                return rec(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return frozenset({Hint("unknown")})
        return frozenset({Hint("unknown")})
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return rec(node.left) | rec(node.right)
    if isinstance(node, ast.Subscript):
        head = _dotted(node.value).split(".")[-1]
        items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return rec(items[0]) | {Hint("none")}
        if head == "Union":
            out: frozenset[Hint] = frozenset()
            for item in items:
                out |= rec(item)
            return out
        if head in {"Annotated", "SkipValidation"}:  # pydantic: Annotated[T, SkipValidation]
            return rec(items[0])
        if head == "Literal":
            values: list[Any] = []
            for item in items:
                if isinstance(item, ast.Constant):
                    values.append(item.value)
                    continue
                inner = rec(item)  # Literal["auto", RunnerType]: Python flattens the Literal
                if len(inner) != 1 or next(iter(inner)).kind != "literal":
                    return frozenset({Hint("unknown")})  # an enum member: no choices known
                values.extend(next(iter(inner)).args)
            return frozenset({Hint("literal", tuple(dict.fromkeys(values)))})
        if head in _COLLECTIONS:
            kind = _COLLECTIONS[head]
            if kind == "dict":
                return frozenset({Hint("dict")})
            elems = tuple(Hint("ellipsis") if isinstance(i, ast.Constant) and i.value is ...
                          else rec(i) for i in items)
            return frozenset({Hint(kind, elems)})
        if head in {"type", "Type", "Callable"}:
            return frozenset({Hint("builtin" if head != "Callable" else "class")})
        return rec(node.value)  # a generic class: its origin decides
    name = _dotted(node)
    if not name:
        return frozenset({Hint("unknown")})
    short = name.split(".")[-1]
    if short in _BUILTIN_SCALARS:
        return frozenset({Hint(short if short != "bytes" else "builtin")})
    if short == "None":
        return frozenset({Hint("none")})
    if short in _COLLECTIONS:
        kind = _COLLECTIONS[short]
        return frozenset({Hint(kind, () if kind != "dict" else ())})
    if short in {"Any", "object"}:
        return frozenset({Hint("class")})  # neither builtin nor dataclass: vLLM gives str
    if short in {"Callable", "type", "Type"}:
        return frozenset({Hint("class")})
    found = sources.lookup(module, short)
    if found is None:
        return frozenset({Hint("unknown")})
    where, target = found
    if isinstance(target, ast.ClassDef):
        info = sources.class_info(where, target)
        if info.is_dataclass:
            return frozenset({Hint("dataclass")})
        base_names = {b.split(".")[-1] for b in info.bases}
        if "dict" in base_names or "Dict" in base_names:
            return frozenset({Hint("dict")})
        return frozenset({Hint("class")})
    if isinstance(target, ast.FunctionDef):
        return frozenset({Hint("class")})
    if isinstance(target, ast.Call) and _dotted(target.func).endswith("TypeAliasType") \
            and len(target.args) >= 2:
        return rec(target.args[1], where)
    if isinstance(target, ast.Call) and _dotted(target.func).endswith("NewType") \
            and len(target.args) >= 2:
        return rec(target.args[1], where)
    if isinstance(target, ast.Call) and _dotted(target.func).endswith("TypeVar"):
        return frozenset({Hint("class")})
    return rec(target, where)


@dataclass
class Rules:
    """The type rules of one release's ``_compute_kwargs`` (vllm/engine/arg_utils.py) that
    changed over time: ``optional_bool_str`` (``{bool, str, None}`` -> ``nargs="?"``, str)
    and the int fields that take human-readable values (``1k``, ``auto``), which this table
    gives kind ``str`` since ``int()`` would refuse them."""

    optional_bool_str: bool = False
    human_ints: frozenset[str] = frozenset()
    enable_disable: bool = False


def read_rules(sources: Sources) -> Rules:
    """The :class:`Rules` of this release, read from ``_compute_kwargs`` (or, in older
    releases, ``get_kwargs``) in vllm/engine/arg_utils.py, and from FlexibleArgumentParser."""
    rules = Rules()
    module = sources.find("vllm/engine/arg_utils.py")
    tree = sources.module(module) if module else None
    func = None
    if tree is not None:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in {"_compute_kwargs",
                                                                   "get_kwargs"}:
                if func is None or node.name == "_compute_kwargs":
                    func = node
    if func is not None:
        text = ast.unparse(func)
        rules.optional_bool_str = "{bool, str, type(None)}" in text
        for node in ast.walk(func):
            if isinstance(node, ast.If) and "contains_type(type_hints, int)" in ast.unparse(
                    node.test):
                names = {c.value for b in node.body for c in ast.walk(b)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str)
                         and re.fullmatch(r"[a-z_]+", c.value) and c.value not in {"type",
                                                                                  "help"}}
                rules.human_ints = frozenset(names)
                break
    parser_mod = sources.find("vllm/utils/argparse_utils.py") or sources.find(
        "vllm/utils/__init__.py")
    ptree = sources.module(parser_mod) if parser_mod else None
    if ptree is not None:
        text = ast.unparse(ptree)
        rules.enable_disable = "class EnableDisableAction" in text and re.search(
            r"register\(\s*'action',\s*BooleanOptionalAction,\s*EnableDisableAction",
            text) is not None
    return rules


def _elem_props(elem: frozenset[Hint] | Hint) -> dict[str, Any]:
    hints = elem if isinstance(elem, frozenset) else frozenset({elem})
    kinds = {h.kind for h in hints} - {"none"}
    if len(kinds) > 1:
        return {"kind": "str", "unknown": "unknown" in kinds}
    kind = next(iter(kinds), "str")
    if kind == "literal":
        values = next(h for h in hints if h.kind == "literal").args
        return {"kind": _literal_kind(values), "choices": [str(v) for v in sorted(values)]}
    if kind in {"int", "float", "str"}:
        return {"kind": kind}
    if kind == "bool":
        return {"kind": "str"}  # argparse's bool("False") is True: any text
    return {"kind": "str", "unknown": kind == "unknown"}


def _literal_kind(values: tuple[Any, ...]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "str"
    if all(isinstance(v, int) for v in values):
        return "int"
    if all(isinstance(v, float) for v in values):
        return "float"
    return "str"


def field_props(name: str, hints: frozenset[Hint], rules: Rules) -> dict[str, Any]:
    """argparse properties of a config field, as ``_compute_kwargs`` gives them.

    Returns a dict with ``kind``, ``takes_value``, ``choices`` (strings or None), ``nargs``,
    ``negatable`` and ``unknown`` (True when a name in the annotation could not be resolved
    statically: the kind is then ``str``, vLLM's fallback for non-builtin types). The order
    of the checks is vLLM's: dataclass -> JSON; ``{bool, str, None}`` -> optional value;
    bool -> BooleanOptionalAction; Literal -> choices (none if ``str`` is also allowed);
    tuple/list/set -> ``nargs="+"`` (a fixed tuple: its length); int; float; dict -> JSON;
    str or any non-builtin -> str. ``None`` in the hints adds the choice ``"None"``.
    """
    kinds = {h.kind for h in hints}
    props: dict[str, Any] = {"kind": "str", "takes_value": True, "choices": None,
                             "nargs": None, "negatable": False, "unknown": False}

    def has(kind: str) -> bool:
        return kind in kinds

    if has("dataclass"):
        props["kind"] = "json"
    elif rules.optional_bool_str and kinds == {"bool", "str", "none"}:
        props.update(kind="str", nargs="?")
    elif has("bool"):
        props.update(kind="bool", takes_value=False, negatable=True)
        return props
    elif has("literal"):
        values = next(h for h in hints if h.kind == "literal").args
        props["kind"] = _literal_kind(values)
        if not has("str"):
            props["choices"] = [str(v) for v in sorted(values, key=str)]
    elif has("tuple") or has("list") or has("set"):
        order = ("tuple", "list", "set")  # vLLM's order: tuple, then list, then set
        coll = next(h for kind in order for h in hints if h.kind == kind)
        elems = [e for e in coll.args if e != Hint("ellipsis")]
        fixed = coll.kind == "tuple" and Hint("ellipsis") not in coll.args and coll.args
        props["nargs"] = str(len(coll.args)) if fixed else "+"
        if elems:
            elem = _elem_props(elems[0])
            props["kind"] = elem["kind"]
            props["choices"] = elem.get("choices")
            props["unknown"] = bool(elem.get("unknown"))
    elif has("int"):
        props["kind"] = "str" if name == "max_model_len" or name in rules.human_ints else "int"
    elif has("float"):
        props["kind"] = "float"
    elif has("dict"):
        props["kind"] = "json"
    else:
        props["kind"] = "str"
        props["unknown"] = has("unknown") and not has("str")
    if has("none") and props["choices"]:
        props["choices"] = [*props["choices"], "None"]
    return props


# ---------------------------------------------------------------------------------------------
# The parser: a small interpreter over the functions that call add_argument


@dataclass
class Option:
    """One ``add_argument`` call: its option strings and properties (see field_props)."""

    strings: list[str]
    props: dict[str, Any]


class _KwDict(dict):
    """``get_kwargs(cls)``'s result: field name -> argparse keywords (a dict of props)."""


_JSON_TYPES = {"loads", "parse_type", "union_dict_and_str", "parse_dataclass"}


def _type_kind(node: ast.expr) -> tuple[str, bool]:
    """kind of an explicit ``type=`` expression, and whether it was not understood."""
    name = _dotted(node).split(".")[-1]
    if name in {"int", "float", "str"}:
        return name, False
    if name in _JSON_TYPES:
        return "json", False
    if name == "optional_type" and isinstance(node, ast.Call) and node.args:
        return _type_kind(node.args[0])
    if name in {"human_readable_int", "human_readable_int_or_auto"}:
        return "str", False
    if name in {"parse_reasoning_parser", "parse_type"}:
        return "str", False
    if isinstance(node, ast.Lambda) and _str_chain(node.body, node.args.args[0].arg
                                                   if node.args.args else ""):
        return "str", False  # lambda s: s.lower().replace("-", "_")
    return "str", True


def _str_chain(node: ast.expr, arg: str) -> bool:
    """Whether ``node`` is ``arg`` put through str methods only (``s.lower().strip()``)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in {"lower", "upper", "strip", "replace", "casefold"}:
        node = node.func.value
    return isinstance(node, ast.Name) and node.id == arg


class Interpreter:
    """Walks the parser-building functions of one release and collects their
    ``add_argument`` calls (a sketch of Python's semantics: every branch of an ``if`` is
    taken, loops over ``kwargs.items()`` are unrolled, calls into functions and methods that
    add arguments are followed)."""

    def __init__(self, sources: Sources, rules: Rules) -> None:
        self.sources = sources
        self.rules = rules
        self.options: list[Option] = []
        self._stack: list[str] = []

    # -- kwargs of a config class -------------------------------------------------------------
    def get_kwargs(self, info: ClassInfo) -> _KwDict:
        """``get_kwargs(cls)`` of arg_utils.py, statically."""
        out = _KwDict()
        for name, (module, annotation) in self.sources.all_fields(info).items():
            hints = type_hints(self.sources, module, annotation)
            props = field_props(name, hints, self.rules)
            out[name] = dict(props)
        return out

    # -- evaluation ---------------------------------------------------------------------------
    def run(self, module: str, func: ast.FunctionDef, cls: ClassInfo | None,
            args: dict[str, Any]) -> Any:
        """Interpret ``func`` (from ``module``, a method of ``cls`` or None) with ``args``
        bound to its parameters; returns what it returns, where understood."""
        key = f"{module}.{cls.name if cls else ''}.{func.name}"
        if key in self._stack or len(self._stack) > 12:
            return None
        self._stack.append(key)
        env: dict[str, Any] = dict(args)
        try:
            return self._block(func.body, module, cls, env)
        finally:
            self._stack.pop()

    def _block(self, body: list[ast.stmt], module: str, cls: ClassInfo | None,
               env: dict[str, Any]) -> Any:
        result = None
        for stmt in body:
            value = self._stmt(stmt, module, cls, env)
            if value is not None:
                result = value
        return result

    def _stmt(self, stmt: ast.stmt, module: str, cls: ClassInfo | None,
              env: dict[str, Any]) -> Any:
        if isinstance(stmt, ast.Return):
            return self._expr(stmt.value, module, cls, env) if stmt.value else None
        if isinstance(stmt, ast.Expr):
            self._expr(stmt.value, module, cls, env)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = self._expr(stmt.value, module, cls, env) if stmt.value else None
            for target in targets:
                self._assign(target, value, stmt.value, module, cls, env)
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                self._delete(target, module, cls, env)
        elif isinstance(stmt, ast.If):
            first = self._block(stmt.body, module, cls, env)
            second = self._block(stmt.orelse, module, cls, env)
            return first if first is not None else second
        elif isinstance(stmt, (ast.With, ast.Try)):
            return self._block(stmt.body, module, cls, env)
        elif isinstance(stmt, ast.For):
            self._for(stmt, module, cls, env)
        return None

    def _assign(self, target: ast.expr, value: Any, node: ast.expr | None, module: str,
                cls: ClassInfo | None, env: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            return
        if isinstance(target, ast.Subscript):
            container = self._expr(target.value, module, cls, env)
            key = self._const(target.slice)
            if isinstance(container, dict) and not isinstance(container, _KwDict) \
                    and isinstance(key, str):
                self._set_prop(container, key, node, value)

    def _set_prop(self, props: dict[str, Any], key: str, node: ast.expr | None,
                  value: Any) -> None:
        if key == "type" and node is not None:
            kind, unknown = _type_kind(node)
            props["kind"] = kind
            props["unknown"] = unknown
            if props.get("negatable") or not props.get("takes_value", True):
                props.update(takes_value=True, negatable=False)
        elif key == "action" and node is not None:
            self._apply_action(props, node)
        elif key == "choices":
            props["choices"] = [str(v) for v in value] if isinstance(value, list) else None
        elif key == "nargs":
            props["nargs"] = None if value is None else str(value)
        elif key == "flags" and isinstance(value, list):
            props["flags"] = [v for v in value if isinstance(v, str)]

    def _apply_action(self, props: dict[str, Any], node: ast.expr) -> None:
        name = node.value if isinstance(node, ast.Constant) else _dotted(node).split(".")[-1]
        if name in {"store_true", "store_false", "store_const", "count", "help", "version",
                    "append_const"}:
            props.update(kind="bool", takes_value=False, negatable=False, choices=None,
                         nargs=None, unknown=False)
        elif name == "BooleanOptionalAction":
            props.update(kind="bool", takes_value=False, negatable=True, choices=None,
                         nargs=None, unknown=False)
        else:  # "store", "append", "extend" or a custom Action class: takes a value
            props["takes_value"] = True
            props["negatable"] = False
            if props.get("kind") == "bool":
                props["kind"] = "str"

    def _delete(self, target: ast.expr, module: str, cls: ClassInfo | None,
                env: dict[str, Any]) -> None:
        if isinstance(target, ast.Subscript):
            container = self._expr(target.value, module, cls, env)
            key = self._const(target.slice)
            if isinstance(container, dict) and isinstance(key, str):
                if isinstance(container, _KwDict):
                    container.pop(key, None)
                elif key == "nargs":
                    container["nargs"] = None
                elif key == "choices":
                    container["choices"] = None
                elif key == "action":
                    container.update(kind="str", takes_value=True, negatable=False)

    def _for(self, stmt: ast.For, module: str, cls: ClassInfo | None,
             env: dict[str, Any]) -> None:
        it = stmt.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) \
                and it.func.attr == "items":
            container = self._expr(it.func.value, module, cls, env)
            if isinstance(container, _KwDict) and isinstance(stmt.target, ast.Tuple) \
                    and len(stmt.target.elts) == 2:
                key_t, value_t = stmt.target.elts
                for key, value in list(container.items()):
                    inner = dict(env)
                    self._assign(key_t, key, None, module, cls, inner)
                    self._assign(value_t, value, None, module, cls, inner)
                    self._block(stmt.body, module, cls, inner)
                return
        if isinstance(it, (ast.List, ast.Tuple)):
            for element in it.elts:
                inner = dict(env)
                self._assign(stmt.target, self._expr(element, module, cls, env), None,
                             module, cls, inner)
                self._block(stmt.body, module, cls, inner)

    @staticmethod
    def _const(node: ast.expr) -> Any:
        return node.value if isinstance(node, ast.Constant) else None

    def _expr(self, node: ast.expr | None, module: str, cls: ClassInfo | None,
              env: dict[str, Any]) -> Any:
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            return self._module_constant(module, node.id)
        if isinstance(node, ast.Dict):  # {**kwargs["x"], "default": None}
            merged: dict[str, Any] = {}
            for key, value in zip(node.keys, node.values, strict=True):
                if key is None:
                    inner = self._expr(value, module, cls, env)
                    if not isinstance(inner, dict) or isinstance(inner, _KwDict):
                        return None
                    merged.update(inner)
                else:
                    name = self._const(key)
                    if isinstance(name, str):
                        self._set_prop(merged, name, value, self._expr(value, module, cls,
                                                                        env))
            return merged
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [self._expr(e, module, cls, env) for e in node.elts]
        if isinstance(node, ast.Subscript):
            container = self._expr(node.value, module, cls, env)
            key = self._const(node.slice)
            if isinstance(container, dict) and key in container:
                return container[key]
            return None
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                if isinstance(value, ast.Constant):
                    parts.append(str(value.value))
                elif isinstance(value, ast.FormattedValue):
                    inner = self._expr(value.value, module, cls, env)
                    if not isinstance(inner, str):
                        return None
                    parts.append(inner)
            return "".join(parts)
        if isinstance(node, ast.Call):
            return self._call(node, module, cls, env)
        return None

    def _module_constant(self, module: str, name: str) -> Any:
        """A module-level string, number or list of them (``PASSTHROUGH: Final = "x"``)."""
        found = self.sources.lookup(module, name)
        if found is None or not isinstance(found[1], (ast.Constant, ast.List, ast.Tuple)):
            return None
        try:
            value = ast.literal_eval(found[1])
        except ValueError:
            return None
        return list(value) if isinstance(value, tuple) else value

    def _call(self, node: ast.Call, module: str, cls: ClassInfo | None,
              env: dict[str, Any]) -> Any:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in {"remove", "append", "extend"}:
            base = self._expr(func.value, module, cls, env)
            args = [self._expr(a, module, cls, env) for a in node.args]
            if isinstance(base, list) and len(args) == 1 and args[0] is not None:
                value = args[0]
                if func.attr == "remove" and str(value) in base:
                    base.remove(str(value))
                elif func.attr == "append":
                    base.append(str(value))
                elif func.attr == "extend" and isinstance(value, list):
                    base.extend(str(v) for v in value)
            return None
        if isinstance(func, ast.Name) and func.id == "get_args" and len(node.args) == 1:
            hints = type_hints(self.sources, module, node.args[0])
            if len(hints) == 1 and next(iter(hints)).kind == "literal":
                return list(next(iter(hints)).args)
            return None
        if isinstance(func, ast.Attribute):
            if func.attr == "add_argument":
                self._add_argument(node, module, cls, env)
                return None
            if func.attr == "replace":
                base = self._expr(func.value, module, cls, env)
                args = [self._expr(a, module, cls, env) for a in node.args]
                if isinstance(base, str) and len(args) == 2 and all(
                        isinstance(a, str) for a in args):
                    return base.replace(args[0], args[1])
                return None
            if func.attr == "pop":
                base = self._expr(func.value, module, cls, env)
                key = self._const(node.args[0]) if node.args else None
                if isinstance(base, dict) and isinstance(key, str):
                    default = self._expr(node.args[1], module, cls, env) if len(
                        node.args) > 1 else None
                    return base.pop(key, default)
                return None
            if func.attr in {"add_argument_group", "add_mutually_exclusive_group",
                             "add_parser"}:
                return None
            target = self._method_target(func, module, cls, env)
            if target is not None:
                return self._invoke(target, node, module, cls, env)
            return None
        if isinstance(func, ast.Name):
            if func.id == "get_kwargs" and node.args:
                info = self._class_of(node.args[0], module, cls, env)
                return self.get_kwargs(info) if info is not None else _KwDict()
            found = self.sources.lookup(module, func.id)
            if found is not None and isinstance(found[1], ast.FunctionDef) \
                    and _adds_arguments(found[1]):
                return self._invoke((found[0], found[1], None), node, module, cls, env)
        return None

    def _class_of(self, node: ast.expr, module: str, cls: ClassInfo | None,
                  env: dict[str, Any]) -> ClassInfo | None:
        if isinstance(node, ast.Name) and node.id == "cls" and cls is not None:
            return env.get("__cls__", cls)
        name = _dotted(node)
        return self.sources.resolve_class(module, name) if name else None

    def _method_target(self, func: ast.Attribute, module: str, cls: ClassInfo | None,
                       env: dict[str, Any]) -> tuple[str, ast.FunctionDef, Any] | None:
        owner = func.value
        start: ClassInfo | None = None
        skip_self = False
        if isinstance(owner, ast.Call) and _dotted(owner.func) == "super" and cls is not None:
            start, skip_self = env.get("__cls__", cls), True
        else:
            start = self._class_of(owner, module, cls, env)
        if start is None:
            return None
        chain = self.sources.mro(start)
        if skip_self and cls is not None:
            names = [c.name for c in chain]
            chain = chain[names.index(cls.name) + 1:] if cls.name in names else chain[1:]
        for info in chain:
            method = info.methods.get(func.attr)
            if method is not None:
                return info.module, method, (info, start)
        return None

    def _invoke(self, target: tuple[str, ast.FunctionDef, Any], node: ast.Call, module: str,
                cls: ClassInfo | None, env: dict[str, Any]) -> Any:
        where, func, owner = target
        params = [a.arg for a in func.args.args]
        values = [self._expr(a, module, cls, env) for a in node.args]
        if params and params[0] in {"self", "cls"}:
            params = params[1:]
        args = dict(zip(params, values, strict=False))
        for kw in node.keywords:
            if kw.arg:
                args[kw.arg] = self._expr(kw.value, module, cls, env)
        if owner is not None:
            info, actual = owner
            args["__cls__"] = actual
            return self.run(where, func, info, args)
        return self.run(where, func, None, args)

    def _add_argument(self, node: ast.Call, module: str, cls: ClassInfo | None,
                      env: dict[str, Any]) -> None:
        strings: list[str] = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                value = self._expr(arg.value, module, cls, env)
                if isinstance(value, list):
                    strings.extend(v for v in value if isinstance(v, str))
                continue
            value = self._expr(arg, module, cls, env)
            if isinstance(value, str):
                strings.append(value)
        if not strings or not all(s.startswith("-") for s in strings):
            return  # a positional argument (model_tag) or one not understood
        props: dict[str, Any] = {"kind": "str", "takes_value": True, "choices": None,
                                 "nargs": None, "negatable": False, "unknown": False}
        explicit_type = False
        for kw in node.keywords:
            if kw.arg is None:
                base = self._expr(kw.value, module, cls, env)
                if isinstance(base, dict):
                    props.update({k: v for k, v in base.items() if k in props})
                    strings = [*base.get("flags", []), *strings] if "flags" in base \
                        else strings
                else:
                    props["unknown"] = True
        for kw in node.keywords:
            if kw.arg == "type":
                explicit_type = True
                self._set_prop(props, "type", kw.value, None)
            elif kw.arg == "action":
                self._apply_action(props, kw.value)
            elif kw.arg == "choices":
                value = self._expr(kw.value, module, cls, env)
                props["choices"] = [str(v) for v in value] if isinstance(value, list) \
                    and all(v is not None for v in value) else None
            elif kw.arg == "nargs":
                value = self._expr(kw.value, module, cls, env)
                props["nargs"] = None if value is None else str(value)
        has_kwargs = any(kw.arg is None for kw in node.keywords)
        has_action = any(kw.arg == "action" for kw in node.keywords)
        if not explicit_type and not has_kwargs and not has_action:
            props["kind"] = "str"  # argparse's default: the text itself
        self.options.append(Option(strings, props))


def _adds_arguments(func: ast.FunctionDef) -> bool:
    """Whether ``func`` calls ``add_argument`` or ``add_cli_args`` (worth following)."""
    for node in ast.walk(func):
        if isinstance(node, ast.Attribute) and node.attr in {"add_argument", "add_cli_args",
                                                             "_customize_cli_kwargs"}:
            return True
    return False


# ---------------------------------------------------------------------------------------------
# One release


@dataclass
class Release:
    """What one release's sources say: options (long name -> props with ``aliases``),
    allow_abbrev, the environment variables of ``vllm/envs.py`` and the options whose type
    stayed unknown."""

    version: str
    flags: dict[str, dict[str, Any]]
    allow_abbrev: bool
    env_vars: set[str]
    unknown: list[str]
    env_mentions: set[str] = field(default_factory=set)


def read_allow_abbrev(sources: Sources) -> bool:
    """False when FlexibleArgumentParser (vllm/utils/argparse_utils.py, earlier
    vllm/utils/__init__.py) or the serve subparser passes ``allow_abbrev=False``."""
    for suffix in ("vllm/utils/argparse_utils.py", "vllm/utils/__init__.py",
                   "vllm/entrypoints/cli/serve.py", "vllm/entrypoints/cli/main.py"):
        module = sources.find(suffix)
        tree = sources.module(module) if module else None
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "allow_abbrev" \
                    and isinstance(node.value, ast.Constant) and node.value.value is False:
                return False
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                    and t.slice.value == "allow_abbrev" for t in node.targets) \
                    and isinstance(node.value, ast.Constant) and node.value.value is False:
                return False
    return True


def read_env_vars(sources: Sources) -> set[str]:
    """The keys of ``environment_variables`` in vllm/envs.py."""
    tree = sources.module("vllm.envs")
    out: set[str] = set()
    if tree is None:
        return out
    for node in _module_level(tree):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(
            node, "target", None)
        if isinstance(target, ast.Name) and target.id == "environment_variables" \
                and isinstance(getattr(node, "value", None), ast.Dict):
            out.update(k.value for k in node.value.keys  # type: ignore[union-attr]
                       if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return out


def _entry(sources: Sources) -> tuple[str, ast.FunctionDef, ClassInfo | None] | None:
    """Where ``vllm serve``'s parser is built: ``ServeSubcommand.subparser_init``."""
    module = sources.find("vllm/entrypoints/cli/serve.py")
    tree = sources.module(module) if module else None
    if tree is None or module is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            info = sources.class_info(module, node)
            method = info.methods.get("subparser_init")
            if method is not None:
                return module, method, info
    return None


def read_release(version: str, files: dict[str, str]) -> Release:
    """Read one release's ``vllm serve`` options from its ``vllm/**.py`` files.

    Raises:
        ValueError: the release has no ``vllm/entrypoints/cli/serve.py`` with a
            ``subparser_init`` method.
    """
    sources = Sources(files)
    rules = read_rules(sources)
    entry = _entry(sources)
    if entry is None:
        raise ValueError(f"vLLM {version}: no vllm/entrypoints/cli/serve.py subparser_init")
    interp = Interpreter(sources, rules)
    module, func, cls = entry
    interp.run(module, func, cls, {"__cls__": cls})
    flags: dict[str, dict[str, Any]] = {}
    unknown: list[str] = []
    for option in interp.options:
        longs = [s for s in option.strings if s.startswith("--")]
        if not longs:
            continue
        name = longs[0]
        aliases = [s for s in option.strings if s != name]
        props = dict(option.props)
        if props.get("negatable") and rules.enable_disable:
            for prefix, inverse in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
                aliases.extend(inverse + s[len(prefix):] for s in option.strings
                               if s.startswith(prefix))
        if props.pop("unknown", False):
            unknown.append(name)
        flags[name] = {"aliases": sorted(set(aliases)), "takes_value": props["takes_value"],
                       "kind": props["kind"], "choices": props["choices"],
                       "nargs": props["nargs"], "negatable": props["negatable"]}
    env_vars = read_env_vars(sources)
    return Release(version, flags, read_allow_abbrev(sources), env_vars,
                   sorted(set(unknown)), env_mentions(files, env_vars))


def env_mentions(files: dict[str, str], env_vars: set[str]) -> set[str]:
    """The variables of ``env_vars`` named in the files that define options
    (vllm/engine/arg_utils.py, vllm/config*, the cli_args.py files): a deprecation note or
    a fallback that ties a variable to its option."""
    texts = [text for path, text in files.items()
             if path == "vllm/engine/arg_utils.py" or path.startswith("vllm/config")
             or path.endswith("/cli_args.py")]
    return {var for var in env_vars if any(var in text for text in texts)}


# ---------------------------------------------------------------------------------------------
# The table


def spans(values: list[Any]) -> list[list[Any]]:
    """``[v0, v0, None, v1]`` -> ``[[0, 1, v0], [3, 3, v1]]``: runs of equal non-None values
    by index (the table's span lists)."""
    out: list[list[Any]] = []
    for index, value in enumerate(values):
        if value is None:
            continue
        if out and out[-1][1] == index - 1 and out[-1][2] == value:
            out[-1][1] = index
        else:
            out.append([index, index, value])
    return out


def env_candidates(reads: list[Release],
                   rejected: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Environment variables that vLLM replaced by an option.

    A candidate is a variable that leaves vllm/envs.py in release N while the option of the
    same name (``VLLM_X_Y`` -> ``--x-y``) exists in N. It is confirmed when the option first
    appears in N itself (the variable was swapped for the option, as vLLM PR #26732 did for
    ``VLLM_ALL2ALL_BACKEND``), or when a release that has both names mentions the variable
    in the option's sources (a deprecation note or a fallback: :func:`env_mentions`).
    Unconfirmed candidates are appended to ``rejected`` as text.

    Returns variable -> ``{"flag": ..., "since": first release with the option}``."""
    out: dict[str, dict[str, str]] = {}
    for index in range(1, len(reads)):
        before, after = reads[index - 1], reads[index]
        for var in sorted(before.env_vars - after.env_vars):
            flag = "--" + var.removeprefix("VLLM_").lower().replace("_", "-")
            if flag not in after.flags:
                continue
            first = next(i for i, r in enumerate(reads) if flag in r.flags)
            swapped = first == index
            mentioned = any(var in r.env_mentions and flag in r.flags
                            for r in reads[first:index])
            if swapped or mentioned:
                out[var] = {"flag": flag, "since": reads[first].version}
            elif rejected is not None:
                rejected.append(f"{var} -> {flag} (left envs.py in {after.version}, option "
                                f"since {reads[first].version}, never named together)")
    return out


def build_table(reads: list[Release], made_at: str,
                rejected: list[str] | None = None) -> dict[str, Any]:
    """The format-1 table (vllm_provision/settings/vllm_cli/__init__.py) of ``reads``
    (oldest first); ``rejected`` collects unconfirmed env_to_flag candidates."""
    names = sorted({name for r in reads for name in r.flags})
    flags = {name: spans([r.flags.get(name) for r in reads]) for name in names}
    return {"format": 1, "made_by": "scripts/vllm_serve_flags.py", "made_at": made_at,
            "releases": [r.version for r in reads],
            "allow_abbrev": spans([r.allow_abbrev for r in reads]),
            "flags": flags, "env_to_flag": env_candidates(reads, rejected)}


def dump(table: dict[str, Any]) -> str:
    """Compact, deterministic JSON: one line per option."""
    head = {k: v for k, v in table.items() if k not in {"flags", "env_to_flag"}}
    lines = ["{"]
    for key, value in head.items():
        lines.append(f"{json.dumps(key)}: {json.dumps(value, separators=(',', ':'))},")
    lines.append('"flags": {')
    items = sorted(table["flags"].items())
    for i, (name, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"{json.dumps(name)}: "
                     f"{json.dumps(value, separators=(',', ':'), sort_keys=True)}{comma}")
    lines.append("},")
    lines.append('"env_to_flag": ' + json.dumps(table["env_to_flag"], sort_keys=True,
                                                separators=(",", ":")))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=DEFAULT_CACHE, type=Path)
    parser.add_argument("--out", default=DEFAULT_OUT, type=Path)
    parser.add_argument("--releases", default="",
                        help="comma-separated subset (env_to_flag then compares only these)")
    parser.add_argument("--offline", action="store_true", help="only cached archives")
    args = parser.parse_args(argv)
    if args.offline:
        archives = cached_archives(args.cache)
    else:
        archives = list_archives(index_url())
    if args.releases:
        want = [v.strip() for v in args.releases.split(",") if v.strip()]
        missing = [v for v in want if v not in archives]
        if missing:
            print(f"not on the index (or not cached): {', '.join(missing)}", file=sys.stderr)
            return 2
        archives = {v: archives[v] for v in want}
    reads: list[Release] = []
    for version, (filename, url) in archives.items():
        path = args.cache / filename
        if not path.exists():
            if args.offline:
                continue
            print(f"{version}: downloading {filename}", file=sys.stderr)
            fetch(url, path)
        read = read_release(version, read_sources(path))
        reads.append(read)
        print(f"{version}: {len(read.flags)} options, {len(read.unknown)} of unknown type"
              f"{' (' + ', '.join(read.unknown) + ')' if read.unknown else ''}, "
              f"allow_abbrev={read.allow_abbrev}")
    reads.sort(key=lambda r: parse_version(r.version) or ())
    rejected: list[str] = []
    table = build_table(reads, datetime.datetime.now(datetime.UTC).date().isoformat(),
                        rejected)
    for line in rejected:
        print(f"env_to_flag candidate not confirmed: {line}")
    args.out.write_text(dump(table), encoding="utf-8")
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size} bytes, {len(reads)} releases, "
          f"{len(table['flags'])} option names, env_to_flag: {table['env_to_flag']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
