"""The rolling upgrade operation behind ``provision upgrade`` (docs/upgrade.md).

Per batch of replicas: drain (the hook, the front door's routers: ``operations/front_door.py``,
then in-flight requests to end), keep each node's unit
and env files, apply the inventory with ``playbooks/up.yml`` limited to the batch (install,
restart in order, wait until it serves, one completion and ``/version``), undrain. A replica
whose new version does not serve is put back from its kept files and restarted in order with
``playbooks/restart.yml``; the upgrade then stops (``--max-fail``). The whole upgrade holds the
run lock on every host, checks ownership once (:func:`vllm_provision.operations.deploy.
guard_ownership`), and writes the state record when every replica upgraded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vllm_provision import resources
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.operations import approval, fleet, front_door
from vllm_provision.operations.deploy import guard_ownership, record_good_up, replica_results
from vllm_provision.runner import managed
from vllm_provision.runner.engine import Runner, RunOptions
from vllm_provision.runner.playbook import load_playbook
from vllm_provision.settings.masking import Masker
from vllm_provision.state import ray_token
from vllm_provision.transport import router, runlock
from vllm_provision.transport.connection import ConnectionOptions
from vllm_provision.transport.tunnel import route_for, route_to_node

# A hook always gets at least this long, even with --drain-timeout 0 (no /metrics wait).
HOOK_MIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Upgrade:
    """What ``provision upgrade`` asks for, parsed.

    Attributes:
        inventory: the loaded inventory. connection: the run's connection options.
        limit: ``--limit`` or None. check / diff: ``--check`` and ``--diff``.
        size: replicas upgraded at once (``--serial``/``--max-unavailable``, at least 1).
        max_fail: failed replicas allowed before the upgrade stops (``--max-fail``).
        drain_hook: the ``--drain-hook`` program, or None (checked with
            :func:`vllm_provision.operations.fleet.hook_argv` before anything runs).
        drain_timeout_s: ``--drain-timeout``, seconds (0: no wait for idle).
        assume_yes: ``--yes``.
    """

    inventory: Inventory
    connection: ConnectionOptions
    limit: str | None = None
    check: bool = False
    diff: bool = False
    size: int = 1
    max_fail: int = 0
    drain_hook: str | None = None
    drain_timeout_s: float = 30.0
    assume_yes: bool = False


@dataclass
class UpgradeOutcome:
    """What an upgrade did, for the command to print.

    Attributes:
        plan: with ``--check``: the batches and, per replica, ``changes``, ``restart`` and
            ``problems``; else None.
        entries: one :class:`vllm_provision.operations.fleet.ReplicaOutcome` per replica.
        summary: the ``--json`` object of a real upgrade (``serial``, ``max_fail``,
            ``duration_s``, ``batches``, ``replicas``, ``recap``, ``capacity``, ``ok`` and the
            state record's key); empty with ``--check``.
        declined: the operator answered no (nothing was changed).
    """

    plan: list[dict[str, Any]] | None = None
    entries: list[Any] | None = None
    summary: dict[str, Any] | None = None
    declined: bool = False


def run(request: Upgrade, reporter: Any, *, echo: Callable[[str], None],
        warn: Callable[[str], None]) -> UpgradeOutcome:
    """Run the upgrade, or with ``request.check`` only its plan.

    Args:
        request: the request. reporter: receives every task result (a silent one unless
            ``-v``). echo: prints one human progress line. warn: prints one warning line.

    Raises:
        ProvisionError: no approval (upgrade restarts every replica: ``--yes``, or a terminal
            to ask), a host's lock held, a host another inventory owns (nothing changed).
    """
    inventory = request.inventory
    up_plays = load_playbook(resources.playbook("up"))
    hosts = runlock.hosts_of_plays(inventory, up_plays, request.limit)
    targeted = {h.name for h in hosts}
    replicas = [r for r in inventory.replicas if targeted & set(_replica_hosts(r))]
    groups = fleet.batches([r.name for r in replicas], request.size)
    if not request.check and not (request.assume_yes or approval.env_approves()):
        if not approval.interactive():
            raise ProvisionError.single("upgrade", "upgrade restarts every replica, N at a "
                                        "time, and needs approval", fix="run it on a terminal, "
                                        "or add --yes (or VLLM_PROVISION_YES=1)")
        if not approval.ask("upgrade", echo=echo):
            return UpgradeOutcome(declined=True)
    started = time.monotonic()
    started_wall = datetime.now(UTC)
    with runlock.locked_run(hosts, request.connection, "upgrade", warn=warn) as factory:
        upgrade = _Upgrade(request, factory, reporter, up_plays)
        guard_ownership("up", inventory, hosts, up_plays, request.connection, factory,
                        take_over=False, check=request.check, echo=echo)
        if request.check:
            return UpgradeOutcome(plan=_plan(upgrade, groups))
        by_name = {r.name: r for r in inventory.replicas}
        entries = [fleet.ReplicaOutcome(name, number, by_name[name].api_url)
                   for number, group in enumerate(groups, 1) for name in group]
        routes = {e.name: upgrade.route(by_name[e.name]) for e in entries}
        probe = fleet.CapacityProbe({e.name: e.endpoint for e in entries},
                                    routes={n: r for n, r in routes.items() if r is not None})
        probe.start()
        failed = 0
        try:
            for number in range(1, len(groups) + 1):
                batch = [e for e in entries if e.batch == number]
                failed += _upgrade_batch(upgrade, batch, echo)
                if fleet.should_stop(failed, request.max_fail):
                    echo(f"upgrade stopped after batch {number}: {failed} replica(s) failed "
                         f"(--max-fail {request.max_fail})")
                    break
        finally:
            capacity = probe.stop()
            upgrade.close()
        recorded = (_record_upgrade(upgrade, started_wall, warn)
                    if all(e.outcome == fleet.UPGRADED for e in entries) else {})
    summary = {"serial": request.size, "max_fail": request.max_fail, "duration_s": round(
        time.monotonic() - started, 3), "batches": groups,
        "replicas": [e.to_json() for e in entries], "recap": fleet.recap(entries),
        "capacity": capacity, "ok": all(e.outcome == fleet.UPGRADED for e in entries),
        **recorded}
    return UpgradeOutcome(entries=entries, summary=summary)


def _replica_hosts(replica: Any) -> list[str]:
    return [node.name for node in replica.nodes]


def _changes(replica: Any, outcome: Any) -> tuple[list[str], bool]:
    """The tasks that changed on the replica's nodes (``host: task``) and whether a handler
    (a restart) ran on one of them."""
    nodes = set(_replica_hosts(replica))
    changed = sorted(f"{r.host}: {r.task}" for r in outcome.results
                     if r.host in nodes and r.status is Status.CHANGED)
    restarted = any(h.result.host in nodes and h.result.status is Status.CHANGED
                    for h in outcome.handler_results)
    return changed, restarted


def _failure_reason(results: Sequence[TaskResult], nodes: Sequence[str]) -> str:
    for result in results:
        if result.host in nodes and result.status in (Status.FAILED, Status.UNREACHABLE):
            return f"{result.host}: {result.task}: " + " ".join(result.message.split())[:300]
    return "its completion did not run"


class _Upgrade:
    """One upgrade run: the request, the lock's connection factory, the reporter, the plays."""

    def __init__(self, request: Upgrade, factory: Any, reporter: Any,
                 up_plays: Sequence[Any]) -> None:
        self.request, self.inventory, self.factory = request, request.inventory, factory
        self.reporter, self.hook = reporter, request.drain_hook
        self.drain_timeout_s = request.drain_timeout_s
        self.up_plays = up_plays
        self.restart_plays = load_playbook(resources.playbook("restart"))
        # host -> facts from each batch's preflight, for the state record written at the end
        self.facts: dict[str, Any] = {}
        # the front door's routers (vllm_gateways), reached through the gateway hosts' own
        # connections; a gateway outside the lock (--limit) gets one of its own, closed at the end
        self.doors = front_door.FrontDoors(router.front_doors(self.inventory), self.gateway)
        self.own: dict[str, Any] = {}

    def gateway(self, host_name: str) -> Any:
        """An open connection to the gateway host ``host_name`` (the lock's, or one of its
        own). Raises ProvisionError when it cannot be reached."""
        conn = self.own.get(host_name)
        if conn is None:
            conn = self.factory(self.inventory.hosts[host_name])
            conn.open()
            if host_name not in self.factory.opened:
                self.own[host_name] = conn
        return conn

    def close(self) -> None:
        """Close the gateway connections opened outside the lock."""
        for conn in self.own.values():
            conn.close()
        self.own.clear()

    def run(self, plays: Sequence[Any], names: Sequence[str], *, check: bool = False) -> Any:
        """Run ``plays`` limited to the replicas ``names`` (their groups) under ``--limit``."""
        limit = ":".join(names)
        if self.request.limit:
            limit = f"{limit}:&{self.request.limit}"
        if not check:  # the Ray token of each Ray replica, before its files are installed
            ray_token.ensure_tokens(self.inventory, connections=self.factory.opened)
        runner = Runner(self.inventory, RunOptions(check_mode=check, diff_mode=self.request.diff,
                                                   limit=limit,
                                                   connection=self.request.connection),
                        self.reporter, connection_factory=self.factory)
        outcome = runner.run_plays(plays)
        self.facts.update(runner.facts)
        return outcome

    def route(self, replica: Any) -> Any:
        """How the controller reaches ``replica``'s API (``vllm_api_via``,
        :func:`~vllm_provision.transport.tunnel.route_for`, through the run's connection to rank
        0); None when that needs a connection rank 0 does not have (the probes then count the
        replica as not answering)."""
        try:
            return route_for(replica, self.factory(replica.master.host))
        except ProvisionError:
            return None

    def wait_idle(self, replica: Any, endpoint: str) -> dict[str, Any]:
        """:func:`fleet.wait_idle` of the replica's API; for a hybrid data-parallel replica, of
        every node's API server in turn (each counts only its own engines' requests), within
        one ``drain_timeout_s``: the first that is not idle in time is the result."""
        started = time.monotonic()
        seen = fleet.wait_idle(endpoint, self.drain_timeout_s, route=self.route(replica))
        for node in replica.api_nodes[1:] if seen["idle"] else ():
            try:
                route = route_to_node(replica, node, self.factory(node.host))
            except ProvisionError:
                continue  # not reachable: nothing can be waited for there
            left = max(0.0, self.drain_timeout_s - (time.monotonic() - started))
            seen = fleet.wait_idle(replica.node_api_url(node), left, route=route)
            if not seen["idle"]:
                break
        return {**seen, "waited_s": round(time.monotonic() - started, 3)}

    def on_nodes(self, replica: Any, command: str) -> str | None:
        """Run one shell line on every node of ``replica``; the first error, or None."""
        for node in replica.nodes:
            error = self.on_nodes_one(node, command)
            if error:
                return error
        return None

    def snapshot(self, replica: Any) -> str | None:
        """Keep every node's managed files (``fleet.snapshot_script``); an error, or None."""

        install = managed.install_plays(self.up_plays)
        files = managed.managed_files(self.inventory, install, limit=replica.name)
        for node in replica.nodes:
            paths = sorted(set(files.get(node.name, {}).values()))
            try:
                conn = self.factory(node.host)
                conn.open()
                found = conn.run(fleet.existing_script(paths), timeout_s=60) if paths else None
            except ProvisionError as exc:
                return f"{node.name}: {' '.join(exc.render().split())[:300]}"
            present = set(found.stdout.split("\n")) if found else set()
            kept = [p for p in paths if p in present]
            error = self.on_nodes_one(node, fleet.snapshot_script(
                kept, [p for p in paths if p not in present], fleet.snapshot_dir(replica)))
            if error:
                return error
        return None

    def on_nodes_one(self, node: Any, command: str) -> str | None:
        """Run one shell line on one node; the error, or None."""
        try:
            conn = self.factory(node.host)
            conn.open()
            result = conn.run(command, timeout_s=120)
        except ProvisionError as exc:
            return f"{node.name}: {' '.join(exc.render().split())[:300]}"
        if result.exit_code != 0:
            return (f"{node.name}: exit {result.exit_code}: "
                    + " ".join((result.stderr or result.stdout).split())[:300])
        return None

    def front_door(self, entry: fleet.ReplicaOutcome, phase: str, echo: Any) -> None:
        """Drain or undrain ``entry`` at every front door (``phase``: ``drain`` or
        ``undrain``), keep each gateway's record, and print one line per gateway."""
        if not self.doors:
            return
        started = time.monotonic()
        replica = next((r for r in self.inventory.replicas if r.name == entry.name), None)
        steps = []
        # every API server of the replica: one, or every node's of a hybrid data-parallel one
        for url in (replica.api_urls if replica is not None else (entry.endpoint,)):
            steps += (self.doors.drain(url) if phase == "drain"
                      else self.doors.undrain(url, entry.front_door))
        entry.front_door.extend(steps)
        if phase == "undrain":
            entry.timings["undrain"] = time.monotonic() - started
        for step in steps:
            echo(f"replica {entry.name}: {phase} at " + front_door.describe(step))

    def undrain(self, entry: fleet.ReplicaOutcome, echo: Any) -> None:
        """Put a serving (or untouched) replica back: the front doors, then the hook."""
        self.front_door(entry, "undrain", echo)
        self.hook_call(entry, "undrain")

    def hook_call(self, entry: fleet.ReplicaOutcome, phase: str) -> bool:
        """Call the drain hook (when there is one) and keep its result; True when it passed."""
        if not self.hook:
            return True
        done = fleet.run_hook(self.hook, phase, entry.name, entry.endpoint,
                              timeout_s=max(self.drain_timeout_s, HOOK_MIN_TIMEOUT_S))
        entry.hooks.append(done.to_json())
        return done.ok


def _plan(upgrade: _Upgrade, groups: list[list[str]]) -> list[dict[str, Any]]:
    """``--check``: the batches and, per replica, what the up would change and restart."""
    names = [name for group in groups for name in group]
    outcome = upgrade.run(upgrade.up_plays, names, check=True)
    by_name = {r.name: r for r in upgrade.inventory.replicas}
    out = []
    for number, group in enumerate(groups, 1):
        entries = []
        for name in group:
            changed, restarted = _changes(by_name[name], outcome)
            failed = [f"{r.host}: {r.task}: {' '.join(r.message.split())[:200]}"
                      for r in outcome.results if r.host in _replica_hosts(by_name[name])
                      and r.status in (Status.FAILED, Status.UNREACHABLE)]
            entries.append({"name": name, "endpoint": by_name[name].api_url,
                            "changes": changed, "restart": restarted, "problems": failed})
        out.append({"batch": number, "replicas": entries})
    return out


def _upgrade_batch(upgrade: _Upgrade, batch: list[fleet.ReplicaOutcome], echo: Any) -> int:
    """Drain, apply, verify, roll back and undrain one batch; return how many failed."""
    by_name = {r.name: r for r in upgrade.inventory.replicas}
    failed = 0
    ready: list[fleet.ReplicaOutcome] = []
    for entry in batch:
        started = time.monotonic()
        echo(f"replica {entry.name}: drain")
        if not upgrade.hook_call(entry, "drain"):
            entry.outcome, entry.reason = fleet.NOT_UPGRADED, "the drain hook failed: " + (
                entry.hooks[-1]["output"] or f"exit {entry.hooks[-1]['exit_code']}")
            failed += 1
            continue
        upgrade.front_door(entry, "drain", echo)
        if upgrade.drain_timeout_s > 0:
            entry.drain = upgrade.wait_idle(by_name[entry.name], entry.endpoint)
        error = upgrade.snapshot(by_name[entry.name])
        entry.timings["drain"] = time.monotonic() - started
        if error:
            entry.outcome, entry.reason = fleet.NOT_UPGRADED, f"keeping its files failed: {error}"
            upgrade.undrain(entry, echo)
            failed += 1
            continue
        ready.append(entry)
    if not ready:
        return failed
    started = time.monotonic()
    echo("apply: " + ", ".join(e.name for e in ready))
    outcome = upgrade.run(upgrade.up_plays, [e.name for e in ready])
    results = {r["name"]: r for r in replica_results(upgrade.inventory, outcome.results,
                                                     outcome.hosts)}
    for entry in ready:
        replica = by_name[entry.name]
        entry.timings["apply"] = time.monotonic() - started
        entry.changed, entry.restarted = _changes(replica, outcome)
        result = results.get(entry.name, {})
        if result.get("served"):
            entry.outcome, entry.serving = fleet.UPGRADED, True
            entry.vllm_version = result.get("vllm_version")
        else:
            failed += 1
            reason = _failure_reason(outcome.results, _replica_hosts(replica))
            _roll_back(upgrade, entry, replica, reason, echo)
        if entry.serving:
            upgrade.undrain(entry, echo)
    return failed


def _roll_back(upgrade: _Upgrade, entry: fleet.ReplicaOutcome, replica: Any, reason: str,
               echo: Any) -> None:
    """Put the replica's kept files back and restart it in order; record the outcome."""
    echo(f"replica {entry.name}: its new version failed ({reason}); rolling back")
    started = time.monotonic()
    error = upgrade.on_nodes(replica, fleet.restore_script(fleet.snapshot_dir(replica)))
    served = False
    if error is None:
        outcome = upgrade.run(upgrade.restart_plays, [entry.name])
        [result] = [r for r in replica_results(upgrade.inventory, outcome.results,
                                               outcome.hosts) if r["name"] == entry.name] or [{}]
        served = bool(result.get("served"))
        entry.vllm_version = result.get("vllm_version")
        if not served:
            error = _failure_reason(outcome.results, _replica_hosts(replica))
    entry.timings["rollback"] = time.monotonic() - started
    entry.serving = served
    entry.outcome = fleet.ROLLED_BACK if served else fleet.ROLLBACK_FAILED
    entry.reason = f"new version failed: {reason}" + (
        "" if served else f"; the rollback did not serve: {error}")


def _record_upgrade(upgrade: _Upgrade, started_at: datetime,
                    warn: Callable[[str], None]) -> dict[str, Any]:
    """After every replica upgraded and verified, write the state record as a verified ``up``
    does, so ``provision drift`` compares with what the upgrade left (see ``record_good_up``)."""
    return record_good_up(upgrade.inventory, upgrade.facts, upgrade.up_plays,
                          upgrade.request.connection, Masker.from_inventory(upgrade.inventory),
                          factory=upgrade.factory, started_at=started_at, warn=warn)
