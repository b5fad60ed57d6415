"""Read ``group_vars/`` and ``host_vars/`` beside the inventory file, as Ansible does.

Ansible's ``host_group_vars`` vars plugin and ``DataLoader.find_vars_files`` (ansible-core
``parsing/dataloader.py``): for a group or host NAME the first that exists of ``NAME``,
``NAME.yml``, ``NAME.yaml`` and ``NAME.json`` is read; when it is a folder, every file in it with
no extension or one of ``.yml``, ``.yaml``, ``.json`` is read, folders without an extension
recursively, each level in sorted order (a later file wins). Hidden entries and names ending in
``~`` are skipped; empty files are ignored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from vllm_provision.inventory.folders import FolderWalk, link_loop
from vllm_provision.inventory.source import Problems, Setting, read_yaml
from vllm_provision.settings import variables

EXTENSIONS = ("", ".yml", ".yaml", ".json")
_SKIPPED_SUFFIXES = ("~", ".bak", ".orig", ".swp", ".retry")


def _dir_files(folder: Path, walk: FolderWalk) -> list[Path]:
    """``DataLoader._get_dir_vars_files``: sorted per level, recursing into folders that have
    no extension; depth first without recursion, symbolic link loops refused (``walk``)."""
    found: list[Path] = []
    place = walk.enter(folder, walk.root)
    if place is None:
        return found

    def descend(entry: Path) -> bool:
        return entry.is_dir() and not os.path.splitext(entry.name)[1]

    for entry in walk.files(folder, place, keep=lambda n: not n.startswith(".")
                            and not n.endswith("~"), descend=descend,
                            unreadable="the folder cannot be read"):
        if entry.is_file() and os.path.splitext(entry.name)[1] in EXTENSIONS:
            found.append(entry)
    return found


def _files_for(folder: Path, name: str, problems: Problems, kind: str) -> list[Path]:
    walk = FolderWalk(folder, problems, f"{kind}_vars folder")
    for extension in EXTENSIONS:
        candidate = folder / f"{name}{extension}"
        if walk.loop(candidate):
            return []
        if candidate.is_dir():
            return _dir_files(candidate, walk)
        if candidate.exists():
            return [candidate]
    return []


def _entry_name(path: Path) -> str:
    return path.name if path.is_dir() else path.stem if path.suffix in EXTENSIONS else path.name


def read_vars_dir(folder: Path, names: Iterable[str], problems: Problems, *,
                  kind: str) -> dict[str, dict[str, Setting]]:
    """Read the vars files of every name in ``names`` from ``folder``.

    Entries that name no known group/host are ignored (one folder is often shared by several
    inventories), unless the name is close to a known one, which is reported as a likely typo.

    Args:
        folder: ``<inventory folder>/group_vars`` or ``.../host_vars`` (may not exist).
        names: the known group names or host names.
        problems: where problems are recorded (YAML errors, non-mapping files, typos).
        kind: ``"group"`` or ``"host"``, for messages.

    Returns:
        ``{name: {variable: Setting}}``, a later file winning within one name.
    """
    known = list(names)
    result: dict[str, dict[str, Setting]] = {}
    if link_loop(folder):
        problems.add(str(folder), f"the {kind}_vars folder is a symbolic link loop (Too many "
                     "levels of symbolic links)", fix="remove the link, or point it at a folder")
        return result
    if not folder.is_dir():
        return result
    for name in known:
        merged: dict[str, Setting] = {}
        for path in _files_for(folder, name, problems, kind):
            doc = read_yaml(path, problems, what=f"{kind}_vars", empty_ok=True)
            if doc is None:
                continue
            for key, value in doc.data.items():
                if not isinstance(key, str):
                    problems.add(doc.origin((key,)).where, "a variable name must be a string",
                                 actual=repr(key), fix="rename the variable")
                    continue
                merged[key] = Setting(value, doc.origin((key,)))
        if merged:
            result[name] = merged
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(_SKIPPED_SUFFIXES) or (
                not entry.is_dir() and os.path.splitext(entry.name)[1] not in EXTENSIONS):
            continue  # Ansible never reads it (a .txt, a backup): not a typo of a name
        name = _entry_name(entry)
        if name in known:
            continue
        guess = variables.suggest(name, known)
        if guess is not None:
            problems.add(str(entry), f"{kind}_vars entry {name!r} names no {kind} of the "
                         f"inventory; did you mean {guess!r}?", actual=repr(name),
                         fix=f"rename it to {guess}")
    return result
