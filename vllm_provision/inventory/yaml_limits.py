"""Bounds on the YAML we read: regular files only, a size cap, a nesting cap, an alias cap.

Every YAML input of the tool (the inventory, ``group_vars/`` and ``host_vars/`` files, ``-e
@file`` and ``-e '{...}'``) goes through here, so a hostile or broken file ends in one located
problem instead of a hang or an "internal error":

- only a regular file is opened: a FIFO would block ``open()`` until a writer appears, and a
  device such as ``/dev/zero`` never ends (``stat(2)`` first, then ``open(2)`` with
  ``O_NONBLOCK`` so a file swapped for a FIFO in between cannot hang us either);
- at most :data:`MAX_BYTES` are read;
- composing stops at :data:`MAX_DEPTH` levels of nested collections (PyYAML's composer recurses
  once per level, and a 3000-deep list would end in ``RecursionError``);
- a document may use at most :data:`MAX_ALIASES` aliases and expand to at most
  :data:`MAX_NODES` nodes once every alias is counted at its full size: the "billion laughs"
  document (nine aliases of nine aliases ...) is small on disk and has few aliases, but expands
  to 9**9 nodes that every later walk of the value would visit.

The limits are far above what an inventory of a few thousand hosts needs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64
MAX_ALIASES = 10_000
MAX_NODES = 200_000


class LimitError(Exception):
    """A YAML input exceeds one of the bounds above.

    Attributes:
        message: what was exceeded, in words. fix: what the user should do.
        line, column: 1-based position of the node where it was noticed, when known.
    """

    def __init__(self, message: str, fix: str, mark: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.line = mark.line + 1 if mark is not None else None
        self.column = mark.column + 1 if mark is not None else None

    def where(self, path: Path | str) -> str:
        """``path:line:column`` (or just ``path``) for a problem's location."""
        return f"{path}:{self.line}:{self.column}" if self.line else str(path)


def read_regular_file(path: Path, what: str) -> str:
    """Return the text of ``path`` after checking it is a regular file of at most MAX_BYTES.

    Args:
        path: the file (symbolic links are followed, as ``open`` would).
        what: what the file is, for messages (``"inventory"``, ``"-e @file"``).

    Raises:
        FileNotFoundError, IsADirectoryError, PermissionError, OSError: as ``open`` would.
        UnicodeDecodeError: not UTF-8 text.
        LimitError: not a regular file (FIFO, socket, device), or larger than MAX_BYTES.
    """
    info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    if not stat.S_ISREG(info.st_mode):
        raise LimitError(f"the {what} is {_kind(info.st_mode)}, not a regular file",
                         "give a YAML file; provision does not read pipes, sockets or devices")
    if info.st_size > MAX_BYTES:
        raise LimitError(f"the {what} file is {info.st_size} bytes, more than the "
                         f"{MAX_BYTES} bytes provision reads", _SPLIT_FIX)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise LimitError(f"the {what} is not a regular file",
                             "give a YAML file; provision does not read pipes or devices")
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise LimitError(f"the {what} file is larger than the {MAX_BYTES} bytes provision "
                         "reads", _SPLIT_FIX)
    return data.decode("utf-8")


_SPLIT_FIX = ("an inventory is far smaller: check that the path is right, or split the "
              "variables into group_vars/ and host_vars/ files")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


class LimitsMixin:
    """A mixin for a PyYAML loader class (before ``yaml.SafeLoader`` in the bases) that
    enforces :data:`MAX_DEPTH`, :data:`MAX_ALIASES` and :data:`MAX_NODES` while composing.

    It overrides ``Composer.compose_node`` (one call per node, recursive per nesting level) and
    ``Composer.compose_document`` (to size the composed graph with every alias expanded).
    """

    _limit_depth = 0
    _limit_aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node, counting aliases and nesting depth.

        Raises:
            LimitError: too many aliases or nesting deeper than MAX_DEPTH.
        """
        if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
            self._limit_aliases += 1
            if self._limit_aliases > MAX_ALIASES:
                raise LimitError(f"the document uses more than {MAX_ALIASES} YAML aliases (*name)",
                                 "write the values out, or use group_vars/ for shared values",
                                 self.peek_event().start_mark)  # type: ignore[attr-defined]
        self._limit_depth += 1
        try:
            if self._limit_depth > MAX_DEPTH:
                raise LimitError(f"the document nests lists, mappings or groups more than "
                                 f"{MAX_DEPTH} levels deep",
                                 "flatten the structure (an inventory needs a few levels)",
                                 self.peek_event().start_mark)  # type: ignore[attr-defined]
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._limit_depth -= 1

    def compose_document(self) -> Any:
        """Compose the document, then refuse it when it expands to more than MAX_NODES nodes.

        Raises:
            LimitError: the expanded document is too large (an alias bomb).
        """
        node = super().compose_document()  # type: ignore[misc]
        if node is not None:
            check_expansion(node)
        return node


def check_expansion(root: yaml.Node) -> None:
    """Count the nodes of ``root`` with every alias expanded (memoised per node, so linear in
    the composed graph, which PyYAML keeps acyclic: a recursive alias is a ComposerError).

    Raises:
        LimitError: more than MAX_NODES nodes.
    """
    sizes: dict[int, int] = {}
    order: list[yaml.Node] = []
    stack: list[yaml.Node] = [root]
    seen: set[int] = set()
    while stack:  # iterative post-order: children before parents
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        stack.extend(_children(node))
    for node in reversed(order):
        total = 1 + sum(sizes.get(id(child), 1) for child in _children(node))
        sizes[id(node)] = total
        if total > MAX_NODES:
            raise LimitError(f"the document expands to more than {MAX_NODES} values once its "
                             "YAML aliases (*name) are resolved (an alias bomb?)",
                             "write the values out without nested aliases", node.start_mark)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class LimitedSafeLoader(LimitsMixin, yaml.SafeLoader):
    """``yaml.SafeLoader`` with the bounds of this module (for ``-e`` values and files)."""


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` within the bounds of this module.

    Raises:
        LimitError: a bound was exceeded. yaml.YAMLError: invalid YAML.
    """
    loader = LimitedSafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def reader_error_position(text: str, error: yaml.reader.ReaderError) -> tuple[int, int]:
    """1-based (line, column) of the character a ``ReaderError`` names (it gives an offset)."""
    before = text[:max(error.position, 0)]
    return before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1


def describe_reader_error(error: yaml.reader.ReaderError) -> str:
    """The character a ``ReaderError`` names, in words (``NUL (#x0000)``)."""
    code = error.character if isinstance(error.character, int) else ord(str(error.character)[:1]
                                                                          or "\0")
    name = {0: "NUL", 7: "BEL", 8: "backspace", 27: "ESC", 127: "DEL"}.get(code, "a control "
                                                                                "character")
    return f"{name} (#x{code:04x})"
