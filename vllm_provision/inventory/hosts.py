"""Merge a host's variables with Ansible's precedence and resolve its connection settings."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_provision.core.models import Host
from vllm_provision.inventory.source import Problems, Setting
from vllm_provision.inventory.tree import Tree
from vllm_provision.settings import instance

INVALID = object()
"""Value of a setting that failed validation (already reported): later checks skip it."""


def merge_host_vars(tree: Tree, host: str, group_files: Mapping[str, Mapping[str, Setting]],
                    host_files: Mapping[str, Mapping[str, Setting]],
                    extra: Mapping[str, Setting]) -> dict[str, Setting]:
    """Return ``host``'s variables merged with Ansible's precedence, low to high.

    Inventory-file group vars (``all`` < parent < child, siblings by name) < ``group_vars/all``
    < ``group_vars/<group>`` (same order) < inventory-file host vars < ``host_vars/<host>`` <
    extra vars. Source: Ansible docs "Variable precedence" and ``VariableManager.get_vars``
    (``VARIABLE_PRECEDENCE`` default: all_inventory, groups_inventory, all_plugins_inventory,
    ..., groups_plugins_inventory). A variable is replaced as a whole (``hash_behaviour=replace``).
    """
    groups = tree.groups_of(host)
    merged: dict[str, Setting] = {}
    for group in groups:
        merged.update(tree.groups[group].vars)
    merged.update(group_files.get("all", {}))
    for group in groups:
        if group != "all":
            merged.update(group_files.get(group, {}))
    merged.update(tree.hosts[host].vars)
    merged.update(host_files.get(host, {}))
    merged.update(extra)
    return merged


def plain(settings: Mapping[str, Setting]) -> dict[str, Any]:
    """Return ``{name: value}`` without origins, leaving out invalid values."""
    return {name: s.value for name, s in settings.items() if s.value is not INVALID}


def resolve_path(text: str, base: Path) -> Path:
    """Expand ``~`` and make a relative path relative to ``base`` (the inventory's folder).

    Raises:
        ValueError: ``~user`` names no user of the controller (``Path.expanduser``'s
            RuntimeError), or ``~`` is used and the controller's home is unknown.
    """
    try:
        path = Path(text).expanduser()
    except RuntimeError as exc:
        raise ValueError(f"{text!r}: {exc} (~ or ~user names no home folder on this "
                         "controller)") from exc
    return path if path.is_absolute() else (base / path)


def known_hosts_from_ssh_args(args: str) -> list[str]:
    """Return the files named by ``UserKnownHostsFile`` in ssh command-line options.

    Accepts ``-o UserKnownHostsFile=F``, ``-oUserKnownHostsFile=F`` and ``-o "UserKnownHostsFile
    F1 F2"`` (ssh_config(5): the keyword is case-insensitive, the value may list several files
    separated by whitespace).

    Raises:
        ValueError: ``args`` has unbalanced quotes (from ``shlex.split``).
    """
    words = shlex.split(args)
    options: list[str] = []
    for index, word in enumerate(words):
        if word == "-o" and index + 1 < len(words):
            options.append(words[index + 1])
        elif word.startswith("-o") and len(word) > 2:
            options.append(word[2:])
    files: list[str] = []
    for option in options:
        keyword, _, value = option.replace("=", " ", 1).partition(" ")
        if keyword.strip().lower() == "userknownhostsfile":
            files.extend(value.split())
    return files


def build_host(name: str, settings: Mapping[str, Setting], groups: tuple[str, ...],
               base: Path, problems: Problems) -> Host:
    """Build a :class:`~vllm_provision.core.models.Host` from its merged, validated settings.

    Args:
        name: inventory host name.
        settings: merged settings (:func:`merge_host_vars`), values already converted.
        groups: every group of the host, ``all`` first.
        base: the inventory file's folder, for relative key and known_hosts paths.
        problems: where problems are recorded (unbalanced quotes in ssh args).
    """
    values = plain(settings)
    known_hosts: list[Path] = []
    for option in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if option not in values:
            continue
        try:
            files = known_hosts_from_ssh_args(values[option])
        except ValueError as exc:
            problems.add(settings[option].origin.where, f"{option} cannot be split into words: "
                         f"{exc}", expected="ssh options with balanced quotes",
                         actual=repr(values[option]), fix="close the quote")
            continue
        for file in files:
            try:
                known_hosts.append(resolve_path(file, base))
            except ValueError as exc:
                problems.add(settings[option].origin.where, f"{option}: UserKnownHostsFile "
                             f"{exc}", expected="a path, absolute, relative to the inventory, "
                             "or ~/...", actual=repr(values[option]),
                             fix="write the path without ~user, or create that user")

    def path_of(option: str) -> Path | None:
        try:
            return resolve_path(values[option], base)
        except ValueError as exc:
            problems.add(settings[option].origin.where, f"{option}: {exc}",
                         expected="a path, absolute, relative to the inventory, or ~/...",
                         actual=repr(values[option]),
                         fix="write the path without ~user, or create that user")
            return None

    if "provision_known_hosts_file" in values:
        known = path_of("provision_known_hosts_file")
        known_hosts.extend([known] if known else [])
    key_file = path_of("ansible_ssh_private_key_file") if values.get(
        "ansible_ssh_private_key_file") else None
    return Host(
        name=name,
        address=values.get("ansible_host", name),
        port=values.get("ansible_port", 22),
        user=values.get("ansible_user"),
        key_file=key_file,
        known_hosts_files=tuple(dict.fromkeys(known_hosts)),
        become=values.get("ansible_become", False),
        become_user=values.get("ansible_become_user", "root"),
        groups=groups,
        vars={**_instance_vars(values), **values},
    )


def _instance_vars(values: Mapping[str, Any]) -> dict[str, str]:
    """The names a valid ``vllm_instance`` derives (:func:`vllm_provision.settings.instance.
    derived`), below every value the inventory sets itself; none without one."""
    name = values.get("vllm_instance")
    if not isinstance(name, str) or instance.check_instance(name) is not None:
        return {}
    return instance.derived(name)
