"""Read an inventory source (a YAML file, an INI file, or a directory of them) into one tree.

Ansible's inventory manager (ansible-core ``inventory/manager.py``, ``parse_source``): a directory
is read entry by entry in sorted order, recursively, skipping hidden entries, ``group_vars``,
``host_vars`` and ``vars_plugins`` and names ending in one of ``INVENTORY_IGNORE_EXTS`` (default
``.pyc .pyo .swp .bak ~ .rpm .md .txt .rst .orig .cfg .retry``). Each file is offered to the
``yaml`` plugin, then to the ``ini`` plugin; here the format is decided by content
(:func:`~.ini.looks_like_ini`, then a YAML parse), never by the file name. No file is ever
executed: a dynamic inventory script or an inventory plugin configuration (``plugin:``) is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

from vllm_provision.inventory.folders import FolderWalk, link_loop
from vllm_provision.inventory.ini import add_ini, looks_like_ini
from vllm_provision.inventory.source import Problems, read_text, read_yaml
from vllm_provision.inventory.tree import Tree, add_yaml, finish_tree

# ansible-core config/base.yml INVENTORY_IGNORE_EXTS default (REJECT_EXTS + .orig .cfg .retry)
IGNORE_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig",
               ".cfg", ".retry")
# ansible-core inventory/manager.py IGNORED_ALWAYS
_IGNORED_ALWAYS = re.compile(r"^\.|^host_vars$|^group_vars$|^vars_plugins$")
# "key: value", "- item" or "---" at the start of a line: the text was meant as YAML.
_YAML_KEY_RE = re.compile(r"^\s*([^\s#;=\[][^\s=]*:|-|---)(\s|$)", re.MULTILINE)
MAX_FILES = 1000


def ignored(name: str) -> bool:
    """True when Ansible skips the directory entry ``name`` of an inventory directory."""
    return bool(_IGNORED_ALWAYS.search(name)) or name.endswith(IGNORE_EXTS)


def vars_base(path: Path) -> Path:
    """The folder whose ``group_vars/`` and ``host_vars/`` belong to the source ``path``: the
    directory itself, or the file's folder (Ansible's ``basedir`` of the source)."""
    return path if path.is_dir() else path.parent


def inventory_files(path: Path, problems: Problems) -> list[Path]:
    """The files of the inventory directory ``path`` that Ansible reads, in its order.

    Symbolic links are followed; a link loop (:class:`~.folders.FolderWalk`) and a folder of
    more than :data:`MAX_FILES` files are refused with their path.
    """
    found: list[Path] = []
    walk_state = FolderWalk(path, problems, "inventory folder")
    for entry in walk_state.files(path, walk_state.root, keep=lambda n: not ignored(n),
                                  descend=Path.is_dir,
                                  unreadable="the inventory folder cannot be read"):
        if len(found) < MAX_FILES:
            found.append(entry)
        else:
            problems.add(str(path), f"the inventory folder holds more than {MAX_FILES} "
                         "inventory files", expected=f"at most {MAX_FILES} files",
                         fix="move files that are not inventories out of the folder, or merge "
                             "inventory files")
            break
    return found


def _add_file(tree: Tree, path: Path, problems: Problems, *, in_directory: bool) -> bool:
    """Add one inventory file to ``tree``; False when it could not be read or parsed at all."""
    text = read_text(path, problems, "inventory")
    if text is None:
        return False
    if text.startswith("#!"):
        problems.add(str(path), "this looks like a dynamic inventory script (it starts with "
                     "'#!'); provision never runs inventory scripts",
                     fix="save its output as a file: ansible-inventory -i SCRIPT --list --yaml "
                         "> hosts.yml" + (", and move the script out of the folder"
                                          if in_directory else ""))
        return False
    if looks_like_ini(text) or (in_directory and not _significant(text)):
        before = len(problems.items)
        add_ini(tree, path, text, problems)
        return len(problems.items) == before  # Ansible's INI errors stop the parse
    yaml_problems = Problems()
    doc = read_yaml(path, yaml_problems, what="inventory", text=text)
    if doc is not None and not yaml_problems:
        if "plugin" in doc.data and not isinstance(doc.data.get("plugin"), dict | type(None)):
            problems.add(f"{path}: plugin", "this is an inventory plugin configuration "
                         f"(plugin: {str(doc.data['plugin'])[:60]}); provision reads only "
                         "static YAML and INI inventories",
                         fix="save its output as a file: ansible-inventory -i FILE --list "
                             "--yaml > hosts.yml")
            return False
        add_yaml(tree, doc, problems)
        return True
    if doc is None and _significant(text) and not _YAML_KEY_RE.search(text):
        ini_problems = Problems()
        scratch = Tree()
        add_ini(scratch, path, text, ini_problems)
        if not ini_problems:
            add_ini(tree, path, text, problems)
            return True
        problems.extend(ini_problems)  # an INI file: never a YAML parser error
        return False
    problems.extend(yaml_problems)
    return False


def _significant(text: str) -> bool:
    return any(line.strip() and not line.strip().startswith(("#", ";"))
               for line in text.splitlines())


def read_inventory(path: Path, problems: Problems) -> Tree | None:
    """Read the inventory source ``path`` (a file, or a directory of files) into one tree.

    Args:
        path: the ``-i`` argument.
        problems: where every problem is recorded, with its file (and line when known).

    Returns:
        the finished tree (:func:`~.tree.finish_tree`), or None when the source cannot be used.
    """
    path = Path(path)
    tree = Tree(file=str(path))
    tree.group("all", ("all",))
    if link_loop(path):
        problems.add(str(path), "the inventory path is a symbolic link loop (Too many levels of "
                     "symbolic links)", fix="give the file or folder the link should lead to")
        return None
    if path.is_dir():
        files = inventory_files(path, problems)
        if not files and not problems:
            problems.add(str(path), "the inventory folder holds no inventory file",
                         expected="YAML or INI inventory files (hidden files, group_vars/, "
                                  "host_vars/ and " + " ".join(IGNORE_EXTS) + " are skipped)",
                         fix="add an inventory file to the folder, or give the file with -i")
            return None
        used = [_add_file(tree, file, problems, in_directory=True) for file in files]
    else:
        used = [_add_file(tree, path, problems, in_directory=False)]
    if not all(used):
        return None
    return finish_tree(tree, problems, lambda key: f"{path}: " + ".".join(map(str, key)))
