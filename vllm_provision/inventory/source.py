"""Read one YAML file of an inventory, remembering where each key is and collecting problems."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vllm_provision.core.errors import InventoryError, Problem
from vllm_provision.inventory import yaml_limits

KeyPath = tuple[str | int, ...]
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def render_key_path(path: KeyPath) -> str:
    """Render a key path as text: ``all.hosts.h1.vllm_node_rank``, ``vllm_extra_args[2]``,
    ``all.hosts["10.0.0.1"].ansible_port`` (keys with dots or spaces are quoted)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not isinstance(part, str):  # a YAML key such as null or true
            text += f"[{part!r}]"
        elif _PLAIN_KEY_RE.match(part):
            text += f".{part}" if text else part
        else:
            text += f'["{part}"]'
    return text


@dataclass(frozen=True)
class Origin:
    """Where a value was written.

    Attributes:
        file: the YAML file, or None for a ``-e`` extra var.
        key: the key path inside the file (``("all", "vars", "vllm_api_port")``).
        line: 1-based line of the key when known.
    """

    file: Path | None
    key: KeyPath
    line: int | None = None

    def child(self, part: str | int, line: int | None = None) -> Origin:
        """Return the origin of an item inside this value (a list index or a mapping key)."""
        return Origin(self.file, (*self.key, part), line if line is not None else self.line)

    @property
    def where(self) -> str:
        """``file:line: key.path``, or ``-e name`` for extra vars."""
        key = render_key_path(self.key)
        if self.file is None:
            return f"-e {key}"
        place = f"{self.file}:{self.line}" if self.line else str(self.file)
        return f"{place}: {key}" if key else place


@dataclass(frozen=True)
class Setting:
    """One variable as written in one place: its (validated) value and its origin."""

    value: Any
    origin: Origin


@dataclass
class Problems:
    """Collects every problem found, so the user sees them all at once.

    A problem recorded twice is kept once; the check uses a set beside :attr:`items`, so
    recording N problems costs N steps (a list scan per problem would cost N**2 and hang on an
    inventory of thousands of hosts with one problem each). Add problems with :meth:`add` or
    :meth:`extend`; :attr:`items` is read-only for everyone else.
    """

    items: list[Problem] = field(default_factory=list)
    _seen: set[Problem] = field(default_factory=set, repr=False, compare=False)

    def _record(self, problem: Problem) -> None:
        if len(self._seen) > len(self.items):
            self._seen = set(self.items)  # items was replaced from outside
        if problem not in self._seen:
            self._seen.add(problem)
            self.items.append(problem)

    def add(self, where: str, message: str, *, expected: str = "", actual: str = "",
            fix: str = "") -> None:
        """Record one problem (see :class:`~vllm_provision.core.errors.Problem` for the fields)."""
        self._record(Problem(where, message, expected, actual, fix))

    def extend(self, other: Problems) -> None:
        """Record every problem of ``other`` (a scratch collection), in its order."""
        for problem in other.items:
            self._record(problem)

    def raise_if_any(self) -> None:
        """Raise :class:`InventoryError` with every problem recorded so far, if any.

        Raises:
            InventoryError: at least one problem was recorded.
        """
        if self.items:
            raise InventoryError(list(self.items))

    def __bool__(self) -> bool:
        return bool(self.items)


@dataclass(frozen=True)
class VaultValue:
    """An Ansible Vault ``!vault`` value; we cannot decrypt it, so it may only pass through."""

    ciphertext: str

    def __str__(self) -> str:
        return "<vault-encrypted>"


@dataclass
class YamlDocument:
    """A parsed YAML file: its data and the line of every key path."""

    path: Path
    data: Any
    lines: dict[KeyPath, int]

    def origin(self, key: KeyPath) -> Origin:
        """Return the :class:`Origin` of ``key`` in this file, with its line when known."""
        line = self.lines.get(key)
        probe = key
        while line is None and probe:
            probe = probe[:-1]
            line = self.lines.get(probe)
        return Origin(self.path, key, line)


class _Loader(yaml_limits.LimitsMixin, yaml.SafeLoader):
    """PyYAML's safe loader plus Ansible's ``!vault`` and ``!unsafe`` tags."""


def _construct_vault(loader: yaml.SafeLoader, node: yaml.Node) -> VaultValue:
    return VaultValue(str(loader.construct_scalar(node)))  # type: ignore[arg-type]


class UnsafeText(str):
    """A string written with Ansible's ``!unsafe`` tag: never rendered as a template (the
    templating layer checks this type), otherwise a plain string."""

    __slots__ = ()


def _construct_unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    # Ansible's !unsafe only disables templating: the value itself is a string.
    return UnsafeText(loader.construct_scalar(node))  # type: ignore[arg-type]


_Loader.add_constructor("!vault", _construct_vault)
_Loader.add_constructor("!unsafe", _construct_unsafe)


def load_yaml_data(text: str) -> Any:
    """Parse one YAML document with the inventory's loader (safe, ``!vault`` and ``!unsafe``
    understood), for ``-e @file`` and ``-e '{...}'``.

    Raises:
        yaml.YAMLError: the text is not valid YAML.
    """
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


_KEY_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def _key_identity(key_node: yaml.Node) -> Any:
    """The key as Python will hold it: ``true``, ``1`` and ``1.0`` are the same dict key (a
    YAML 1.1 bool is an int), so two of them in one mapping collapse into one."""
    if not isinstance(key_node, yaml.ScalarNode):
        return ("node", str(key_node.value))
    try:
        value = _KEY_CONSTRUCTOR.construct_object(key_node)
        hash(value)
    except Exception:  # noqa: BLE001 - an unhashable or odd key: compare its text
        return ("text", key_node.value)
    return value


def _walk(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], duplicates: list) -> None:
    """Record the line of every key and every duplicate key under ``node``, including keys
    written differently that Python reads as one (``true`` and ``1``)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            line = key_node.start_mark.line + 1
            identity = _key_identity(key_node)
            if identity in seen:
                duplicates.append(((*path, key), seen[identity], line))
            seen[identity] = line
            lines[(*path, key)] = line
            _walk(value_node, (*path, key), lines, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _walk(item, (*path, index), lines, duplicates)


def _syntax_problem(path: Path, error: yaml.YAMLError, problems: Problems) -> None:
    mark = getattr(error, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    detail = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    if "\\t" in detail or "'\\t'" in str(error):
        problems.add(where, "YAML syntax error: a tab character is used for indentation",
                     expected="spaces for indentation (YAML forbids tabs)", actual="a tab",
                     fix="replace the tab with spaces (e.g. two spaces per level)")
        return
    message = f"YAML syntax error: {detail}" + (f" ({context})" if context else "")
    problems.add(where, message,
                 fix="correct the YAML at that line and column (check indentation, quotes, "
                     "and that a 'key: value' has a space after the colon)")


def read_text(path: Path, problems: Problems, what: str = "inventory") -> str | None:
    """Read one inventory or vars file as text, within the limits of
    :func:`vllm_provision.inventory.yaml_limits.read_regular_file` (a regular UTF-8 file, 8 MiB).

    Args:
        path: the file.
        problems: where a problem is recorded (missing, a folder, too large or not a regular
            file, unreadable, not UTF-8), naming the file and the fix.
        what: what the file is, for messages (``"inventory"``, ``"group_vars file"``).

    Returns:
        the text, or None when a problem was recorded.
    """
    try:
        return yaml_limits.read_regular_file(path, what)
    except yaml_limits.LimitError as exc:
        problems.add(str(path), exc.message, fix=exc.fix)
    except FileNotFoundError:
        problems.add(str(path), f"the {what} file does not exist",
                     fix="check the path given with -i (relative paths are relative to the "
                         "current folder)")
    except IsADirectoryError:
        problems.add(str(path), f"the {what} path is a folder, not a file",
                     expected="a YAML or INI file such as inventory/hosts.yml",
                     fix="give the file itself, or the inventory folder with -i")
    except (OSError, UnicodeDecodeError) as exc:
        problems.add(str(path), f"the {what} file cannot be read: {exc}",
                     fix="check the file's permissions and that it is UTF-8 text")
    return None


def read_yaml(path: Path, problems: Problems, *, what: str, empty_ok: bool = False,
              text: str | None = None) -> YamlDocument | None:
    """Parse ``path`` as one YAML document that must be a mapping.

    Args:
        path: the file.
        problems: where problems are recorded (missing file, syntax error with line and column,
            tabs, empty file, duplicate keys, not a mapping, Vault-encrypted file).
        what: what the file is, for messages (``"inventory"``, ``"group_vars file"``).
        empty_ok: an empty file (or one of comments only) is no problem and gives an empty
            document, as Ansible ignores empty vars files.
        text: the file's content when the caller has read it already.

    Returns:
        the document, or None when it could not be used (a problem was recorded).
    """
    if text is None:
        text = read_text(path, problems, what)
        if text is None:
            return None
    if text.startswith("$ANSIBLE_VAULT;"):
        problems.add(str(path), f"the {what} file is encrypted with Ansible Vault",
                     fix="provision cannot decrypt Vault files; decrypt it "
                         "(ansible-vault decrypt) or move its variables elsewhere")
        return None
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml_limits.LimitError as exc:
        problems.add(exc.where(path), exc.message, fix=exc.fix)
        return None
    except yaml.reader.ReaderError as exc:
        line, column = yaml_limits.reader_error_position(text, exc)
        problems.add(f"{path}:{line}:{column}", "the file holds "
                     f"{yaml_limits.describe_reader_error(exc)}, which YAML does not allow",
                     fix="remove the character (is this a binary file?)")
        return None
    except yaml.YAMLError as exc:
        _syntax_problem(path, exc, problems)
        return None
    finally:
        if loader is not None:
            loader.dispose()
    if data is None and empty_ok:
        return YamlDocument(path, {}, {})
    if data is None:
        problems.add(str(path), f"the {what} file is empty",
                     expected="a YAML mapping" + (" with a top-level 'all:' group"
                                                  if what == "inventory" else " of variables"),
                     fix="add content or remove the file")
        return None
    lines: dict[KeyPath, int] = {}
    duplicates: list[tuple[KeyPath, int, int]] = []
    if node is not None:  # data is not None, so the document has a root node
        _walk(node, (), lines, duplicates)
    for key, first, second in duplicates:
        problems.add(f"{path}:{second}: {render_key_path(key)}",
                     f"duplicate key (also on line {first}); YAML would silently keep only "
                     "the last one",
                     fix="merge the two entries into one")
    if not isinstance(data, Mapping):
        shape = type(data).__name__
        fix = ("write a mapping such as 'all: {children: {...}}', or an INI inventory "
               "starting with a [group] line"
               if what == "inventory" else "write 'name: value' lines")
        problems.add(str(path), f"the top level of the {what} file is not a mapping",
                     expected="a YAML mapping", actual=f"a {_yaml_kind(shape)}", fix=fix)
        return None
    return YamlDocument(path, data, lines)


def _yaml_kind(python_type: str) -> str:
    return {"list": "list", "str": "string (an INI file?)", "int": "number",
            "float": "number", "bool": "boolean"}.get(python_type, python_type)
