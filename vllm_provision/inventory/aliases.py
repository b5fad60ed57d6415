"""Ansible's legacy connection variable names (``ansible_ssh_host`` ...), honoured as ansible-core
honours them.

ansible-core reads both names of each pair (``constants.MAGIC_VARIABLE_MAPPING`` and the ``vars``
lists of the ``ssh`` connection plugin). When both are set for a host, the ``ansible_ssh_*`` name
wins: ``PlayContext.set_task_and_variable_override`` takes the first name of
``remote_addr=('ansible_ssh_host', 'ansible_host')`` that is set, and the config manager's
``_loop_entries`` keeps the last of ``vars: [ansible_host, ansible_ssh_host]``.

``ansible_ssh_private_key_file`` is not an alias here: it is the name Ansible's documentation
("Connecting to hosts: behavioral inventory parameters") and this tool use; its newer spelling
``ansible_private_key_file`` is read as the same variable, ``ansible_ssh_private_key_file``
winning when both are set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from vllm_provision.inventory.source import Setting

# legacy name -> the variable it sets (and is validated as)
DEPRECATED: dict[str, str] = {
    "ansible_ssh_host": "ansible_host",
    "ansible_ssh_port": "ansible_port",
    "ansible_ssh_user": "ansible_user",
    "ansible_ssh_pass": "ansible_password",
    "ansible_ssh_password": "ansible_password",
}
# other spellings of a variable, read without a warning
SYNONYMS: dict[str, str] = {"ansible_private_key_file": "ansible_ssh_private_key_file"}
ALIASES: dict[str, str] = {**DEPRECATED, **SYNONYMS}

log = logging.getLogger("vllm_provision.inventory")


def canonical(name: str) -> str:
    """The variable ``name`` sets: ``ansible_ssh_host`` -> ``ansible_host``; other names are
    returned unchanged."""
    return ALIASES.get(name, name)


def warn_deprecated(name: str, where: str) -> None:
    """Log one line (a warning, on stderr) for a legacy name written at ``where``; the loader
    checks each written value once, so a group variable warns once, not once per host."""
    if name not in DEPRECATED:
        return
    log.warning("%s: %s is deprecated; use %s instead (it is still honoured, and wins over %s "
                "when both are set, as in ansible-core)", where, name, DEPRECATED[name],
                DEPRECATED[name])


def apply(settings: Mapping[str, Setting]) -> dict[str, Setting]:
    """Return a host's merged settings with each alias copied onto the variable it sets, a
    legacy name winning when both are set and ``ansible_ssh_private_key_file`` winning over
    ``ansible_private_key_file`` (see the module docstring); the alias itself is kept, as
    Ansible keeps it among the host's variables."""
    result = dict(settings)
    for alias, target in DEPRECATED.items():
        if alias in settings:
            result[target] = settings[alias]
    for synonym, target in SYNONYMS.items():  # the documented name wins over its synonym
        if synonym in settings and target not in settings:
            result[target] = settings[synonym]
    return result
