"""The linear strategy: a play's hosts in ``serial`` batches, each task on the whole batch, then
its handlers; failed hosts leave the run, ``any_errors_fatal`` stops it (or one replica).

Ansible's linear strategy (docs playbooks_strategies.rst, playbooks_error_handling.rst): every
host of a batch finishes a task before any starts the next; a failed or unreachable host runs
nothing more. Extension (docs/engine.md): ``fatal_scope: replica`` narrows ``any_errors_fatal``
to the failed host's replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import as_completed

from vllm_provision.core.models import Host
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.modules import find_module
from vllm_provision.runner.executor import TaskExecutor
from vllm_provision.runner.handlers import HandlerQueue
from vllm_provision.runner.outcome import RunState
from vllm_provision.runner.playbook import Play, Task
from vllm_provision.runner.prefetch import Prefetcher
from vllm_provision.runner.variables import VariableResolver


class LinearStrategy:
    """Runs plays, batch after batch, with the run's parts.

    Args:
        state: the run's shared state. variables: registered values (``run_once`` shares them).
        executor: runs one task on one host. prefetcher: batches reads per host and batch.
        handlers: the handler queue (notifications in, handlers run at the end of a batch).
    """

    def __init__(self, state: RunState, variables: VariableResolver, executor: TaskExecutor,
                 prefetcher: Prefetcher, handlers: HandlerQueue) -> None:
        self.state = state
        self.variables = variables
        self.executor = executor
        self.prefetcher = prefetcher
        self.handlers = handlers

    def run_play(self, play: Play, hosts: list[Host]) -> None:
        """Run ``play`` on those of ``hosts`` still in the run, ``play.serial`` at a time (all
        at once without it); stop early once ``state.aborted`` is set."""
        state = self.state
        active = [h for h in hosts if h.name not in state.dropped]
        state.reporter.play_started(play.name, [h.name for h in active])
        if not active:
            return
        size = play.serial or len(active)
        for start in range(0, len(active), size):
            batch = [h for h in active[start:start + size] if h.name not in state.dropped]
            if state.aborted:
                return
            state.outcome.batch_starts.append(len(state.outcome.results))
            self.executor.connect(batch)
            batch = [h for h in batch if h.name not in state.dropped]
            self.prefetcher.start_batch(play, batch)
            self.handlers.start_batch(play, batch)
            for index, task in enumerate(play.tasks):
                if state.aborted:
                    return
                batch = [h for h in batch if h.name not in state.dropped]
                if not batch:
                    break
                self._run_task(play, task, batch, index)
            if not state.aborted:
                self.handlers.flush(play, [h for h in batch if h.name not in state.dropped])

    def _run_task(self, play: Play, task: Task, batch: list[Host], index: int) -> None:
        self.state.reporter.task_started(task.name)
        spec = find_module(task.module)
        assert spec is not None  # validated at load time
        if spec.runs_on == "controller" or task.run_once:
            outcomes = [self.executor.run_on_host(play, task, batch[0])]
            # run_once / controller: the registered value is seen by every host (Ansible)
            self.variables.share(task, batch[0].name, batch[1:])
        else:
            futures = [self.state.threads().submit(self._refill_and_run, play, task, host, index)
                       for host in batch]
            outcomes = [future.result() for future in as_completed(futures)]
        failed_hosts: list[str] = []
        for result_list in outcomes:
            for result in result_list:
                self._after_result(task, result)
                if result.status in (Status.FAILED, Status.UNREACHABLE) and not task.ignore_errors:
                    failed_hosts.append(result.host)
        if failed_hosts and play.any_errors_fatal:
            if play.fatal_scope == "replica":
                self._stop_replicas(task, failed_hosts)
            else:
                self.state.aborted = True

    def _refill_and_run(self, play: Play, task: Task, host: Host, index: int
                        ) -> list[TaskResult]:
        self.prefetcher.refill(play, host, index)
        return self.executor.run_on_host(play, task, host)

    def _after_result(self, task: Task, result: TaskResult) -> None:
        if result.status in (Status.CHANGED, Status.FAILED, Status.UNREACHABLE):
            self.prefetcher.drop([result.host])  # a write may change what a later read sees
        self.handlers.notify(task, result)
        if result.status in (Status.FAILED, Status.UNREACHABLE) and not (
                task.ignore_errors and result.status is Status.FAILED):
            self.state.dropped.setdefault(result.host, result.status)

    def _stop_replicas(self, task: Task, failed_hosts: Sequence[str]) -> None:
        """``any_errors_fatal`` with ``fatal_scope: replica``: drop every node of each failed
        host's replica from the rest of the run (each gets a ``skipped`` result saying why);
        the other replicas go on. A failed host in no replica stops the whole run, as plain
        ``any_errors_fatal`` does."""
        state = self.state
        for host_name in failed_hosts:
            replica = state.inventory.replica_of(host_name)
            if replica is None:
                state.aborted = True
                return
            for node in replica.nodes:
                if node.name in state.dropped:
                    continue
                state.dropped[node.name] = Status.FAILED
                self.prefetcher.drop([node.name])
                state.record(TaskResult(
                    node.name, task.name, Status.SKIPPED,
                    f"replica {replica.name} stopped: {host_name} failed this task "
                    "(any_errors_fatal, fatal_scope: replica)"))
