"""The stack operations behind ``provision stack lock|sync|rollback|status`` (docs/stack.md).

Each acts on one replica at a time (replicas are independent: the command goes on with the
next one when one fails) over one connection per node:

- :func:`lock_replica`: read every node's platform and Python (one round trip each), refuse
  nodes that differ, resolve the requirements with ``uv pip compile --generate-hashes``
  (:func:`vllm_provision.stack.lock.compile_lock`) and write the lock atomically;
- :func:`sync_replica`: every node builds and checks the lock's stack in a new venv, in
  parallel, and only when all of them did does any node switch, so a node lost mid-build
  leaves the whole replica on its old venv;
- :func:`rollback_replica`: every node back to its previous stack, or none;
- :func:`status_replica`: each node's active venv against the lock.

``sync`` and ``rollback`` change the nodes: the command holds the run lock on every node of
the replicas it acts on for the whole command (:func:`locked`, the same lock as ``provision
up``), and each step that writes on a node checks first that this run still holds that node's
lock (docs/security.md, "Run lock"). ``lock`` and ``status`` only read the nodes: no lock.

The command module (``vllm_provision.cli.stack``) only parses options and prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.files import replace_atomically
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.inventory import select_hosts
from vllm_provision.stack import lock as stack_lock
from vllm_provision.stack import sync as stack_sync
from vllm_provision.transport import runlock
from vllm_provision.transport.connection import ConnectionOptions, close_all, open_all


def replicas_with_locks(inventory: Inventory, limit: str | None) -> list[tuple[Replica, Path]]:
    """The replicas ``limit`` touches (all without one), each with its lock file's path.

    Raises:
        ProvisionError: a chosen replica has no ``vllm_stack_lock`` (names the inventory and
            the replica, and what to set).
    """
    wanted = {h.name for h in select_hosts(inventory, limit)} if limit else None
    chosen = []
    for replica in inventory.replicas:
        if wanted is not None and not any(n.name in wanted for n in replica.nodes):
            continue
        path = stack_lock.lock_path(inventory, replica)
        if path is None:
            raise ProvisionError.single(
                f"{inventory.path}: replica {replica.name}", "vllm_stack_lock is not set",
                fix="set vllm_stack_lock: stack.lock.txt (a path beside the inventory) in the "
                    "replica's group vars")
        chosen.append((replica, path))
    return chosen


@contextmanager
def locked(replicas: Sequence[Replica], options: ConnectionOptions, command: str,
           warn: Callable[[str], None]) -> Iterator[runlock.LendingFactory]:
    """Hold the run lock on every node of ``replicas`` for the block
    (:func:`vllm_provision.transport.runlock.locked_run`) and yield its connection factory
    (pass it to :func:`sync_replica` / :func:`rollback_replica`).

    Args:
        replicas: the replicas the command acts on. options: the connection options.
        command: ``stack sync`` or ``stack rollback`` (the holder file names it).
        warn: receives one line per stale lock taken over.

    Raises:
        RunLockError: another run holds a node's lock (nothing was changed).
    """
    hosts = [node.host for replica in replicas for node in replica.nodes]
    with runlock.locked_run(hosts, options, command, warn=warn) as factory:
        yield factory


def connect(replica: Replica, options: ConnectionOptions,
            factory: runlock.LendingFactory | None = None) -> dict[str, Any]:
    """One connection per node of ``replica`` (host name -> connection), or none
    (:func:`vllm_provision.transport.connection.open_all`); ``factory``: the run lock's, which
    lends the connections the lock holds.

    Raises:
        ProvisionError: a node cannot be reached (every reason, one per host).
    """
    return open_all([n.host for n in replica.nodes], options, factory)


def _check_point(factory: runlock.LendingFactory | None, name: str) -> Callable[[], None]:
    """The run lock's check point of node ``name`` (nothing without a lock)."""
    def held() -> None:
        if factory is not None:
            factory.ensure_held(name)
    return held


def probe(connections: Mapping[str, Any], venv: str) -> dict[str, stack_sync.NodeStack]:
    """Probe every node's stack beside ``venv`` (:func:`vllm_provision.stack.sync.probe_nodes`).

    Raises:
        ProvisionError: a node's probe failed (one problem per node).
    """
    nodes = stack_sync.probe_nodes(connections, venv)
    failed = [Problem(n.host, n.error) for n in nodes.values() if n.error and not n.target]
    if failed:
        raise ProvisionError(failed)
    return nodes


@dataclass(frozen=True)
class LockWritten:
    """What :func:`lock_replica` wrote.

    Attributes:
        path: the lock file. lock: the new lock. target / python: the nodes' platform and
        Python. changes: ``(package, before, after)`` against the lock that was there (None:
        absent or removed).
    """

    path: Path
    lock: stack_lock.Lock
    target: str
    python: str
    changes: list[tuple[str, str | None, str | None]]


def lock_replica(replica: Replica, path: Path, options: ConnectionOptions, *,
                 requirements: Path | None, excludes: Path | None, overrides: Path | None,
                 warn: Callable[[str], None]) -> LockWritten:
    """Resolve the replica's requirements for its nodes' platform and write its lock.

    Args:
        replica: the replica. path: its lock file. options: connection options.
        requirements: the short list (default: ``requirements.in`` beside the lock).
        excludes / overrides: uv's files (default: ``excludes.txt`` / ``overrides.txt`` beside
            the lock, when there).
        warn: receives a warning line (a lock written with a file this run has not).

    Raises:
        ProvisionError: no requirements file, a node unreachable, nodes on different
            platforms, or uv failed (the lock file is unchanged then).
    """
    source = requirements or path.with_name("requirements.in")
    if not source.is_file():
        raise ProvisionError.single(str(source), "no requirements file",
                                    fix="write the short list (vllm==..., ray==...) there, "
                                        "or pass -r FILE")
    connections = connect(replica, options)
    try:
        nodes = probe(connections, stack_sync.venv_of(replica))
    finally:
        close_all(connections)
    target, python = stack_sync.same_target(list(nodes.values()))
    extra = {name: given or _beside(path, f"{name}.txt")
             for name, given in (("excludes", excludes), ("overrides", overrides))}
    text = stack_lock.compile_lock(source, target, python, excludes=extra["excludes"],
                                   overrides=extra["overrides"])
    new = stack_lock.parse_lock(text, str(path))
    old = stack_lock.read_lock(path) if path.exists() else None
    old_text = path.read_text(encoding="utf-8") if old is not None else ""
    for name, given in extra.items():
        if given is None and f"\n# {name}: " in old_text:
            warn(f"{path} was written with --{name}; this lock has none "
                 f"(write {name}.txt beside it, or pass --{name} FILE)")
    replace_atomically(path, text, mode=0o644)
    return LockWritten(path, new, target, python, stack_lock.diff_locks(old, new))


def _beside(lock: Path, name: str) -> Path | None:
    """``name`` in the lock's folder when that file exists, else None."""
    candidate = lock.with_name(name)
    return candidate if candidate.is_file() else None


def sync_replica(replica: Replica, path: Path, wheelhouse: Path | None,
                 options: ConnectionOptions, *, progress: Callable[[str], None],
                 factory: runlock.LendingFactory | None = None) -> tuple[str, list[Any]]:
    """Sync one replica's nodes to its lock at ``path``: ``(lock id, NodeResult per node)``.

    Two phases: every node builds and checks its stack (in parallel), and only when all of them
    did does any node switch, so a node lost mid-build leaves the whole replica on its old venv
    (docs/stack.md).

    Args:
        replica: the replica. path: its lock file. wheelhouse: a folder of wheels to take
            (None: download the lock's wheels into the controller's cache). options: the
            connection options. progress: receives one line per step of a node's build.
        factory: the run lock's connection factory (:func:`locked`): each step that writes on
            a node checks that node's lock first, and every node's before any node switches
            (a node whose lock was lost fails; then no node switches).

    Raises:
        ProvisionError: the lock is unreadable, a node is unreachable or on another target.
        RunLockLost: the run's lock on a node was lost before the switch (no node switched).
    """
    lock = stack_lock.read_lock(path)
    venv = stack_sync.venv_of(replica)
    target = f"{venv}.stack-{lock.id}"
    connections = connect(replica, options, factory)
    try:
        nodes = probe(connections, venv)
        stack_sync.check_target(lock, nodes)
        wheels: dict[str, Any] = {}
        if any(not (n.active == target and n.active_complete) for n in nodes.values()):
            folder = wheelhouse
            if folder is None:
                folder = stack_sync.default_wheelhouse(lock)
                stack_sync.download_wheels(path, lock, folder)
            wheels = stack_sync.wheel_plan(lock, stack_sync.index_wheelhouse(folder), str(folder))

        def build(name: str) -> Any:
            try:
                return stack_sync.build_node(connections[name], nodes[name], lock, wheels,
                                             venv, progress=progress,
                                             held=_check_point(factory, name))
            except ProvisionError as exc:
                return stack_sync.NodeResult(name, active=nodes[name].active, error=exc.render())

        def switch(result: Any) -> Any:
            try:
                return stack_sync.switch_node(connections[result.host], result, venv, lock.id,
                                              held=_check_point(factory, result.host),
                                              prune=False)
            except ProvisionError as exc:
                result.error = exc.render()
                return result

        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            results = list(pool.map(build, nodes))
            broken = [r.host for r in results if r.error]
            if not broken:
                if factory is not None:  # all or none: every node's lock before any switch
                    factory.ensure_held(*nodes)
                switched = list(pool.map(switch, results))
                return lock.id, _all_or_none(switched, connections, venv, factory, pool)
        for result in results:
            if not result.error and result.active != target:
                result.held = f"{', '.join(broken)} failed"
        return lock.id, results
    finally:
        close_all(connections)


def _all_or_none(results: list[Any], connections: Mapping[str, Any], venv: str,
                 factory: runlock.LendingFactory | None, pool: ThreadPoolExecutor) -> list[Any]:
    """After the switch phase: when every node switched (or had the stack already), prune
    each; when one failed, switch back every node that did (docs/stack.md, "All or none"), so
    the replica stays on one stack, and say so in each result. A node that cannot be switched
    back is named as left on the new stack."""
    failed = [r.host for r in results if r.error]
    if not failed:
        def prune(result: Any) -> Any:
            try:
                stack_sync.prune_node(connections[result.host], venv,
                                      _check_point(factory, result.host))
            except ProvisionError as exc:  # switched; only the old stacks stay on disk
                result.held = f"switched, but pruning the old stacks failed: {exc.render()}"
            return result
        return list(pool.map(prune, results))
    for result in results:
        if result.error or not result.switched:
            continue
        try:
            stack_sync.undo_switch(connections[result.host], result, venv)
            result.held = f"switched back: {', '.join(failed)} failed to switch"
        except ProvisionError as exc:
            result.error = (f"left on the new stack: switching back after {', '.join(failed)} "
                            f"failed did not work: {exc.render()}")
    return results


def rollback_replica(replica: Replica, options: ConnectionOptions,
                     factory: runlock.LendingFactory | None = None) -> tuple[bool, list[str]]:
    """Point every node's venv back at its previous stack (kept by the last sync), or none.

    Every node is probed first: a node without a previous stack refuses the whole replica's
    rollback before any node changed (a replica on two stacks would mix versions). With
    ``factory`` (the run lock's, :func:`locked`), every node's lock is checked before the first
    node rolls back, and each node's again just before its own rollback.

    Returns:
        ``(failed, lines)``: whether anything failed, and one human line per node (``host:
        before -> active``) or per failure.
    """
    venv = stack_sync.venv_of(replica)
    try:
        connections = connect(replica, options, factory)
    except ProvisionError as exc:
        return True, [f"replica {replica.name}: FAILED, nothing rolled back: {exc.render()}"]
    lines: list[str] = []
    failed = False
    try:
        nodes = probe(connections, venv)
        missing = [n.host for n in nodes.values() if not n.previous]
        if missing:
            return True, [f"replica {replica.name}: FAILED, nothing rolled back: "
                          f"no previous stack is kept beside {venv} on {', '.join(missing)} "
                          "(a sync that switched keeps one)"]
        if factory is not None:  # all or none: every node's lock before the first change
            factory.ensure_held(*connections)
        done: list[str] = []
        for name, conn in connections.items():
            try:
                _check_point(factory, name)()
                answer = stack_sync.run_node(conn, {"action": "rollback", "venv": venv})
            except ProvisionError as exc:
                failed = True
                lines.append(f"{name}: FAILED: {exc.render()}")
                # all or none: the nodes already rolled back go forward again (rollback swaps
                # the active and the previous stack), so the replica stays on one stack
                for back in reversed(done):
                    try:
                        again = stack_sync.run_node(connections[back],
                                                    {"action": "rollback", "venv": venv})
                        lines.append(f"{back}: rolled forward again to {again.get('active')} "
                                     f"({name} failed)")
                    except ProvisionError as undo:
                        lines.append(f"{back}: FAILED to roll forward again, left on the "
                                     f"previous stack: {undo.render()}")
                break
            done.append(name)
            lines.append(f"{name}: {answer.get('before')} -> {answer.get('active')}")
    except ProvisionError as exc:
        return True, [*lines, f"replica {replica.name}: FAILED, nothing rolled back: "
                              f"{exc.render()}"]
    finally:
        close_all(connections)
    return failed, lines


def status_replica(replica: Replica, path: Path, options: ConnectionOptions) -> tuple[
        stack_lock.Lock, list[tuple[str, stack_sync.NodeStack, list[Any]]]]:
    """Each node's active venv against the replica's lock.

    Returns:
        ``(lock, [(host, node stack, differences)])``; no difference: the node matches.

    Raises:
        ProvisionError: the lock is unreadable or a node unreachable.
    """
    lock = stack_lock.read_lock(path)
    connections = connect(replica, options)
    try:
        nodes = probe(connections, stack_sync.venv_of(replica))
    finally:
        close_all(connections)
    return lock, [(name, node, stack_lock.compare(lock, name, node.packages))
                  for name, node in nodes.items()]
