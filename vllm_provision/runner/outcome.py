"""What one run is given and produces, and the state its parts share: options, outcome, reporter.

The runner's parts (``strategy.py``, ``executor.py``, ``prefetch.py``, ``handlers.py``,
``variables.py``) import their data types from here and get one :class:`RunState` from the
``Runner`` facade (``engine.py``), so none of them imports another's module to reach it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vllm_provision.core.models import Inventory
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.runner import handlers_state
from vllm_provision.settings import instance
from vllm_provision.settings.masking import Masker
from vllm_provision.transport.base import ConnectionOptions


class Reporter(Protocol):
    """Receives events as they happen (``report.HumanReporter``, ``report.JsonReporter``)."""

    def play_started(self, name: str, hosts: Sequence[str]) -> None: ...
    def task_started(self, name: str, *, handler: bool = False) -> None: ...
    def task_result(self, result: TaskResult) -> None: ...


class NullReporter:
    """A :class:`Reporter` that drops every event (the default)."""

    def play_started(self, name: str, hosts: Sequence[str]) -> None:
        """Ignore the start of a play."""

    def task_started(self, name: str, *, handler: bool = False) -> None:
        """Ignore the start of a task."""

    def task_result(self, result: TaskResult) -> None:
        """Ignore a result."""


@dataclass(frozen=True)
class RunOptions:
    """How to run.

    Attributes:
        check_mode: change nothing, report what would change (``--check``).
        diff_mode: show diffs (``--diff``).
        limit: extra host pattern every play is intersected with (``--limit``).
        roles_paths: more folders holding roles (``--roles-path``).
        connection: SSH settings (forks, timeouts, host-key policy).
        pending_dir: where notifications are persisted on hosts.
    """

    check_mode: bool = False
    diff_mode: bool = False
    limit: str | None = None
    roles_paths: tuple[Path, ...] = ()
    connection: ConnectionOptions = field(default_factory=ConnectionOptions)
    pending_dir: str = handlers_state.PENDING_DIR


@dataclass(frozen=True)
class HandlerResult:
    """One host's result of one handler.

    Attributes:
        handler: the handler's name. scope: ``host`` or ``replica`` (one node after another).
        result: the host's result (``changed`` with ``would ...`` in check mode).
    """

    handler: str
    scope: str
    result: TaskResult


@dataclass
class RunOutcome:
    """Everything a run produced, for the report.

    Attributes:
        results: every task result, in the order they arrived.
        hosts: every host any play targeted, in inventory order.
        check_mode: whether this was a dry run.
        duration_s: wall time of the run, in seconds.
        aborted: ``any_errors_fatal`` stopped the run.
        extra: command-specific keys for ``--json`` (e.g. ``completion``).
        handler_results: the results of handlers, in the order they arrived (a ``scope:
            replica`` handler's nodes one after another, in its order), for the plan
            (``vllm_provision.operations.plan``).
        batch_starts: the index in ``results`` where each batch of hosts of each play began
            (plays, and ``serial`` batches, run one after another).
    """

    results: list[TaskResult] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    check_mode: bool = False
    duration_s: float = 0.0
    aborted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    handler_results: list[HandlerResult] = field(default_factory=list)
    batch_starts: list[int] = field(default_factory=list)


@dataclass
class RunState:
    """The mutable state one run's parts share (one per ``Runner``).

    Attributes:
        inventory: the loaded inventory. options: :class:`RunOptions`.
        reporter: receives results as they arrive. masker: hides secrets in every result.
        outcome: what the run produced so far.
        connections: the open connection of each host, by host name (one for the whole run).
        dropped: hosts out of the rest of the run, with the status that dropped them.
        host_state: per-host scratch space of modules (``TaskContext.host_state``).
        pool: the run's worker threads (``forks`` of them), set while ``run_plays`` runs.
        aborted: ``any_errors_fatal`` stopped the run.
    """

    inventory: Inventory
    options: RunOptions
    reporter: Reporter
    masker: Masker
    outcome: RunOutcome
    connections: dict[str, Any] = field(default_factory=dict)
    dropped: dict[str, Status] = field(default_factory=dict)
    host_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    pool: ThreadPoolExecutor | None = None
    aborted: bool = False

    def pending_dir(self, host_name: str) -> str:
        """Where ``host_name``'s notifications are persisted: ``options.pending_dir``, or, left
        at its default, ``pending`` in the host's own ``provision_state_dir`` (a replica on a
        shared server has its own: docs/inventory.md, "Shared servers")."""
        host = self.inventory.hosts.get(host_name)
        if self.options.pending_dir != handlers_state.PENDING_DIR or host is None:
            return self.options.pending_dir
        return f"{instance.state_dir(host.vars)}/pending"

    def record(self, result: TaskResult) -> TaskResult:
        """Append ``result`` to the outcome and report it; return it."""
        self.outcome.results.append(result)
        self.reporter.task_result(result)
        return result

    def threads(self) -> ThreadPoolExecutor:
        """The run's pool of worker threads.

        Raises:
            RuntimeError: outside ``Runner.run_plays`` (a programming error).
        """
        if self.pool is None:
            raise RuntimeError("the runner's worker threads exist only while run_plays runs")
        return self.pool

    def drop_unreachable(self, host: str, task: str, message: str) -> None:
        """Record ``host`` unreachable at ``task`` (``message`` masked) and drop it from the run."""
        self.record(TaskResult(host, task, Status.UNREACHABLE, self.masker.text(message)))
        self.dropped[host] = Status.UNREACHABLE
