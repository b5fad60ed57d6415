"""``provision stack``: the replica's Python stack from one lock (docs/stack.md).

``lock`` resolves a short requirements list for the nodes' platform and Python with ``uv pip
compile --generate-hashes``; ``sync`` installs the lock on every node, air-gapped, into a new
venv and switches to it atomically; ``rollback`` returns to the previous venv; ``status``
compares each node's active venv with the lock.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, shared_options

# The host options without --json: these commands print lines for an operator (and exit codes).
STACK_OPTIONS = tuple(name for name in HOST_OPTIONS if name != "json")


@click.group("stack", epilog=examples(
    "provision stack lock -i inventory.yml -r requirements.in",
    "provision stack sync -i inventory.yml",
    "provision stack status -i inventory.yml",
    "provision stack rollback -i inventory.yml"))
def command() -> None:
    """Install and upgrade the replica's Python stack from one reviewed lock."""


def _replicas(opts: CommonOptions) -> tuple[Any, list[tuple[Any, Path]]]:
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.stack import lock as stack_lock

    inventory = opts.load_inventory()
    wanted = None
    if opts.limit:
        from vllm_provision.inventory import select_hosts

        wanted = {h.name for h in select_hosts(inventory, opts.limit)}
    chosen = []
    for replica in inventory.replicas:
        if wanted is not None and not any(n.name in wanted for n in replica.nodes):
            continue
        path = stack_lock.lock_path(inventory, replica)
        if path is None:
            raise ProvisionError.single(
                f"{opts.inventory}: replica {replica.name}", "vllm_stack_lock is not set",
                fix="set vllm_stack_lock: stack.lock.txt (a path beside the inventory) in the "
                    "replica's group vars")
        chosen.append((replica, path))
    return inventory, chosen


def _connect(opts: CommonOptions, replica: Any) -> dict[str, Any]:
    """One connection per node of ``replica`` (as ``provision bench`` and ``fault`` open them).

    Raises:
        ProvisionError: a node cannot be reached (every reason, one per host).
    """
    from vllm_provision.cli.bench import connect

    return connect(opts, replica)


def _probe(connections: dict[str, Any], venv: str) -> dict[str, Any]:
    from vllm_provision.core.errors import Problem, ProvisionError
    from vllm_provision.stack import sync as stack_sync

    nodes = stack_sync.probe_nodes(connections, venv)
    failed = [Problem(n.host, n.error) for n in nodes.values() if n.error and not n.target]
    if failed:
        raise ProvisionError(failed)
    return nodes


@command.command("lock", epilog=examples(
    "provision stack lock -i inventory.yml                     # requirements.in beside the lock",
    "provision stack lock -i inventory.yml -r requirements.in",
    "provision stack lock -i inventory.yml --excludes excludes.txt   # e.g. torchvision"))
@shared_options(STACK_OPTIONS)
@click.option("-r", "--requirements", "requirements", type=click.Path(path_type=Path),
              help="The short requirements list (default: requirements.in beside the lock).")
@click.option("--excludes", type=click.Path(path_type=Path, dir_okay=False,
                                                exists=True),
              help="Names uv leaves out of the resolution even where a package depends on "
                   "them (default: excludes.txt beside the lock, when there).")
@click.option("--overrides", type=click.Path(path_type=Path, dir_okay=False,
                                                exists=True),
              help="Requirements that replace what packages ask for (default: overrides.txt "
                   "beside the lock, when there).")
def lock_command(requirements: Path | None, excludes: Path | None, overrides: Path | None,
                 **kwargs: Any) -> None:
    """Resolve the requirements for the nodes' platform and Python and write the lock.

    Reads each node's machine, glibc and python3 (one round trip each) and refuses when the
    replica's nodes differ. Prints what changed against the lock already there. uv's
    --excludes and --overrides files are passed on and named in the lock's header.
    """
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.core.files import replace_atomically
    from vllm_provision.stack import lock as stack_lock
    from vllm_provision.stack import sync as stack_sync
    from vllm_provision.transport.connection import close_all

    opts = CommonOptions.from_kwargs(kwargs)
    _inventory, chosen = _replicas(opts)
    for replica, path in chosen:
        source = requirements or path.with_name("requirements.in")
        if not source.is_file():
            raise ProvisionError.single(str(source), "no requirements file",
                                        fix="write the short list (vllm==..., ray==...) there, "
                                            "or pass -r FILE")
        connections = _connect(opts, replica)
        try:
            nodes = _probe(connections, stack_sync.venv_of(replica))
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
                click.echo(f"warning: {path} was written with --{name}; this lock has none "
                           f"(write {name}.txt beside it, or pass --{name} FILE)", err=True)
        replace_atomically(path, text, mode=0o644)
        changes = stack_lock.diff_locks(old, new)
        click.echo(f"{path}: {len(new.pins)} packages for {target}, Python {python} "
                   f"(stack {new.id})")
        for name, before, after in changes:
            click.echo(f"  {name}: {before or '(absent)'} -> {after or '(removed)'}")
        if not changes:
            click.echo("  no change")


def _beside(lock: Path, name: str) -> Path | None:
    """``name`` in the lock's folder when that file exists, else None."""
    candidate = lock.with_name(name)
    return candidate if candidate.is_file() else None


@command.command("sync", epilog=examples(
    "provision stack sync -i inventory.yml",
    "provision stack sync -i inventory.yml --wheelhouse /srv/wheelhouse"))
@shared_options(STACK_OPTIONS)
@click.option("--wheelhouse", type=click.Path(path_type=Path, file_okay=False),
              help="A folder of wheels to take (default: download the lock's wheels into the "
                   "controller's cache).")
def sync_command(wheelhouse: Path | None, **kwargs: Any) -> None:
    """Install the lock on every node into a new venv, check it, and switch atomically.

    Pushes only the wheels a node lacks over SSH (checked by sha256), installs with pip
    --no-index --no-deps --require-hashes, checks versions and imports (and vllm --version),
    then points vllm_venv at the new venv with one rename(2). The previous venv is kept for
    rollback. A second run changes nothing; an interrupted run leaves the old venv active.
    """
    from vllm_provision.core.errors import ProvisionError

    opts = CommonOptions.from_kwargs(kwargs)
    _inventory, chosen = _replicas(opts)
    failed = False
    for replica, path in chosen:  # replicas are independent: one's failure skips no other
        try:
            lock_id, results = _sync_replica(opts, replica, path, wheelhouse)
        except ProvisionError as exc:
            failed = True
            click.echo(f"replica {replica.name}: FAILED: {exc.render()}")
            continue
        for result in results:
            click.echo(result.line())
        changed = sum(r.changed for r in results)
        errors = sum(bool(r.error) for r in results)
        failed = failed or bool(errors)
        click.echo(f"replica {replica.name}: stack {lock_id}: {changed} changed, "
                   f"{len(results) - changed - errors} unchanged, {errors} failed"
                   + ("; no node switched, run sync again" if any(r.held for r in results)
                      else "")
                   + ("; `provision up` restarts the replica once to use it"
                      if changed and not errors else ""))
    sys.exit(1 if failed else 0)


def _sync_replica(opts: CommonOptions, replica: Any, path: Path,
                  wheelhouse: Path | None) -> tuple[str, list[Any]]:
    """Sync one replica's nodes to its lock at ``path``: ``(lock id, sync.NodeResult per node)``.

    Two phases: every node builds and checks its stack (in parallel), and only when all of them
    did does any node switch, so a node lost mid-build leaves the whole replica on its old venv
    (docs/stack.md).

    Raises:
        ProvisionError: the lock is unreadable, a node is unreachable or on another target.
    """
    from concurrent.futures import ThreadPoolExecutor

    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.stack import lock as stack_lock
    from vllm_provision.stack import sync as stack_sync
    from vllm_provision.transport.connection import close_all

    lock = stack_lock.read_lock(path)
    venv = stack_sync.venv_of(replica)
    target = f"{venv}.stack-{lock.id}"
    connections = _connect(opts, replica)
    try:
        nodes = _probe(connections, venv)
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
                                             venv, progress=click.echo)
            except ProvisionError as exc:
                return stack_sync.NodeResult(name, active=nodes[name].active, error=exc.render())

        def switch(result: Any) -> Any:
            try:
                return stack_sync.switch_node(connections[result.host], result, venv, lock.id)
            except ProvisionError as exc:
                result.error = exc.render()
                return result

        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            results = list(pool.map(build, nodes))
            broken = [r.host for r in results if r.error]
            if not broken:
                return lock.id, list(pool.map(switch, results))
        for result in results:
            if not result.error and result.active != target:
                result.held = f"{', '.join(broken)} failed"
        return lock.id, results
    finally:
        close_all(connections)


@command.command("rollback", epilog=examples("provision stack rollback -i inventory.yml"))
@shared_options(STACK_OPTIONS)
def rollback_command(**kwargs: Any) -> None:
    """Point every node's venv back at its previous stack (kept by the last sync).

    Every node of a replica must keep a previous stack, or no node is rolled back. The units
    restart on the next `provision up`. Revert the lock file too (git), so preflight
    and drift compare the nodes with what they run.
    """
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.stack import sync as stack_sync
    from vllm_provision.transport.connection import close_all

    opts = CommonOptions.from_kwargs(kwargs)
    _inventory, chosen = _replicas(opts)
    failed = False
    for replica, _path in chosen:  # replicas are independent: one's failure skips no other
        venv = stack_sync.venv_of(replica)
        try:
            connections = _connect(opts, replica)
        except ProvisionError as exc:
            failed = True
            click.echo(f"replica {replica.name}: FAILED, nothing rolled back: {exc.render()}")
            continue
        try:
            # every node first: a node without a previous stack refuses the whole replica's
            # rollback before any node changed (a replica on two stacks would mix versions)
            nodes = _probe(connections, venv)
            missing = [n.host for n in nodes.values() if not n.previous]
            if missing:
                failed = True
                click.echo(f"replica {replica.name}: FAILED, nothing rolled back: "
                           f"no previous stack is kept beside {venv} on {', '.join(missing)} "
                           "(a sync that switched keeps one)")
                continue
            for name, conn in connections.items():
                try:
                    answer = stack_sync.run_node(conn, {"action": "rollback", "venv": venv})
                except ProvisionError as exc:
                    failed = True
                    click.echo(f"{name}: FAILED: {exc.render()}")
                    continue
                click.echo(f"{name}: {answer.get('before')} -> {answer.get('active')}")
        except ProvisionError as exc:
            failed = True
            click.echo(f"replica {replica.name}: FAILED, nothing rolled back: {exc.render()}")
        finally:
            close_all(connections)
    sys.exit(1 if failed else 0)


@command.command("status", epilog=examples("provision stack status -i inventory.yml"))
@shared_options(STACK_OPTIONS)
def status_command(**kwargs: Any) -> None:
    """Compare each node's active venv with the lock: package, node, expected, actual.

    Exit status: 0 every node matches, 2 a node differs (as `provision drift`), 1 error.
    """
    from vllm_provision.stack import lock as stack_lock
    from vllm_provision.stack import sync as stack_sync
    from vllm_provision.transport.connection import close_all

    opts = CommonOptions.from_kwargs(kwargs)
    _inventory, chosen = _replicas(opts)
    differs = False
    for replica, path in chosen:
        lock = stack_lock.read_lock(path)
        connections = _connect(opts, replica)
        try:
            nodes = _probe(connections, stack_sync.venv_of(replica))
        finally:
            close_all(connections)
        for name, node in nodes.items():
            found = stack_lock.compare(lock, name, node.packages)
            differs = differs or bool(found)
            state = "matches the lock" if not found else f"{len(found)} packages differ"
            click.echo(f"{name}: {node.active or '(no venv)'}: {state} (stack {lock.id})")
            for d in found:
                click.echo(f"  {d.package}  {d.host}  expected {d.expected}  actual "
                           f"{d.actual or 'not installed'}")
    sys.exit(2 if differs else 0)
