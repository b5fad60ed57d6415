"""``provision up``: install, start in order, wait until the replica serves, send one completion."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import click

from vllm_provision import resources
from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, common_options
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.operations.approval import YES_HELP
from vllm_provision.operations.record import record_after_up
from vllm_provision.runner import managed


def run_deploy_playbook(name: str, opts: CommonOptions, *, extra_vars: dict[str, Any] | None = None,
                        skip_checks: tuple[str, ...] = (), take_over: bool = False,
                        assume_yes: bool = False) -> int:
    """Run ``playbooks/<name>.yml`` with the shared options, print the recap (or ``--json``) and
    return the exit code (0, 1, or 2 for pending changes in check mode).

    The summary gains ``completion``, ``served_model``, ``ttft_s``, ``start_to_serving_s`` and
    ``vllm_version`` when the readiness and verify tasks ran (with several replicas: the first
    that served), and for ``up`` and ``restart`` ``replicas``: one result per replica
    (:func:`replica_results`). Replicas are independent: one that fails preflight or readiness
    is reported failed (exit 1) and the others go on. ``plan``
    (``vllm_provision.operations.plan.build_plan``) in check mode, also printed after the recap.

    Args:
        name: ``up``, ``down`` or ``restart``.
        opts: the shared command-line options.
        extra_vars: more extra variables from the command's own flags (``purge``).
        skip_checks: preflight checks to skip (``--skip-check``).
        take_over: ``--take-over``: hosts another replica or inventory deployed are taken over
            (``vllm_provision.operations.takeover``) instead of refused.
        assume_yes: ``--yes``: approve a run that needs approval
        (``vllm_provision.operations.approval``:
            ``up`` restarting a serving replica, ``down``, ``--take-over``) without asking.

    The run holds the run lock on every host it may touch (``vllm_provision.transport.runlock``),
    the
    state record included.

    Raises:
        ProvisionError: invalid inventory or playbook (nothing was changed then).
        RunLockError: another run holds a host's lock (nothing was changed).
        ProvisionError: a host belongs to another replica or inventory and ``take_over`` is
            false (nothing was changed).
        ProvisionError: the run needs approval, and stdin is not a terminal and ``assume_yes``
            is false (nothing was changed).
    """
    from vllm_provision.operations import approval
    from vllm_provision.output import report
    from vllm_provision.runner.engine import Runner, RunOptions
    from vllm_provision.runner.playbook import load_playbook
    from vllm_provision.transport import runlock

    overrides = dict(extra_vars or {})
    # taken over: the preflight ownership check would still read the old owner's record
    overrides.update(skip_check_vars((*skip_checks, "ownership") if take_over else skip_checks))
    if overrides:
        opts = replace(opts, extra_vars={**(opts.extra_vars or {}), **overrides})
    inventory = opts.load_inventory(require_replica=True)
    plays = load_playbook(resources.playbook(name))
    reporter = report.HumanReporter(sys.stderr if opts.json else sys.stdout,
                                    diff_mode=opts.diff, verbosity=opts.verbosity)
    extra: dict[str, Any] = {}
    measured: dict[str, float | None] = {}
    started_at = datetime.now(UTC)
    connection = opts.connection_options()
    approved = (opts.check or assume_yes or approval.env_approves()
                or (name == "restart" and not take_over))
    if not approved and approval.always_asks(name, take_over) and not approval.interactive():
        raise approval.refusal(name, take_over)
    with runlock.locked_run(runlock.hosts_of_plays(inventory, plays, opts.limit), connection,
                            name, warn=lambda line: click.echo(f"warning: {line}",
                                                               err=True)) as factory:
        if not approved and not _approve(name, inventory, plays, opts, factory, take_over):
            return 1
        taken = _guard_ownership(name, inventory, plays, opts, factory, take_over)
        if taken:
            extra["take_over"] = [take.to_json() for take in taken]
        runner = Runner(inventory, RunOptions(check_mode=opts.check, diff_mode=opts.diff,
                                              limit=opts.limit, connection=connection),
                        reporter, connection_factory=factory)
        outcome = runner.run_plays(plays)
        replicas = replica_results(inventory, outcome.results, outcome.hosts)
        # the top-level keys (one replica's, as before there were several): the first replica
        # that served, else the first that got as far as the readiness wait
        first = next((r for r in replicas if "completion" in r),
                     next((r for r in replicas if set(r) & set(SERVING_KEYS)), None))
        if first is not None:
            extra.update({k: first[k] for k in SERVING_KEYS if k in first})
        if name in ("up", "restart"):
            extra["replicas"] = replicas
        for entry in replicas:
            if "start_to_serving_s" in entry:
                measured[entry["name"]] = entry["start_to_serving_s"]
        # a verified up (a completion answered, or no replica has an API to verify) records
        # who owns the hosts now; without it the previous owner's record would stay
        verified = "completion" in extra or not any(
            r.backend_type.serves_openai for r in inventory.replicas)
        if (name == "up" and not opts.check and not opts.limit and verified
                and not any(r.failed for r in outcome.results)):
            extra.update(record_good_up(inventory, runner.facts, runner.options.connection,
                                        runner.masker, factory, measured, started_at))
        if opts.check:
            extra["plan"] = run_plan(inventory, outcome, starts_again=name == "restart")
    extra["stats"] = report.connection_stats()
    summary = report.summarize(outcome.results, outcome.hosts, check_mode=opts.check,
                               duration_s=outcome.duration_s, extra=extra)
    reporter.recap(summary)
    if "plan" in extra:
        from vllm_provision.operations.plan import plan_lines

        click.echo("\n".join(plan_lines(extra["plan"])), err=opts.json)
    if opts.json:
        report.print_json(summary)
    elif name in ("up", "restart") and len(replicas) > 1:
        for line in replica_lines(replicas):
            click.echo(line)
    elif "completion" in extra:
        click.echo(f"completion from {extra.get('served_model')}: {extra['completion']!r}")
        click.echo(serving_line(extra))
        if extra.get("start_to_serving_s") is None:
            reason = extra.get("start_to_serving_reason") or "the readiness wait did not run"
            click.echo(f"warning: start to serving was not measured: {reason}", err=True)
    return report.exit_code(summary, check_mode=opts.check)


# The playbooks' ``register`` names of the readiness and verify tasks (playbooks/up.yml,
# restart.yml): stable handles, where task names are prose.
SERVING_REGISTERS = ("vllm_ready", "vllm_verified")
SERVING_KEYS = ("completion", "served_model", "ttft_s", "completion_s", "start_to_serving_s",
                "start_to_serving_reason", "vllm_version", "already_serving")


def serving_summary(results: Iterable[TaskResult]) -> dict[str, Any]:
    """The summary keys (``SERVING_KEYS``) from the results registered as ``vllm_ready`` or
    ``vllm_verified``, later results winning; ``{}`` when neither ran.

    Args:
        results: every task result of the run, in order.
    """
    found: dict[str, Any] = {}
    for result in results:
        if result.data and result.register in SERVING_REGISTERS:
            found.update({k: v for k, v in result.data.items() if k in SERVING_KEYS})
    return found


# The ``register`` name of the preflight task (playbooks/up.yml, restart.yml).
PREFLIGHT_REGISTER = "vllm_preflight"


def replica_results(inventory: Any, results: Sequence[TaskResult],
                    hosts: Sequence[str]) -> list[dict[str, Any]]:
    """One result per replica the run targeted, for the recap and ``--json`` (``replicas``).

    Each: ``name``, ``backend``, ``hosts`` (its nodes), ``served`` (the completion task on its
    rank 0 succeeded and returned a completion), ``failed`` (a node failed or was unreachable),
    ``failed_findings`` (its preflight error findings, as the ``vllm_preflight`` task reports
    them), ``failures`` (``host``, ``task``, ``status``, ``message`` of each failed result on its
    nodes) and, when the readiness and completion tasks ran on its rank 0, their keys
    (:data:`SERVING_KEYS`: ``completion``, ``start_to_serving_s``, ...).

    Args:
        inventory: the loaded inventory.
        results: every task result of the run, in order.
        hosts: the hosts any play targeted (a replica with none of them is left out).
    """
    targeted = set(hosts)
    out: list[dict[str, Any]] = []
    for replica in inventory.replicas:
        nodes = [node.name for node in replica.nodes]
        if not targeted & set(nodes):
            continue
        mine = [r for r in results if r.host in nodes]
        failures = [{"host": r.host, "task": r.task, "status": r.status.value,
                     "message": r.message} for r in mine
                    if r.status in (Status.FAILED, Status.UNREACHABLE)]
        findings: list[dict[str, Any]] = []
        for result in mine:
            if result.register == PREFLIGHT_REGISTER and result.data:
                findings = [f for f in result.data.get("findings", [])
                            if f.get("severity") == "error"]
                break
        entry: dict[str, Any] = {"name": replica.name, "backend": replica.backend,
                                 "hosts": nodes, "served": False, "failed": bool(failures),
                                 "failed_findings": findings, "failures": failures}
        entry.update(serving_summary(r for r in mine if r.host == replica.master.name))
        entry["served"] = any(
            r.host == replica.master.name and r.register == "vllm_verified"
            and r.status in (Status.OK, Status.CHANGED) and "completion" in (r.data or {})
            for r in mine)
        out.append(entry)
    return out


def replica_lines(replicas: Sequence[dict[str, Any]]) -> list[str]:
    """The human lines of :func:`replica_results`, one block per replica: served (with its
    completion and timings) or failed (with its failed findings, else its first failure)."""
    lines = []
    for entry in replicas:
        if entry["served"]:
            lines.append(f"replica {entry['name']}: served; completion from "
                         f"{entry.get('served_model')}: {entry['completion']!r}")
            lines.append(f"  {serving_line(entry)}")
        elif entry["failed"]:
            lines.append(f"replica {entry['name']}: FAILED")
            for finding in entry["failed_findings"]:
                lines.append(f"  {finding['check']} on {finding['host']}: {finding['item']}: "
                             f"expected {finding['expected']}, got {finding['actual']}")
            if not entry["failed_findings"]:
                first = entry["failures"][0]
                text = " ".join(first["message"].split())[:200]
                lines.append(f"  {first['host']}: {first['task']}: {text}")
        else:
            lines.append(f"replica {entry['name']}: not served (its completion did not run)")
    return lines


def serving_line(extra: dict[str, Any]) -> str:
    """The human line with start-to-serving and time to first token; a value that was not
    measured reads ``not measured``, never ``None`` (the reason goes to a warning).

    Args:
        extra: the summary keys of the readiness and completion tasks (``start_to_serving_s``,
            ``already_serving``, ``ttft_s``).
    """
    def seconds(value: Any) -> str:
        return "not measured" if value is None else f"{value} s"

    already = " (already serving)" if extra.get("already_serving") else ""
    return (f"start to serving: {seconds(extra.get('start_to_serving_s'))}{already}; "
            f"time to first token: {seconds(extra.get('ttft_s'))}")


def skip_check_vars(skip_checks: tuple[str, ...]) -> dict[str, Any]:
    """The extra variables that carry ``--skip-check NAME ...`` to the preflight task:
    ``skip_checks``, which ``modules/vllm_preflight.py`` adds to the task's own list and to the
    inventory's ``preflight_skip_checks`` (so neither replaces the other)."""
    return {"skip_checks": list(skip_checks)} if skip_checks else {}


def run_plan(inventory: Any, outcome: Any, *, starts_again: bool = False) -> dict[str, Any]:
    """The plan of a dry run (``vllm_provision.operations.plan.build_plan``): the serving units of
    each
    node from its variables, the outage estimate from the controller's state record (none when
    it is missing or unreadable). ``starts_again``: the playbook starts what it stops
    (``restart``)."""
    from vllm_provision import settings, state
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.modules.vllm_wait_ready import replica_units
    from vllm_provision.operations.plan import build_plan

    serving: dict[str, list[str]] = {}
    for replica in inventory.replicas:
        serving.update(replica_units(replica, settings.master_settings(
            replica, inventory.extra_vars)))
    try:
        record = state.read_controller_record(inventory.path)
    except ProvisionError:
        record = None
    return build_plan(outcome, inventory, serving, state.last_start_s(record),
                      starts_again=starts_again)


def _approve(name: str, inventory: Any, plays: Sequence[Any], opts: CommonOptions,
             factory: Any, take_over: bool) -> bool:
    """Dry-run the playbook on the run's connections (the run locks are held), show its plan,
    and ask for approval where it needs one (``vllm_provision.operations.approval``); True to go on.

    Raises:
        ProvisionError: approval is needed and stdin is not a terminal (nothing was changed).
    """
    import io

    from vllm_provision.operations import approval
    from vllm_provision.operations.plan import plan_lines
    from vllm_provision.output import report
    from vllm_provision.runner.engine import Runner, RunOptions

    dry = replace(opts, check=True)
    _guard_ownership(name, inventory, plays, dry, factory, take_over)
    runner = Runner(inventory, RunOptions(check_mode=True, diff_mode=False, limit=opts.limit,
                                          connection=opts.connection_options()),
                    report.HumanReporter(io.StringIO()), connection_factory=factory)
    plan = run_plan(inventory, runner.run_plays(plays), starts_again=name == "restart")
    if not approval.plan_needs_approval(name, plan, take_over):
        return True
    click.echo("\n".join(plan_lines(plan)), err=opts.json)
    if not approval.interactive():
        raise approval.refusal(name, take_over)
    return approval.ask(name, echo=lambda line: click.echo(line, err=opts.json))


def _guard_ownership(name: str, inventory: Any, plays: Sequence[Any], opts: CommonOptions,
                     factory: Any, take_over: bool) -> list[Any]:
    """Refuse hosts another replica or inventory deployed, or take them over
    (:func:`vllm_provision.operations.takeover.guard`); before the first play, on the run's
    connections."""
    from vllm_provision.operations import takeover
    from vllm_provision.runner.playbook import load_playbook
    from vllm_provision.transport import runlock
    from vllm_provision.transport.connection import close_all, open_connections

    hosts = runlock.hosts_of_plays(inventory, plays, opts.limit)
    install = managed.install_plays(load_playbook(resources.playbook("up")))
    planned = {host: list(files.values())
               for host, files in managed.managed_files(inventory, install).items()}
    connections, _errors = open_connections(hosts, opts.connection_options(), factory)
    try:
        return takeover.guard(inventory, [h.name for h in hosts], planned, connections,
                              command=name, take_over=take_over, check_mode=opts.check,
                              echo=lambda line: click.echo(line, err=opts.json))
    finally:
        close_all(connections)


TAKE_OVER_HELP = ("Take over hosts that another replica or inventory deployed: remove what it "
                  "installed that this inventory does not, then go on.")


def record_good_up(inventory: Any, facts: Any, connection_options: Any, masker: Any,
                   factory: Any = None, measured: dict[str, float | None] | None = None,
                   started_at: datetime | None = None) -> dict[str, str]:
    """Write the state record of a verified `up` (or of an upgrade that verified every
    replica) for `provision drift` (vllm_provision.state).

    Args:
        facts: host name -> the facts preflight gathered; connection_options: the run's
            ``ConnectionOptions``; masker: masks secrets in the warning; factory: the run
            lock's connection factory; measured, started_at: see ``record_after_up``.

    Returns:
        ``{"state_record": controller path}``, or ``{"state_record_error": text}`` (also printed
        on stderr as a warning: the run itself succeeded).
    """
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.runner.playbook import load_playbook

    try:
        return {"state_record": str(record_after_up(
            inventory, facts, load_playbook(resources.playbook("up")), connection_options,
            factory, measured=measured, started_at=started_at))}
    except ProvisionError as exc:
        text = masker.text(exc.render())
        click.echo(f"warning: the state record for `provision drift` was not written: {text}",
                   err=True)
        return {"state_record_error": text}


@click.command("up", epilog=examples(
    'provision up -i inventory.yml',
    'provision up -i inventory.yml --check -D         # the plan, changing nothing',
    'provision up -i inventory.yml --json > result.json',
    'provision up -i inventory.yml --skip-check host.clock'))
@common_options
@click.option("--skip-check", "skip_checks", multiple=True, metavar="NAME",
              help="Preflight check to skip (by its name, e.g. parity.nccl); repeatable.")
@click.option("--take-over", is_flag=True, help=TAKE_OVER_HELP)
@click.option("-y", "--yes", "assume_yes", is_flag=True, help=YES_HELP)
def command(skip_checks: tuple[str, ...], take_over: bool, assume_yes: bool,
            **kwargs: Any) -> None:
    """Deploy the replica: preflight, install, start in order, wait until it serves, verify.

    An up that would restart a serving replica shows its plan and asks first (--yes approves).
    """
    sys.exit(run_deploy_playbook("up", CommonOptions.from_kwargs(kwargs),
                                 skip_checks=skip_checks, take_over=take_over,
                                 assume_yes=assume_yes))
