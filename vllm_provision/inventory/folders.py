"""Walk an inventory's folders (``-i folder``, ``group_vars/``, ``host_vars/``) with bounds.

Ansible follows symbolic links in these folders, and so do we, but a link that points back at a
folder holding it (``group_vars/all/loop -> ..``) would make the walk endless, and a link to
itself (``a -> a``) makes ``stat(2)`` fail with ``ELOOP`` ("Too many levels of symbolic
links", path_resolution(7)). A walk here tracks the real paths (``os.path.realpath``) of the
folders it is inside: a folder whose real path is one of them is a loop and is refused with its
path, as is a link that cannot be resolved because of a loop. A folder reached twice by
different links (not a loop) is read twice, as Ansible does, but one walk enters at most
:data:`MAX_FOLDERS` folders, so links that fan out cannot multiply the work without bound.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from vllm_provision.inventory.source import Problems

MAX_FOLDERS = 1000
"""The most folders one walk enters (links included): far above any inventory layout."""
Place = tuple[frozenset[str], str]
"""Where a walk is: the real paths of the folders it is inside, and that of the innermost."""
_LOOP_FIX = ("remove the symbolic link, or point it at a folder outside the inventory folder "
             "(a link may not lead back to a folder that holds it)")


def link_loop(path: Path) -> bool:
    """True when ``path`` is a symbolic link that cannot be resolved because links loop
    (``ELOOP``): ``a -> a``, or ``a -> b`` with ``b -> a``."""
    if not path.is_symlink():
        return False
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


class FolderWalk:
    """The state of one walk down a folder tree that follows symbolic links.

    Args:
        root: the folder the walk starts in.
        problems: where a loop or an exceeded cap is recorded (with the path).
        what: what the folder is, for messages (``"inventory folder"``, ``"group_vars"``).
    """

    def __init__(self, root: Path, problems: Problems, what: str) -> None:
        self.problems = problems
        self.what = what
        self.entered = 0
        self.full = False
        real = os.path.realpath(root)
        self.root: Place = (frozenset({real}), real)

    def enter(self, folder: Path, above: Place) -> Place | None:
        """Check that the walk may go into ``folder``, a sub-folder of the folder ``above``
        (the real paths of the folders the walk is inside, and the real path of the last).

        Returns:
            the place of ``folder``, or None when it is refused (a loop, or more than
            :data:`MAX_FOLDERS` folders entered; the problem is recorded).
        """
        chain, parent = above
        # only a link needs resolving: a plain folder's real path is its parent's plus its name
        # (resolving every one would cost a deep tree the square of its depth)
        real = os.path.realpath(folder) if folder.is_symlink() else os.path.join(parent,
                                                                                 folder.name)
        if real in chain:
            self.problems.add(str(folder), f"symbolic link loop in the {self.what}: this folder "
                              f"is {real}, which holds it", fix=_LOOP_FIX)
            return None
        self.entered += 1
        if self.entered > MAX_FOLDERS:
            if not self.full:
                self.problems.add(str(folder), f"the {self.what} has more than {MAX_FOLDERS} "
                                  "folders (symbolic links included)",
                                  fix="remove symbolic links that lead to the same folders "
                                      "again, or flatten the folder")
            self.full = True
            return None
        return chain | {real}, real

    def loop(self, path: Path) -> bool:
        """True, with a problem recorded, when ``path`` is a symbolic link that loops
        (:func:`link_loop`)."""
        if not link_loop(path):
            return False
        self.problems.add(str(path), f"symbolic link loop in the {self.what}: the link cannot "
                          "be resolved (Too many levels of symbolic links)", fix=_LOOP_FIX)
        return True

    def files(self, folder: Path, place: Place, *, keep: Callable[[str], bool],
              descend: Callable[[Path], bool], unreadable: str) -> Iterator[Path]:
        """The entries below ``folder`` (at ``place``) that the walk does not go into, depth
        first, each folder in sorted order, without recursion (a deep tree of folders must not
        exhaust Python's stack).

        Args:
            folder: the folder to list; ``place`` is its place (:meth:`enter`).
            keep: whether an entry name is listed at all (hidden, ignored names are not).
            descend: whether an entry is a folder to walk into (through :meth:`enter`); the
                other entries are yielded, links that loop left out (:meth:`loop`).
            unreadable: the problem recorded for a folder that cannot be listed (the
                ``strerror`` of ``listdir(2)`` follows it).
        """
        stack: list[tuple[list[Path], Place]] = []

        def push(current: Path, at: Place) -> None:
            try:
                names = sorted(os.listdir(current))
            except OSError as exc:
                self.problems.add(str(current), f"{unreadable}: {exc.strerror}",
                                  fix="check its permissions")
                return
            stack.append(([current / n for n in reversed(names) if keep(n)], at))

        push(folder, place)
        while stack:
            entries, at = stack[-1]
            if not entries:
                stack.pop()
                continue
            entry = entries.pop()
            if self.loop(entry):
                continue
            if descend(entry):
                inner = self.enter(entry, at)
                if inner is not None:
                    push(entry, inner)
            else:
                yield entry
