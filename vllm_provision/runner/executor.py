"""Run one task on one host: connect, render, call the module, apply conditions, mask, record.

Ansible's per-task rules (docs playbooks_conditionals.rst, playbooks_error_handling.rst,
playbooks_delegation.rst): ``when`` skips, ``failed_when``/``changed_when`` override the
module's status, ``register`` keeps the result, ``delegate_to`` runs on another host (or the
controller), ``become`` per task; ``no_log`` hides output (docs/security.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.modules import UNAFFECTED_KEY, UNAFFECTED_NOTE, ModuleResult, find_module
from vllm_provision.runner.context import TaskContext
from vllm_provision.runner.handlers import notify_script, persist
from vllm_provision.runner.outcome import RunState
from vllm_provision.runner.playbook import Play, Task
from vllm_provision.runner.prefetch import PrefetchingConnection
from vllm_provision.runner.templating import Templar
from vllm_provision.runner.variables import VariableResolver, node_of, registered_value
from vllm_provision.settings.masking import mask_diff
from vllm_provision.transport.base import Connection, UnreachableError
from vllm_provision.transport.connection import open_connections
from vllm_provision.transport.local import LocalConnection

LOCALHOST_NAMES = ("localhost", "127.0.0.1")

ConnectionFactory = Callable[[Host], Any]


class TaskExecutor:
    """Runs tasks on hosts and records their results in the run's outcome.

    Args:
        state: the run's shared state (connections, dropped hosts, outcome, options, masker).
        variables: the run's :class:`~vllm_provision.runner.variables.VariableResolver`.
        connection_factory: builds a connection object for a host; it must have ``open()``
            raising :class:`UnreachableError` and ``run(...)``.
    """

    def __init__(self, state: RunState, variables: VariableResolver,
                 connection_factory: ConnectionFactory) -> None:
        self.state = state
        self.variables = variables
        self.connection_factory = connection_factory
        # one lock per server that several hosts of the inventory are (replicas sharing it,
        # docs/inventory.md "Shared servers"): their tasks run there one at a time, so two
        # installs of one shared thing (the service user, the watchdog's program, a package)
        # never race; every other host runs unlocked
        servers: dict[tuple[str, int], list[str]] = {}
        for host in state.inventory.hosts.values():
            servers.setdefault(host.server, []).append(host.name)
        self._server_locks: dict[str, contextlib.AbstractContextManager[Any]] = {}
        for names in servers.values():
            if len(names) > 1:
                shared = threading.Lock()
                self._server_locks.update({name: shared for name in names})

    def connect(self, hosts: list[Host]) -> None:
        """Open a connection to each of ``hosts`` not connected yet, in parallel (each wrapped
        in a :class:`PrefetchingConnection`); an unreachable one is recorded and dropped."""
        missing = [h for h in hosts if h.name not in self.state.connections]
        if not missing:
            return
        opened, errors = open_connections(missing, self.state.options.connection,
                                          self.connection_factory)
        self.state.connections.update({name: PrefetchingConnection(conn)
                                       for name, conn in opened.items()})
        for name, error in errors.items():
            self.state.drop_unreachable(name, "Connect", error.render())

    def run_handler(self, play: Play, handler: Task, host: Host, note: str) -> list[TaskResult]:
        """Run ``handler`` on ``host``, its results' messages led by ``note``."""
        return self.run_on_host(play, handler, host, note=note)

    def run_on_host(self, play: Play, task: Task, host: Host, *, note: str = ""
                    ) -> list[TaskResult]:
        """Run ``task`` on ``host``; report and record every result; return them (one per
        host a controller module reports on, else one)."""
        started = time.monotonic()
        label = task.name
        masker = self.state.masker
        try:
            with self._server_locks.get(host.name, contextlib.nullcontext()):
                module_result, persisted = self._execute(play, task, host)
        except UnreachableError as exc:
            result = TaskResult(host.name, label, Status.UNREACHABLE, masker.text(exc.render()),
                                duration_s=time.monotonic() - started)
            return [self.state.record(result)]
        except ProvisionError as exc:
            result = TaskResult(host.name, label, Status.FAILED, masker.text(exc.render()),
                                duration_s=time.monotonic() - started)
            self.variables.register_failure(task, host.name, result)
            return [self.state.record(result)]
        duration = time.monotonic() - started
        if module_result.host_results:
            return [self.state.record(self._to_task_result(task, name, sub, duration, note))
                    for name, sub in module_result.host_results.items()]
        result = self._to_task_result(task, host.name, module_result, duration, note)
        if (result.status is Status.CHANGED and task.notify and not persisted
                and not self._check_mode(task)):
            try:
                persist(task, self.state.connections[host.name],
                        self.state.pending_dir(host.name))
            except UnreachableError as exc:
                result = TaskResult(host.name, label, Status.UNREACHABLE,
                                    masker.text(exc.render()), duration_s=duration)
        return [self.state.record(result)]

    def task_context(self, play: Play, task: Task, host: Host, templar: Templar, conn: Any,
                     resolved: Mapping[str, Any]) -> TaskContext:
        """Return what ``task``'s module sees on ``host`` (``resolved``: its variables)."""
        check = self._check_mode(task)
        state = self.state
        return TaskContext(
            host=host, conn=conn, connections=state.connections, inventory=state.inventory,
            replica=state.inventory.replica_of(host.name),
            node=node_of(state.inventory, host.name), vars=resolved,
            check_mode=check, diff_mode=state.options.diff_mode, templar=templar,
            role_path=task.role_path, template_dirs=play.template_dirs, file_dirs=play.file_dirs,
            host_state=state.host_state.setdefault(host.name, {}),
            run_state=state.host_state,
            notify_script=("" if check or not task.notify
                           else notify_script(task, state.pending_dir(host.name))),
            task_name=task.name, no_log=task.no_log, facts=self.variables.facts,
        )

    def ensure_lock_held(self, task: Task, host: Host) -> None:
        """The run lock's check point before ``task`` may change ``host`` (and its
        ``delegate_to`` host): the connection factory's ``ensure_held`` when it has one
        (:class:`vllm_provision.transport.runlock.LendingFactory`; no round trip while the lock
        is held). A lost lock fails the task, so the host makes no further change in this run.

        Raises:
            RunLockLost: this run's lock on one of them was lost (docs/security.md, "Run lock").
        """
        names = [host.name]
        if task.delegate_to and task.delegate_to in self.state.inventory.hosts:
            names.append(task.delegate_to)
        self._ensure_held(names)

    def lock_held(self, name: str) -> bool:
        """Whether this run still holds host ``name``'s run lock (True without a lock); for the
        prefetcher, which runs a task's lead command ahead of the task."""
        try:
            self._ensure_held([name])
        except ProvisionError:
            return False
        return True

    def _ensure_held(self, names: list[str]) -> None:
        ensure = getattr(self.connection_factory, "ensure_held", None)
        if ensure is not None:
            ensure(*names)

    def _execute(self, play: Play, task: Task, host: Host) -> tuple[ModuleResult, bool]:
        self.ensure_lock_held(task, host)
        templar = self.variables.templar_for(play, host)
        if task.when and not templar.test(list(task.when), f"{task.where}.when"):
            result = ModuleResult(Status.SKIPPED, "condition false")
            self.variables.register(task, host.name, result)
            return result, False
        spec = find_module(task.module)
        assert spec is not None
        args = templar.render_value(task.args, f"{task.where}.{task.module}")
        if spec.arguments is not None:  # the rendered values, against the module's declaration
            args = spec.arguments.validate(args, f"{task.where}.{task.module}")
        conn = self._connection_for(task, host)
        ctx = self.task_context(play, task, host, templar, conn, templar.lazy())
        result = spec.run(ctx, args)
        if not isinstance(result, ModuleResult):
            raise ProvisionError.single(task.where, f"module {task.module} returned "
                                                    f"{type(result).__name__}, not ModuleResult")
        result = _apply_conditions(task, templar, result)
        self.variables.register(task, host.name, result)
        return result, ctx.notify_used or result.persisted_notify

    def _to_task_result(self, task: Task, host: str, module_result: ModuleResult,
                        duration: float, note: str) -> TaskResult:
        masker = self.state.masker
        message = module_result.message
        if note:
            message = f"{note}; {message}" if message else note
        diff = module_result.diff if self.state.options.diff_mode else ""
        data = module_result.data
        if task.no_log:
            unaffected = bool((data or {}).get(UNAFFECTED_KEY))
            message = "(output hidden: no_log)" if message else ""
            if unaffected:
                message += f"; {UNAFFECTED_NOTE}"
            data = {UNAFFECTED_KEY: True} if unaffected else None
        # a diff is shown line by line with only the secrets masked, even under no_log; hidden
        # only when it is nothing but secrets (docs/security.md)
        diff = mask_diff(masker, diff) if diff else ""
        return TaskResult(host, task.name, module_result.status, masker.text(message),
                          diff, duration, masker.data(data), register=task.register)

    def _check_mode(self, task: Task) -> bool:
        return self.state.options.check_mode if task.check_mode is None else task.check_mode

    def _connection_for(self, task: Task, host: Host) -> Connection:
        connections = self.state.connections
        if task.delegate_to:
            target = task.delegate_to
            if target in LOCALHOST_NAMES:
                return LocalConnection(become=bool(task.become),
                                       command_timeout_s=self.state.options.connection
                                       .command_timeout_s)
            if target not in self.state.inventory.hosts:
                raise ProvisionError.single(f"{task.where}.delegate_to",
                                            f"unknown host '{target}'",
                                            expected="an inventory host name or localhost")
            if target not in connections:
                self.connect([self.state.inventory.hosts[target]])
            if target not in connections:
                raise UnreachableError.single(host.name, f"delegate host {target} is unreachable")
            conn = connections[target]
        else:
            conn = connections[host.name]
        with_become = getattr(conn, "with_become", None)
        if task.become is not None and with_become is not None:
            return with_become(task.become)
        return conn


def _apply_conditions(task: Task, templar: Templar, result: ModuleResult) -> ModuleResult:
    """``failed_when`` then ``changed_when`` over the module's status (Ansible's order)."""
    if task.changed_when is None and task.failed_when is None:
        return result
    if result.status is Status.SKIPPED:
        return result
    value = registered_value(result)
    names = {"result": value, **({task.register: value} if task.register else {})}
    scoped = templar.with_vars(names)
    status = result.status
    if task.failed_when is not None:
        failed = scoped.test(_as_list(task.failed_when), f"{task.where}.failed_when")
        if failed:
            status = Status.FAILED
        elif status is Status.FAILED:
            status = Status.CHANGED
    if task.changed_when is not None and status is not Status.FAILED:
        changed = scoped.test(_as_list(task.changed_when), f"{task.where}.changed_when")
        status = Status.CHANGED if changed else Status.OK
    message = result.message
    if status is Status.FAILED and result.status is not Status.FAILED:
        message = message or "failed_when condition true"
    return ModuleResult(status, message, result.diff, result.data, result.host_results,
                        result.persisted_notify)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]
