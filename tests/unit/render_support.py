"""Render every unit, env file and command of a loaded inventory the way the engine does, and
read them back the way systemd and a POSIX shell do (used by the hostile-input and property
tests)."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from vllm_provision.core.models import Inventory, Replica
from vllm_provision.runner.templating import Templar, make_environment
from vllm_provision.settings import variables

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
PLAYBOOKS = REPO / "playbooks"

# (role of the template, template, which nodes render it) per backend, as the plays install them.
TEMPLATES = {
    "mp": [("vllm_mp", "vllm.service.j2", "all"), ("vllm_mp", "vllm.env.j2", "all"),
           ("vllm_watchdog", "vllm-watchdog.service.j2", "all"),
           ("vllm_watchdog", "watchdog.json.j2", "all")],
    "ray": [("ray", "ray-head.service.j2", "master"), ("ray", "ray-worker.service.j2", "followers"),
            ("ray", "ray.env.j2", "all"), ("vllm_ray", "vllm.service.j2", "master"),
            ("vllm_ray", "vllm.env.j2", "master"),
            ("vllm_watchdog", "vllm-watchdog.service.j2", "all"),
            ("vllm_watchdog", "watchdog.json.j2", "all")],
}
ROLES_OF = {"mp": ("vllm_common", "vllm_mp", "vllm_watchdog"),
            "ray": ("vllm_common", "ray", "vllm_ray", "vllm_watchdog")}


def templar_for(inventory: Inventory, replica: Replica, rank: int) -> Templar:
    """The Templar a task on node ``rank`` sees: role defaults < host vars < -e, plus the
    engine's fixed names (replica, node, engine, inventory_hostname)."""
    node = replica.nodes[rank]
    defaults: dict[str, Any] = variables.defaults()
    for role in ROLES_OF[replica.backend]:
        defaults.update(_role_defaults(role))
    layered = {**defaults, **node.host.vars, **inventory.extra_vars}
    fixed = {"replica": replica, "node": node, "engine": replica.engine,
             "inventory_hostname": node.name, "facts": None, "check_mode": False,
             "hostvars": {n: dict(h.vars) for n, h in inventory.hosts.items()}}
    return Templar(_environment(replica.backend), layered, node.name, fixed)


@functools.cache
def _environment(backend: str) -> Any:
    # one environment per backend, as one play has: imported templates are compiled once
    return make_environment([ROLES / role / "templates" for role in ROLES_OF[backend]])


@functools.cache
def _role_defaults(role: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()))


@functools.cache
def _source(path: Path) -> str:
    return path.read_text()


def rendered_files(inventory: Inventory) -> Iterator[tuple[str, str]]:
    """Yield ``(label, text)`` for every unit, env file and watchdog config of every node."""
    for replica in inventory.replicas:
        for node in replica.nodes:
            templar = templar_for(inventory, replica, node.rank)
            for role, name, who in TEMPLATES[replica.backend]:
                if who == "master" and node.rank != 0 or who == "followers" and node.rank == 0:
                    continue
                source = _source(ROLES / role / "templates" / name)
                yield f"{node.name}:{role}/{name}", templar.render(source, name)


def unit_words(line: str) -> list[str]:
    """Split an ``Exec*=`` value as systemd.service(5) "COMMAND LINES" does (the subset our
    quoting emits: double quotes with ``\\\\``/``\\"``, ``$$``, ``%%``, ``\\;``)."""
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(line)]


def directives(text: str) -> list[str]:
    """The ``Key`` of every ``Key=value`` line of a unit (comments and sections left out)."""
    return [line.split("=", 1)[0] for line in text.splitlines()
            if line and not line.startswith(("#", ";", "[")) and "=" in line]


_ENV_LINE_RE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"$')


def env_values(text: str) -> dict[str, str]:
    """Parse an EnvironmentFile as systemd's env-file parser reads our ``KEY="value"`` lines
    (systemd.exec(5): inside double quotes a backslash escapes the next character). A line
    that is neither a comment nor such an assignment fails the parse."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _ENV_LINE_RE.match(line)
        assert match is not None, f"not a KEY=\"value\" line: {line!r}"
        values[match[1]] = re.sub(r"\\(.)", r"\1", match[2])
    return values


def exec_words(text: str) -> list[list[str]]:
    """The words of every ``Exec*=`` line of a unit."""
    return [unit_words(line.split("=", 1)[1]) for line in text.splitlines()
            if line.startswith("Exec")]


def shape(inventory: Inventory | dict[str, str]) -> dict[str, Any]:
    """What a value must never change: per file (of an inventory, or already rendered by
    :func:`rendered_files`), its line count, its directives (units) or its variable names (env
    files)."""
    out: dict[str, Any] = {}
    files = inventory if isinstance(inventory, dict) else dict(rendered_files(inventory))
    for label, text in files.items():
        name = label.split(":", 1)[1]
        if name.endswith(".env.j2"):
            out[label] = ("env", len(text.splitlines()), sorted(env_values(text)))
        elif name.endswith(".service.j2"):
            out[label] = ("unit", len(text.splitlines()), directives(text))
        else:
            out[label] = ("json", len(text.splitlines()))
    return out


def command_tasks() -> Iterator[tuple[str, str]]:
    """Yield ``(where, command template)`` for every ``command`` task and handler of every
    playbook and role."""
    files = sorted(PLAYBOOKS.glob("*.yml")) + sorted(ROLES.glob("*/tasks/*.yml")) + sorted(
        ROLES.glob("*/handlers/*.yml"))
    for path in files:
        for item in _tasks(yaml.safe_load(path.read_text()) or []):
            cmd = item.get("command")
            if isinstance(cmd, dict):
                cmd = cmd.get("cmd")
            if isinstance(cmd, str):
                yield f"{path.relative_to(ROLES.parent)}: {item.get('name')}", cmd


def _tasks(data: Any) -> Iterator[dict[str, Any]]:
    if isinstance(data, list):
        for item in data:
            if isinstance(item, dict):
                if "tasks" in item or "handlers" in item:
                    yield from _tasks(item.get("tasks", []))
                    yield from _tasks(item.get("handlers", []))
                else:
                    yield item


def write_inventory(path: Path, data: Any) -> Path:
    """Dump ``data`` as YAML at ``path`` (PyYAML escapes control characters in quotes)."""
    path.write_text(yaml.safe_dump(data, allow_unicode=False, sort_keys=False))
    return path
