"""Fact modules: a new fact is one file of this package, read on the host by the same probe
(one SSH round trip per host) and parsed on the controller, as a pyinfra fact is one class
with its command and its ``process``.

A fact module defines two functions and registers them with :func:`fact`::

    def probe_gpu_iommu(config):          # runs ON THE HOST, inside the probe
        import glob                       # standard library only, imported here
        return {...}                      # anything json.dumps can write

    @fact("gpu_iommu", probe=probe_gpu_iommu)
    def gpu_iommu(raw: Any) -> GpuIommu:  # runs on the controller: raw -> the fact's value
        ...

The probe function's source is added to the probe script when it is sent
(:func:`probe_additions`): it must be a plain top-level function named ``probe_<name>`` that
takes the probe's configuration (a dict), carries no annotations, default values or
decorator, imports what it uses inside itself (it reads no global of its module: on the host
only the builtins are there) and stays valid on Python 3.8 (the probe's floor:
docs/preflight.md, "Facts"). What it returns reaches the controller under
``extra.<name>`` of the probe's document. The host compiles and runs each probe function
on its own (``probe_script.extra_facts``) and sends its answer as a JSON text of its own: a
syntax its Python lacks, an exception, an exit, a run past 20 s, or an answer over 1 MiB of
JSON or nested too deep is one line of the host's ``problems`` and the fact is None, so one
fact cannot cost a host its other facts; what it prints, itself or through a program, is
dropped.

The parsed value lands in :attr:`HostFacts.extra <vllm_provision.facts.model.HostFacts>` under
the fact's name, and in ``provision facts`` (a row, through ``text``) and ``--json`` (as
``dataclasses.asdict`` writes it). A check reads it with :func:`value_of`.

docs/architecture.md, "Extending", says what a new fact touches: this file and its check.
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import textwrap
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_provision.core import hostjson
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.registry import Registry, import_submodules

if TYPE_CHECKING:
    from vllm_provision.facts.model import HostFacts


@dataclass(frozen=True)
class Fact:
    """One registered fact.

    Attributes:
        name: its name: the key under ``HostFacts.extra`` and the probe's ``extra``.
        probe: the function that reads it on the host (its source is sent).
        parse: raw (what ``probe`` returned, decoded from JSON) -> the fact's value; it may
            raise ValueError for a document it cannot read (a problem of the host, not a bug).
        text: the value -> one line for ``provision facts``' table.
        label: its row's label in that table.
        compared: whether that table marks the row where a replica's hosts differ (False for
            a fact that differs by nature, such as one naming PCI addresses).
    """

    name: str
    probe: Callable[[dict[str, Any]], Any]
    parse: Callable[[Any], Any]
    text: Callable[[Any], str]
    label: str
    compared: bool = True


FACTS: Registry[Fact] = Registry("fact")


def fact(name: str, *, probe: Callable[[dict[str, Any]], Any], order: float = 0,
         text: Callable[[Any], str] = str, label: str = "", compared: bool = True,
         ) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register the decorated parser as the fact ``name``, read on the host by ``probe``.

    Args:
        name: a lower-case word (the JSON key), unique among the facts.
        probe: the host side, ``probe_<name>(config)`` (see the module's rules).
        order: its place in ``provision facts``' rows (smaller first; ties by name).
        text: the parsed value -> one line for the facts table (default ``str``).
        label: the row's label there (default: ``name``).
        compared: False where the row's text differs between hosts by nature (addresses):
            ``provision facts`` then does not mark it as a difference.

    Raises:
        ProvisionError: (when decorating) the name is taken or invalid, or ``probe`` breaks a
            rule the host side depends on (its name, annotations, default values, a
            decorator, a closure, a global of its module).
    """
    def decorate(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
        where = f"fact {name!r} ({parse.__module__})"
        problem = _probe_problem(name, probe)
        if problem:
            raise ProvisionError.single(where, f"its probe function {problem}",
                                        expected=f"a plain top-level def probe_{name}(config) "
                                                 "without annotations or decorators",
                                        fix=f"rewrite the probe function in {parse.__module__}")
        FACTS.add(name, Fact(name, probe, parse, text, label or name, compared), order=order,
                  module=parse.__module__)
        return parse

    return decorate


def _probe_problem(name: str, probe: Callable[..., Any]) -> str:
    if getattr(probe, "__name__", "") != f"probe_{name}":
        return f"is called {getattr(probe, '__name__', probe)!r}, not probe_{name}"
    if getattr(probe, "__qualname__", "") != probe.__name__:
        return "is not defined at the top level of its module"
    if getattr(probe, "__annotations__", None):
        return "has annotations (Python 3.8 on the host would evaluate them)"
    if getattr(probe, "__defaults__", None) or getattr(probe, "__kwdefaults__", None):
        return "has default values (the host would evaluate them when the probe loads)"
    code = getattr(probe, "__code__", None)
    outside = sorted(_globals_read(code) - _BUILTINS) if code is not None else []
    if outside:
        return (f"reads {', '.join(outside[:5])} from its module (only builtins are there on "
                "the host: import inside the function)")
    try:
        source = inspect.getsource(probe)
    except (OSError, TypeError):
        return "has no source to send"
    if not source.startswith(f"def probe_{name}("):
        return "has a decorator"
    try:
        ast.parse(textwrap.dedent(source), feature_version=(3, 8))
    except SyntaxError as exc:
        return f"is not valid on Python 3.8, the probe's floor ({exc.msg}, line {exc.lineno})"
    return ""


_BUILTINS = frozenset(dir(builtins))
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})


def _globals_read(code: types.CodeType) -> set[str]:
    """The global names a function's code (its nested functions' included) loads: on the host
    these resolve in the probe script, where only the builtins are sure to be."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_LOADS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


def all_facts() -> list[Fact]:
    """Every fact of this package (its modules imported on the first call), in order.

    Raises:
        ProvisionError: a module registers an invalid or duplicate fact (see :func:`fact`).
    """
    import_submodules(__name__)
    return [entry.obj for entry in FACTS]


def probe_additions() -> str:
    """The source added to the probe script: the ``EXTRA_FACTS`` table its ``main()`` runs,
    name -> the source of the fact's probe function, as a string: the host compiles each on
    its own, so one that its Python cannot compile costs only that fact."""
    return "".join(f"EXTRA_FACTS[{item.name!r}] = {probe_text(item.probe)!r}\n"
                   for item in all_facts())


def probe_text(probe: Callable[..., Any]) -> str:
    """The source of a probe function as the host runs it (dedented)."""
    return textwrap.dedent(inspect.getsource(probe))


def parse_extra(raw: Any, problems: list[str]) -> dict[str, Any]:
    """The facts of the probe's ``extra`` section (name -> each fact's answer as its own JSON
    text, :func:`probe_script.extra_facts <vllm_provision.facts.probe_script.extra_facts>`),
    decoded and parsed (pure). A fact the host could not read (None), whose text is not JSON
    (malformed, or nested deeper than the controller's recursion limit:
    :func:`~vllm_provision.core.hostjson.loads`), or whose document does not parse
    (ValueError, TypeError, KeyError, IndexError; or any other exception of its parser, named
    as the parser's fault), is None, with one line added to ``problems``: one fact never costs
    a host its other facts. A fact the probe did not send is left out.

    Args:
        raw: the probe's ``extra`` section, or None.
        problems: the host's problems (appended to).
    """
    section = raw if isinstance(raw, Mapping) else {}
    parsed: dict[str, Any] = {}
    for item in all_facts():
        if item.name not in section:
            continue
        parsed[item.name] = None
        text = section[item.name]
        if text is None:
            continue
        try:
            if not isinstance(text, str):
                raise TypeError(f"not a JSON text but {type(text).__name__}")
            value = hostjson.loads(text)
        except (ValueError, TypeError) as exc:
            problems.append(f"fact {item.name}: cannot read what the host sent: {exc}")
            continue
        try:
            parsed[item.name] = item.parse(value)
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
            problems.append(f"fact {item.name}: cannot read what the host sent: {exc}")
        except Exception as exc:  # a parser's own fault: this fact only, never the host's
            problems.append(f"fact {item.name}: its parser failed ({item.parse.__module__}): "
                            f"{type(exc).__name__}: {exc}")
    return parsed


def value_of(facts: HostFacts, name: str) -> Any:
    """The parsed value of the fact ``name`` on a host: None when it could not be read or was
    not gathered."""
    return facts.extra.get(name)
