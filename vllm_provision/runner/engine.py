"""Run plays: hosts in parallel (bounded by ``forks``), tasks in order, handlers at the end.

Semantics follow Ansible's linear strategy (docs playbooks_strategies.rst, playbooks_handlers.rst)
with three extensions: notifications are persisted on the host until their handler ran
(``handlers_state``), a handler may have ``scope: replica``, and a play's ``any_errors_fatal``
may be narrowed to the failed host's replica (``fatal_scope: replica``, docs/engine.md).

:class:`Runner` is the facade: it builds one run's parts and hands each what it needs
(``outcome.RunState``): the variable resolver (``variables.py``), the task executor
(``executor.py``), the read prefetcher (``prefetch.py``), the handler queue (``handlers.py``)
and the linear strategy (``strategy.py``) that drives them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vllm_provision.core.models import Host, Inventory
from vllm_provision.core.results import Status
from vllm_provision.inventory.selection import select_play_hosts
from vllm_provision.runner.executor import LOCALHOST_NAMES, ConnectionFactory, TaskExecutor
from vllm_provision.runner.handlers import HandlerQueue, Notifier
from vllm_provision.runner.outcome import (
    HandlerResult,
    NullReporter,
    Reporter,
    RunOptions,
    RunOutcome,
    RunState,
)
from vllm_provision.runner.playbook import Play, load_playbook
from vllm_provision.runner.prefetch import Prefetcher
from vllm_provision.runner.strategy import LinearStrategy
from vllm_provision.runner.templating import Templar
from vllm_provision.runner.variables import VariableResolver, registered_value
from vllm_provision.settings.masking import Masker
from vllm_provision.transport.connection import HostConnection, close_all

__all__ = ["LOCALHOST_NAMES", "ConnectionFactory", "HandlerResult", "Notifier", "Reporter",
           "RunOptions", "RunOutcome", "Runner", "registered_value"]


class Runner:
    """Runs playbooks against one inventory; one connection per host for the whole run.

    Args:
        inventory: a loaded, validated inventory.
        options: :class:`RunOptions`.
        reporter: receives results as they arrive.
        connection_factory: builds a connection object for a host (tests pass a fake); it must
            have ``open()`` raising :class:`UnreachableError` and ``run(...)``.

    Attributes:
        outcome: what the run produced (:class:`RunOutcome`).
        facts: gathered facts by host name (preflight modules fill it; ``state.py`` reads it).
        registered: what each host's tasks registered, by host name then register name.
        masker: hides the inventory's secrets in every result.
    """

    def __init__(self, inventory: Inventory, options: RunOptions | None = None,
                 reporter: Reporter | None = None,
                 connection_factory: ConnectionFactory | None = None) -> None:
        self.inventory = inventory
        self.options = options or RunOptions()
        self.reporter = reporter or NullReporter()
        self.connection_factory = connection_factory or (
            lambda host: HostConnection(host, self.options.connection))
        self.masker = Masker.from_inventory(inventory)
        self.outcome = RunOutcome(check_mode=self.options.check_mode)
        self.variables = VariableResolver(inventory, check_mode=self.options.check_mode)
        self.masker.add(self.variables.ray_tokens.values())  # never printed (docs/security.md)
        self.state = RunState(inventory, self.options, self.reporter, self.masker, self.outcome)
        self.executor = TaskExecutor(self.state, self.variables, self.connection_factory)
        self.prefetcher = Prefetcher(self.state, self.variables.templar_for,
                                     self.executor.task_context, self.executor.lock_held)
        self.handlers = HandlerQueue(self.state, self.executor.run_handler)
        self.strategy = LinearStrategy(self.state, self.variables, self.executor,
                                       self.prefetcher, self.handlers)

    # the run's state, under the names callers have always used
    @property
    def connections(self) -> dict[str, Any]:
        """The open connection of each host, by host name."""
        return self.state.connections

    @property
    def dropped(self) -> dict[str, Status]:
        """Hosts out of the rest of the run, with the status that dropped them."""
        return self.state.dropped

    @property
    def host_state(self) -> dict[str, dict[str, Any]]:
        """Per-host scratch space of modules (``TaskContext.host_state``)."""
        return self.state.host_state

    @property
    def registered(self) -> dict[str, dict[str, Any]]:
        """What each host's tasks registered (``VariableResolver.registered``)."""
        return self.variables.registered

    @property
    def facts(self) -> dict[str, Any]:
        """Gathered facts by host name (``VariableResolver.facts``)."""
        return self.variables.facts

    # -- entry points ---------------------------------------------------------------------------

    def run_playbook(self, path: Path) -> RunOutcome:
        """Load ``path`` (validating it and every host pattern first), then run it.

        Raises:
            ProvisionError: invalid playbook or host pattern (nothing was connected yet).
        """
        plays = load_playbook(Path(path), self.options.roles_paths)
        return self.run_plays(plays)

    def run_plays(self, plays: Sequence[Play]) -> RunOutcome:
        """Run ``plays`` in order; return the outcome (also kept in ``self.outcome``)."""
        started = time.monotonic()
        selections = [(play, select_play_hosts(self.inventory, play.hosts, self.options.limit))
                      for play in plays]
        seen = {h.name for _, hosts in selections for h in hosts}
        self.outcome.hosts = [name for name in self.inventory.hosts if name in seen]
        forks = max(1, self.options.connection.forks)
        self.prefetcher.plan(selections)
        try:
            with ThreadPoolExecutor(max_workers=forks) as pool:
                self.state.pool = pool
                for play, hosts in selections:
                    if self.state.aborted:
                        break
                    self.strategy.run_play(play, hosts)
        finally:
            self.state.pool = None
            close_all(self.state.connections)
            self.outcome.duration_s = time.monotonic() - started
            self.outcome.aborted = self.state.aborted
        return self.outcome

    def templar_for(self, play: Play, host: Host) -> Templar:
        """Return the Templar holding ``host``'s variables for ``play``
        (:func:`vllm_provision.settings.layered`: variables-table defaults < role defaults <
        inventory < play vars < registered < -e; docs/runner-contract.md)."""
        return self.variables.templar_for(play, host)
