"""Run plays: hosts in parallel (bounded by ``forks``), tasks in order, handlers at the end.

Semantics follow Ansible's linear strategy (docs playbooks_strategies.rst, playbooks_handlers.rst)
with three extensions: notifications are persisted on the host until their handler ran
(``handlers_state``), a handler may have ``scope: replica``, and a play's ``any_errors_fatal``
may be narrowed to the failed host's replica (``fatal_scope: replica``, docs/engine.md).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vllm_provision import handlers_state, settings
from vllm_provision.connection import (
    Connection,
    ConnectionOptions,
    HostConnection,
    LocalConnection,
    UnreachableError,
    close_all,
    open_connections,
)
from vllm_provision.errors import ProvisionError
from vllm_provision.models import Host, Inventory
from vllm_provision.modules import UNAFFECTED_KEY, UNAFFECTED_NOTE, ModuleResult, find_module
from vllm_provision.results import Status, TaskResult
from vllm_provision.runner.context import TaskContext
from vllm_provision.runner.masking import Masker, mask_diff
from vllm_provision.runner.playbook import Play, Task, load_playbook
from vllm_provision.runner.prefetch import PrefetchingConnection
from vllm_provision.runner.selection import select_play_hosts
from vllm_provision.runner.templating import Templar, environment_for

log = logging.getLogger(__name__)

LOCALHOST_NAMES = ("localhost", "127.0.0.1")


class Reporter(Protocol):
    """Receives events as they happen (``report.HumanReporter``, ``report.JsonReporter``)."""

    def play_started(self, name: str, hosts: Sequence[str]) -> None: ...
    def task_started(self, name: str, *, handler: bool = False) -> None: ...
    def task_result(self, result: TaskResult) -> None: ...


class _NullReporter:
    def play_started(self, name: str, hosts: Sequence[str]) -> None:
        pass

    def task_started(self, name: str, *, handler: bool = False) -> None:
        pass

    def task_result(self, result: TaskResult) -> None:
        pass


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
            (``vllm_provision.plan``).
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


ConnectionFactory = Callable[[Host], Any]


class Runner:
    """Runs playbooks against one inventory; one connection per host for the whole run.

    Args:
        inventory: a loaded, validated inventory.
        options: :class:`RunOptions`.
        reporter: receives results as they arrive.
        connection_factory: builds a connection object for a host (tests pass a fake); it must
            have ``open()`` raising :class:`UnreachableError` and ``run(...)``.
    """

    def __init__(self, inventory: Inventory, options: RunOptions | None = None,
                 reporter: Reporter | None = None,
                 connection_factory: ConnectionFactory | None = None) -> None:
        self.inventory = inventory
        self.options = options or RunOptions()
        self.reporter = reporter or _NullReporter()
        self.connection_factory = connection_factory or (
            lambda host: HostConnection(host, self.options.connection))
        self.connections: dict[str, Any] = {}
        self.dropped: dict[str, Status] = {}
        self.host_state: dict[str, dict[str, Any]] = {}
        self.registered: dict[str, dict[str, Any]] = {}
        self.facts: dict[str, Any] = {}
        self.masker = Masker.from_inventory(inventory)
        self._no_prefetch: set[str] = set()  # hosts that changed or failed in this play batch
        self._ahead: dict[str, list[str]] = {}  # host -> lead commands of its last batch
        self.outcome = RunOutcome(check_mode=self.options.check_mode)
        self._aborted = False

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
        try:
            with ThreadPoolExecutor(max_workers=forks) as pool:
                self._pool = pool
                for play, hosts in selections:
                    if self._aborted:
                        break
                    self._run_play(play, hosts)
        finally:
            close_all(self.connections)
            self.outcome.duration_s = time.monotonic() - started
            self.outcome.aborted = self._aborted
        return self.outcome

    # -- plays ----------------------------------------------------------------------------------

    def _run_play(self, play: Play, hosts: list[Host]) -> None:
        active = [h for h in hosts if h.name not in self.dropped]
        self.reporter.play_started(play.name, [h.name for h in active])
        if not active:
            return
        size = play.serial or len(active)
        for start in range(0, len(active), size):
            batch = [h for h in active[start:start + size] if h.name not in self.dropped]
            if self._aborted:
                return
            self.outcome.batch_starts.append(len(self.outcome.results))
            self._connect(batch)
            batch = [h for h in batch if h.name not in self.dropped]
            self._no_prefetch = set()
            self._prefetch(play, batch)
            notified: dict[str, dict[str, Notifier]] = {}  # target -> host -> notifying task
            self._load_pending(play, batch, notified)
            for index, task in enumerate(play.tasks):
                if self._aborted:
                    return
                batch = [h for h in batch if h.name not in self.dropped]
                if not batch:
                    break
                self._run_task(play, task, batch, notified, index)
            self._drop_prefetched(batch)
            if not self._aborted:
                self._run_handlers(play, [h for h in batch if h.name not in self.dropped],
                                   notified)

    def _connect(self, hosts: list[Host]) -> None:
        missing = [h for h in hosts if h.name not in self.connections]
        if not missing:
            return
        opened, errors = open_connections(missing, self.options.connection,
                                          self.connection_factory)
        self.connections.update({name: PrefetchingConnection(conn)
                                 for name, conn in opened.items()})
        for name, error in errors.items():
            self._record(TaskResult(name, "Connect", Status.UNREACHABLE,
                                    self.masker.text(error.render())))
            self.dropped[name] = Status.UNREACHABLE

    # -- batched reads (docs/engine.md "Round trips") -------------------------------------------

    def _prefetch(self, play: Play, batch: list[Host]) -> None:
        """Run, per host and in parallel, the pending-notifications read and the read commands
        of the play's tasks in ONE round trip; modules asking for the same commands are then
        answered from the host's cache (``runner/prefetch.py``). A failure here is not reported:
        the live command that follows reports it as usual."""

        def one(host: Host) -> None:
            conn = self.connections.get(host.name)
            if not isinstance(conn, PrefetchingConnection):
                return
            try:
                commands = self._read_commands(play, host, conn, 0)
            except Exception:  # noqa: BLE001 - an optimisation only; tasks report it live
                commands = []
            if play.handlers:
                commands.insert(0, handlers_state.read_script(self.options.pending_dir))
            try:
                conn.prefetch(commands, ahead=self._ahead.get(host.name, ()))
            except UnreachableError:
                conn.drop()

        list(self._pool.map(one, batch))

    def _refill(self, play: Play, host: Host, index: int) -> None:
        """Before task ``index`` on ``host``: when a live command (e.g. an unchanged ``command``
        task) dropped the cache and nothing changed or failed on the host in this batch yet,
        batch the reads of the remaining tasks again (they run after that command, so they see
        its effects)."""
        conn = self.connections.get(host.name)
        if (not isinstance(conn, PrefetchingConnection) or not conn.ran_live
                or host.name in self._no_prefetch):
            return
        try:
            commands = self._read_commands(play, host, conn, index)
        except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
            commands = []
        if len(commands) < 2:
            conn.ran_live = False  # one read costs the same live; look again after the next
            return
        try:
            conn.prefetch(commands, ahead=self._ahead.get(host.name, ()))
        except UnreachableError:
            conn.drop()

    def _read_commands(self, play: Play, host: Host, conn: PrefetchingConnection,
                       start: int) -> list[str]:
        """Return the read commands ``host``'s tasks ``play.tasks[start:]`` will send first, in
        task order, up to the first task that will run something else (a later read would be
        dropped). When the first task to send anything has a module ``lead_command`` (a
        ``command`` task), that command leads the list, marked for the connection to run once
        (:meth:`PrefetchingConnection.prefetch` ``ahead``): the reads after it run after it, as
        they would live."""
        commands: list[str] = []
        registers = {t.register for t in play.tasks if t.register}
        pattern = (re.compile(r"\b(" + "|".join(re.escape(r) for r in sorted(registers)) + r")\b")
                   if registers else None)
        templar = self.templar_for(play, host)
        resolved: Mapping[str, Any] | None = None
        passed_over = False  # a task before this one may run live: nothing may run ahead of it
        self._ahead[host.name] = []
        for task in play.tasks[start:]:
            spec = find_module(task.module)
            if pattern is not None and pattern.search(repr((task.when, task.args))):
                passed_over = True
                continue  # depends on a value this play registers: cannot be known up front
            try:
                if task.when and not templar.test(list(task.when), f"{task.where}.when"):
                    continue  # skipped: sends nothing
            except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
                passed_over = True
                continue
            if (spec is not None and spec.read_command is None and spec.lead_command is not None
                    and not commands and not passed_over and spec.runs_on == "host"
                    and not task.run_once and not task.delegate_to and task.become is None
                    and not task.notify):
                lead = self._lead_command(play, task, host, templar, conn, spec)
                if lead is None:
                    break
                commands.append(lead)
                self._ahead[host.name].append(lead)
                if resolved is None:
                    resolved = templar.lazy()
                continue
            if (spec is None or spec.read_command is None or spec.runs_on != "host"
                    or task.run_once or task.delegate_to):
                break
            if task.become is not None and task.become != getattr(conn.inner, "become", None):
                passed_over = True
                continue
            try:
                args = templar.render_value(task.args, f"{task.where}.{task.module}")
                if resolved is None:
                    resolved = templar.lazy()
                ctx = self._task_context(play, task, host, templar, conn, resolved)
                command = spec.read_command(ctx, args)
            except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
                log.debug("%s: no prefetch for task %s", host.name, task.name, exc_info=True)
                passed_over = True
                continue
            if command and command not in self._ahead[host.name]:
                commands.append(command)
        return commands

    def _lead_command(self, play: Play, task: Task, host: Host, templar: Templar,
                      conn: PrefetchingConnection, spec: Any) -> str | None:
        """The first command of ``task``'s module (``lead_command``), rendered as ``run`` will
        get it; None when it cannot be known up front."""
        try:
            args = templar.render_value(task.args, f"{task.where}.{task.module}")
            if spec.arguments is not None:
                args = spec.arguments.validate(args, f"{task.where}.{task.module}")
            ctx = self._task_context(play, task, host, templar, conn, templar.lazy())
            command: str | None = spec.lead_command(ctx, args)
        except Exception:  # noqa: BLE001 - an optimisation only; the task reports it live
            log.debug("%s: no lead command for task %s", host.name, task.name, exc_info=True)
            return None
        return command or None

    def _drop_prefetched(self, hosts: Sequence[Host] | Sequence[str]) -> None:
        for host in hosts:
            name = host if isinstance(host, str) else host.name
            self._no_prefetch.add(name)
            conn = self.connections.get(name)
            if isinstance(conn, PrefetchingConnection):
                conn.drop()

    def _load_pending(self, play: Play, batch: list[Host],
                      notified: dict[str, dict[str, Notifier]]) -> None:
        """Read notifications left by earlier runs (one round trip per host, in parallel)."""
        if not play.handlers:
            return
        targets = {h.name for h in play.handlers} | {t for h in play.handlers for t in h.listen}
        script = handlers_state.read_script(self.options.pending_dir)

        def read(host: Host) -> tuple[Host, list[handlers_state.PendingNotification] | str]:
            try:
                result = self.connections[host.name].run(script)
            except UnreachableError as exc:
                return host, exc.render()
            return host, handlers_state.parse_pending(result.stdout) if result.ok else []

        for host, found in self._pool.map(read, batch):
            if isinstance(found, str):
                self._record(TaskResult(host.name, "Read pending notifications",
                                        Status.UNREACHABLE, self.masker.text(found)))
                self.dropped[host.name] = Status.UNREACHABLE
                continue
            for item in found:
                if item.handler in targets:
                    notified.setdefault(item.handler, {})[host.name] = Notifier(
                        item.task, earlier_run=True)

    # -- tasks ----------------------------------------------------------------------------------

    def _run_task(self, play: Play, task: Task, batch: list[Host],
                  notified: dict[str, dict[str, Notifier]], index: int = 0) -> None:
        self.reporter.task_started(task.name)
        spec = find_module(task.module)
        assert spec is not None  # validated at load time
        if spec.runs_on == "controller" or task.run_once:
            results = [self._run_on_host(play, task, batch[0], batch, controller=True)]
            first = results[0]
            # run_once / controller: the registered value is seen by every host (Ansible)
            if task.register and batch[0].name in self.registered:
                value = self.registered[batch[0].name].get(task.register)
                for host in batch[1:]:
                    self.registered.setdefault(host.name, {})[task.register] = value
            outcomes = [first]
        else:
            futures = [self._pool.submit(self._refill_and_run, play, task, host, batch, index)
                       for host in batch]
            outcomes = []
            for future in as_completed(futures):
                outcomes.append(future.result())
        failed_hosts: list[str] = []
        for result_list in outcomes:
            for result in result_list:
                self._after_result(task, result, notified)
                if result.status in (Status.FAILED, Status.UNREACHABLE) and not task.ignore_errors:
                    failed_hosts.append(result.host)
        if failed_hosts and play.any_errors_fatal:
            if play.fatal_scope == "replica":
                self._stop_replicas(task, failed_hosts)
            else:
                self._aborted = True

    def _stop_replicas(self, task: Task, failed_hosts: Sequence[str]) -> None:
        """``any_errors_fatal`` with ``fatal_scope: replica``: drop every node of each failed
        host's replica from the rest of the run (each gets a ``skipped`` result saying why);
        the other replicas go on. A failed host in no replica stops the whole run, as plain
        ``any_errors_fatal`` does."""
        for host_name in failed_hosts:
            replica = self.inventory.replica_of(host_name)
            if replica is None:
                self._aborted = True
                return
            for node in replica.nodes:
                if node.name in self.dropped:
                    continue
                self.dropped[node.name] = Status.FAILED
                self._drop_prefetched([node.name])
                self._record(TaskResult(
                    node.name, task.name, Status.SKIPPED,
                    f"replica {replica.name} stopped: {host_name} failed this task "
                    "(any_errors_fatal, fatal_scope: replica)"))

    def _refill_and_run(self, play: Play, task: Task, host: Host, batch: list[Host],
                        index: int) -> list[TaskResult]:
        self._refill(play, host, index)
        return self._run_on_host(play, task, host, batch)

    def _after_result(self, task: Task, result: TaskResult,
                      notified: dict[str, dict[str, Notifier]]) -> None:
        if result.status in (Status.CHANGED, Status.FAILED, Status.UNREACHABLE):
            self._drop_prefetched([result.host])  # a write may change what a later read sees
        if result.status is Status.CHANGED and not (result.data or {}).get(UNAFFECTED_KEY):
            for target in task.notify:
                notified.setdefault(target, {}).setdefault(result.host, Notifier(task.name))
        if result.status in (Status.FAILED, Status.UNREACHABLE) and not (
                task.ignore_errors and result.status is Status.FAILED):
            self.dropped.setdefault(result.host, result.status)

    def _run_on_host(self, play: Play, task: Task, host: Host, batch: list[Host],
                     *, controller: bool = False, handler: bool = False,
                     note: str = "") -> list[TaskResult]:
        """Run ``task`` on ``host``; report and record every result; return them."""
        started = time.monotonic()
        label = task.name
        try:
            module_result, persisted = self._execute(play, task, host, batch, handler=handler)
        except UnreachableError as exc:
            result = TaskResult(host.name, label, Status.UNREACHABLE,
                                self.masker.text(exc.render()),
                                duration_s=time.monotonic() - started)
            return [self._record(result)]
        except ProvisionError as exc:
            result = TaskResult(host.name, label, Status.FAILED, self.masker.text(exc.render()),
                                duration_s=time.monotonic() - started)
            self._register(task, host.name, result)
            return [self._record(result)]
        duration = time.monotonic() - started
        if module_result.host_results:
            results = []
            for name, sub in module_result.host_results.items():
                results.append(self._record(self._to_task_result(task, name, sub, duration, note)))
            return results
        result = self._to_task_result(task, host.name, module_result, duration, note)
        if (result.status is Status.CHANGED and task.notify and not persisted
                and not self._check_mode(task)):
            try:
                self._persist(task, host)
            except UnreachableError as exc:
                result = TaskResult(host.name, label, Status.UNREACHABLE,
                                    self.masker.text(exc.render()), duration_s=duration)
        return [self._record(result)]

    def _to_task_result(self, task: Task, host: str, module_result: ModuleResult,
                        duration: float, note: str) -> TaskResult:
        message = module_result.message
        if note:
            message = f"{note}; {message}" if message else note
        diff = module_result.diff if self.options.diff_mode else ""
        data = module_result.data
        if task.no_log:
            unaffected = bool((data or {}).get(UNAFFECTED_KEY))
            message = "(output hidden: no_log)" if message else ""
            if unaffected:
                message += f"; {UNAFFECTED_NOTE}"
            data = {UNAFFECTED_KEY: True} if unaffected else None
        # a diff is shown line by line with only the secrets masked, even under no_log; hidden
        # only when it is nothing but secrets (docs/security.md)
        diff = mask_diff(self.masker, diff) if diff else ""
        result = TaskResult(host, task.name, module_result.status, self.masker.text(message),
                            diff, duration, self.masker.data(data), register=task.register)
        return result

    def _record(self, result: TaskResult) -> TaskResult:
        self.outcome.results.append(result)
        self.reporter.task_result(result)
        return result

    def _check_mode(self, task: Task) -> bool:
        return self.options.check_mode if task.check_mode is None else task.check_mode

    def _persist(self, task: Task, host: Host) -> None:
        script = self._notify_script(task)
        if script:
            self.connections[host.name].run(script, check=True)

    def _notify_script(self, task: Task) -> str:
        return handlers_state.persist_script(
            [handlers_state.PendingNotification(target, task.name) for target in task.notify],
            self.options.pending_dir)

    def templar_for(self, play: Play, host: Host) -> Templar:
        """Return the Templar holding ``host``'s variables for ``play``
        (:func:`vllm_provision.settings.layered`: variables-table defaults < role defaults <
        inventory < play vars < registered < -e; docs/runner-contract.md)."""
        replica = self.inventory.replica_of(host.name)
        node = next((n for n in replica.nodes if n.name == host.name), None) if replica else None
        layered = settings.layered(host.vars, role_defaults=play.role_defaults,
                                   play_vars=play.vars,
                                   registered=self.registered.get(host.name, {}),
                                   extra_vars=self.inventory.extra_vars)
        groups = {name: self.inventory.hosts_in_group(name) for name in self.inventory.groups}
        fixed: dict[str, Any] = {
            "inventory_hostname": host.name,
            "groups": groups,
            "hostvars": {name: dict(h.vars) for name, h in self.inventory.hosts.items()},
            "replica": replica,
            "node": node,
            "engine": replica.engine if replica else None,
            "facts": self.facts.get(host.name),
            "check_mode": self.options.check_mode,
            "ansible_check_mode": self.options.check_mode,
            "role_names": [],
        }
        env = environment_for(list(play.template_dirs))
        return Templar(env, layered, host.name, fixed)

    def _execute(self, play: Play, task: Task, host: Host, batch: list[Host],
                 *, handler: bool) -> tuple[ModuleResult, bool]:
        templar = self.templar_for(play, host)
        if task.when and not templar.test(list(task.when), f"{task.where}.when"):
            result = ModuleResult(Status.SKIPPED, "condition false")
            self._register_module(task, host.name, result)
            return result, False
        spec = find_module(task.module)
        assert spec is not None
        args = templar.render_value(task.args, f"{task.where}.{task.module}")
        if spec.arguments is not None:  # the rendered values, against the module's declaration
            args = spec.arguments.validate(args, f"{task.where}.{task.module}")
        conn = self._connection_for(task, host)
        ctx = self._task_context(play, task, host, templar, conn, templar.lazy())
        result = spec.run(ctx, args)
        if not isinstance(result, ModuleResult):
            raise ProvisionError.single(task.where, f"module {task.module} returned "
                                                    f"{type(result).__name__}, not ModuleResult")
        result = self._apply_conditions(task, templar, result)
        self._register_module(task, host.name, result)
        return result, ctx.notify_used or result.persisted_notify

    def _task_context(self, play: Play, task: Task, host: Host, templar: Templar, conn: Any,
                      resolved: Mapping[str, Any]) -> TaskContext:
        check = self._check_mode(task)
        return TaskContext(
            host=host, conn=conn, connections=self.connections, inventory=self.inventory,
            replica=self.inventory.replica_of(host.name),
            node=_node_of(self.inventory, host.name), vars=resolved,
            check_mode=check, diff_mode=self.options.diff_mode, templar=templar,
            role_path=task.role_path, template_dirs=play.template_dirs, file_dirs=play.file_dirs,
            host_state=self.host_state.setdefault(host.name, {}),
            run_state=self.host_state,
            notify_script="" if check or not task.notify else self._notify_script(task),
            task_name=task.name, no_log=task.no_log, facts=self.facts,
        )

    def _apply_conditions(self, task: Task, templar: Templar,
                          result: ModuleResult) -> ModuleResult:
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

    def _register_module(self, task: Task, host: str, result: ModuleResult) -> None:
        if task.register:
            self.registered.setdefault(host, {})[task.register] = registered_value(result)

    def _register(self, task: Task, host: str, result: TaskResult) -> None:
        if task.register:
            self.registered.setdefault(host, {})[task.register] = {
                "status": str(result.status), "changed": False, "failed": True,
                "skipped": False, "msg": result.message}

    def _connection_for(self, task: Task, host: Host) -> Connection:
        if task.delegate_to:
            target = task.delegate_to
            if target in LOCALHOST_NAMES:
                return LocalConnection(become=bool(task.become),
                                       command_timeout_s=self.options.connection
                                       .command_timeout_s)
            if target not in self.inventory.hosts:
                raise ProvisionError.single(f"{task.where}.delegate_to",
                                            f"unknown host '{target}'",
                                            expected="an inventory host name or localhost")
            if target not in self.connections:
                self._connect([self.inventory.hosts[target]])
            if target not in self.connections:
                raise UnreachableError.single(host.name, f"delegate host {target} is unreachable")
            conn = self.connections[target]
        else:
            conn = self.connections[host.name]
        with_become = getattr(conn, "with_become", None)
        if task.become is not None and with_become is not None:
            return with_become(task.become)
        return conn

    # -- handlers -------------------------------------------------------------------------------

    def _run_handlers(self, play: Play, batch: list[Host],
                      notified: dict[str, dict[str, Notifier]]) -> None:
        """Run each notified handler once, in definition order; then clear what ran."""
        if not notified:
            return
        active = {h.name: h for h in batch}
        done_ok: dict[str, set[str]] = {}  # target -> hosts whose notification was served
        failed_targets: dict[str, set[str]] = {}
        for handler in play.handlers:
            targets = [t for t in (handler.name, *handler.listen) if t in notified]
            if not targets:
                continue
            notifying: dict[str, Notifier] = {}
            for target in targets:
                for host_name, why in notified[target].items():
                    notifying.setdefault(host_name, why)
            notifying = {h: why for h, why in notifying.items()
                         if h in active and h not in self.dropped}
            if not notifying:
                continue
            self.reporter.task_started(handler.name, handler=True)
            if handler.scope == "replica":
                succeeded = self._run_replica_handler(play, handler, active, notifying)
            else:
                succeeded = self._run_host_handler(play, handler, active, notifying)
            for target in targets:
                for host_name in notifying:
                    bucket = done_ok if host_name in succeeded else failed_targets
                    bucket.setdefault(target, set()).add(host_name)
        if self.options.check_mode:
            return
        clear: dict[str, list[str]] = {}
        for target, hosts in done_ok.items():
            for host_name in hosts - failed_targets.get(target, set()):
                clear.setdefault(host_name, []).append(target)
        for host_name, targets in clear.items():
            if host_name in self.dropped or host_name not in self.connections:
                continue
            try:
                self.connections[host_name].run(
                    handlers_state.clear_script(targets, self.options.pending_dir))
            except UnreachableError as exc:
                self._record(TaskResult(host_name, "Clear pending notifications",
                                        Status.UNREACHABLE, self.masker.text(exc.render())))
                self.dropped[host_name] = Status.UNREACHABLE

    def _run_host_handler(self, play: Play, handler: Task, active: Mapping[str, Host],
                          notifying: Mapping[str, Notifier]) -> set[str]:
        futures = [self._pool.submit(self._run_on_host, play, handler, active[name],
                                     list(active.values()), handler=True,
                                     note=why.note)
                   for name, why in notifying.items()]
        succeeded: set[str] = set()
        for future in as_completed(futures):
            for result in future.result():
                self._after_handler(handler, result)
                if result.status not in (Status.FAILED, Status.UNREACHABLE):
                    succeeded.add(result.host)
        return succeeded

    def _run_replica_handler(self, play: Play, handler: Task, active: Mapping[str, Host],
                             notifying: Mapping[str, Notifier]) -> set[str]:
        """Run once per replica, on every node in rank order (followers first by default)."""
        succeeded: set[str] = set()
        done_replicas: set[str] = set()
        for host_name, why in notifying.items():
            replica = self.inventory.replica_of(host_name)
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
                       if (self.inventory.replica_of(name) or None) == replica] if replica \
                else [host_name]
            all_ok = True
            for node_name in nodes:
                if node_name not in active or node_name in self.dropped:
                    all_ok = False
                    continue
                results = self._run_on_host(play, handler, active[node_name],
                                            list(active.values()), handler=True,
                                            note=why.note)
                for result in results:
                    self._after_handler(handler, result)
                    if result.status in (Status.FAILED, Status.UNREACHABLE):
                        all_ok = False
                if not all_ok and play.any_errors_fatal:
                    break
            if all_ok:
                succeeded.update(members)
        return succeeded

    def _after_handler(self, handler: Task, result: TaskResult) -> None:
        self.outcome.handler_results.append(
            HandlerResult(handler.name, handler.scope or "host", result))
        if result.status in (Status.FAILED, Status.UNREACHABLE) and not handler.ignore_errors:
            self.dropped.setdefault(result.host, result.status)


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


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _node_of(inventory: Inventory, host_name: str) -> Any:
    replica = inventory.replica_of(host_name)
    if replica is None:
        return None
    return next((n for n in replica.nodes if n.name == host_name), None)


