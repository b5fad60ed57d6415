"""The ``vllm serve`` command line of every vLLM release, as data (docs/vllm-versions.md).

``serve_flags.json`` beside this file holds, for every release from 0.10.0 to the newest the
package index had when it was made, every option ``vllm serve`` accepts (its long name, aliases,
whether it takes a value, the value's kind and choices), whether the release's parser accepts
abbreviations (argparse's ``allow_abbrev``; vLLM's ``FlexibleArgumentParser``), and the
environment variables that became options. ``scripts/vllm_serve_flags.py`` regenerates it from
the released sdists (a wheel where a release has none), read with :mod:`ast` (vLLM is never
imported); ``README.md`` beside this file says how.

The file's format (``"format": 1``)::

    {"format": 1, "made_by": "...", "made_at": "YYYY-MM-DD",
     "releases": ["0.10.0", "0.10.1", ...],            # oldest first; an index below is into it
     "allow_abbrev": [[first, last, true], ...],         # spans of release indices
     "flags": {"--tensor-parallel-size": [[first, last, {"aliases": ["-tp"],
                                                         "takes_value": true, "kind": "int",
                                                         "choices": null, "nargs": null,
                                                         "negatable": false}], ...], ...},
     "env_to_flag": {"VLLM_ALL2ALL_BACKEND": {"flag": "--all2all-backend", "since": "0.11.1"}}}

A span ``[first, last, props]`` says the option exists, with those properties, in every release
from ``releases[first]`` to ``releases[last]`` inclusive; an option absent from a release has no
span covering it. ``kind`` is one of ``int``, ``float``, ``str``, ``json`` (a JSON object or
``key=value`` text: vLLM's config options) or ``bool`` (no value: ``store_true`` and argparse's
``BooleanOptionalAction``, whose ``negatable`` adds ``--no-<name>``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["AmbiguousOption", "Flag", "Surface", "UnknownOption", "first_release",
           "parse_release", "releases", "surface", "table"]

DATA = "serve_flags.json"
# PEP 440 release segment at the start of a version (0.12.0, 0.11.1rc2, 0.12.0+cu129, 0.10.1.1)
_RELEASE_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?")


class UnknownOption(LookupError):
    """An option the release's ``vllm serve`` does not have (argparse: "unrecognized
    arguments"). ``str()`` names the option and the release."""


class AmbiguousOption(LookupError):
    """An abbreviation that matches more than one option (argparse: "ambiguous option: --x
    could match --a, --b"). ``candidates`` holds the matches, sorted."""

    def __init__(self, message: str, candidates: tuple[str, ...]) -> None:
        super().__init__(message)
        self.candidates = candidates


@dataclass(frozen=True)
class Flag:
    """One option of ``vllm serve`` in one release.

    Attributes:
        name: the long name, ``--tensor-parallel-size``.
        aliases: other spellings argparse registers for it (``-tp``).
        takes_value: False for flags (``--enforce-eager``).
        kind: ``int``, ``float``, ``str``, ``json`` or ``bool`` (see the module docstring).
        choices: the values argparse accepts, or None for any of ``kind``.
        nargs: argparse's ``nargs`` (``"+"``, ``"*"``, ``"?"``) or None for one value.
        negatable: argparse's ``BooleanOptionalAction``: ``--no-<name>`` exists too.
    """

    name: str
    aliases: tuple[str, ...] = ()
    takes_value: bool = True
    kind: str = "str"
    choices: tuple[str, ...] | None = None
    nargs: str | None = None
    negatable: bool = False

    def spellings(self) -> tuple[str, ...]:
        """Every option string argparse registers for this flag (name, aliases, ``--no-``)."""
        negated = ("--no-" + self.name[2:],) if self.negatable else ()
        return (self.name, *self.aliases, *negated)

    def value_problem(self, value: str) -> str | None:
        """Why argparse (or vLLM's type function) would refuse ``value`` for this flag, or None.

        Checks the kind (``int``, ``float``) and the choices, as argparse does: "argument
        --x: invalid int value: 'a'" and "invalid choice: 'a' (choose from ...)".
        """
        if not self.takes_value:
            return f"{self.name} takes no value"
        if self.kind == "int":
            try:
                int(value)
            except ValueError:
                return f"argument {self.name}: invalid int value: {value!r}"
        elif self.kind == "float":
            try:
                float(value)
            except ValueError:
                return f"argument {self.name}: invalid float value: {value!r}"
        if self.choices is not None and value not in self.choices:
            shown = ", ".join(repr(c) for c in self.choices)
            return f"argument {self.name}: invalid choice: {value!r} (choose from {shown})"
        return None


@dataclass(frozen=True)
class Surface:
    """``vllm serve``'s options in one release.

    Attributes:
        release: the table's release (``0.11.1``).
        flags: every option string (long names, aliases, ``--no-`` forms) -> its :class:`Flag`.
        allow_abbrev: the release's parser resolves unique prefixes of long options.
        env_to_flag: environment variable -> the option that replaced it in this release or an
            earlier one.
    """

    release: str
    flags: Mapping[str, Flag]
    allow_abbrev: bool
    env_to_flag: Mapping[str, str]

    def resolve(self, option: str) -> Flag:
        """The flag ``option`` means to this release's parser, as argparse resolves it.

        ``option`` is one word of a command line without its ``=value``. vLLM's
        ``FlexibleArgumentParser`` first turns underscores into dashes in a ``--`` option
        (``--tensor_parallel_size``); then argparse takes an exact match, else, when the
        release allows abbreviations, the one long option that starts with it
        (``Lib/argparse.py``, ``_parse_optional`` and ``_get_option_tuples``).

        Raises:
            UnknownOption: no option matches (or one would only by abbreviation, in a release
                that refuses abbreviations).
            AmbiguousOption: two or more options start with it.
        """
        word = "--" + option[2:].replace("_", "-") if option.startswith("--") else option
        found = self.flags.get(word)
        if found is not None:
            return found
        if word.startswith("--") and self.allow_abbrev and len(word) > 2:
            matches = tuple(sorted(s for s in self.flags if s.startswith("--")
                                   and s.startswith(word)))
            flags = {self.flags[m].name for m in matches}
            if len(flags) == 1:
                return self.flags[matches[0]]
            if len(matches) > 1:
                raise AmbiguousOption(
                    f"ambiguous option: {option} could match {', '.join(matches)} "
                    f"(vLLM {self.release})", matches)
        raise UnknownOption(f"unrecognized arguments: {option} (vLLM {self.release} has no "
                            "such option)")


def parse_release(version: str) -> tuple[int, ...] | None:
    """The release segment of a vLLM version as a tuple of ints (``0.12.0+cu129`` ->
    ``(0, 12, 0)``, ``0.10.1.1`` -> ``(0, 10, 1, 1)``, ``0.11.1rc2`` -> ``(0, 11, 1)``: a
    pre-release counts as its release), or None when it does not start with one."""
    match = _RELEASE_RE.match(str(version).strip())
    if match is None:
        return None
    parts = [int(match[1]), int(match[2]), int(match[3] or 0)]
    if match[4] is not None:
        parts.append(int(match[4]))
    return tuple(parts)


def _covering(spans: list[list[Any]], index: int) -> Any:
    for first, last, value in spans:
        if first <= index <= last:
            return value
    return None


def _shipped_text() -> str:
    """The shipped table's JSON (tests replace this function to load a small table)."""
    return resources.files(__name__).joinpath(DATA).read_text(encoding="utf-8")


@lru_cache(maxsize=4)
def table(text: str | None = None) -> dict[str, Any]:
    """The parsed ``serve_flags.json`` (``text``: another table's JSON, for tests).

    Raises:
        FileNotFoundError: the data file is missing from the installation.
        ValueError: it is not a table of format 1.
    """
    data = json.loads(_shipped_text() if text is None else text)
    if not isinstance(data, dict) or data.get("format") != 1:
        raise ValueError(f"{DATA} is not a vllm serve table of format 1")
    return data


def releases(text: str | None = None) -> tuple[str, ...]:
    """Every release the table has, oldest first."""
    return tuple(table(text)["releases"])


def first_release(name: str) -> str | None:
    """The oldest release of the shipped table that has option ``name`` (a long name as the
    table writes it), or None when none has it or the table cannot be read."""
    try:
        data = table()
        spans = data["flags"].get(name)
        return data["releases"][min(first for first, _last, _props in spans)] if spans else None
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


@lru_cache(maxsize=64)
def _surface_at(index: int, text: str | None) -> Surface:
    data = table(text)
    flags: dict[str, Flag] = {}
    for name, spans in data["flags"].items():
        props = _covering(spans, index)
        if props is None:
            continue
        flag = Flag(name=name, aliases=tuple(props.get("aliases") or ()),
                    takes_value=bool(props.get("takes_value", True)),
                    kind=str(props.get("kind") or "str"),
                    choices=None if props.get("choices") is None
                    else tuple(str(c) for c in props["choices"]),
                    nargs=props.get("nargs"), negatable=bool(props.get("negatable")))
        for spelling in flag.spellings():
            flags[spelling] = flag
    release = data["releases"][index]
    parsed = parse_release(release) or ()
    env = {var: entry["flag"] for var, entry in data.get("env_to_flag", {}).items()
           if (parse_release(entry.get("since", "0")) or ()) <= parsed}
    return Surface(release=release, flags=flags,
                   allow_abbrev=bool(_covering(data.get("allow_abbrev", []), index)),
                   env_to_flag=env)


def surface(version: str, text: str | None = None) -> tuple[Surface, str | None]:
    """The ``vllm serve`` surface of ``version``, and a warning when it is a stand-in.

    Args:
        version: a vLLM version as the facts or a pin give it (``0.12.0``, ``0.11.1+cu129``,
            ``0.12.0rc1``).
        text: another table's JSON (tests); None for the shipped table.

    Returns:
        ``(surface, warning)``: a release in the table gives its own surface and None; a
        release between two of the table's gives the nearest older one and a warning; a
        release newer than the table's newest gives the newest and a warning that the table
        may be stale (refresh it: docs/vllm-versions.md).

    Raises:
        ValueError: ``version`` is not a version, or is older than the table's oldest release
            (the message names the supported range).
    """
    known = releases(text)
    parsed = parse_release(version)
    if parsed is None:
        raise ValueError(f"{version!r} is not a vLLM version (expected one like 0.12.0)")
    keyed = [(parse_release(r) or (), i) for i, r in enumerate(known)]
    older = [i for key, i in keyed if key <= parsed]
    if not older:
        raise ValueError(f"vLLM {version} is older than the oldest release this tool knows "
                         f"({known[0]}); supported: {known[0]} to {known[-1]}")
    index = older[-1]
    chosen = known[index]
    if keyed[index][0] == parsed:
        return _surface_at(index, text), None
    if index == len(known) - 1:
        return _surface_at(index, text), (
            f"vLLM {version} is newer than the newest release in the vllm serve table "
            f"({chosen}): checking against {chosen}'s options; the table may be stale "
            "(docs/vllm-versions.md says how to refresh it)")
    return _surface_at(index, text), (
        f"vLLM {version} is not in the vllm serve table: checking against {chosen}, the "
        "nearest older release")
