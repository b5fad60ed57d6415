"""Resolve a host's variables for a play: the one precedence chain, registered values, the templar.

The chain itself is :func:`vllm_provision.settings.layered` (variables-table defaults < role
defaults < inventory < play vars < registered < ``-e``; docs/runner-contract.md); this module
only feeds it the play's and the host's levels, keeps what tasks ``register`` and adds the
names every template sees (``inventory_hostname``, ``groups``, ``hostvars``, ``replica``,
``node``, ``engine``, ``facts``, ``check_mode``, ``ray_auth_token``: the controller's token of
the host's Ray replica, ``vllm_provision.state.ray_token``, or None; ``gateway``: the front door
the host runs, ``inventory.gateways.Gateway``, or None outside ``vllm_gateways``).
"""

from __future__ import annotations

import threading
from typing import Any

from vllm_provision import settings
from vllm_provision.core.models import Host, Inventory, Node
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.inventory.gateways import gateway_hosts, gateway_of
from vllm_provision.modules import ModuleResult
from vllm_provision.runner.playbook import Play, Task
from vllm_provision.runner.templating import Templar, environment_for
from vllm_provision.state.ray_token import read_tokens


def registered_value(result: ModuleResult) -> dict[str, Any]:
    """Return what ``register`` stores: status flags, message and the module's data."""
    value: dict[str, Any] = dict(result.data or {})
    value.update({
        "status": str(result.status),
        "changed": result.status is Status.CHANGED,
        "failed": result.status is Status.FAILED,
        "skipped": result.status is Status.SKIPPED,
        "msg": result.message,
    })
    return value


def node_of(inventory: Inventory, host_name: str) -> Node | None:
    """Return ``host_name``'s node in its replica, or None outside ``vllm_replicas``."""
    replica = inventory.replica_of(host_name)
    if replica is None:
        return None
    return next((n for n in replica.nodes if n.name == host_name), None)


class VariableResolver:
    """The variables of every host of one run, play by play.

    Args:
        inventory: the loaded inventory (host variables, groups, replicas, ``-e`` values).
        check_mode: the run's ``--check`` (templates see it as ``check_mode``).

    Attributes:
        registered: what each host's tasks registered, by host name then register name.
        facts: gathered facts by host name (filled by preflight modules; templates see a
            host's own as ``facts``).
        ray_tokens: replica name -> the controller's Ray token (read once, at construction:
            ``up`` and ``restart`` make the missing ones before; docs/security.md).

    Raises:
        ProvisionError: a stored Ray token is unreadable or malformed
            (``state.ray_token.read_token``).
    """

    def __init__(self, inventory: Inventory, *, check_mode: bool = False) -> None:
        self.inventory = inventory
        self.check_mode = check_mode
        self.registered: dict[str, dict[str, Any]] = {}
        self.facts: dict[str, Any] = {}
        self._lock = threading.Lock()  # hosts register from the run's worker threads
        # the inventory is frozen: its names are built once per run, not per task x host (the
        # templates cannot change them: ImmutableSandboxedEnvironment, runner/templating.py)
        self._groups = {name: inventory.hosts_in_group(name) for name in inventory.groups}
        self._hostvars = {name: dict(h.vars) for name, h in inventory.hosts.items()}
        self.ray_tokens = read_tokens(inventory)
        # the front door of each host of vllm_gateways (the group is walked once)
        self._gateways = {name: gateway_of(inventory, name) for name in gateway_hosts(inventory)}

    def templar_for(self, play: Play, host: Host) -> Templar:
        """Return the Templar holding ``host``'s variables for ``play`` as they are now (a
        value registered later is seen by the next call), on the process's cached Jinja2
        environment for the play's template folders (``templating.environment_for``)."""
        replica = self.inventory.replica_of(host.name)
        token = self.ray_tokens.get(replica.name) if replica else None
        layered = settings.layered(host.vars, role_defaults=play.role_defaults,
                                   play_vars=play.vars,
                                   registered=self.registered.get(host.name, {}),
                                   extra_vars=self.inventory.extra_vars)
        fixed: dict[str, Any] = {
            "inventory_hostname": host.name,
            "groups": self._groups,
            "hostvars": self._hostvars,
            "replica": replica,
            "node": node_of(self.inventory, host.name),
            "engine": replica.engine if replica else None,
            "facts": self.facts.get(host.name),
            "check_mode": self.check_mode,
            "ansible_check_mode": self.check_mode,
            "role_names": [],
            "ray_auth_token": token,
            "gateway": self._gateways.get(host.name),
        }
        env = environment_for(list(play.template_dirs))
        return Templar(env, layered, host.name, fixed)

    def register(self, task: Task, host: str, result: ModuleResult) -> None:
        """Keep ``result`` under ``task.register`` for ``host`` (nothing without ``register``)."""
        if task.register:
            with self._lock:
                self.registered.setdefault(host, {})[task.register] = registered_value(result)

    def register_failure(self, task: Task, host: str, result: TaskResult) -> None:
        """Keep a task that failed before its module returned (a rendering or argument error)
        under ``task.register``: ``failed`` with the error as ``msg``."""
        if task.register:
            with self._lock:
                self.registered.setdefault(host, {})[task.register] = {
                    "status": str(result.status), "changed": False, "failed": True,
                    "skipped": False, "msg": result.message}

    def share(self, task: Task, source: str, hosts: list[Host]) -> None:
        """``run_once`` or a controller module: every host of ``hosts`` sees the value
        ``source`` registered (Ansible's rule for ``run_once``)."""
        if not task.register or source not in self.registered:
            return
        with self._lock:
            value = self.registered[source].get(task.register)
            for host in hosts:
                self.registered.setdefault(host.name, {})[task.register] = value
