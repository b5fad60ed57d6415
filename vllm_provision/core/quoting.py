"""Quote values for the place they land: a POSIX shell, a systemd ``ExecStart=``, an env file.

Every inventory value that reaches a shell command, a unit file or an environment file goes
through one of these functions. A newline or other control character is refused outright: in a
unit file it would start a new line, i.e. a new directive such as ``ExecStartPre=``.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Sequence

from vllm_provision.core.errors import ProvisionError

# systemd.exec(5), "ENVIRONMENT": names are shell-style identifiers.
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# systemd.service(5) "COMMAND LINES": an argument needs quotes when it is empty or holds
# whitespace, a quote or a backslash (quotes and C escapes are interpreted anywhere in a word).
_EXEC_NEEDS_QUOTES_RE = re.compile(r"[\s\"'\\]")
# systemd.service(5): the first word may start with the special prefixes "@-:+!".
_EXEC_PREFIX_CHARS = "@-:+!"


def find_control_chars(value: str) -> str | None:
    """Return a description of the first control character in ``value``, or None if clean.

    Control characters are Unicode category ``Cc`` (``\\n``, ``\\r``, ``\\t``, NUL, DEL, ...) plus
    the line and paragraph separators U+2028/U+2029.

    Returns:
        e.g. ``"a newline (\\\\n) at position 4"``.
    """
    names = {"\n": "a newline (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab (\\t)",
             "\x00": "a NUL byte (\\x00)"}
    for index, char in enumerate(value):
        if unicodedata.category(char) == "Cc" or char in "\u2028\u2029":
            name = names.get(char, f"a control character (U+{ord(char):04X})")
            return f"{name} at position {index}"
    return None


def reject_control_chars(value: str, where: str) -> str:
    """Return ``value`` unchanged if it has no control characters; raise otherwise.

    Args:
        value: text bound for a shell command, a unit file or an env file.
        where: where the value comes from, for the message (``"inventory.yml: all.vars.x"``).

    Raises:
        ProvisionError: the value holds a newline, carriage return, tab or other control
            character, which could add a directive (``ExecStartPre=``) or a command.
    """
    found = find_control_chars(value)
    if found is not None:
        raise ProvisionError.single(
            where, f"the value contains {found}",
            expected="a single line without control characters",
            actual=repr(value),
            fix="remove the line break or control character; a value ends up on one line of a "
                "unit file, env file or shell command",
        )
    return value


def shell_quote(value: str) -> str:
    """Quote ``value`` as one word for a POSIX shell (``shlex.quote``).

    Raises:
        ValueError: ``value`` contains a control character.
    """
    _refuse_control_chars(value)
    return shlex.quote(value)


def quote(value: object) -> str:
    """Quote ``value`` (converted with ``str``) as one POSIX shell word; refuse control chars.

    The one quoting function of the task modules, the connection layer (``sudo_wrap``) and the
    ``quote`` template filter.

    Raises:
        ProvisionError: the value contains a newline or another control character.
    """
    try:
        return shell_quote(str(value))
    except ValueError as exc:
        raise ProvisionError.single("task argument", str(exc),
                                    fix="remove the line break or control character") from None


def shell_join(argv: Sequence[str]) -> str:
    """Quote every word of ``argv`` for a POSIX shell and join them with spaces.

    Raises:
        ValueError: a word contains a control character.
    """
    return " ".join(shell_quote(word) for word in argv)


def _systemd_escape_word(word: str) -> str:
    _refuse_control_chars(word)
    # "$$" is a literal "$" and "%%" a literal "%" (systemd.service(5) "COMMAND LINES",
    # systemd.unit(5) "SPECIFIERS"); both apply inside quotes too.
    escaped = word.replace("%", "%%").replace("$", "$$")
    if word == ";":
        # A lone ";" separates commands; "\;" is the documented literal semicolon.
        return "\\;"
    if word and not _EXEC_NEEDS_QUOTES_RE.search(word):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def systemd_exec_quote(argv: Sequence[str]) -> str:
    """Render ``argv`` as the value of ``ExecStart=`` (and the other ``Exec*=`` settings).

    Per systemd.service(5) "COMMAND LINES": words with whitespace, quotes or backslashes are
    double-quoted with ``\\\\`` and ``\\"`` escaped; ``$`` becomes ``$$`` (no variable
    expansion) and ``%`` becomes ``%%`` (no specifier expansion); a lone ``;`` becomes ``\\;``.

    Args:
        argv: the command and its arguments, at least one word; the first must not start with
            one of systemd's prefix characters ``@-:+!`` (write an absolute path).

    Raises:
        ValueError: ``argv`` is empty, the command word starts with a prefix character or is
            empty, or any word contains a control character (newline, tab, ...).
    """
    if not argv:
        raise ValueError("an ExecStart= command line needs at least one word")
    command = argv[0]
    if not command or command[0] in _EXEC_PREFIX_CHARS:
        raise ValueError(
            f"the command {command!r} would be read as systemd prefixes {_EXEC_PREFIX_CHARS!r}; "
            "give an absolute path")
    return " ".join(_systemd_escape_word(word) for word in argv)


def env_file_line(key: str, value: str) -> str:
    """Render one ``KEY="value"`` line of a systemd ``EnvironmentFile=`` (no trailing newline).

    Per systemd.exec(5) ``EnvironmentFile=`` (parsed by systemd's env-file parser, like a shell
    assignment): inside double quotes a backslash escapes ``"``, ``\\\\``, ``$`` and `````, so
    those four are escaped and everything else is literal. The value is always quoted so that
    leading/trailing whitespace, ``#`` and ``;`` survive.

    Args:
        key: the variable name, ``[A-Za-z_][A-Za-z0-9_]*``.
        value: the value, a single line.

    Raises:
        ValueError: ``key`` is not a valid name, or ``value`` contains a control character.
    """
    if not _ENV_NAME_RE.match(key):
        raise ValueError(f"{key!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    _refuse_control_chars(value)
    escaped = re.sub(r'(["\\$`])', r"\\\1", value)
    return f'{key}="{escaped}"'


def python_loader(script: str, *, name: str = "<script>", compress: bool = False) -> str:
    """``script`` (Python source, any number of lines) as ONE argument for ``python -c``: the
    source base64-encoded (base64 holds no quote, space or line break, so the word passes
    :func:`quote`'s rule against control characters), decoded and run as ``__main__`` on the
    host. ``compress``: zlib first (the 33 KB fact probe becomes about 14 KB). ``name``: the file
    name tracebacks show. Needs only Python's standard library, >= 3.8.

    A command built this way reads no standard input for its script, so a batch of reads or
    the run lock's holder can run it (docs/engine.md, "Round trips").
    """
    import base64
    import json
    import zlib

    data = script.encode()
    if compress:
        packed = base64.b64encode(zlib.compress(data, 9)).decode()
        return ('import base64,zlib;exec(compile(zlib.decompress(base64.b64decode("'
                + packed + f'")),{json.dumps(name)},"exec"))')
    return ('import base64;exec(compile(base64.b64decode("'
            + base64.b64encode(data).decode() + f'"),{json.dumps(name)},"exec"))')


def _refuse_control_chars(value: str) -> None:
    found = find_control_chars(value)
    if found is not None:
        raise ValueError(f"{value!r} contains {found}")


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal, for a label matcher such as
    ``{replica=<this>}`` in a generated rule or dashboard query.

    PromQL strings follow Go's escaping rules (Prometheus docs, "Querying basics", "String
    literals"): ``\\`` and ``"`` are escaped, and every character that is not a printable
    ASCII one is written as ``\\uXXXX`` / ``\\UXXXXXXXX``. ``$`` is written ``\\x24`` too:
    Grafana replaces ``$name`` and ``${name}`` in a panel's query with its template variables
    before Prometheus sees it (Grafana docs, "Variable syntax"), so a name holding ``$`` must
    not reach the query text as ``$``. The result is one string token whatever ``value`` holds.
    """
    out = ['"']
    for char in value:
        if char in '\\"':
            out.append("\\" + char)
        elif char == "$":
            out.append("\\x24")
        elif " " <= char <= "~":
            out.append(char)
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)
