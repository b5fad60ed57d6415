"""Declared module arguments, checked when the playbook loads and again once rendered.

Each task module declares ``ARGUMENT_SPEC``, an :class:`ArgumentSpec`: every argument's kind,
whether it is required, its choices, range and default, and one line of help. This is Ansible's
``argument_spec`` (https://docs.ansible.com/ansible/latest/dev_guide/developing_program_flow_modules.html#argument-spec),
with Ansible's kind names. The declaration is used three times:

- when the playbook loads (``runner/playbook.py``), before any connection: an unknown argument, a
  missing required one, and every value that is not a template is checked, so a typo such as
  ``vllm_verify: {promt: hi}`` stops the run with the playbook file, play, task and argument;
- after the task's arguments are rendered (``runner/executor.py``), for the values that were
  templates, and by the module itself (``values = ARGUMENT_SPEC.validate(args)``);
- to write the module reference, docs/modules.md (``python -m vllm_provision.modules.reference``).

Kinds: ``str``; ``int`` (an integer, or a string of one: Ansible converts it too); ``float`` (a
number, or a string of one; returned as a float); ``bool`` (``true``/``false`` only, never a
string); ``dict`` (a mapping); ``list``; ``raw`` (anything). ``None`` counts as absent.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from vllm_provision.core.errors import ProvisionError

Kind = Literal["str", "int", "float", "bool", "dict", "list", "raw"]
KIND_WORDS: dict[str, str] = {
    "str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
    "dict": "a mapping", "list": "a list", "raw": "any value",
}
REFERENCE = "docs/modules.md"
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_TEMPLATE_MARKERS = ("{{", "{%")
_NO_VALUE = object()


@dataclass(frozen=True)
class Argument:
    """One declared argument of a module.

    Attributes:
        name: the key in the task (``timeout_s``).
        kind: one kind, or several tried in order (``("str", "int")``): see the module docstring.
        help: one line for the reference (what it does, its unit).
        required: the task must give it (a template counts as given).
        default: the value used when the argument is absent or ``None``.
        default_text: the default in words when it is worked out at run time (``"the
            vllm_ready_timeout_s variable (1800)"``); ``default`` is then None.
        choices: the only values allowed, when not empty.
        minimum / maximum: inclusive bounds of a number.
    """

    name: str
    kind: Kind | tuple[Kind, ...]
    help: str
    required: bool = False
    default: Any = None
    default_text: str = ""
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """The kinds, as a tuple."""
        return self.kind if isinstance(self.kind, tuple) else (self.kind,)

    def expected(self) -> str:
        """What a valid value is, in words (``"a number >= 0.1"``, ``"one of a, b"``)."""
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        words = " or ".join(KIND_WORDS[k] for k in self.kinds)
        if self.minimum is not None and self.maximum is not None:
            return f"{words} {self.minimum:g}-{self.maximum:g}"
        if self.minimum is not None:
            return f"{words} >= {self.minimum:g}"
        if self.maximum is not None:
            return f"{words} <= {self.maximum:g}"
        return words


@dataclass(frozen=True)
class ArgumentSpec:
    """The arguments of one module.

    Attributes:
        module: the module's task key (``wait_for``).
        arguments: every argument, in the order the reference lists them.
        free_form: the argument a plain string fills (``command: echo hi`` is ``cmd``), or None
            when the arguments must be a mapping.
    """

    module: str
    arguments: tuple[Argument, ...]
    free_form: str | None = None

    def __post_init__(self) -> None:
        names = [a.name for a in self.arguments]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.module}: an argument is declared twice: {names}")
        if self.free_form is not None and self.free_form not in names:
            raise ValueError(f"{self.module}: free_form {self.free_form!r} is not declared")

    @property
    def names(self) -> tuple[str, ...]:
        """The declared argument names, in order."""
        return tuple(a.name for a in self.arguments)

    def argument(self, name: str) -> Argument:
        """The declaration of ``name``.

        Raises:
            KeyError: not declared.
        """
        for argument in self.arguments:
            if argument.name == name:
                return argument
        raise KeyError(name)

    def validate(self, args: Mapping[str, Any] | str | None, where: str | None = None,
                 ) -> dict[str, Any]:
        """Check fully rendered arguments; return every declared name with its value.

        Absent arguments get their ``default``; ``int``/``float`` strings are converted.
        Validating the returned mapping again gives the same mapping.

        Args:
            args: the task's rendered arguments (a mapping, or a string for a free-form module).
            where: the place for messages (``"playbooks/up.yml: play[3].tasks[0].vllm_verify"``);
                default: the module's name.

        Raises:
            ProvisionError: an unknown argument, a missing required one, or a value of the wrong
                kind, outside its choices or range; the message names the argument, what was
                expected and where the arguments are listed.
        """
        return self._check(args, where, static=False, context="")

    def check_declared(self, args: Any, where: str, *, task: str = "", play: str = "") -> None:
        """Check a task's arguments as written in the playbook, before anything is rendered.

        Values that are templates (``"{{ x }}"``) are checked after rendering instead; everything
        else is checked here, so a typo fails before any SSH connection.

        Args:
            args: the value under the module key (a mapping or a string).
            where: the playbook file and key path of the module key.
            task / play: the task's and the play's names, for the message.

        Raises:
            ProvisionError: as :meth:`validate`, naming the file, play, task and argument.
        """
        context = ""
        if task:
            context = f" (task '{task}'" + (f", play '{play}')" if play else ")")
        self._check(args, where, static=True, context=context)

    # -- internals --------------------------------------------------------------------------

    def _check(self, args: Any, where: str | None, *, static: bool,
               context: str) -> dict[str, Any]:
        base = where or self.module
        if args is None:
            args = {}
        if isinstance(args, str):
            if self.free_form is None:
                raise self._error(base, f"{self.module} takes a mapping of arguments{context}",
                                  expected="a mapping such as {" + self.names[0] + ": ...}"
                                  if self.names else "{}", actual=repr(args[:200]))
            args = {self.free_form: args}
        if not isinstance(args, Mapping):
            raise self._error(base, f"{self.module} takes a mapping of arguments{context}",
                              actual=type(args).__name__)
        names = set(self.names)
        for key in args:
            if key not in names:
                close = difflib.get_close_matches(str(key), sorted(names), n=1)
                raise self._error(
                    self._place(base, str(key)), f"unknown argument{context}",
                    expected="one of " + (", ".join(self.names) or "(no arguments)"),
                    fix=(f"did you mean '{close[0]}'? " if close else "remove it; ")
                    + f"the arguments of {self.module} are listed in {REFERENCE}")
        values: dict[str, Any] = {}
        for argument in self.arguments:
            value = args.get(argument.name)
            if value is None:
                if argument.required:
                    raise self._error(
                        self._place(base, argument.name), f"required argument missing{context}",
                        expected=argument.expected(),
                        fix=f"add '{argument.name}:' to the task's {self.module} arguments")
                values[argument.name] = argument.default
                continue
            if static and _holds_template(value):
                values[argument.name] = value
                continue
            values[argument.name] = self._value(argument, value, base, context)
        return values

    def _value(self, argument: Argument, value: Any, base: str, context: str) -> Any:
        converted: Any = _NO_VALUE
        for kind in argument.kinds:
            converted = _convert(kind, value)
            if converted is not _NO_VALUE:
                break
        place = self._place(base, argument.name)
        if converted is _NO_VALUE:
            raise self._error(place, f"wrong argument type{context}",
                              expected=" or ".join(KIND_WORDS[k] for k in argument.kinds),
                              actual=_show(value),
                              fix=f"give {argument.expected()} ({REFERENCE}, {self.module})")
        if argument.choices and converted not in argument.choices:
            raise self._error(place, f"invalid value{context}", expected=argument.expected(),
                              actual=_show(value))
        if isinstance(converted, (int, float)) and not isinstance(converted, bool):
            low, high = argument.minimum, argument.maximum
            if (low is not None and converted < low) or (high is not None and converted > high):
                raise self._error(place, f"out of range{context}", expected=argument.expected(),
                                  actual=_show(value))
        return converted

    def _place(self, base: str, name: str) -> str:
        return f"{base}.{name}" if base != self.module else f"{self.module}: {name}"

    @staticmethod
    def _error(where: str, message: str, *, expected: str = "", actual: str = "",
               fix: str = "") -> ProvisionError:
        return ProvisionError.single(where, message, expected=expected, actual=actual, fix=fix)


def _convert(kind: Kind, value: Any) -> Any:
    """``value`` as ``kind``, or ``_NO_VALUE`` when it is not one."""
    if kind == "raw":
        return value
    if kind == "str":
        return value if isinstance(value, str) else _NO_VALUE
    if kind == "bool":
        return value if isinstance(value, bool) else _NO_VALUE
    if kind == "dict":
        return value if isinstance(value, Mapping) else _NO_VALUE
    if kind == "list":
        return list(value) if isinstance(value, (list, tuple)) else _NO_VALUE
    if isinstance(value, bool):
        return _NO_VALUE
    if kind == "int":
        if isinstance(value, int):
            return value
        if isinstance(value, str) and _INT_RE.match(value.strip()):
            return int(value.strip())
        return _NO_VALUE
    # float
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return _NO_VALUE
    else:
        return _NO_VALUE
    return number if math.isfinite(number) else _NO_VALUE


def _holds_template(value: Any) -> bool:
    """True when ``value`` is, or holds, a string with Jinja2 markup (rendered later)."""
    if isinstance(value, str):
        return any(marker in value for marker in _TEMPLATE_MARKERS)
    if isinstance(value, Mapping):
        return any(_holds_template(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_template(v) for v in value)
    return False


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
