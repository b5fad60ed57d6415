"""Resolve Ansible host patterns (``--limit``, a play's ``hosts:``) against an inventory."""

from __future__ import annotations

import fnmatch
import re

from vllm_provision.core.errors import InventoryError
from vllm_provision.core.models import Host, Inventory
from vllm_provision.settings import variables

_WILDCARD_CHARS = set("*?[")


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


def _match_term(inventory: Inventory, term: str, pattern: str) -> set[str]:
    if term in ("all", "*"):
        return set(inventory.hosts)
    found: set[str] = set()
    if term in inventory.hosts:
        found.add(term)
    if term in inventory.groups:
        # an existing but empty group (e.g. vllm_ray in an mp-only inventory) matches no host
        return found | set(inventory.hosts_in_group(term))
    if found:
        return found
    if term.startswith("~"):
        try:
            regex = re.compile(term[1:])
        except re.error as exc:
            raise InventoryError.single(
                f"host pattern {pattern!r}", f"invalid regular expression {term!r}: {exc}",
                fix="correct the expression after '~'") from None
        names = [n for n in [*inventory.groups, *inventory.hosts] if regex.match(n)]
    elif _WILDCARD_CHARS & set(term):
        names = [n for n in [*inventory.groups, *inventory.hosts] if fnmatch.fnmatchcase(n, term)]
    else:
        names = []
    for name in names:
        found |= set(inventory.hosts_in_group(name)) if name in inventory.groups else {name}
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
