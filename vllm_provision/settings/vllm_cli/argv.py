"""A ``vllm serve`` command line read as the release's parser reads it (docs/vllm-versions.md).

:func:`read_argv` splits the words after ``vllm serve`` into options and their values with the
release's :class:`~vllm_provision.settings.vllm_cli.Surface`: an option word is resolved as
argparse resolves it (exact, ``_`` for ``-``, unique prefix where the release allows
abbreviations), a value is the part after ``=`` or the next word(s) by the option's ``nargs``,
and a word such as ``-1`` is a value (argparse's ``_negative_number_matcher``,
``Lib/argparse.py``). Nothing is executed; a word is only compared with the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_provision.settings.vllm_cli import AmbiguousOption, Flag, Surface, UnknownOption

__all__ = ["ArgvOption", "abbreviated", "prefix_of", "read_argv", "spelled", "value_problem"]

# Lib/argparse.py: a word like this is a value unless the parser has options that look like it
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class ArgvOption:
    """One option word of a command line and what the release's parser makes of it.

    Attributes:
        index: the word's position in the argument list.
        word: the option as written, up to any ``=`` (``--tensor_parallel``).
        value: its value (after ``=``, or the next word; several words joined by a space for
            ``nargs`` ``+``/``*``), or None when none was given.
        values: every value word, one item each (``()`` when none was given).
        inline: the value was written ``--option=value``.
        flag: the option the release resolves it to, or None when it does not.
        error: why the release refuses the word (:class:`UnknownOption` or
            :class:`AmbiguousOption`), or None.
    """

    index: int
    word: str
    value: str | None
    inline: bool
    flag: Flag | None
    error: LookupError | None
    values: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The resolved option's long name, else the word with ``_`` turned into ``-``."""
        return self.flag.name if self.flag is not None else spelled(self.word)


def spelled(word: str) -> str:
    """``word`` as vLLM's ``FlexibleArgumentParser`` spells a ``--`` option: underscores become
    dashes (``--tensor_parallel_size`` -> ``--tensor-parallel-size``); other words as they
    are."""
    return "--" + word[2:].replace("_", "-") if word.startswith("--") else word


def abbreviated(option: ArgvOption) -> bool:
    """True when ``option`` resolved to a flag only as an abbreviation (its word, spelled with
    dashes, is none of the flag's spellings)."""
    return option.flag is not None and spelled(option.word) not in option.flag.spellings()


def prefix_of(surface: Surface, word: str) -> tuple[str, ...]:
    """The long option names of ``surface`` that ``word`` (spelled with dashes) is a proper
    prefix of, sorted: what argparse would consider were abbreviations allowed."""
    spelled_word = spelled(word)
    if not spelled_word.startswith("--") or len(spelled_word) <= 2:
        return ()
    return tuple(sorted({flag.name for spelling, flag in surface.flags.items()
                         if spelling.startswith("--") and spelling != spelled_word
                         and spelling.startswith(spelled_word)}))


def _is_option(word: str) -> bool:
    return word.startswith("-") and word != "-" and not NEGATIVE_NUMBER.match(word)


def _optimization_level(surface: Surface, word: str, following: list[str],
                        ) -> tuple[str, str | None, bool] | None:
    """``-O3``, ``-O=3`` and ``-O 3`` as vLLM's ``FlexibleArgumentParser.parse_args`` rewrites
    them (vllm/utils/argparse_utils.py; vllm/utils/__init__.py before 0.11): into
    ``--optimization-level`` where the release has it, else into ``-O.level=`` of the
    ``-O`` alias of ``--compilation-config``. Returns ``(option, value, inline)`` for the
    option word that replaces ``word``, or None when ``word`` is not such a form."""
    has_level = "--optimization-level" in surface.flags
    if word == "-O":
        if has_level and following[:1] and following[0] in ("0", "1", "2", "3"):
            return "--optimization-level", None, False
        return None
    if not word.startswith("-O") or (word[2] == "." and not has_level):
        return None
    level = word[3:] if word[2] == "=" else word[2:]
    return ("--optimization-level", level, True) if has_level else ("-O", level, True)


def read_argv(surface: Surface, argv: list[str] | tuple[str, ...]) -> list[ArgvOption]:
    """Every option word of ``argv`` (the words after ``vllm serve``), in order.

    Positional words (the model) are skipped. vLLM's own rewrites come first, as its
    ``FlexibleArgumentParser`` makes them: ``-O3`` is ``--optimization-level 3`` (or the
    compilation config's level before that option existed), and ``--option.key value`` (or
    ``=value``) is a key of the JSON value of ``--option``. A resolved option that takes a
    value gets the next word unless it is written ``--x=v`` or the next word is an option;
    ``nargs`` ``+`` and ``*`` take every following word up to the next option. An option the
    release does not resolve takes the next word when that is not an option (argparse would
    refuse the line anyway; this keeps its value from being read as an option).

    Args:
        surface: the release's options (:func:`vllm_provision.settings.vllm_cli.surface`).
        argv: the words, each one argument (no shell quoting).

    Returns:
        One :class:`ArgvOption` per option word; never raises for any list of strings.
    """
    words = [str(w) for w in argv]
    found: list[ArgvOption] = []
    position = 0
    while position < len(words):
        word = words[position]
        if not _is_option(word) or word == "--":
            position += 1
            continue
        option, inline, value = word, False, None
        taken: list[str] = []
        level = _optimization_level(surface, word, words[position + 1:position + 2])
        key = word.split("=", 1)[0]
        if level is not None:
            option, value, inline = level
            taken = [value] if value is not None else []
        elif "." in key:
            # --json-option.key[=value]: vLLM merges these into one JSON value of the option
            # (FlexibleArgumentParser.parse_args); the value is the next word when not inline
            option = key.split(".", 1)[0]
            if "=" in word:
                value, inline = word.split("=", 1)[1], True
            elif position + 1 < len(words):
                value = words[position + 1]
                position += 1
            taken = []
            inline = True
        elif word.startswith("--") and "=" in word:
            option, value = word.split("=", 1)
            inline = True
            taken = [value]
        flag: Flag | None = None
        error: LookupError | None = None
        try:
            flag = surface.resolve(option)
        except (UnknownOption, AmbiguousOption) as refused:
            error = refused
        following = position + 1
        if not inline:
            takes = flag is None or flag.takes_value
            many = flag is not None and flag.nargs in ("+", "*")
            while takes and following < len(words) and not _is_option(words[following]):
                taken.append(words[following])
                following += 1
                if not many:
                    break
            value = " ".join(taken) if taken else None
        found.append(ArgvOption(position, option, value, inline, flag, error, tuple(taken)))
        position = following
    return found


def value_problem(option: ArgvOption) -> str | None:
    """Why the release's parser would refuse the value of a resolved ``option``, in argparse's
    words ("argument --x: expected one argument", "ignored explicit argument", "invalid int
    value", "invalid choice"), or None (also for an unresolved option)."""
    flag = option.flag
    if flag is None:
        return None
    if option.value is None:
        if flag.takes_value and flag.nargs not in ("?", "*"):
            return f"argument {flag.name}: expected one argument"
        return None
    if not flag.takes_value:
        return (f"argument {flag.name}: ignored explicit argument {option.value!r}"
                if option.inline else None)
    for value in option.values:
        problem = flag.value_problem(value)
        if problem is not None:
            return problem
    return None
