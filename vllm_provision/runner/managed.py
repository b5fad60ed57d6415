"""The files ``provision up`` installs, named from the playbook without running it.

The install plays (:func:`install_plays`) and, by host, the destination of every file they put
in place (:func:`managed_files`), rendered with each host's variables the way the engine renders
them. The state record hashes these files (``vllm_provision.operations.record``), ``provision
drift`` compares them, and a replica that leaves a host removes them (``vllm_prune``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory
from vllm_provision.inventory.selection import select_play_hosts

# Modules that install a file's content at ``dest`` (a rendered template, or a role's file as it
# is): the files the state record hashes and `provision drift` compares.
FILE_MODULES = frozenset({"template", "copy"})
# Modules whose plays only put files and units in place: the plays `provision drift` replays in
# check mode (preflight, waiting and verification plays are left out).
INSTALL_MODULES = FILE_MODULES | {"file", "systemd", "command", "package"}


def install_plays(plays: Sequence[Any]) -> list[Any]:
    """The plays of ``plays`` (``runner.playbook.Play``) that install files: at least one
    :data:`FILE_MODULES` task and only :data:`INSTALL_MODULES` (the install plays of
    ``playbooks/up.yml``; preflight, hold, start-in-order, wait and verify plays are left out).
    """
    return [play for play in plays
            if any(task.module in FILE_MODULES for task in play.tasks)
            and all(task.module in INSTALL_MODULES for task in play.tasks)]


def managed_files(inventory: Inventory, plays: Sequence[Any],
                  limit: str | None = None) -> dict[str, dict[str, str]]:
    """By host: task name -> destination path of every :data:`FILE_MODULES` task of ``plays``
    that applies to the host (its ``when`` is true, or cannot be told without running).

    Pure apart from reading role defaults already loaded in ``plays``; no connection is opened.

    Raises:
        ProvisionError: a ``dest`` that does not render (undefined variable).
    """
    from vllm_provision.runner.engine import Runner

    runner = Runner(inventory)
    files: dict[str, dict[str, str]] = {}
    for play in plays:
        for host in select_play_hosts(inventory, play.hosts, limit):
            templar = runner.templar_for(play, host)
            for task in play.tasks:
                if task.module not in FILE_MODULES or not isinstance(task.args, Mapping):
                    continue
                if task.when:
                    try:
                        if not templar.test(list(task.when), label=f"{task.name}: when"):
                            continue
                    except ProvisionError:
                        pass
                dest = templar.render_value(task.args.get("dest"), f"{task.name}: dest")
                files.setdefault(host.name, {})[task.name] = str(dest)
    return files


