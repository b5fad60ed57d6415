"""``provision up``: install, start in order, wait until the replica serves, send one completion."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, common_options, echo
from vllm_provision.operations.approval import YES_HELP


def run_deploy_playbook(name: str, opts: CommonOptions, *, extra_vars: dict[str, Any] | None = None,
                        skip_checks: tuple[str, ...] = (), take_over: bool = False,
                        assume_yes: bool = False, rotate_ray_token: bool = False) -> int:
    """Run the deploy operation (:func:`vllm_provision.operations.deploy.run`: lock, approval,
    ownership guard, apply and verify, state record) for ``up``, ``down`` or ``restart``; print
    the recap (or ``--json``) and return the exit code (0, 1, or 2 for pending changes in check
    mode).

    Args:
        name: ``up``, ``down`` or ``restart``.
        opts: the shared command-line options.
        extra_vars: more extra variables from the command's own flags (``purge``).
        skip_checks: preflight checks to skip (``--skip-check``).
        take_over: ``--take-over``.
        assume_yes: ``--yes``.
        rotate_ray_token: ``restart --rotate-ray-token`` (a new Ray token per targeted Ray
            replica before the restart in order; docs/security.md).

    Raises:
        ProvisionError, RunLockError: as :func:`vllm_provision.operations.deploy.run` (nothing
            was changed then).
    """
    # imported here, not at the top: `provision up --help` (and down's, restart's) then loads
    # only the command line, not the engine
    from vllm_provision.operations import deploy
    from vllm_provision.operations.plan import plan_lines
    from vllm_provision.output import report

    overrides = {**(extra_vars or {}), **deploy.run_vars(skip_checks, take_over)}
    if overrides:
        opts = replace(opts, extra_vars={**(opts.extra_vars or {}), **overrides})
    request = deploy.Deploy(name, opts.load_inventory(require_replica=True),
                            opts.connection_options(), limit=opts.limit, check=opts.check,
                            diff=opts.diff, take_over=take_over, assume_yes=assume_yes,
                            verbosity=opts.verbosity, rotate_ray_token=rotate_ray_token)
    reporter = report.HumanReporter(sys.stderr if opts.json else sys.stdout,
                                    diff_mode=opts.diff, verbosity=opts.verbosity)
    done = deploy.run(request, reporter, echo=lambda line: echo(line, err=opts.json),
                      warn=lambda line: echo(f"warning: {line}", err=True))
    if done.declined:
        return done.exit_code
    summary = done.summary
    reporter.recap(summary)
    if "plan" in summary:
        echo("\n".join(plan_lines(summary["plan"])), err=opts.json)
    if opts.json:
        report.print_json(summary)
    elif name in ("up", "restart") and len(done.replicas) > 1:
        for line in replica_lines(done.replicas):
            echo(line)
    elif "completion" in summary:
        echo(f"completion from {summary.get('served_model')}: {summary['completion']!r}")
        echo(serving_line(summary))
        for entry in done.replicas[:1]:
            if entry.get("api_path"):
                echo(f"API path: {entry['api_path']['path']} "
                           f"({entry['api_path']['reason']})")
        if summary.get("start_to_serving_s") is None:
            reason = summary.get("start_to_serving_reason") or "the readiness wait did not run"
            echo(f"warning: start to serving was not measured: {reason}", err=True)
    return done.exit_code


def replica_lines(replicas: Sequence[dict[str, Any]]) -> list[str]:
    """The human lines of :func:`replica_results`, one block per replica: served (with its
    completion and timings) or failed (with its failed findings, else its first failure)."""
    lines = []
    for entry in replicas:
        if entry["served"]:
            lines.append(f"replica {entry['name']}: served; completion from "
                         f"{entry.get('served_model')}: {entry['completion']!r}")
            lines.append(f"  {serving_line(entry)}")
            if entry.get("api_path"):
                lines.append(f"  API path: {entry['api_path']['path']} "
                             f"({entry['api_path']['reason']})")
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
    measured reads ``not measured``, never ``None`` (the reason goes to a warning). A replica
    that was already serving was not started: its line says so, with its units' uptime.

    Args:
        extra: the summary keys of the readiness and completion tasks (``start_to_serving_s``,
            ``already_serving``, ``ttft_s``) and ``start_kind`` (``cold`` or ``warm``: the
            state record's verdict, docs/deploy.md "Cold and warm starts").
    """
    def seconds(value: Any) -> str:
        return "not measured" if value is None else f"{value} s"

    started = extra.get("start_to_serving_s")
    if extra.get("already_serving"):
        # nothing was started: the value is how long the units have been up, not a start
        ago = f", its vLLM units started {started} s ago" if started is not None else ""
        first = f"start to serving: not measured (already serving{ago})"
    else:
        kind = extra.get("start_kind")  # cold or warm, once the state record is written
        first = f"start to serving: {seconds(started)}" + (
            f" ({kind} start)" if kind in ("cold", "warm") and started is not None else "")
    return f"{first}; time to first token: {seconds(extra.get('ttft_s'))}"


TAKE_OVER_HELP = ("Take over hosts whose state record names another replica id (another "
                  "replica, or this one with another name, hosts or model): remove what it "
                  "installed that this inventory does not, then go on.")


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
