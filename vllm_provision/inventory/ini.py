"""Read an INI inventory into the group tree, with the rules of Ansible's ``ini`` inventory plugin.

Grammar (ansible-core ``plugins/inventory/ini.py``):

- ``[group]`` starts a hosts section, ``[group:vars]`` a section of ``key=value`` lines,
  ``[group:children]`` a section of child group names; lines before any section are hosts of
  ``ungrouped``. A section name has no space, ``:`` or ``]``.
- A host line is split into words as a POSIX shell would (``shlex``, ``#`` starting a comment):
  the first word is a host name or range (``gpu[01:16]``, ``node-[a:c]``, ``h[0:10:2]``) with an
  optional ``:port``; every other word is ``key=value``.
- Values, in host lines and in ``:vars`` sections alike, are read with :func:`ast.literal_eval`
  when they are a Python literal (``8000`` -> 8000, ``True`` -> True, ``[1, 2]`` -> a list,
  ``'a b'`` -> a string) and are strings otherwise. ``literal_eval`` evaluates no code: it only
  builds literals. A complex number or ``...`` stays text, as in Ansible.
- Lines starting with ``#`` or ``;`` are comments. A ``[g:vars]`` section for a group that is
  never declared, or a ``[g:children]`` entry naming a group never declared, is an error.

The values still go through the loader's per-variable validation (:mod:`~.values`).
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from vllm_provision.inventory.source import Origin, Problems, Setting
from vllm_provision.inventory.tree import Tree, add_host_entry, check_name

SECTION_RE = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_LINE_RE = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
_COMMENT = ("#", ";")
# A longer value is kept as text: literal_eval of a huge nested literal costs memory and stack.
_LITERAL_MAX_CHARS = 10_000


def looks_like_ini(text: str) -> bool:
    """True when the first line that is not blank or a comment is an INI section header
    (``[group]``, ``[group:vars]``): no YAML inventory starts that way (a YAML document starting
    with ``[`` is a list, which is not an inventory)."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(_COMMENT):
            continue
        return SECTION_RE.match(stripped) is not None
    return False


def parse_value(text: str) -> Any:
    """Return an INI value as Ansible types it: a Python literal becomes its value (int, float,
    bool, None, str, list, dict; tuples and sets become lists), anything else stays the string.

    Source: ansible-core ``InventoryModule._parse_value`` (``ast.literal_eval``, SyntaxError and
    ValueError meaning "a string").
    """
    if len(text) > _LITERAL_MAX_CHARS:
        return text
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {_plain(k) if not isinstance(k, str) else k: _plain(v) for k, v in value.items()}
    if value is Ellipsis:
        return "..."
    return str(value)  # a complex number


def _split_port(pattern: str) -> tuple[str, int | None]:
    """``host:2222`` -> (host, 2222); ``[::1]:22`` -> (::1, 22); an IPv6 address or a range
    (``gpu[01:04]``) keeps its colons. Source: ansible ``parse_address``."""
    bracketed = re.match(r"^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$", pattern)
    if bracketed and ":" in bracketed[1]:
        return bracketed[1], int(bracketed[2]) if bracketed[2] else None
    outside = re.sub(r"\[[^\]]*\]", "", pattern)
    if outside.count(":") == 1:
        head, _, port = pattern.rpartition(":")
        if port.isdigit():
            return head, int(port)
    return pattern, None


class _Parser:
    def __init__(self, tree: Tree, path: Path, problems: Problems) -> None:
        self.tree, self.path, self.problems = tree, path, problems
        self.line = 0
        # group -> (line, state, parents) of sections/children naming a group not yet declared
        self.pending: dict[str, tuple[int, str, list[str]]] = {}
        # groups of earlier files of an inventory directory are declared already
        self.declared: set[str] = {"all", "ungrouped", *tree.groups}

    def where(self, key: str = "") -> str:
        return f"{self.path}:{self.line}" + (f": {key}" if key else "")

    def origin(self, name: str) -> Origin:
        return Origin(self.path, (name,), self.line)

    def error(self, message: str, *, expected: str = "", actual: str = "", fix: str) -> None:
        self.problems.add(self.where(), message, expected=expected, actual=actual, fix=fix)

    def valid_group(self, name: str) -> bool:
        expected = check_name(name, "group")
        if expected is None:
            return True
        self.error("invalid group name", expected=expected, actual=repr(name[:80]),
                   fix="rename the group")
        return False

    def declare(self, name: str, state: str) -> None:
        """A ``[name]``/``[name:children]`` section declares the group (and settles pending
        children entries naming it); a ``[name:vars]`` section alone does not."""
        self.tree.group(name, (f"[{name}]",))
        if state == "vars":
            if name not in self.declared and name not in self.pending:
                self.pending[name] = (self.line, "vars", [])
            return
        self.declared.add(name)
        pending = self.pending.pop(name, None)
        if pending is not None:
            for parent in pending[2]:
                self.add_child(parent, name)

    def add_child(self, parent: str, child: str) -> None:
        self.tree.groups[parent].add_child(child)

    def host_line(self, group: str, line: str) -> None:
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            self.error(f"the host line cannot be split into words: {exc}", actual=line[:80],
                       fix="close the quote (values with spaces are written key='a b')")
            return
        if not words:
            return
        pattern, port = _split_port(words[0])
        if pattern.strip() == "---":
            self.error("'---' is not a host; is this a YAML file?",
                       fix="give YAML inventories a top-level 'all:' mapping")
            return
        if words[0].endswith(":") and port is None:
            self.error("a host pattern may not end in ':' (it is reserved for a port)",
                       actual=repr(words[0][:80]), fix="write host:PORT or just host")
            return
        target = self.tree.groups[group] if group != "ungrouped" else None
        nodes = add_host_entry(self.tree, target, pattern, self.where(f"[{group}] {pattern[:80]}"),
                               (f"line {self.line}",), self.problems)
        if not nodes:
            return
        values: dict[str, Setting] = {}
        if port is not None:
            values["ansible_port"] = Setting(port, self.origin("ansible_port"))
        for word in words[1:]:
            key, equals, raw = word.partition("=")
            if not equals or not key:
                self.error("expected key=value after the host name", actual=repr(word[:80]),
                           fix="write host variables as name=value (quote a value with spaces)")
                return
            values[key] = Setting(parse_value(raw), self.origin(key))
        for node in nodes:
            node.vars.update(values)

    def vars_line(self, group: str, line: str) -> None:
        key, equals, raw = line.partition("=")
        key = key.strip()
        if not equals or not key:
            self.error(f"expected key=value in [{group}:vars]", actual=repr(line[:80]),
                       fix="write one name=value per line")
            return
        self.tree.groups[group].vars[key] = Setting(parse_value(raw.strip()), self.origin(key))

    def children_line(self, group: str, line: str) -> None:
        match = _GROUP_LINE_RE.match(line)
        if match is None:
            self.error(f"expected a group name in [{group}:children]", actual=repr(line[:80]),
                       fix="write one child group name per line")
            return
        child = match[1]
        if not self.valid_group(child):
            return
        if child in self.declared:
            self.add_child(group, child)
        else:
            self.tree.group(child, (f"[{child}]",))
            self.add_child(group, child)  # kept only if the child is declared by the end
            line_, state, parents = self.pending.get(child, (self.line, "children", []))
            self.pending[child] = (line_, "children", [*parents, group])

    def run(self, text: str) -> None:
        group, state = "ungrouped", "hosts"
        self.tree.group("all", ("all",))
        self.tree.group("ungrouped", ("[ungrouped]",))
        for self.line, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith(_COMMENT):
                continue
            section = SECTION_RE.match(line)
            if section:
                name, state = section[1], section[2] or "hosts"
                if state not in ("hosts", "children", "vars"):
                    self.error(f"section [{name}:{state}] has an unknown type {state!r}",
                               expected="[group], [group:vars] or [group:children]",
                               actual=repr(line[:80]), fix="use one of those three forms")
                    group = ""
                    continue
                if not self.valid_group(name):
                    group = ""
                    continue
                group = name
                self.declare(name, state)
                continue
            if line.startswith("[") and line.endswith("]"):
                self.error("invalid section header", expected="[group], [group:vars] or "
                           "[group:children], without spaces", actual=repr(line[:80]),
                           fix="remove spaces and other characters from the section name")
                group = ""
                continue
            if not group:
                continue  # the lines of a refused section (already reported)
            {"hosts": self.host_line, "vars": self.vars_line,
             "children": self.children_line}[state](group, line)
        for name, (line_no, state, parents) in self.pending.items():
            self.line = line_no
            if state == "vars":
                self.error(f"section [{name}:vars] is for group {name!r}, which is never "
                           "declared", fix=f"add a [{name}] or [{name}:children] section, or "
                           "remove the vars section")
            else:
                self.error(f"section [{parents[-1]}:children] includes group {name!r}, which "
                           "is never declared", fix=f"add a [{name}] section with its hosts")


def add_ini(tree: Tree, path: Path, text: str, problems: Problems) -> None:
    """Add the groups, hosts and vars of the INI inventory ``text`` (read from ``path``) to
    ``tree``; finish the tree with :func:`~.tree.finish_tree`.

    Records a problem, with file and line, for: an unknown section type, a section header with
    spaces, a host line with unbalanced quotes or a word that is not ``key=value``, an invalid
    host range or name, a ``:vars`` line without ``=``, and a group named in ``:vars`` or
    ``:children`` that is never declared.
    """
    _Parser(tree, path, problems).run(text)
