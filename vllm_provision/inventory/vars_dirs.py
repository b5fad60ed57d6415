"""Read ``group_vars/`` and ``host_vars/`` beside the inventory file, as Ansible does.

Ansible's ``host_group_vars`` vars plugin: for a group or host NAME it reads ``NAME``,
``NAME.yml``, ``NAME.yaml`` and ``NAME.json``, and when ``NAME`` is a folder every such file under
it, sorted by path (a later file wins). Hidden files and backups (``~``, ``.bak``, ``.orig``) are
skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from vllm_provision import variables
from vllm_provision.inventory.source import Problems, Setting, read_yaml

EXTENSIONS = ("", ".yml", ".yaml", ".json")
_SKIPPED_SUFFIXES = ("~", ".bak", ".orig", ".swp", ".retry")


def _is_vars_file(path: Path) -> bool:
    return (path.is_file() and not path.name.startswith(".")
            and not path.name.endswith(_SKIPPED_SUFFIXES) and path.suffix in EXTENSIONS[1:])


def _files_for(folder: Path, name: str) -> list[Path]:
    files: list[Path] = []
    for extension in EXTENSIONS:
        candidate = folder / f"{name}{extension}"
        if candidate.is_file():
            files.append(candidate)
        elif extension == "" and candidate.is_dir():
            files.extend(sorted(p for p in candidate.rglob("*") if _is_vars_file(p)))
    return files


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
    if not folder.is_dir():
        return result
    for name in known:
        merged: dict[str, Setting] = {}
        for path in _files_for(folder, name):
            doc = read_yaml(path, problems, what=f"{kind}_vars")
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
        if entry.name.startswith(".") or entry.name.endswith(_SKIPPED_SUFFIXES):
            continue
        name = _entry_name(entry)
        if name in known:
            continue
        guess = variables.suggest(name, known)
        if guess is not None:
            problems.add(str(entry), f"{kind}_vars entry {name!r} names no {kind} of the "
                         f"inventory; did you mean {guess!r}?", actual=repr(name),
                         fix=f"rename it to {guess}")
    return result
