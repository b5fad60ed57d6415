"""Resolve Ansible host patterns (``--limit``, a play's ``hosts:``) against an inventory."""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from vllm_provision.core.errors import InventoryError
from vllm_provision.core.models import Host, Inventory
from vllm_provision.inventory.tree import groups_under
from vllm_provision.settings import variables

try:  # the parser behind re.compile (Python 3.11+); sre_parse before
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover - older Pythons are not supported (pyproject)
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_WILDCARD_CHARS = set("*?[")
MAX_PATTERN_CHARS = 4096
"""The longest host pattern (``--limit``, ``hosts:``) accepted."""
MAX_REGEX_CHARS = 200
"""The longest ``~regex`` term accepted."""
MAX_REGEX_CHOICES = 65_536
"""The most ways a ``~regex`` term's repeats may split one name (see :func:`check_regex`)."""
MAX_REGEX_REPEATS = 8
"""The most repeats (``?``, ``*``, ``+``, ``{m,n}``) in one ``~regex`` term."""
_NAME_CHARS = 253  # the longest host name (RFC 1123; tree.HOST_NAME_RE)
_REPEATS = {_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", None)}
_REGEX_RULES = ("a Python regular expression of at most 200 characters, without back-references "
                "or conditionals, without a repeated group that holds another repeat or an "
                "alternation ('(a+)+', '(a|ab)*'), and with at most 8 repeats, two of them "
                "unbounded ('*', '+', '{n,}')")


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of one parsed regex item (``re._parser`` shapes)."""
    if op in _REPEATS:
        return [av[2]]
    if op is _sre.SUBPATTERN:
        return [av[3]]
    if op is _sre.BRANCH:
        return list(av[1])
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [av[1]]
    if op is getattr(_sre, "ATOMIC_GROUP", None):
        return [av]
    return []


def _varies(items: Any) -> bool:
    """True when ``items`` holds an alternation or a repeat of varying count, at any depth:
    a repeated group around it could match one text in many ways."""
    for op, av in items:
        if op is _sre.BRANCH or op in _REPEATS and av[0] != av[1]:
            return True
        if any(_varies(child) for child in _children(op, av)):
            return True
    return False


def _count_repeats(items: Any) -> int:
    count = 0
    for op, av in items:
        count += op in _REPEATS
        count += sum(_count_repeats(child) for child in _children(op, av))
    return count


def _regex_problem(items: Any) -> tuple[str, int]:
    """``(what is refused or "", choices)`` for a parsed expression: choices multiply along a
    sequence and add up over the branches of an alternation."""
    choices = 1
    for op, av in items:
        if op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            return "a back-reference or conditional ('\\1', '(?P=name)', '(?(1)a|b)')", 0
        if op in _REPEATS:
            low, high, body = av
            if high > 1 and _varies(body):
                return ("a repeated group that holds another repeat or an alternation (nested "
                        "quantifiers such as '(a+)+' or '(a|ab)*' backtrack exponentially)", 0)
            high = min(high, _NAME_CHARS)
            choices *= max(high - min(low, high), 0) + 1
        inner = [_regex_problem(child) for child in _children(op, av)]
        for found, _ in inner:
            if found:
                return found, 0
        if op is _sre.BRANCH:
            choices *= sum(count for _, count in inner)
        else:
            for _, count in inner:
                choices *= count
    return "", choices


def check_regex(expression: str) -> str | None:
    """Why the ``~regex`` term ``expression`` (without its ``~``) is refused, or None.

    Python's ``re`` backtracks and has no time limit, so an expression with nested quantifiers
    (``(a+)+$``) takes time exponential in the name's length, and many repeats in a row
    (``.*.*.*.*x``) a high power of it. Refused, before anything is matched:

    - more than :data:`MAX_REGEX_CHARS` characters;
    - a back-reference or conditional (``\1``, ``(?P=name)``, ``(?(1)a|b)``);
    - a group repeated more than once (``*``, ``+``, ``{m,n}`` with n > 1) that holds another
      repeat or an alternation;
    - more than :data:`MAX_REGEX_REPEATS` repeats, or repeats whose choices multiply past
      :data:`MAX_REGEX_CHOICES`: each repeat offers ``max - min + 1`` counts, an unbounded one
      (``*``, ``+``, ``{n,}``) as many as a host name has characters (253), so two unbounded
      repeats, or one with several ``?``, pass.

    What remains backtracks at most ~65,536 ways per name: under a millisecond on a
    253-character name that does not match (``bench/inventory_bounds.py`` measures it).

    Raises:
        re.error: ``expression`` is not a regular expression at all.
    """
    if len(expression) > MAX_REGEX_CHARS:
        return f"the expression has {len(expression)} characters, more than {MAX_REGEX_CHARS}"
    parsed = _sre_parse.parse(expression)
    found, choices = _regex_problem(list(parsed))
    if found:
        return found
    repeats = _count_repeats(list(parsed))
    if repeats > MAX_REGEX_REPEATS:
        return (f"{repeats} repeats ('?', '*', '+', '{{m,n}}'), more than {MAX_REGEX_REPEATS}: "
                "each is a choice the matcher may take back")
    if choices > MAX_REGEX_CHOICES:
        return ("too many repeats in a row: their choices multiply to more than "
                f"{MAX_REGEX_CHOICES} (at most two unbounded repeats '*', '+', '{{n,}}', fewer "
                "with '?' or '{m,n}' besides), which would backtrack for long on a long name")
    return None


def _compile_regex(term: str, pattern: str) -> re.Pattern[str]:
    try:
        refused = check_regex(term[1:])
        regex = re.compile(term[1:])
    except (re.error, RecursionError, OverflowError) as exc:
        raise InventoryError.single(
            f"host pattern {pattern[:200]!r}", f"invalid regular expression {term[:200]!r}: "
            f"{exc}", fix="correct the expression after '~'") from None
    if refused:
        raise InventoryError.single(
            f"host pattern {pattern[:200]!r}", f"regular expression {term[:200]!r} refused: "
            f"{refused}", expected=_REGEX_RULES, actual=repr(term[:200]),
            fix="simplify the expression (e.g. '~gpu-[0-9]+' instead of '~(gpu-[0-9]+)+'), or "
                "use a wildcard such as 'gpu-*'")
    return regex


def split_pattern(pattern: str) -> list[str]:
    """Split a pattern into terms: on ``,`` when present, else on ``:`` (Ansible's
    ``split_host_pattern``; an IPv6 address is kept whole)."""
    if "," in pattern:
        parts = pattern.split(",")
    else:
        try:
            import ipaddress

            ipaddress.ip_address(pattern.strip())
            parts = [pattern]
        except ValueError:
            parts = pattern.split(":")
    return [part.strip() for part in parts if part.strip()]


def _hosts_of_groups(inventory: Inventory, names: list[str]) -> set[str]:
    """Every host of the groups ``names`` and their descendants, in one walk of the groups
    (a wildcard matching thousands of groups costs their memberships, not groups x hosts)."""
    if "all" in names:
        return set(inventory.hosts)
    hosts: set[str] = set()
    for name in groups_under(inventory.groups, names):
        hosts.update(inventory.groups[name].hosts)
    return hosts & inventory.hosts.keys()


def _match_term(inventory: Inventory, term: str, pattern: str) -> set[str]:
    if term in ("all", "*"):
        return set(inventory.hosts)
    found: set[str] = set()
    if term in inventory.hosts:
        found.add(term)
    if term in inventory.groups:
        # an existing but empty group (e.g. vllm_ray in an mp-only inventory) matches no host
        return found | _hosts_of_groups(inventory, [term])
    if found:
        return found
    if term.startswith("~"):
        regex = _compile_regex(term, pattern)
        names = [n for n in [*inventory.groups, *inventory.hosts] if regex.match(n)]
    elif _WILDCARD_CHARS & set(term):
        names = [n for n in [*inventory.groups, *inventory.hosts] if fnmatch.fnmatchcase(n, term)]
    else:
        names = []
    found |= _hosts_of_groups(inventory, [n for n in names if n in inventory.groups])
    found |= {n for n in names if n not in inventory.groups}
    if not names:
        known_groups = sorted(g for g in inventory.groups if g not in ("all",))
        guess = variables.suggest(term, [*inventory.groups, *inventory.hosts])
        raise InventoryError.single(
            f"host pattern {pattern!r}",
            f"no host or group named {term!r}" + (f" (did you mean {guess!r}?)" if guess else "")
            + f"; known groups: {', '.join(known_groups)}",
            actual=repr(term),
            fix="use a host or group name of the inventory (see `provision ... -i INVENTORY`), "
                "or a wildcard such as 'h*'")
    return found


def select_hosts(inventory: Inventory, pattern: str) -> list[Host]:
    """Return the hosts matching an Ansible host pattern, in inventory order.

    Grammar (Ansible "Patterns: targeting hosts and groups"): ``all`` or ``*``; a host or group
    name; shell wildcards (``h*``, ``web?``); ``~regex``; terms joined by ``:`` or ``,`` are a
    union, ``&term`` intersects and ``!term`` excludes. As in Ansible, unions are applied first,
    then intersections, then exclusions; a pattern of only ``&``/``!`` terms starts from ``all``.

    Args:
        inventory: a loaded inventory.
        pattern: e.g. ``"vllm_replicas:!h2"``, ``"llama:&vllm_master"``, ``"h1,h3"``.

    Raises:
        InventoryError: the pattern is empty, or a term names no host or group (the message
            lists the known groups and a close match).
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InventoryError.single("host pattern", f"the host pattern has {len(pattern)} "
                                    f"characters, more than {MAX_PATTERN_CHARS}",
                                    actual=repr(pattern[:80]) + "...",
                                    fix="select hosts with a group instead of a long list")
    terms = split_pattern(pattern)
    if not terms:
        raise InventoryError.single("host pattern", "the host pattern is empty",
                                    actual=repr(pattern),
                                    expected="a host or group name, or 'all'",
                                    fix="give a pattern such as 'all' or 'vllm_replicas'")
    unions = [t for t in terms if not t.startswith(("&", "!"))]
    intersections = [t[1:] for t in terms if t.startswith("&")]
    exclusions = [t[1:] for t in terms if t.startswith("!")]
    selected: set[str] = set()
    for term in unions or ["all"]:
        selected |= _match_term(inventory, term, pattern)
    for term in intersections:
        selected &= _match_term(inventory, term, pattern)
    for term in exclusions:
        selected -= _match_term(inventory, term, pattern)
    return [host for name, host in inventory.hosts.items() if name in selected]
