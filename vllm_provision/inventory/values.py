"""Check one variable's value against the variables table and convert it to its Python type."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from vllm_provision.core.quoting import find_control_chars
from vllm_provision.inventory import yaml_limits
from vllm_provision.inventory.source import Problems, Setting, UnsafeText, VaultValue
from vllm_provision.settings import kinds, variables
from vllm_provision.settings.variables import Variable

# ansible.module_utils.parsing.convert_bool: the strings Ansible reads as booleans.
_TRUE = frozenset({"y", "yes", "on", "1", "true", "t"})
_FALSE = frozenset({"n", "no", "off", "0", "false", "f"})
_INVALID = object()
# provision_owned_dirs of the inventory being loaded (set by the loader before it checks).
_owned_dirs: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "provision_owned_dirs", default=())


# The longest value a message repeats; a longer one is cut (an inventory value can be huge).
SHOW_MAX_CHARS = 200


# Options whose value is a secret: in vllm_extra_args it would land in the 0644 unit file, in
# `ps` output and in the state record. argparse (which `vllm serve` uses) also accepts any
# unambiguous prefix of a long option (allow_abbrev, Python's argparse docs), so a prefix down
# to the shortest one that no other vLLM option shares is refused too (`--api` and `--api-` are
# shared with --api-server-count, `--hf-` with --hf-overrides and --hf-config-path).
SECRET_OPTIONS = {
    "--api-key": ("--api-k", "vllm_api_key (written to the 0600 env file as VLLM_API_KEY)"),
    "--hf-token": ("--hf-t", "vllm_env: {HF_TOKEN: ...} (written to the 0600 env file)"),
}


def secret_option(option: str) -> str | None:
    """Return the secret-bearing option that ``option`` spells (itself, its ``_`` form or an
    abbreviation argparse would accept), or None.

    Args:
        option: a word of ``vllm_extra_args`` up to any ``=`` (``--api-key``, ``--api_k``).
    """
    normalized = "--" + option[2:].replace("_", "-") if option.startswith("--") else option
    for full, (shortest, _variable) in SECRET_OPTIONS.items():
        if len(normalized) >= len(shortest) and full.startswith(normalized):
            return full
    return None


def show(name: str, value: Any) -> str:
    """Render ``value`` for a message: masked when ``name`` is a secret, the value of a
    secret-bearing option (``--api-key K``, ``--api-key=K``) masked wherever it is written as
    text, and cut to :data:`SHOW_MAX_CHARS` characters."""
    if value is None:
        return "nothing (unset)"
    shown = variables.mask(name, value)
    if isinstance(shown, str) and shown == variables.MASK:
        return shown
    text = repr(_mask_secret_options(shown))
    return text if len(text) <= SHOW_MAX_CHARS else text[:SHOW_MAX_CHARS] + "... (cut)"


def _mask_secret_options(value: Any) -> Any:
    """``value`` with the word after a secret-bearing option (and the part after its ``=``)
    replaced by the mask, in a string of words or in a list of words."""
    if isinstance(value, str):
        return " ".join(_mask_secret_options(value.split(" ")))
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    hide_next = False
    for word in value:
        if hide_next:
            out.append(variables.MASK)
            hide_next = False
            continue
        text = str(word)
        option, equals, _rest = text.partition("=")
        if option.startswith("--") and secret_option(option) is not None:
            if equals:
                out.append(f"{option}={variables.MASK}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(word)
    return out


def _coerce(var: Variable, value: Any, *, from_command_line: bool) -> Any:
    """Return ``value`` as ``var.type`` or ``_INVALID``; strings of digits/booleans are read the
    way Ansible reads them (INI inventories and ``-e`` give strings)."""
    if var.type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        return _INVALID
    if var.type is int:
        if isinstance(value, bool):
            return _INVALID
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
        return _INVALID
    if var.type is float:
        if isinstance(value, bool):
            return _INVALID
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                return _INVALID
            return number if number == number and abs(number) != float("inf") else _INVALID
        return _INVALID
    if var.type is str:
        if isinstance(value, str):
            return value
        # A YAML number for a version pin or a name (vllm_version: 0.12) is meant as text.
        if isinstance(value, int | float) and not isinstance(value, bool) and var.name.endswith(
                "_version"):
            return str(value)
        return _INVALID
    if from_command_line and isinstance(value, str):
        try:
            value = yaml_limits.safe_load(value)
        except (yaml.YAMLError, yaml_limits.LimitError):
            return _INVALID
    if var.type is list:
        if not isinstance(value, list):
            return _INVALID
        if var.items is int:  # integers only: a "2" or a 2.0 is not a GPU index
            if not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
                return _INVALID
            return [int(item) for item in value]
        if not all(isinstance(item, str | int | float) and not isinstance(item, bool)
                   for item in value):
            return _INVALID
        return [item if isinstance(item, str) else str(item) for item in value]  # !unsafe kept
    if var.type is dict:
        if not isinstance(value, Mapping):
            return _INVALID
        if not all(isinstance(item, str | int | float | bool) for item in value.values()):
            return _INVALID
        return {str(k): (str(v).lower() if isinstance(v, bool) else
                         v if isinstance(v, str) else str(v))  # !unsafe kept
                for k, v in value.items()}
    return _INVALID


def _strings_of(value: Any) -> list[tuple[str | int | None, str]]:
    """Every string inside ``value`` with its sub-key (None for the value itself)."""
    if isinstance(value, str):
        return [(None, value)]
    if isinstance(value, list):
        return [(index, item) for index, item in enumerate(value) if isinstance(item, str)]
    if isinstance(value, dict):
        pairs: list[tuple[str | int | None, str]] = []
        for key, item in value.items():
            pairs.append((key, key))
            pairs.append((key, item))
        return pairs
    return []


def _check_role_default(name: str, setting: Setting, problems: Problems) -> Setting | None:
    """Check an override of a role default (roles/*/defaults/main.yml): same kind of value as
    the default (a number for a number), one line, no control characters."""
    where = setting.origin.where
    default, value = variables.role_defaults()[name], setting.value
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, str) \
            and value.strip().lstrip("-").isdigit():
        value = int(value)  # `-e vllm_restart_sec=3` arrives as text, as in Ansible
    if isinstance(default, (int, float)) and not isinstance(default, bool) and (
            isinstance(value, bool) or not isinstance(value, (int, float))):
        problems.add(where, f"{name} has the wrong type", expected="a number (as its role "
                     f"default {default!r})", actual=show(name, value),
                     fix=f"write e.g. {name}: {default}")
        return None
    for _sub_key, text in _strings_of(value):
        found = find_control_chars(text)
        if found is not None:
            problems.add(where, f"{name} contains {found}; it would end up in a unit file, env "
                         "file or shell command, where a line break can add a directive",
                         expected="a single line without control characters",
                         actual=show(name, text), fix="remove the line break or control character")
            return None
    if not _kind_ok(name, value, setting, problems):
        return None
    return replace(setting, value=value)


def _kind_ok(name: str, value: Any, setting: Setting, problems: Problems) -> bool:
    """Apply the rule of ``name``'s kind (:mod:`vllm_provision.settings.kinds`); record a problem
    and
    return False when the value breaks it."""
    kind = kinds.kind_of(name)
    if kind is None:
        return True
    where = setting.origin.where
    if kind in kinds.STRUCTURED and isinstance(value, str) and ("{{" in value or "{%" in value):
        problems.add(where, f"{name} holds a Jinja template, which the inventory loader does "
                     f"not evaluate ({name} is checked as a {kind.replace('_', ' ')})",
                     actual=show(name, value), fix="write the value itself")
        return False
    wrong = kinds.check(name, value, _owned_dirs.get())
    if wrong is None:
        return True
    problems.add(where, f"{name} has an invalid value", expected=wrong,
                 actual=show(name, value), fix=_kind_fix(name, kind))
    return False


def _kind_fix(name: str, kind: str) -> str:
    default = variables.role_defaults().get(name)
    if default is None and name in variables.VARIABLES:
        default = variables.VARIABLES[name].example
    example = f"write e.g. {name}: {default}" if default is not None and not is_template(
        default) else f"write a valid {kind.replace('_', ' ')}"
    if kind in kinds.OWNED:
        example += ("; a directory outside the tool's prefixes needs provision_owned_dirs: "
                    "[DIR] (never a system directory)")
    return example


def is_template(value: Any) -> bool:
    """True when ``value`` is a string holding Jinja2 markup."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def check_setting(name: str, setting: Setting, problems: Problems) -> Setting | None:
    """Validate one variable as written in one place and return it converted to its type.

    Unknown variables with a prefix we own (``vllm_``, ``ray_``, ``provision_``) are errors with
    a "did you mean"; other unknown variables pass through untouched (Ansible inventories carry
    many). Known variables are checked for type, range, choices, extra rules and control
    characters (a newline in a value that lands in a unit file could add a directive).

    Args:
        name: the variable name.
        setting: its value and origin.
        problems: where problems are recorded.

    Returns:
        the setting with a converted value, or None when it is invalid (a problem was recorded).
    """
    where = setting.origin.where
    var = variables.VARIABLES.get(name)
    if var is None and name in variables.role_defaults():
        return _check_role_default(name, setting, problems)
    if var is None:
        if variables.is_owned(name):
            guess = variables.suggest(name, variables.VARIABLES)
            problems.add(where, f"unknown variable {name!r}"
                         + (f"; did you mean {guess!r}?" if guess else ""),
                         actual=show(name, setting.value),
                         fix=f"rename it to {guess}" if guess else
                         "remove it or see docs/inventory.md for the variables we read")
            return None
        return setting
    value = setting.value
    if isinstance(value, VaultValue):
        problems.add(where, f"{name} is encrypted with Ansible Vault, which provision cannot "
                     "decrypt", actual="!vault ...",
                     fix=f"give {name} in plain text, e.g. in a 0600 host_vars file")
        return None
    if isinstance(value, str) and "{{" in value and not isinstance(value, UnsafeText):
        problems.add(where, f"{name} holds a Jinja template, which the inventory loader does "
                     "not evaluate", expected=var.expected(), actual=show(name, value),
                     fix="write the value itself")
        return None
    converted = _coerce(var, value, from_command_line=setting.origin.file is None)
    if converted is _INVALID:
        fix = f"write {name}: {var.example}"
        if var.type is list and var.items is int:
            fix = f"write a list of integers (no quotes), e.g. {name}: {var.example}"
        elif var.type is list and isinstance(value, str):
            fix = f"write one list item per word, e.g. {name}: {var.example}"
        problems.add(where, f"{name} has the wrong type", expected=var.expected(),
                     actual=show(name, value), fix=fix)
        return None
    for sub_key, text in _strings_of(converted):
        if sub_key is not None and is_template(text) and not isinstance(text, UnsafeText):
            problems.add(setting.origin.child(sub_key).where, f"{name} holds a Jinja template, "
                         "which the inventory loader does not evaluate",
                         actual=show(name, text) if not variables.is_secret_name(
                             str(sub_key)) else variables.MASK,
                         fix="write the value itself (or tag it !unsafe to keep '{{' as text)")
            return None
        found = find_control_chars(text)
        if found is not None:
            sub = setting.origin.child(sub_key).where if sub_key is not None else where
            problems.add(sub, f"{name} contains {found}; it would end up in a unit file, env "
                         "file or shell command, where a line break can add a directive",
                         expected="a single line without control characters",
                         actual=show(name, text) if not variables.is_secret_name(
                             str(sub_key)) else variables.MASK,
                         fix="remove the line break or control character")
            return None
    wrong = None
    if var.choices and converted not in var.choices:
        wrong = var.expected()
    elif var.type is int and (
            (var.minimum is not None and converted < var.minimum)
            or (var.maximum is not None and converted > var.maximum)):
        wrong = var.expected()
    elif var.check is not None:
        wrong = var.check(converted)
    if wrong is not None:
        problems.add(where, f"{name} has an invalid value", expected=wrong,
                     actual=show(name, value), fix=f"write e.g. {name}: {var.example}")
        return None
    if not _kind_ok(name, converted, setting, problems):
        return None
    return Setting(converted, setting.origin)
