"""The handler queue of a play batch: notifications in, each notified handler run once at the end.

Ansible's rules (docs playbooks_handlers.rst): a handler runs once however many tasks notified
it, in the order handlers are defined, after the batch's tasks; ``listen`` names it too. Two
extensions (docs/engine.md): a notification is persisted on the host until its handler ran
(``vllm_provision.runner.handlers_state``; an earlier run's is read back at the start of the play)
and
a handler with ``scope: replica`` runs once per replica, on its nodes one after another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import as_completed
from dataclasses import dataclass
from typing import Any

from vllm_provision.core.models import Host
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.modules import UNAFFECTED_KEY
from vllm_provision.runner import handlers_state
from vllm_provision.runner.outcome import HandlerResult, RunState
from vllm_provision.runner.playbook import Play, Task
from vllm_provision.transport.base import UnreachableError

# runs a handler on one host: (play, handler, host, note) -> its results, recorded
RunHandler = Callable[[Play, Task, Host, str], list[TaskResult]]


@dataclass(frozen=True)
class Notifier:
    """Who notified a handler on a host: a task of this run, or a notification persisted by an
    earlier run (``handlers_state``) and read back at the start of the play.

    Attributes:
        task: the notifying task's name (``""`` when an earlier run did not record it).
        earlier_run: read back from the host, not notified in this run.
    """

    task: str
    earlier_run: bool = False

    @property
    def note(self) -> str:
        """The handler result's note: ``"notified by an earlier run (TASK)"`` for a persisted
        notification, ``""`` for one of this run (the output already shows that task)."""
        if not self.earlier_run:
            return ""
        return f"notified by an earlier run ({self.task})" if self.task else \
            "notified by an earlier run"


def notify_script(task: Task, pending_dir: str) -> str:
    """Shell commands persisting ``task``'s notifications on a host under ``pending_dir``
    (``""`` when it notifies nothing; ``handlers_state.persist_script``)."""
    return handlers_state.persist_script(
        [handlers_state.PendingNotification(target, task.name) for target in task.notify],
        pending_dir)


def persist(task: Task, conn: Any, pending_dir: str) -> None:
    """Persist ``task``'s notifications through ``conn`` (the notifying host's connection),
    when its module did not do it with its change command.

    Raises:
        UnreachableError: the host is gone. ProvisionError: the write failed.
    """
    script = notify_script(task, pending_dir)
    if script:
        conn.run(script, check=True)


class HandlerQueue:
    """Notifications of one play batch and the handlers they call for.

    Args:
        state: the run's shared state (connections, dropped hosts, outcome, options).
        run_handler: runs a handler on one host and records its results
            (``executor.TaskExecutor.run_handler``).

    Attributes:
        notified: handler name or ``listen`` topic -> host name -> who notified it.
    """

    def __init__(self, state: RunState, run_handler: RunHandler) -> None:
        self.state = state
        self.run_handler = run_handler
        self.notified: dict[str, dict[str, Notifier]] = {}

    # -- notifications --------------------------------------------------------------------------

    def start_batch(self, play: Play, batch: list[Host]) -> None:
        """Forget the last batch's notifications; read those earlier runs left on ``batch``'s
        hosts (one round trip per host, in parallel; an unreachable host is dropped)."""
        self.notified = {}
        if not play.handlers:
            return
        targets = {h.name for h in play.handlers} | {t for h in play.handlers for t in h.listen}
        def read(host: Host) -> tuple[Host, list[handlers_state.PendingNotification] | str]:
            script = handlers_state.read_script(self.state.pending_dir(host.name))
            try:
                result = self.state.connections[host.name].run(script)
            except UnreachableError as exc:
                return host, exc.render()
            return host, handlers_state.parse_pending(result.stdout) if result.ok else []

        for host, found in self.state.threads().map(read, batch):
            if isinstance(found, str):
                self.state.drop_unreachable(host.name, "Read pending notifications", found)
                continue
            for item in found:
                if item.handler in targets:
                    self.notified.setdefault(item.handler, {})[host.name] = Notifier(
                        item.task, earlier_run=True)

    def notify(self, task: Task, result: TaskResult) -> None:
        """Note ``task``'s notifications for ``result.host`` when it changed something (a
        change that affects nothing, ``UNAFFECTED_KEY``, notifies no one)."""
        if result.status is Status.CHANGED and not (result.data or {}).get(UNAFFECTED_KEY):
            for target in task.notify:
                self.notified.setdefault(target, {}).setdefault(result.host, Notifier(task.name))

    # -- flushing -------------------------------------------------------------------------------

    def flush(self, play: Play, batch: list[Host]) -> None:
        """Run each notified handler once, in definition order, on the hosts of ``batch``
        still in the run; then clear, on each host, the notifications its handlers served."""
        if not self.notified:
            return
        active = {h.name: h for h in batch}
        done_ok: dict[str, set[str]] = {}  # target -> hosts whose notification was served
        failed_targets: dict[str, set[str]] = {}
        for handler in play.handlers:
            targets = [t for t in (handler.name, *handler.listen) if t in self.notified]
            if not targets:
                continue
            notifying: dict[str, Notifier] = {}
            for target in targets:
                for host_name, why in self.notified[target].items():
                    notifying.setdefault(host_name, why)
            notifying = {h: why for h, why in notifying.items()
                         if h in active and h not in self.state.dropped}
            if not notifying:
                continue
            self.state.reporter.task_started(handler.name, handler=True)
            if handler.scope == "replica":
                succeeded = self._per_replica(play, handler, active, notifying)
            else:
                succeeded = self._per_host(play, handler, active, notifying)
            for target in targets:
                for host_name in notifying:
                    bucket = done_ok if host_name in succeeded else failed_targets
                    bucket.setdefault(target, set()).add(host_name)
        if self.state.options.check_mode:
            return
        clear: dict[str, list[str]] = {}
        for target, hosts in done_ok.items():
            for host_name in hosts - failed_targets.get(target, set()):
                clear.setdefault(host_name, []).append(target)
        for host_name, cleared in clear.items():
            if host_name in self.state.dropped or host_name not in self.state.connections:
                continue
            try:
                self.state.connections[host_name].run(
                    handlers_state.clear_script(cleared, self.state.pending_dir(host_name)))
            except UnreachableError as exc:
                self.state.drop_unreachable(host_name, "Clear pending notifications",
                                            exc.render())

    def _per_host(self, play: Play, handler: Task, active: Mapping[str, Host],
                  notifying: Mapping[str, Notifier]) -> set[str]:
        futures = [self.state.threads().submit(self.run_handler, play, handler, active[name],
                                               why.note)
                   for name, why in notifying.items()]
        succeeded: set[str] = set()
        for future in as_completed(futures):
            for result in future.result():
                self._after(handler, result)
                if result.status not in (Status.FAILED, Status.UNREACHABLE):
                    succeeded.add(result.host)
        return succeeded

    def _per_replica(self, play: Play, handler: Task, active: Mapping[str, Host],
                     notifying: Mapping[str, Notifier]) -> set[str]:
        """Run once per replica, on every node in rank order (followers first by default)."""
        inventory = self.state.inventory
        succeeded: set[str] = set()
        done_replicas: set[str] = set()
        for host_name, why in notifying.items():
            replica = inventory.replica_of(host_name)
            if replica is None:
                nodes = [host_name]
                key = f"host:{host_name}"
            else:
                key = f"replica:{replica.name}"
                followers = [n.name for n in replica.followers]
                nodes = ([replica.master.name, *followers] if handler.order == "master_first"
                         else [*followers, replica.master.name])
            if key in done_replicas:
                continue
            done_replicas.add(key)
            members = [name for name, _ in notifying.items()
                       if (inventory.replica_of(name) or None) == replica] if replica \
                else [host_name]
            all_ok = True
            for node_name in nodes:
                if node_name not in active or node_name in self.state.dropped:
                    all_ok = False
                    continue
                results = self.run_handler(play, handler, active[node_name], why.note)
                for result in results:
                    self._after(handler, result)
                    if result.status in (Status.FAILED, Status.UNREACHABLE):
                        all_ok = False
                if not all_ok and play.any_errors_fatal:
                    break
            if all_ok:
                succeeded.update(members)
        return succeeded

    def _after(self, handler: Task, result: TaskResult) -> None:
        self.state.outcome.handler_results.append(
            HandlerResult(handler.name, handler.scope or "host", result))
        if result.status in (Status.FAILED, Status.UNREACHABLE) and not handler.ignore_errors:
            self.state.dropped.setdefault(result.host, result.status)
