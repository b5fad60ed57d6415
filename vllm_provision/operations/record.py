"""The state record written after a verified ``provision up`` (docs/deploy.md, "What a good
``up`` leaves on each host")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory
from vllm_provision.core.parallel import split_map
from vllm_provision.facts.model import HostFacts
from vllm_provision.runner.managed import install_plays, managed_files
from vllm_provision.settings.masking import Masker
from vllm_provision.state import (
    build_record,
    hash_files_script,
    invocation_script,
    parse_hashes,
    parse_invocations,
    read_controller_record,
    save_record,
    serving_record,
    start_key,
    started_from,
    unit_names,
)
from vllm_provision.transport.connection import close_all, open_connections


def record_after_up(inventory: Inventory, facts: Mapping[str, HostFacts],
                    plays: Sequence[Any], connection_options: Any,
                    factory: Callable[[Any], Any] | None = None, *,
                    measured: Mapping[str, float | None] | None = None,
                    phases: Mapping[str, Mapping[str, Any]] | None = None,
                    started_at: datetime | None = None) -> tuple[Path, dict[str, Any]]:
    """After a verified ``provision up``: hash the installed files on every node (one round trip
    each), then write the record on every node and on the controller, where it changed
    (:func:`~vllm_provision.state.save_record`); return the controller path
    and, by replica name, what the record says of its starts (:func:`serving_record`).

    Args:
        inventory: the inventory ``up`` ran with.
        facts: the facts preflight gathered (``Runner.facts``).
        plays: the playbook's plays (the install plays among them name the files).
        connection_options: ``connection.ConnectionOptions``.
        factory: builds each host's connection (the run's own, lent by the run lock).
        measured: replica name -> the start to serving this ``up`` measured (seconds, None when
            it did not start the replica); see :func:`serving_record`.
        phases: replica name -> node -> phase -> seconds of the start this ``up`` measured
            (kept with the start, cold or warm, in the record).
        started_at: when this ``up`` began (default: now).

    Raises:
        ProvisionError: a node could not be reached or written, or the controller's copy failed.
        RunLockLost: the run lost its lock on a node (nothing is written).
    """
    chosen = install_plays(plays)
    files = managed_files(inventory, chosen)
    hosts = [node.host for replica in inventory.replicas for node in replica.nodes]
    connections, errors = open_connections(hosts, connection_options, factory)
    problems: list[Any] = [p for exc in errors.values() for p in exc.problems]
    try:
        try:
            previous = read_controller_record(inventory.path) or {}
        except ProvisionError:
            previous = {}
        before: dict[str, Any] = previous.get("hosts") or {}
        hashes: dict[str, dict[str, str]] = {}
        started: dict[str, dict[str, Any]] = {}
        scripts = {}
        for name in connections:
            paths = sorted(set((files.get(name) or {}).values()))
            scripts[name] = (hash_files_script(paths) + "; "
                             + invocation_script(unit_names(paths)))
        # over the run lock's open channels where it holds them (one round trip, no channel);
        # the others on their own connections, all hosts at once
        exchange = getattr(factory, "exchange", None)
        results: dict[str, Any] = dict(exchange(scripts)) if exchange is not None else {}
        def read(name: str) -> tuple[str, Any]:
            try:
                return name, connections[name].run(scripts[name])
            except ProvisionError as exc:  # UnreachableError among them
                return name, exc

        rest = [name for name in connections if name not in results]
        read_results, read_errors = split_map(read, rest, workers=len(rest),
                                              failure=ProvisionError)
        if read_errors:
            raise ProvisionError([p for exc in read_errors.values() for p in exc.problems])
        results.update(read_results)
        for name in connections:
            result = results[name]
            hashes[name] = parse_hashes(result.stdout)
            entry: dict[str, Any] = before.get(name) or {}
            started[name] = started_from(hashes[name], parse_invocations(result.stdout),
                                         entry.get("started_from"))
        # The record holds no secret by construction; mask anyway, in every encoding, in case
        # a secret reached a recorded value (a fact, an argument).
        begun = started_at or datetime.now(UTC)
        serving = {r.name: serving_record(previous or None, r.name, (measured or {}).get(r.name),
                                          begun, replica_id=r.replica_id,
                                          key=start_key(r, facts),
                                          phase_s=(phases or {}).get(r.name))
                   for r in inventory.replicas}
        record = Masker.from_inventory(inventory).data(
            build_record(inventory, facts, hashes, serving=serving, started=started))
        ensure_held = getattr(factory, "ensure_held", None)
        if ensure_held is not None:  # the run lock's check point before writing on the nodes
            ensure_held(*connections)
        path, write_errors = save_record(inventory, record, connections,
                                         found=getattr(factory, "records", None),
                                         previous=previous or None)
        problems += [p for exc in write_errors.values() for p in exc.problems]
    finally:
        close_all(connections)
    if problems:
        raise ProvisionError(problems)
    return path, serving
