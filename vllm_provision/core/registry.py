"""One way to extend: a registry per extension point, filled by a decorator where an item is
defined, and discovery of a package's modules so that a new item is one new file.

Each extension point owns one :class:`Registry` (``CHECKS`` in ``checks/context.py``, the
built-in backends in ``backends/base.py``, ``FACTS`` in ``facts/extra/__init__.py``)::

    CHECKS = Registry("check")

    @CHECKS.register("network.routes", order=70, scope="replica")
    def routes(scope): ...

A name is a lower-case dotted word (``network.routes``); taking a name twice is an error naming
both modules, so two files cannot silently shadow each other. :func:`import_submodules` imports
every module of a package (``pkgutil`` over its folder) so that their decorators run; the
entries then come out in their declared ``order`` (ties by name), never in import order.
docs/architecture.md, "Extending", lists what each extension point needs.

This module is in the lowest room (``core``): it imports nothing of the package above
``core.errors``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from vllm_provision.core.errors import ProvisionError

T = TypeVar("T")

# lower-case words joined by dots: ``network.routes``, ``mp``, ``exec``
NAME_RE = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered item.

    Attributes:
        name: its registered name (unique in its registry).
        obj: what was registered (a function, a class, a module name...).
        module: the module that registered it (``obj.__module__`` for a decorated item).
        order: its place among the registry's entries (smaller first; ties by name).
        meta: the other keyword arguments of :meth:`Registry.register` (a check's ``scope``,
            a command's ``summary``), read-only.
    """

    name: str
    obj: T
    module: str
    order: float = 0
    meta: Mapping[str, Any] = field(default_factory=dict)


def _module_of(obj: object) -> str:
    return str(getattr(obj, "__module__", None) or "<unknown module>")


class Registry(Generic[T]):
    """The items of one extension point, by name.

    Args:
        kind: what an item is, for messages (``check``, ``backend``, ``command``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, *, order: float = 0,
                 **meta: Any) -> Callable[[T], T]:
        """A decorator that adds the decorated item under ``name`` and returns it unchanged.

        Args:
            name: a lower-case dotted word (:data:`NAME_RE`), unique in this registry.
            order: its place among the entries (:meth:`entries`).
            **meta: anything else the extension point reads (kept in :attr:`Entry.meta`).

        Raises:
            ProvisionError: (when decorating) the name is invalid or already taken; the
                message names the item and the module(s).
        """

        def decorate(obj: T) -> T:
            self.add(name, obj, order=order, module=_module_of(obj), **meta)
            return obj

        return decorate

    def add(self, name: str, obj: T, *, order: float = 0, module: str | None = None,
            **meta: Any) -> T:
        """Add ``obj`` under ``name`` (the same as :meth:`register`, for an item that cannot be
        decorated: a table row, an instance) and return it.

        Args:
            name: a lower-case dotted word (:data:`NAME_RE`), unique in this registry.
            obj: the item.
            order: its place among the entries.
            module: the module that adds it (default: ``obj.__module__``).
            **meta: kept in :attr:`Entry.meta`.

        Raises:
            ProvisionError: ``name`` is not a lower-case dotted word, or another item (another
                object, or the same one from another module) already has it. Re-running the
                same module (``importlib.reload``) replaces its own function or class of the
                same qualified name.
        """
        where = module or _module_of(obj)
        item = getattr(obj, "__qualname__", None) or type(obj).__name__
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ProvisionError.single(
                f"{self.kind} {name!r} ({item} in {where})", f"invalid {self.kind} name",
                expected="lower-case words joined by dots, such as network.routes",
                actual=repr(name), fix=f"rename the {self.kind} in {where}")
        old = self._entries.get(name)
        if old is not None and old.obj is not obj and not (
                old.module == where and _same_item(old.obj, obj)):
            raise ProvisionError.single(
                f"{self.kind} {name!r} ({item} in {where})",
                f"a {self.kind} of this name is registered already",
                actual=f"{_item_name(old.obj)} in {old.module}",
                fix=f"give one of them another name ({where} or {old.module})")
        self._entries[name] = Entry(name, obj, where, order, MappingProxyType(dict(meta)))
        return obj

    def remove(self, name: str) -> None:
        """Forget ``name`` (a no-op when absent); for tests and plug-ins that unload."""
        self._entries.pop(name, None)

    def entries(self) -> list[Entry[T]]:
        """Every entry, by ``order``, then by name."""
        return sorted(self._entries.values(), key=lambda e: (e.order, e.name))

    def names(self) -> list[str]:
        """Every name, in :meth:`entries` order."""
        return [e.name for e in self.entries()]

    def get(self, name: str) -> Entry[T] | None:
        """The entry called ``name``, or None."""
        return self._entries.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self.entries())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()!r})"


def _item_name(obj: object) -> str:
    return str(getattr(obj, "__qualname__", None) or type(obj).__name__)


def _same_item(old: object, new: object) -> bool:
    """The same definition run again (a reloaded module): same qualified name and kind."""
    return (type(old) is type(new) and getattr(old, "__qualname__", None) is not None
            and _item_name(old) == _item_name(new))


def import_submodules(package: str, *, skip: Iterable[str] = ()) -> list[str]:
    """Import every module of ``package`` (``pkgutil.iter_modules`` over its folder, sorted by
    name; subpackages and names starting with ``_`` left out), so that their decorators run.

    Args:
        package: a package's dotted name (``vllm_provision.checks``).
        skip: module names (the last part) not to import, such as the package's runner.

    Returns:
        The full names of the modules imported (or already imported), sorted.

    Raises:
        ProvisionError: from a decorator (a duplicate or invalid name); ImportError and the
            like propagate as they are (a broken module of the package is a bug of ours).
    """
    parent = importlib.import_module(package)
    skipped = set(skip)
    names = sorted(info.name for info in pkgutil.iter_modules(parent.__path__)
                   if not info.ispkg and not info.name.startswith("_")
                   and info.name not in skipped)
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return [f"{package}.{name}" for name in names]
