"""Ansible's host ranges (``gpu[01:16]``, ``node-[a:d]``, ``h[0:10:2]``), counted before expanded.

Grammar (Ansible docs "Adding ranges of hosts"; ansible-core ``plugins/inventory/__init__.py``
``expand_hostname_range``): ``head[start:end]tail`` or ``head[start:end:step]tail``, where start
and end are both numbers (zero padding kept from ``start``: ``[01:10]`` -> 01..10) or both
single ASCII letters (taken in the order of Python's ``string.ascii_letters``, a-z then A-Z, as
Ansible does); ``tail`` may hold more ranges, expanded left to right.

Bounds (a typo such as ``gpu[0:99999999]``, or a hostile file, must end in one located problem,
never in an exhausted memory or a traceback; Ansible has none of these):

- a range end or step has at most :data:`MAX_RANGE_DIGITS` digits (an RFC 1123 label is at
  most 63 characters, so no host name holds a longer number); it is checked on the text, before
  ``int()``;
- the number of hosts an entry names is computed from the ends (``(end - start) // step + 1``,
  multiplied over the entry's ranges) before one name is built, and must stay within
  :data:`MAX_RANGE_HOSTS`.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass

MAX_RANGE_HOSTS = 10_000
"""The most hosts one entry (one host pattern with its ranges) may name: far above any cluster,
low enough that a typo is refused at once. Also the cap of the whole inventory
(:data:`~vllm_provision.inventory.tree.MAX_HOSTS`)."""
MAX_RANGE_DIGITS = 63
"""The most digits of a range end or step (RFC 1123: a label is at most 63 characters)."""

_RANGE_RE = re.compile(r"^(?P<head>[^\[]*)\[(?P<range>[^\]]*)\](?P<tail>.*)$", re.DOTALL)
_NUMBER_RE = re.compile(r"^[0-9]+$")
_SHOWN_COUNT_MAX = 10**15
RANGE_FIX = (f"correct the range in brackets (a typo in an end?); one entry names at most "
             f"{MAX_RANGE_HOSTS} hosts, and so does a whole inventory: split a larger fleet into "
             "several inventories")


class HostRangeError(ValueError):
    """A host pattern's range is malformed or names too many hosts.

    Attributes:
        fix: what the user should do, one line.
    """

    def __init__(self, message: str, fix: str = "correct the range in brackets") -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class _Range:
    """One bracket: its text, and either numbers (start, step, width) or letters."""

    text: str
    count: int
    start: int = 0
    step: int = 1
    width: int = 0
    letters: str = ""

    def values(self) -> Iterator[str]:
        if self.letters:
            yield from self.letters
            return
        for index in range(self.count):
            yield str(self.start + index * self.step).zfill(self.width)


def _show(name: str) -> str:
    return repr(name[:80] + ("..." if len(name) > 80 else ""))


def _parse_range(name: str, text: str) -> _Range:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise HostRangeError(f"{_show(name)}: a range is [start:end] or [start:end:step]")
    start, end = parts[0], parts[1]
    step_text = parts[2] if len(parts) == 3 else "1"
    if not _NUMBER_RE.match(step_text):
        raise HostRangeError(f"{_show(name)}: the step must be a positive integer")
    for what, value in (("start", start), ("end", end), ("step", step_text)):
        if _NUMBER_RE.match(value) and len(value) > MAX_RANGE_DIGITS:
            raise HostRangeError(
                f"{_show(name)}: the {what} of the range [{text[:40]}...] has {len(value)} "
                f"digits, more than {MAX_RANGE_DIGITS} (no host name holds a longer number)",
                RANGE_FIX)
    step = max(int(step_text), 1)
    if _NUMBER_RE.match(start) and _NUMBER_RE.match(end):
        first, last = int(start), int(end)
        count = (last - first) // step + 1 if last >= first else 0
        width = len(start) if start.startswith("0") else 0
        return _Range(text, count, start=first, step=step, width=width)
    letters = string.ascii_letters
    if len(start) == 1 and len(end) == 1 and start in letters and end in letters:
        chosen = letters[letters.index(start):letters.index(end) + 1:step]
        return _Range(text, len(chosen), letters=chosen)
    raise HostRangeError(f"{_show(name)}: a range is numeric (01:10) or single ASCII letters "
                         "(a:f)")


def parse_host_pattern(name: str) -> tuple[list[str | _Range], int]:
    """Split a host pattern into literal parts and ranges, and count the hosts it names.

    Args:
        name: a host pattern as written in an inventory (``gpu[01:16].lab``).

    Returns:
        ``(parts, count)``: ``parts`` alternates literal text and ranges; ``count`` is the number
        of host names the pattern expands to (1 without a range), computed without expanding.

    Raises:
        HostRangeError: a bracket that is not ``[start:end]`` or ``[start:end:step]``, an end or
            step of more than :data:`MAX_RANGE_DIGITS` digits, an empty range (end before
            start), or more than :data:`MAX_RANGE_HOSTS` hosts.
    """
    parts: list[str | _Range] = []
    rest = name
    count = 1
    while (match := _RANGE_RE.match(rest)) is not None:
        parsed = _parse_range(name, match["range"])
        if parsed.count == 0:
            raise HostRangeError(f"{_show(name)}: the range [{match['range'][:40]}] is empty "
                                 "(end before start)", "write the smaller end first")
        parts += [match["head"], parsed]
        count *= parsed.count
        if count > MAX_RANGE_HOSTS:
            shown = f"{count}" if count < _SHOWN_COUNT_MAX else f"more than {_SHOWN_COUNT_MAX}"
            which = (f"the range [{match['range'][:40]}] names" if len(parts) == 2
                     else "its ranges together name")
            raise HostRangeError(f"{_show(name)}: {which} {shown} hosts, more than "
                                 f"{MAX_RANGE_HOSTS} (the most one entry may name)", RANGE_FIX)
        rest = match["tail"]
    parts.append(rest)
    return parts, count


def iter_host_range(name: str) -> Iterator[str]:
    """Yield the host names of an Ansible host pattern, one at a time, left range outermost.

    The pattern is checked and counted first (:func:`parse_host_pattern`, which raises
    :class:`HostRangeError`), so at most :data:`MAX_RANGE_HOSTS` names are ever produced.
    """
    parts, _ = parse_host_pattern(name)
    literals = parts[0::2]
    ranges = [part.values() for part in parts[1::2]]  # type: ignore[union-attr]
    if not ranges:
        yield name
        return
    for values in itertools.product(*(list(r) for r in ranges)):
        pieces = [literals[0]]
        for value, literal in zip(values, literals[1:], strict=True):
            pieces += [value, literal]
        yield "".join(pieces)  # type: ignore[arg-type]


def expand_host_range(name: str) -> list[str]:
    """Expand an Ansible host range: ``gpu[01:03]`` -> gpu01, gpu02, gpu03; ``h[a:c]`` -> ha..hc.

    Several ranges in one name are expanded left to right; a name without ``[`` is returned as
    is. Source: ansible-core ``plugins/inventory/__init__.py`` ``expand_hostname_range``.

    Raises:
        HostRangeError (a ValueError): as :func:`parse_host_pattern`.
    """
    return list(iter_host_range(name))
