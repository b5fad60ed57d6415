"""``provision stack``: the replica's Python stack from one lock (docs/stack.md); the command
parses and prints, :mod:`vllm_provision.operations.stack` does the work.

``lock`` resolves a short requirements list for the nodes' platform and Python with ``uv pip
compile --generate-hashes``; ``sync`` installs the lock on every node, air-gapped, into a new
venv and switches to it atomically; ``rollback`` returns to the previous venv; ``status``
compares each node's active venv with the lock. ``sync`` and ``rollback`` hold the run lock on
every node they act on, as ``provision up`` does (docs/security.md, "Run lock").
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, echo, shared_options
from vllm_provision.core.errors import ProvisionError
from vllm_provision.operations import stack as stack_op

if TYPE_CHECKING:
    from vllm_provision.transport.connection import ConnectionOptions
    from vllm_provision.transport.runlock import LendingFactory

# The host options without --json: these commands print lines for an operator (and exit codes).
STACK_OPTIONS = tuple(name for name in HOST_OPTIONS if name != "json")


@click.group("stack", epilog=examples(
    "provision stack lock -i inventory.yml -r requirements.in",
    "provision stack sync -i inventory.yml",
    "provision stack status -i inventory.yml",
    "provision stack rollback -i inventory.yml"))
def command() -> None:
    """Install and upgrade the replica's Python stack from one reviewed lock."""


def _chosen(opts: CommonOptions) -> list[tuple[Any, Path]]:
    """The replicas the options choose, each with its lock path."""
    return stack_op.replicas_with_locks(opts.load_inventory(), opts.limit)


@contextmanager
def _locked(kwargs: dict[str, Any],
            what: str) -> Iterator[tuple[list[tuple[Any, Path]], ConnectionOptions,
                                         LendingFactory]]:
    """The chosen replicas (:func:`_chosen`), the connection options and the connection
    factory, while this run holds the run lock on every node of those replicas
    (:func:`vllm_provision.operations.stack.locked`; ``what`` names the run in the lock, e.g.
    ``"stack sync"``).

    Raises:
        ProvisionError: bad options, an inventory that does not load, or a node whose run lock
            another run holds (``RunLockError``, nothing changed).
    """
    opts = CommonOptions.from_kwargs(kwargs)
    chosen = _chosen(opts)
    options = opts.connection_options()
    with stack_op.locked([replica for replica, _ in chosen], options, what,
                         warn=_warn) as factory:
        yield chosen, options, factory


def _warn(line: str) -> None:
    """A warning line on stderr (a stale run lock taken over)."""
    echo(f"warning: {line}", err=True)


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
    opts = CommonOptions.from_kwargs(kwargs)
    for replica, path in _chosen(opts):
        done = stack_op.lock_replica(
            replica, path, opts.connection_options(), requirements=requirements,
            excludes=excludes, overrides=overrides,
            warn=lambda line: echo(f"warning: {line}", err=True))
        echo(f"{path}: {len(done.lock.pins)} packages for {done.target}, Python "
                   f"{done.python} (stack {done.lock.id})")
        for name, before, after in done.changes:
            echo(f"  {name}: {before or '(absent)'} -> {after or '(removed)'}")
        if not done.changes:
            echo("  no change")


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
    Holds the run lock on every node, as `provision up` does.
    """
    failed = False
    with _locked(kwargs, "stack sync") as (chosen, options, factory):
        for replica, path in chosen:  # replicas are independent: one's failure skips none
            try:
                lock_id, results = stack_op.sync_replica(replica, path, wheelhouse, options,
                                                         progress=echo, factory=factory)
            except ProvisionError as exc:
                failed = True
                echo(f"replica {replica.name}: FAILED: {exc.render()}")
                continue
            for result in results:
                echo(result.line())
            changed = sum(r.changed for r in results)
            errors = sum(bool(r.error) for r in results)
            failed = failed or bool(errors)
            echo(f"replica {replica.name}: stack {lock_id}: {changed} changed, "
                       f"{len(results) - changed - errors} unchanged, {errors} failed"
                       + ("; no node switched, run sync again" if any(r.held for r in results)
                          else "")
                       + ("; `provision up` restarts the replica once to use it"
                          if changed and not errors else ""))
    sys.exit(1 if failed else 0)


@command.command("rollback", epilog=examples("provision stack rollback -i inventory.yml"))
@shared_options(STACK_OPTIONS)
def rollback_command(**kwargs: Any) -> None:
    """Point every node's venv back at its previous stack (kept by the last sync).

    Every node of a replica must keep a previous stack, or no node is rolled back. The units
    restart on the next `provision up`. Revert the lock file too (git), so preflight
    and drift compare the nodes with what they run. Holds the run lock on every node, as
    `provision up` does.
    """
    failed = False
    with _locked(kwargs, "stack rollback") as (chosen, options, factory):
        for replica, _path in chosen:  # replicas are independent: one's failure skips none
            replica_failed, lines = stack_op.rollback_replica(replica, options, factory)
            failed = failed or replica_failed
            for line in lines:
                echo(line)
    sys.exit(1 if failed else 0)


@command.command("status", epilog=examples("provision stack status -i inventory.yml"))
@shared_options(STACK_OPTIONS)
def status_command(**kwargs: Any) -> None:
    """Compare each node's active venv with the lock: package, node, expected, actual.

    Exit status: 0 every node matches, 2 a node differs (as `provision drift`), 1 error.
    """
    opts = CommonOptions.from_kwargs(kwargs)
    differs = False
    for replica, path in _chosen(opts):
        lock, nodes = stack_op.status_replica(replica, path, opts.connection_options())
        for name, node, found in nodes:
            differs = differs or bool(found)
            state = "matches the lock" if not found else f"{len(found)} packages differ"
            echo(f"{name}: {node.active or '(no venv)'}: {state} (stack {lock.id})")
            for d in found:
                echo(f"  {d.package}  {d.host}  expected {d.expected}  actual "
                           f"{d.actual or 'not installed'}")
    sys.exit(2 if differs else 0)
