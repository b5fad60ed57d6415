"""Parse the group tree of an Ansible YAML inventory: groups, hosts, children and their vars.

Grammar (Ansible's ``yaml`` inventory plugin): the top level maps group names to groups; a group
is null or a mapping with ``hosts`` (host name -> null or vars), ``children`` (group name -> group)
and ``vars``. Top-level groups other than ``all`` are children of ``all``; hosts that belong to no
group but ``all`` are in ``ungrouped``. A group or host named in several places is one group or
host; its vars are merged, the later one winning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_provision.core.models import hosts_under
from vllm_provision.inventory.ranges import HostRangeError, iter_host_range, parse_host_pattern
from vllm_provision.inventory.source import KeyPath, Problems, Setting, YamlDocument
from vllm_provision.settings import variables

GROUP_KEYS = ("hosts", "children", "vars")
# Each key of a YAML group holds a mapping (or nothing): what a wrong value is told,
# (expected, fix), in one table for the one check of the three.
_SECTION_SHAPES = {
    "hosts": ("a mapping of host names to their vars (or nothing)",
              "write hosts as a mapping: 'hosts: {h1: {}, h2: {}}' (not a list)"),
    "children": ("a mapping of child group names to groups (or nothing)",
                 "write children as a mapping: 'children: {web: {hosts: {...}}}'"),
    "vars": ("a mapping of variable names to values",
             "write 'vars:' followed by 'name: value' lines"),
}

MAX_HOSTS = 10_000
"""The most hosts one inventory may define (every source of an inventory folder together): the
per-entry range cap (:data:`~.ranges.MAX_RANGE_HOSTS`), far above any vLLM fleet one controller
drives. Checked host by host as entries are expanded, so a larger inventory costs no more than
this many hosts before it is refused."""
MAX_GROUPS = 10_000
"""The most groups one inventory may define: as many as hosts."""
MAX_MEMBERSHIPS = 1_000_000
"""The most group memberships of all hosts together, each group above a host's own groups
counted (a host in ``gpu`` under ``dc1`` under ``all`` has three): every one is a variable merge
when the inventory loads (10,000 hosts in 100 groups each)."""
MAX_EXPANDED = 10 * MAX_HOSTS
"""The most host names all the range entries of an inventory may name together, repeats
included (one host may be in several groups): without it, many groups each listing the same
``gpu[1:10000]`` would cost their product while adding no host."""


@dataclass
class GroupNode:
    """A group as written: direct hosts, child groups and its own inventory-file vars.

    Add hosts and children with :meth:`add_host` and :meth:`add_child`, which keep a set beside
    each list, so that building a group of N hosts costs N steps, not N**2.
    """

    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Setting] = field(default_factory=dict)
    key: KeyPath = ()
    priority: int = 1
    _host_set: set[str] = field(default_factory=set, repr=False, compare=False)
    _child_set: set[str] = field(default_factory=set, repr=False, compare=False)

    def add_host(self, name: str) -> None:
        """Append host ``name`` to :attr:`hosts` unless it is there already."""
        if len(self._host_set) != len(self.hosts):
            self._host_set = set(self.hosts)  # the list was changed directly
        if name not in self._host_set:
            self._host_set.add(name)
            self.hosts.append(name)

    def add_child(self, name: str) -> None:
        """Append group ``name`` to :attr:`children` unless it is there already."""
        if len(self._child_set) != len(self.children):
            self._child_set = set(self.children)
        if name not in self._child_set:
            self._child_set.add(name)
            self.children.append(name)


@dataclass
class HostNode:
    """A host as written: its inventory-file host vars and where it was first defined."""

    name: str
    vars: dict[str, Setting] = field(default_factory=dict)
    key: KeyPath = ()


@dataclass
class Tree:
    """Every group and host of the inventory file, in file order.

    Attributes:
        expanded: host names named by range entries so far (:data:`MAX_EXPANDED`).
        full: a host was refused because the tree already held :data:`MAX_HOSTS` hosts (the
            problem is recorded once; later entries are skipped unread).
    """

    groups: dict[str, GroupNode] = field(default_factory=dict)
    hosts: dict[str, HostNode] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)
    file: str = "inventory"
    expanded: int = 0
    full: bool = False
    # Built at the first query (ancestors, groups_of) of a finished tree; finish_tree drops them.
    _parents: dict[str, list[str]] | None = field(default=None, repr=False)
    _member_of: dict[str, list[str]] | None = field(default=None, repr=False)
    _ancestors: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)
    _groups_of: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _rank: dict[str, int] | None = field(default=None, repr=False)

    def group(self, name: str, key: KeyPath) -> GroupNode:
        """Return the group ``name``, creating it (first defined at ``key``) if new."""
        if name not in self.groups:
            self.groups[name] = GroupNode(name, key=key)
        return self.groups[name]

    def host(self, name: str, key: KeyPath, problems: Problems, where: str) -> HostNode | None:
        """Return the host ``name``, creating it (first defined at ``key``) if new.

        Returns None, and records one problem at ``where`` (the first time only), when ``name``
        is new and the tree already holds :data:`MAX_HOSTS` hosts.
        """
        node = self.hosts.get(name)
        if node is not None:
            return node
        if len(self.hosts) >= MAX_HOSTS:
            if not self.full:
                problems.add(where, f"the inventory defines more than {MAX_HOSTS} hosts (host "
                             f"{name[:80]!r} would be number {MAX_HOSTS + 1})",
                             expected=f"at most {MAX_HOSTS} hosts in one inventory, every file "
                                      "of an inventory folder together",
                             actual=f"host {name[:80]!r}",
                             fix="split the fleet into several inventories (one per cluster or "
                                 "rack), or correct the range")
            self.full = True
            return None
        node = self.hosts[name] = HostNode(name, key=key)
        return node

    def reserve(self, count: int, problems: Problems, where: str, pattern: str) -> bool:
        """Count ``count`` host names about to be expanded from the range entry ``pattern``;
        False, with a problem at ``where``, when all the range entries of the inventory would
        name more than :data:`MAX_EXPANDED` host names together."""
        if self.expanded + count > MAX_EXPANDED:
            if not self.full:
                problems.add(where, f"the range entries of the inventory name more than "
                             f"{MAX_EXPANDED} host names together (repeats included)",
                             expected=f"at most {MAX_EXPANDED} host names named by ranges",
                             actual=repr(pattern[:80]),
                             fix="name each range of hosts once and list it in one group; add "
                                 "that group to other groups with 'children:'")
            self.full = True
            return False
        self.expanded += count
        return True

    def _index(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        if self._parents is None or self._member_of is None:
            parents: dict[str, list[str]] = {}
            member_of: dict[str, list[str]] = {}
            for group in self.groups.values():
                for child in group.children:
                    parents.setdefault(child, []).append(group.name)
                for host in group.hosts:
                    member_of.setdefault(host, []).append(group.name)
            self._parents, self._member_of = parents, member_of
            self._ancestors, self._groups_of, self._rank = {}, {}, None
        return self._parents, self._member_of

    def forget_index(self) -> None:
        """Drop the indexes of :meth:`ancestors` and :meth:`groups_of` (the tree changed)."""
        self._parents = self._member_of = None
        self._ancestors, self._groups_of, self._rank = {}, {}, None

    def ancestors(self, name: str) -> set[str]:
        """Names of ``name`` and every group above it (walked once per group, then cached)."""
        parents, _ = self._index()
        found = self._ancestors.get(name)
        if found is None:
            seen = {name}
            stack = [name]
            while stack:
                for parent in parents.get(stack.pop(), ()):
                    if parent not in seen:
                        seen.add(parent)
                        stack.append(parent)
            found = self._ancestors[name] = frozenset(seen)
        return set(found)

    def hosts_of(self, name: str) -> list[str]:
        """Every host in group ``name`` or its descendants, in inventory order."""
        return hosts_under(self.groups, self.hosts, name)

    def groups_of(self, host: str) -> list[str]:
        """Every group ``host`` belongs to, sorted as Ansible merges them: by depth (``all`` first,
        parents before children), then by priority, then by name (cached per host)."""
        _, member_of = self._index()
        found = self._groups_of.get(host)
        if found is None:
            if self._rank is None:
                order = sorted(self.groups, key=lambda g: (self.depth.get(g, 0),
                                                           self.priority(g), g))
                self._rank = {name: index for index, name in enumerate(order)}
            names: set[str] = {"all"}
            for group in member_of.get(host, ()):
                names |= self.ancestors(group)
            found = self._groups_of[host] = sorted(names, key=self._rank.__getitem__)
        return list(found)

    def memberships_over(self, limit: int) -> bool:
        """True when the hosts' group memberships, each group above a host's groups counted
        (``sum(len(groups_of(h)))``), pass ``limit``; stops counting as soon as they do, so the
        answer costs at most about ``limit`` steps."""
        total = 0
        for host in self.hosts:
            total += len(self.groups_of(host))
            if total > limit:
                return True
        return False

    def priority(self, name: str) -> int:
        """The group's ``ansible_group_priority`` from the inventory file (default 1): among
        groups of one depth, a higher priority merges later and wins (Ansible's ``sort_groups``;
        group_vars files do not set it)."""
        return self.groups[name].priority


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


def add_host_entry(tree: Tree, group: GroupNode | None, pattern: str, where: str,
                   key: KeyPath, problems: Problems) -> list[HostNode]:
    """Add the hosts of one host entry (a name or a range such as ``gpu[01:16]``) to ``tree``.

    The entry is counted before it is expanded (:func:`~.ranges.parse_host_pattern`), then its
    hosts are added one by one, so the caps hold without building a list first: at most
    :data:`~.ranges.MAX_RANGE_HOSTS` names per entry, :data:`MAX_EXPANDED` named by range
    entries in all, :data:`MAX_HOSTS` hosts in the tree.

    Args:
        tree: the tree being read; once :attr:`Tree.full`, entries are skipped.
        group: the group the hosts join (None: none, as for INI hosts before any section).
        pattern: the entry as written.
        where: the entry's place (file, line, key path) for problems.
        key: the key path recorded as a new host's first definition.
        problems: where a bad range, an invalid expanded name or an exceeded cap is recorded.

    Returns:
        the host nodes of the entry that were added (empty when it was refused).
    """
    if tree.full:
        return []
    try:
        _, count = parse_host_pattern(pattern)
    except HostRangeError as exc:
        problems.add(where, f"invalid host range: {exc}",
                     expected="a range such as gpu[01:04] or node-[a:d]",
                     actual=repr(pattern[:80]), fix=exc.fix)
        return []
    if "[" in pattern and not tree.reserve(count, problems, where, pattern):
        return []
    names = list(iter_host_range(pattern))
    bad = next((n for n in names if check_name(n, "host") is not None), None)
    if bad is not None:
        problems.add(where, "invalid host name", expected=_NAME_RULES["host"][1],
                     actual=repr(bad[:80]), fix="rename the host")
        return []
    nodes: list[HostNode] = []
    for name in names:
        node = tree.host(name, key, problems, where)
        if node is None:
            break
        if group is not None:
            group.add_host(name)
        nodes.append(node)
    return nodes


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
        if section not in _SECTION_SHAPES:
            guess = variables.suggest(str(section), GROUP_KEYS)
            hint = f"; did you mean {guess!r}?" if guess else ""
            problems.add(doc.origin(section_key).where,
                         f"unknown key {section!r} in group {name!r}{hint}",
                         expected="only 'hosts', 'children' and 'vars'", actual=repr(section),
                         fix=f"rename it to '{guess}'" if guess else
                         "put hosts under 'hosts:', groups under 'children:' and variables "
                         "under 'vars:'")
            continue
        expected, fix = _SECTION_SHAPES[section]
        mapping = _mapping_or_none(value, doc, section_key, problems, expected=expected, fix=fix)
        if mapping is None:
            continue
        if section == "vars":
            group.vars.update(_parse_vars(mapping, doc, section_key, problems))
        elif section == "hosts":
            for pattern, host_vars in mapping.items():
                host_key = (*section_key, pattern)
                if not _valid_name(pattern, doc, host_key, problems, "host"):
                    continue
                nodes = add_host_entry(tree, group, pattern, doc.origin(host_key).where,
                                       host_key, problems)
                if not nodes:
                    continue
                values = _mapping_or_none(
                    host_vars, doc, host_key, problems,
                    expected="a mapping of host variables (or nothing)",
                    fix=f"write '{pattern}: {{ansible_host: 10.0.0.11}}' or '{pattern}:'")
                if values:
                    parsed = _parse_vars(values, doc, host_key, problems)
                    for node in nodes:
                        node.vars.update(parsed)
        else:  # children
            for child, child_entry in mapping.items():
                child_key = (*section_key, child)
                if not _valid_name(child, doc, child_key, problems, "group"):
                    continue
                group.add_child(child)
                _parse_group(tree, child, child_entry, doc, child_key, problems)


def _find_cycle(tree: Tree) -> list[str] | None:
    """The first cycle of groups (``[a, b, a]``), by a depth-first walk without recursion (a
    chain of thousands of INI ``:children`` sections must not exhaust Python's stack)."""
    state: dict[str, int] = {}
    for root in tree.groups:
        if root in state:
            continue
        state[root] = 1
        path = [root]
        pending = [iter(tree.groups[root].children)]
        while pending:
            child = next(pending[-1], None)
            if child is None:
                pending.pop()
                state[path.pop()] = 2
            elif state.get(child) == 1:
                return [*path[path.index(child):], child]
            elif child not in state and child in tree.groups:
                state[child] = 1
                path.append(child)
                pending.append(iter(tree.groups[child].children))
    return None


def groups_under(groups: Mapping[str, Any], names: Iterable[str]) -> set[str]:
    """The groups ``names`` and all their descendants, in one walk (each group once, cycles
    included: time linear in groups and children).

    Args:
        groups: group name -> a group with ``children`` (names); the loaded
            :class:`~vllm_provision.core.models.Group` or the loader's :class:`GroupNode`.
        names: the groups to start from; a name that is no group is passed over, as is a child
            that is none.
    """
    found: set[str] = set()
    frontier = [name for name in names if name in groups]
    while frontier:
        name = frontier.pop()
        if name not in found:
            found.add(name)
            frontier.extend(child for child in groups[name].children if child in groups)
    return found


def _compute_depth(tree: Tree) -> None:
    """Depth as Ansible's: the longest path from ``all`` (``all`` = 0). The groups form a tree
    without cycles (checked first), so one pass in topological order (Kahn) settles each group
    once: time linear in groups and children."""
    reachable = groups_under(tree.groups, ["all"])
    waiting = dict.fromkeys(reachable, 0)
    for name in reachable:
        for child in tree.groups[name].children:
            if child in waiting:
                waiting[child] += 1
    depth = {"all": 0}
    ready = [name for name, count in waiting.items() if count == 0]
    while ready:
        name = ready.pop()
        for child in tree.groups[name].children:
            if child not in waiting:
                continue
            depth[child] = max(depth.get(child, 0), depth.get(name, 0) + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
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
    if len(tree.groups) > MAX_GROUPS:
        extra = list(tree.groups.values())[MAX_GROUPS]
        problems.add(where(extra.key), f"the inventory defines more than {MAX_GROUPS} groups "
                     f"(group {extra.name!r} would be number {MAX_GROUPS + 1})",
                     expected=f"at most {MAX_GROUPS} groups in one inventory",
                     actual=f"{len(tree.groups)} groups",
                     fix="split the fleet into several inventories, or merge groups")
        return None
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
            tree.groups["all"].add_child(name)
    ungrouped = tree.group("ungrouped", ("all", "children", "ungrouped"))
    tree.groups["all"].add_child("ungrouped")
    grouped = {h for g in tree.groups.values() if g.name not in ("all", "ungrouped")
               for h in g.hosts}
    ungrouped.hosts[:] = [h for h in ungrouped.hosts if h not in grouped]
    for host in tree.hosts:
        if host not in grouped:
            ungrouped.add_host(host)
    _compute_depth(tree)
    tree.forget_index()
    if tree.memberships_over(MAX_MEMBERSHIPS):
        problems.add(where(("all",)), f"the hosts' group memberships pass {MAX_MEMBERSHIPS} "
                     "(each group above a host's groups counted)",
                     expected=f"at most {MAX_MEMBERSHIPS} host-in-group memberships, e.g. "
                              f"{MAX_HOSTS} hosts in 100 groups each",
                     fix="put fewer groups above the hosts' groups (a group of groups needs no "
                         "copies), or split the inventory")
        return None
    return tree
