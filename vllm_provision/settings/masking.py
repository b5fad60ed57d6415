"""Mask secret values in every text and value the run prints (messages, diffs, ``--json``)."""

from __future__ import annotations

import json
import re
import shlex
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from jinja2.utils import htmlsafe_json_dumps

from vllm_provision.core.models import Inventory
from vllm_provision.settings.variables import MASK, is_secret_name

# Shorter secrets would mask ordinary words in the output: vllm_provision.settings.variables
# refuses a
# shorter vllm_api_key (check_secret); other secret-named values (vllm_env: {HF_TOKEN: ...}) that
# are shorter are still masked, down to this length.
_MIN_SECRET_LENGTH = 4


class Masker:
    """Replaces every known secret value with ``********``.

    Secrets are the values of variables that ``vllm_provision.settings.variables.is_secret_name``
    marks
    (the table's ``secret`` flag, or names containing token/password/secret/api key), and the
    secret-named keys of mapping variables such as ``vllm_env``.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Create a masker for ``secrets`` (strings shorter than 4 characters are ignored).

        Each secret is matched in every encoding it can take on its way to the output: see
        :func:`encodings`.
        """
        self.secrets = _forms(secrets)

    @classmethod
    def from_inventory(cls, inventory: Inventory) -> Masker:
        """Collect the secrets of every host's variables and of ``-e``."""
        found: set[str] = set()
        for host in inventory.hosts.values():
            found.update(secret_values(host.vars))
        found.update(secret_values(inventory.extra_vars))
        for replica in inventory.replicas:
            if replica.engine.api_key:
                found.add(replica.engine.api_key)
        return cls(found)

    def add(self, values: Iterable[str]) -> None:
        """Add more secret values (e.g. a role default marked secret)."""
        self.secrets = sorted({*self.secrets, *_forms(values)}, key=len, reverse=True)

    def text(self, value: str) -> str:
        """Return ``value`` with every secret replaced by ``********``."""
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def data(self, value: Any) -> Any:
        """Return a copy of a JSON-like value with secrets masked in every string."""
        if value is None:
            return None
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: (MASK if is_secret_name(str(k)) and v else self.data(v))
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value


def encodings(secret: str) -> set[str]:
    """Every form ``secret`` takes in what the tool writes or prints, the raw one included.

    - JSON string bodies: ``json.dumps`` (``\\"``, ``\\\\``, ``\\uXXXX`` for non-ASCII),
      the same without ``ensure_ascii``, and Jinja's ``tojson`` filter (``htmlsafe_json_dumps``:
      also ``<`` ``>`` ``&`` ``'`` as ``\\u003c`` ...), which renders ``watchdog.json``;
    - Python ``repr`` bodies (error messages show values with ``!r``), of the raw and JSON forms;
    - POSIX shell: ``shlex.quote`` and the body it puts between single quotes;
    - systemd: ``Exec*=`` words (``$$``, ``%%``, ``\\"``, ``\\\\``; systemd.service(5)) and
      ``EnvironmentFile=`` values (``\\"``, ``\\\\``, ``\\$``, ``\\```; systemd.exec(5));
    - URLs: percent-encoding (``urllib.parse.quote``, ``quote_plus``).
    """
    forms = {secret}
    json_forms = {json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
                  str(htmlsafe_json_dumps(secret))[1:-1]}
    forms |= json_forms
    for form in (secret, *json_forms):
        forms.add(repr(form)[1:-1])
        # Inside a longer text, repr escapes whichever quote it delimits with.
        escaped = form.replace("\\", "\\\\")
        forms |= {escaped.replace("'", "\\'"), escaped.replace('"', '\\"')}
    quoted = shlex.quote(secret)
    forms |= {quoted, quoted[1:-1] if quoted.startswith("'") else quoted}
    exec_word = secret.replace("%", "%%").replace("$", "$$")
    forms |= {exec_word, exec_word.replace("\\", "\\\\").replace('"', '\\"')}
    forms.add(re.sub(r'(["\\$`])', r"\\\1", secret))
    forms |= {urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    return forms


def _forms(secrets: Iterable[str]) -> list[str]:
    """Every encoding of every secret long enough to mask, longest first (so a form that
    contains another is replaced whole)."""
    found: set[str] = set()
    for secret in secrets:
        if len(secret) >= _MIN_SECRET_LENGTH:
            found |= {form for form in encodings(secret) if len(form) >= _MIN_SECRET_LENGTH}
    return sorted(found, key=len, reverse=True)


def secret_values(variables: Mapping[str, Any]) -> set[str]:
    """Return the secret strings among ``variables`` (top-level names and nested mapping keys)."""
    found: set[str] = set()
    for name, value in variables.items():
        if is_secret_name(str(name)):
            if isinstance(value, str):
                found.add(value)
            continue
        if isinstance(value, Mapping):
            for key, inner in value.items():
                if is_secret_name(str(key)) and isinstance(inner, str):
                    found.add(inner)
    return found


# An env-file line (``NAME=value``, systemd.exec(5) EnvironmentFile=, ``export`` allowed) and a
# JSON member line (``"name": value,``, as ``tojson(indent=2)`` writes one per line).
_ENV_LINE = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)(\s*=\s*)(\S.*)$")
_JSON_LINE = re.compile(r'^(\s*)"((?:[^"\\]|\\.)*)"(\s*:\s*)(.*?)(,?)\s*$')
_JSON_EMPTY = ("null", '""', "{", "[", "{}", "[]")
HIDDEN_ONLY_SECRETS = "(diff hidden: the file holds nothing but secrets)"


def mask_line(masker: Masker, line: str) -> str:
    """Return one line of a file with secrets masked: every known secret value
    (:meth:`Masker.text`), and the value of a secret-named env variable (``HF_TOKEN=...``) or
    JSON member (``"api_key": "..."``) even when the masker does not know it
    (``vllm_provision.settings.variables.is_secret_name``)."""
    line = masker.text(line)
    env = _ENV_LINE.match(line)
    if env and is_secret_name(env.group(2)):
        return f"{env.group(1)}{env.group(2)}{env.group(3)}{MASK}"
    member = _JSON_LINE.match(line)
    if member and is_secret_name(member.group(2)) and member.group(4) not in _JSON_EMPTY:
        return f'{member.group(1)}"{member.group(2)}"{member.group(3)}"{MASK}"{member.group(5)}'
    return line


def mask_diff(masker: Masker, diff: str) -> str:
    """Return a unified diff with only the secrets masked, line by line (:func:`mask_line`), or
    :data:`HIDDEN_ONLY_SECRETS` when every line of content it shows holds a secret (a file that
    is nothing but secrets: even its shape would tell too much).

    Headers (``---``, ``+++``, ``@@``) are kept; comment lines (``#``), blank lines and JSON
    punctuation (``{``, ``},``) are not content. The rule: docs/security.md.
    """
    out: list[str] = []
    content = secret = 0
    for line in diff.splitlines(keepends=True):
        if line.startswith(("--- ", "+++ ", "@@")) or not line.strip():
            out.append(line)
            continue
        prefix, body = (line[0], line[1:]) if line[0] in " +-\\" else ("", line)
        ending = body[len(body.rstrip("\r\n")):]
        masked = mask_line(masker, body.rstrip("\r\n"))
        text = masked.strip()
        if prefix != "\\" and text and not text.startswith("#") and text.strip("{}[],") != "":
            content += 1
            secret += MASK in masked
        out.append(prefix + masked + ending)
    if content and secret == content:
        return HIDDEN_ONLY_SECRETS
    return "".join(out)
