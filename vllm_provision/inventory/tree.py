"""Parse the group tree of an Ansible YAML inventory: groups, hosts, children and their vars.

Grammar (Ansible's ``yaml`` inventory plugin): the top level maps group names to groups; a group
is null or a mapping with ``hosts`` (host name -> null or vars), ``children`` (group name -> group)
and ``vars``. Top-level groups other than ``all`` are children of ``all``; hosts that belong to no
group but ``all`` are in ``ungrouped``. A group or host named in several places is one group or
host; its vars are merged, the later one winning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_provision.core.models import hosts_under
from vllm_provision.inventory.source import KeyPath, Problems, Setting, YamlDocument
from vllm_provision.settings import variables

GROUP_KEYS = ("hosts", "children", "vars")


@dataclass
class GroupNode:
    """A group as written: direct hosts, child groups and its own inventory-file vars."""

    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Setting] = field(default_factory=dict)
    key: KeyPath = ()
    priority: int = 1


@dataclass
class HostNode:
    """A host as written: its inventory-file host vars and where it was first defined."""

    name: str
    vars: dict[str, Setting] = field(default_factory=dict)
    key: KeyPath = ()


@dataclass
class Tree:
    """Every group and host of the inventory file, in file order."""

    groups: dict[str, GroupNode] = field(default_factory=dict)
    hosts: dict[str, HostNode] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)
    file: str = "inventory"

    def group(self, name: str, key: KeyPath) -> GroupNode:
        """Return the group ``name``, creating it (first defined at ``key``) if new."""
        if name not in self.groups:
            self.groups[name] = GroupNode(name, key=key)
        return self.groups[name]

    def ancestors(self, name: str) -> set[str]:
        """Names of ``name`` and every group above it."""
        found = {name}
        changed = True
        while changed:
            changed = False
            for group in self.groups.values():
                if group.name not in found and any(c in found for c in group.children):
                    found.add(group.name)
                    changed = True
        return found

    def hosts_of(self, name: str) -> list[str]:
        """Every host in group ``name`` or its descendants, in inventory order."""
        return hosts_under(self.groups, self.hosts, name)

    def groups_of(self, host: str) -> list[str]:
        """Every group ``host`` belongs to, sorted as Ansible merges them: by depth (``all`` first,
        parents before children), then by name."""
        names: set[str] = set()
        for group in self.groups.values():
            if host in group.hosts:
                names |= self.ancestors(group.name)
        names.add("all")
        return sorted(names, key=lambda g: (self.depth.get(g, 0), self.priority(g), g))

    def priority(self, name: str) -> int:
        """The group's ``ansible_group_priority`` from the inventory file (default 1): among
        groups of one depth, a higher priority merges later and wins (Ansible's ``sort_groups``;
        group_vars files do not set it)."""
        return self.groups[name].priority


# Ansible's host ranges (inventory "Adding ranges of hosts"): prefix[start:end(:step)]suffix,
# numeric (zero padding kept from start) or single letters.
# The most hosts one range may name: far above any cluster, low enough that a typo
# (gpu[0:99999999]) is refused at once instead of exhausting memory (Ansible has no limit).
MAX_RANGE_HOSTS = 10_000
_RANGE_RE = re.compile(r"^(?P<head>[^\[]*)\[(?P<range>[^\]]*)\](?P<tail>.*)$")


def expand_host_range(name: str) -> list[str]:
    """Expand an Ansible host range: ``gpu[01:03]`` -> gpu01, gpu02, gpu03; ``h[a:c]`` -> ha..hc.

    Several ranges in one name are expanded left to right; a name without ``[`` is returned as
    is. Source: ansible/inventory/helpers ``expand_hostname_range``.

    Raises:
        ValueError: a bracket that is not ``[start:end]`` or ``[start:end:step]``, an empty
            range (end before start), or more than :data:`MAX_RANGE_HOSTS` hosts.
    """
    match = _RANGE_RE.match(name)
    if match is None:
        return [name]
    parts = match["range"].split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"{name!r}: a range is [start:end] or [start:end:step]")
    start, end = parts[0], parts[1]
    step = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else 1
    if len(parts) == 3 and not parts[2].isdigit():
        raise ValueError(f"{name!r}: the step must be a positive integer")
    if start.isdigit() and end.isdigit():
        width = len(start) if start.startswith("0") else 0
        numbers = range(int(start), int(end) + 1, max(step, 1))
        if len(numbers) > MAX_RANGE_HOSTS:
            raise ValueError(f"{name[:80]!r}: the range names {len(numbers)} hosts, more than "
                             f"{MAX_RANGE_HOSTS}")
        values = [str(i).zfill(width) for i in numbers]
    elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
        values = [chr(i) for i in range(ord(start), ord(end) + 1, max(step, 1))]
    else:
        raise ValueError(f"{name!r}: a range is numeric (01:10) or single letters (a:f)")
    if not values:
        raise ValueError(f"{name!r}: the range is empty (end before start)")
    hosts: list[str] = []
    for value in values:
        hosts.extend(expand_host_range(f"{match['head']}{value}{match['tail']}"))
        if len(hosts) > MAX_RANGE_HOSTS:
            raise ValueError(f"{name[:80]!r}: the ranges name more than {MAX_RANGE_HOSTS} "
                             "hosts")
    return hosts


def _mapping_or_none(value: Any, doc: YamlDocument, key: KeyPath, problems: Problems,
                     *, expected: str, fix: str) -> Mapping | None:
    if value is None or isinstance(value, Mapping):
        return value or {}
    problems.add(doc.origin(key).where, f"'{key[-1]}' must be a mapping", expected=expected,
                 actual=f"{type(value).__name__} {value!r}", fix=fix)
    return None


# Names reach unit comments and Description=, env-file comments, file names and log lines, so
# they are held to a charset with no control character, space, quote, '%', '$' or '/'.
# Groups: Ansible's rule for group names ("letters, numbers and underscores", the
# TRANSFORM_INVALID_GROUP_CHARS check) plus '-', which Ansible accepts with a warning.
GROUP_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
# Hosts: RFC 1123 host names and IPv4/IPv6 literals (':'), plus '_' as Ansible allows.
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}$")
_NAME_RULES = {
    "group": (GROUP_NAME_RE, "a group name of letters, digits, '_' and '-' that starts with a "
                             "letter or '_' (Ansible's group-name rule), at most 64 characters"),
    "host": (HOST_NAME_RE, "a host name of letters, digits, '.', '_', '-' and ':' that does not "
                           "start with '.', '-' or ':' (RFC 1123), at most 253 characters"),
}


def check_name(name: Any, what: str) -> str | None:
    """Return what a ``what`` (``"host"`` or ``"group"``) name must look like when ``name``
    breaks the rule (:data:`GROUP_NAME_RE`, :data:`HOST_NAME_RE`), or None when it is fine."""
    pattern, expected = _NAME_RULES[what]
    if isinstance(name, str) and pattern.match(name):
        return None
    return expected


def _valid_name(name: Any, doc: YamlDocument, key: KeyPath, problems: Problems,
                what: str) -> bool:
    checked = name
    if what == "host" and isinstance(name, str) and "[" in name:
        checked = re.sub(r"\[[^\]]*\]", "0", name)  # a range: its parts are checked expanded
    expected = check_name(checked, what)
    if expected is None:
        return True
    shown = repr(name) if not isinstance(name, str) else repr(name[:80])
    problems.add(doc.origin(key).where, f"invalid {what} name", expected=expected,
                 actual=shown, fix=f"rename the {what}")
    return False


def _parse_vars(values: Mapping, doc: YamlDocument, key: KeyPath,
                problems: Problems) -> dict[str, Setting]:
    parsed: dict[str, Setting] = {}
    for name, value in values.items():
        if not isinstance(name, str):
            problems.add(doc.origin((*key, name)).where, "a variable name must be a string",
                         actual=repr(name), fix="rename the variable")
            continue
        parsed[name] = Setting(value, doc.origin((*key, name)))
    return parsed


def _add_host(tree: Tree, group: GroupNode, host_name: str, host_vars: Any, doc: YamlDocument,
              host_key: KeyPath, problems: Problems) -> None:
    host = tree.hosts.setdefault(host_name, HostNode(host_name, key=host_key))
    if host_name not in group.hosts:
        group.hosts.append(host_name)
    values = _mapping_or_none(
        host_vars, doc, host_key, problems,
        expected="a mapping of host variables (or nothing)",
        fix=f"write '{host_name}: {{ansible_host: 10.0.0.11}}' or '{host_name}:'")
    if values:
        host.vars.update(_parse_vars(values, doc, host_key, problems))


def _parse_group(tree: Tree, name: str, entry: Any, doc: YamlDocument, key: KeyPath,
                 problems: Problems) -> None:
    group = tree.group(name, key)
    if entry is None:
        return
    if not isinstance(entry, Mapping):
        problems.add(doc.origin(key).where, f"group {name!r} must be a mapping",
                     expected="a mapping with 'hosts', 'children' and/or 'vars'",
                     actual=f"{type(entry).__name__} {entry!r}",
                     fix=f"write e.g. {name}: {{hosts: {{h1: {{}}}}}}")
        return
    for section, value in entry.items():
        section_key = (*key, section)
        if section == "vars":
            values = _mapping_or_none(value, doc, section_key, problems,
                                      expected="a mapping of variable names to values",
                                      fix="write 'vars:' followed by 'name: value' lines")
            if values is not None:
                group.vars.update(_parse_vars(values, doc, section_key, problems))
        elif section == "hosts":
            hosts = _mapping_or_none(
                value, doc, section_key, problems,
                expected="a mapping of host names to their vars (or nothing)",
                fix="write hosts as a mapping: 'hosts: {h1: {}, h2: {}}' (not a list)")
            for pattern, host_vars in (hosts or {}).items():
                host_key = (*section_key, pattern)
                if not _valid_name(pattern, doc, host_key, problems, "host"):
                    continue
                try:
                    names = expand_host_range(pattern)
                except ValueError as exc:
                    problems.add(doc.origin(host_key).where, f"invalid host range: {exc}",
                                 expected="a range such as gpu[01:04] or node-[a:d]",
                                 actual=repr(pattern), fix="correct the range in brackets")
                    continue
                bad = [n for n in names if check_name(n, "host") is not None]
                if bad:
                    problems.add(doc.origin(host_key).where, "invalid host name",
                                 expected=_NAME_RULES["host"][1], actual=repr(bad[0][:80]),
                                 fix="rename the host")
                    continue
                for host_name in names:
                    _add_host(tree, group, host_name, host_vars, doc, host_key, problems)
        elif section == "children":
            children = _mapping_or_none(
                value, doc, section_key, problems,
                expected="a mapping of child group names to groups (or nothing)",
                fix="write children as a mapping: 'children: {web: {hosts: {...}}}'")
            for child, child_entry in (children or {}).items():
                child_key = (*section_key, child)
                if not _valid_name(child, doc, child_key, problems, "group"):
                    continue
                if child not in group.children:
                    group.children.append(child)
                _parse_group(tree, child, child_entry, doc, child_key, problems)
        else:
            guess = variables.suggest(str(section), GROUP_KEYS)
            hint = f"; did you mean {guess!r}?" if guess else ""
            problems.add(doc.origin(section_key).where,
                         f"unknown key {section!r} in group {name!r}{hint}",
                         expected="only 'hosts', 'children' and 'vars'", actual=repr(section),
                         fix=f"rename it to '{guess}'" if guess else
                         "put hosts under 'hosts:', groups under 'children:' and variables "
                         "under 'vars:'")


def _find_cycle(tree: Tree) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for child in tree.groups[name].children:
            if state.get(child) == 1:
                return [*stack[stack.index(child):], child]
            if state.get(child) is None and child in tree.groups:
                found = visit(child)
                if found:
                    return found
        stack.pop()
        state[name] = 2
        return None

    for name in tree.groups:
        if state.get(name) is None:
            found = visit(name)
            if found:
                return found
    return None


def _compute_depth(tree: Tree) -> None:
    """Depth as Ansible's: the longest path from ``all`` (``all`` = 0)."""
    depth = {"all": 0}
    changed = True
    while changed:
        changed = False
        for group in tree.groups.values():
            if group.name not in depth:
                continue
            for child in group.children:
                if depth.get(child, -1) < depth[group.name] + 1:
                    depth[child] = depth[group.name] + 1
                    changed = True
    tree.depth = depth


def add_yaml(tree: Tree, doc: YamlDocument, problems: Problems) -> None:
    """Add the groups and hosts of one YAML inventory document to ``tree`` (several sources of an
    inventory directory add to one tree, in file order; see :func:`finish_tree`)."""
    tree.group("all", ("all",))
    for name, entry in doc.data.items():
        if not _valid_name(name, doc, (name,), problems, "group"):
            continue
        _parse_group(tree, name, entry, doc, (name,), problems)
        # a top-level group other than all becomes a child of all only if it has no other
        # parent (finish_tree), as Ansible's reconcile_inventory does


def parse_tree(doc: YamlDocument, problems: Problems) -> Tree | None:
    """Parse the inventory file's group tree.

    Records problems for: group/hosts/children/vars of the wrong shape, unknown group keys (with
    a "did you mean"), invalid names, and group cycles (``a -> b -> a``).

    Returns:
        the tree with ``all`` and ``ungrouped`` present and depths computed, or None if a cycle
        makes it unusable.
    """
    tree = Tree(file=str(doc.path))
    add_yaml(tree, doc, problems)
    return finish_tree(tree, problems, lambda key: doc.origin(key).where)


def finish_tree(tree: Tree, problems: Problems,
                where: Callable[[KeyPath], str]) -> Tree | None:
    """Complete a tree read from one or more sources as Ansible's ``reconcile_inventory`` does:
    every group without a parent becomes a child of ``all``, and hosts in no group but ``all``
    go to ``ungrouped``; then depths are computed.

    Args:
        tree: the tree, with ``all`` present.
        problems: where a cycle of groups is recorded.
        where: renders a group's key path (:attr:`GroupNode.key`) as a place for messages.

    Returns:
        the tree, or None if a cycle makes it unusable.
    """
    tree.group("all", ("all",))
    for group in tree.groups.values():
        setting = group.vars.pop("ansible_group_priority", None)
        if setting is None:
            continue
        try:
            group.priority = int(setting.value)
        except (TypeError, ValueError):
            problems.add(setting.origin.where, "ansible_group_priority must be an integer",
                         actual=repr(setting.value)[:80], fix="write e.g. "
                         "ansible_group_priority: 10 (a higher priority wins among groups of "
                         "one depth)")
    cycle = _find_cycle(tree)
    if cycle:
        first = tree.groups[cycle[0]]
        problems.add(where(first.key),
                     "groups contain each other: " + " -> ".join(cycle),
                     expected="a tree of groups without cycles", actual=" -> ".join(cycle),
                     fix=f"remove {cycle[-1]!r} from the children of {cycle[-2]!r}")
        return None
    parented = {child for group in tree.groups.values() for child in group.children}
    for name in tree.groups:
        if name != "all" and name not in parented:
            tree.groups["all"].children.append(name)
    ungrouped = tree.group("ungrouped", ("all", "children", "ungrouped"))
    if "ungrouped" not in tree.groups["all"].children:
        tree.groups["all"].children.append("ungrouped")
    grouped = {h for g in tree.groups.values() if g.name not in ("all", "ungrouped")
               for h in g.hosts}
    ungrouped.hosts[:] = [h for h in ungrouped.hosts if h not in grouped]
    for host in tree.hosts:
        if host not in grouped and host not in ungrouped.hosts:
            ungrouped.hosts.append(host)
    _compute_depth(tree)
    return tree
