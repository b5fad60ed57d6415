"""``provision upgrade``: a rolling upgrade of a fleet of replicas, N at a time (docs/upgrade.md).

Per batch of replicas: drain (the hook, then in-flight requests to end), keep each node's unit
and env files, apply the inventory with ``playbooks/up.yml`` limited to the batch (install,
restart in order, wait until it serves, one completion and ``/version``), undrain. A replica
whose new version does not serve is put back from its kept files and restarted in order with
``playbooks/restart.yml``; the upgrade then stops (``--max-fail``).
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

from vllm_provision import resources
from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, common_options
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.operations import fleet
from vllm_provision.operations.approval import YES_HELP
from vllm_provision.operations.deploy import guard_ownership, record_good_up, replica_results
from vllm_provision.runner import managed

# A hook always gets at least this long, even with --drain-timeout 0 (no /metrics wait).
HOOK_MIN_TIMEOUT_S = 30.0


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
    """One upgrade run: the inventory, the options, the lock's connection factory."""

    def __init__(self, inventory: Any, opts: CommonOptions, factory: Any, reporter: Any,
                 hook: str | None, drain_timeout_s: float) -> None:
        self.inventory, self.opts, self.factory = inventory, opts, factory
        self.reporter, self.hook, self.drain_timeout_s = reporter, hook, drain_timeout_s
        from vllm_provision.runner.playbook import load_playbook

        self.up_plays = load_playbook(resources.playbook("up"))
        self.restart_plays = load_playbook(resources.playbook("restart"))
        # host -> facts from each batch's preflight, for the state record written at the end
        self.facts: dict[str, Any] = {}

    def run(self, plays: Sequence[Any], names: Sequence[str], *, check: bool = False) -> Any:
        """Run ``plays`` limited to the replicas ``names`` (their groups) under ``--limit``."""
        from vllm_provision.runner.engine import Runner, RunOptions

        limit = ":".join(names)
        if self.opts.limit:
            limit = f"{limit}:&{self.opts.limit}"
        runner = Runner(self.inventory, RunOptions(check_mode=check, diff_mode=self.opts.diff,
                                                   limit=limit,
                                                   connection=self.opts.connection_options()),
                        self.reporter, connection_factory=self.factory)
        outcome = runner.run_plays(plays)
        self.facts.update(runner.facts)
        return outcome

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
                kept, [p for p in paths if p not in present]))
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
        if upgrade.drain_timeout_s > 0:
            entry.drain = fleet.wait_idle(entry.endpoint, upgrade.drain_timeout_s)
        error = upgrade.snapshot(by_name[entry.name])
        entry.timings["drain"] = time.monotonic() - started
        if error:
            entry.outcome, entry.reason = fleet.NOT_UPGRADED, f"keeping its files failed: {error}"
            upgrade.hook_call(entry, "undrain")
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
            upgrade.hook_call(entry, "undrain")
    return failed


def _roll_back(upgrade: _Upgrade, entry: fleet.ReplicaOutcome, replica: Any, reason: str,
               echo: Any) -> None:
    """Put the replica's kept files back and restart it in order; record the outcome."""
    echo(f"replica {entry.name}: its new version failed ({reason}); rolling back")
    started = time.monotonic()
    error = upgrade.on_nodes(replica, fleet.restore_script())
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


@click.command("upgrade", epilog=examples(
    'provision upgrade -i fleet.yml --check             # the batches and what changes on each',
    'provision upgrade -i fleet.yml --serial 1',
    'provision upgrade -i fleet.yml --max-unavailable 2 --max-fail 1',
    'provision upgrade -i fleet.yml --drain-hook ./lb.sh --drain-timeout 60 --json > up.json'))
@common_options
@click.option("--serial", type=click.IntRange(min=1), default=None, metavar="N",
              help="Replicas upgraded at once (default 1).")
@click.option("--max-unavailable", type=click.IntRange(min=1), default=None, metavar="N",
              help="Replicas out of service at once: the same batches as --serial N.")
@click.option("--max-fail", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="N", help="Failed replicas allowed before the upgrade stops.")
@click.option("--drain-hook", default=None, metavar="CMD",
              help="Program run on this machine before (drain) and after (undrain) each "
                   "replica, with the phase, the replica's name and endpoint as its last three "
                   "arguments (and VLLM_PROVISION_PHASE/REPLICA/ENDPOINT); no shell runs it.")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              metavar="S", help="Seconds to wait for vllm:num_requests_running to reach 0 "
                                "(0: no wait); also the hook's time limit (at least 30 s).")
@click.option("-y", "--yes", "assume_yes", is_flag=True, help=YES_HELP)
def command(serial: int | None, max_unavailable: int | None, max_fail: int,
            drain_hook: str | None, drain_timeout: float, assume_yes: bool,
            **kwargs: Any) -> None:
    """Upgrade the replicas N at a time: drain, apply, restart in order, verify, undrain.

    A replica whose new version does not serve is rolled back to the unit and env files it had
    and the upgrade stops (after --max-fail failures). The recap names every replica: upgraded,
    rolled back or untouched. Exit 0 when every replica was upgraded, 2 with --check when
    something would change, 1 otherwise.
    """
    sys.exit(run_upgrade(CommonOptions.from_kwargs(kwargs), serial=serial,
                         max_unavailable=max_unavailable, max_fail=max_fail,
                         drain_hook=drain_hook, drain_timeout_s=drain_timeout,
                         assume_yes=assume_yes))


def run_upgrade(opts: CommonOptions, *, serial: int | None, max_unavailable: int | None,
                max_fail: int, drain_hook: str | None, drain_timeout_s: float,
                assume_yes: bool) -> int:
    """Run the upgrade (or its plan with ``opts.check``); print the recap or ``--json``; return
    the exit code.

    Raises:
        ProvisionError: both --serial and --max-unavailable, an invalid inventory or hook, a
            host's lock held, a host another inventory owns, or no approval (nothing changed).
    """
    from vllm_provision.operations import approval
    from vllm_provision.output import report
    from vllm_provision.transport import runlock

    if serial is not None and max_unavailable is not None:
        raise ProvisionError.single("--serial/--max-unavailable", "give one of them",
                                    fix="--serial N and --max-unavailable N both mean N "
                                        "replicas at a time")
    if drain_hook is not None:
        fleet.hook_argv(drain_hook, "drain", "-", "-")  # refuse a bad hook before anything
    size = serial or max_unavailable or 1
    inventory = opts.load_inventory(require_replica=True)
    out = sys.stderr if opts.json else sys.stdout
    verbose = opts.verbosity > 0
    reporter = report.HumanReporter(out if verbose else io.StringIO(), diff_mode=opts.diff,
                                    verbosity=opts.verbosity)

    def echo(line: str) -> None:
        click.echo(line, err=opts.json)

    from vllm_provision.runner.playbook import load_playbook

    up_plays = load_playbook(resources.playbook("up"))
    hosts = runlock.hosts_of_plays(inventory, up_plays, opts.limit)
    targeted = {h.name for h in hosts}
    replicas = [r for r in inventory.replicas if targeted & set(_replica_hosts(r))]
    groups = fleet.batches([r.name for r in replicas], size)
    if not opts.check and not (assume_yes or approval.env_approves()):
        if not approval.interactive():
            raise ProvisionError.single("upgrade", "upgrade restarts every replica, N at a "
                                        "time, and needs approval", fix="run it on a terminal, "
                                        "or add --yes (or VLLM_PROVISION_YES=1)")
        if not approval.ask("upgrade", echo=echo):
            return 1
    started = time.monotonic()
    started_wall = datetime.now(UTC)
    with runlock.locked_run(hosts, opts.connection_options(), "upgrade",
                            warn=lambda line: click.echo(f"warning: {line}", err=True)) as factory:
        upgrade = _Upgrade(inventory, opts, factory, reporter, drain_hook, drain_timeout_s)
        guard_ownership("up", inventory, hosts, up_plays, opts.connection_options(), factory,
                        take_over=False, check=opts.check, echo=echo)
        if opts.check:
            plan = _plan(upgrade, groups)
            return _print_plan(plan, size, max_fail, opts.json)
        by_name = {r.name: r for r in inventory.replicas}
        entries = [fleet.ReplicaOutcome(name, number, by_name[name].api_url)
                   for number, group in enumerate(groups, 1) for name in group]
        probe = fleet.CapacityProbe({e.name: e.endpoint for e in entries})
        probe.start()
        failed = 0
        try:
            for number in range(1, len(groups) + 1):
                batch = [e for e in entries if e.batch == number]
                failed += _upgrade_batch(upgrade, batch, echo)
                if fleet.should_stop(failed, max_fail):
                    echo(f"upgrade stopped after batch {number}: {failed} replica(s) failed "
                         f"(--max-fail {max_fail})")
                    break
        finally:
            capacity = probe.stop()
        recorded = (_record_upgrade(upgrade, started_wall)
                    if all(e.outcome == fleet.UPGRADED for e in entries) else {})
    summary = {"serial": size, "max_fail": max_fail, "duration_s": round(
        time.monotonic() - started, 3), "batches": groups,
        "replicas": [e.to_json() for e in entries], "recap": fleet.recap(entries),
        "capacity": capacity, "ok": all(e.outcome == fleet.UPGRADED for e in entries),
        **recorded}
    if opts.json:
        click.echo(json.dumps(summary))
    else:
        for line in fleet.recap_lines(entries, capacity):
            click.echo(line)
    return 0 if summary["ok"] else 1


def _record_upgrade(upgrade: _Upgrade, started_at: datetime) -> dict[str, str]:
    """After every replica upgraded and verified, write the state record as a verified ``up``
    does, so ``provision drift`` compares with what the upgrade left (see ``record_good_up``)."""
    from vllm_provision.settings.masking import Masker

    return record_good_up(upgrade.inventory, upgrade.facts, upgrade.up_plays,
                          upgrade.opts.connection_options(),
                          Masker.from_inventory(upgrade.inventory), factory=upgrade.factory,
                          started_at=started_at,
                          warn=lambda line: click.echo(f"warning: {line}", err=True))


def _print_plan(plan: list[dict[str, Any]], size: int, max_fail: int, as_json: bool) -> int:
    would = any(r["changes"] or r["restart"] for b in plan for r in b["replicas"])
    problems = any(r["problems"] for b in plan for r in b["replicas"])
    if as_json:
        click.echo(json.dumps({"check": True, "serial": size, "max_fail": max_fail,
                               "plan": plan}))
    else:
        for batch in plan:
            click.echo(f"batch {batch['batch']}: " + ", ".join(
                r["name"] for r in batch["replicas"]))
            for entry in batch["replicas"]:
                what = ("restart in order" if entry["restart"] else
                        "no restart") + f", {len(entry['changes'])} change(s)"
                click.echo(f"  replica {entry['name']}: {what}")
                for change in entry["changes"]:
                    click.echo(f"    would change {change}")
                for problem in entry["problems"]:
                    click.echo(f"    problem {problem}")
    if problems:
        return 1
    return 2 if would else 0
