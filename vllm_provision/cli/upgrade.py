"""``provision upgrade``: a rolling upgrade of a fleet of replicas, N at a time (docs/upgrade.md).

The command parses and prints; the upgrade itself is
:func:`vllm_provision.operations.upgrade.run`.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, common_options, echo
from vllm_provision.core.errors import ProvisionError
from vllm_provision.operations import fleet
from vllm_provision.operations import upgrade as operation
from vllm_provision.operations.approval import YES_HELP


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
    from vllm_provision.output import report

    if serial is not None and max_unavailable is not None:
        raise ProvisionError.single("--serial/--max-unavailable", "give one of them",
                                    fix="--serial N and --max-unavailable N both mean N "
                                        "replicas at a time")
    if drain_hook is not None:
        fleet.hook_argv(drain_hook, "drain", "-", "-")  # refuse a bad hook before anything
    size = serial or max_unavailable or 1
    request = operation.Upgrade(opts.load_inventory(require_replica=True),
                                opts.connection_options(), limit=opts.limit, check=opts.check,
                                diff=opts.diff, size=size, max_fail=max_fail,
                                drain_hook=drain_hook, drain_timeout_s=drain_timeout_s,
                                assume_yes=assume_yes)
    out = sys.stderr if opts.json else sys.stdout
    reporter = report.HumanReporter(out if opts.verbosity > 0 else io.StringIO(),
                                    diff_mode=opts.diff, verbosity=opts.verbosity)
    done = operation.run(request, reporter, echo=lambda line: echo(line, err=opts.json),
                         warn=lambda line: echo(f"warning: {line}", err=True))
    if done.declined:
        return 1
    if done.plan is not None:
        return _print_plan(done.plan, size, max_fail, opts.json)
    summary = done.summary or {}
    if opts.json:
        echo(json.dumps(summary))
    else:
        for line in fleet.recap_lines(done.entries or [], summary["capacity"]):
            echo(line)
    return 0 if summary["ok"] else 1


def _print_plan(plan: list[dict[str, Any]], size: int, max_fail: int, as_json: bool) -> int:
    would = any(r["changes"] or r["restart"] for b in plan for r in b["replicas"])
    problems = any(r["problems"] for b in plan for r in b["replicas"])
    if as_json:
        echo(json.dumps({"check": True, "serial": size, "max_fail": max_fail,
                               "plan": plan}))
    else:
        for batch in plan:
            echo(f"batch {batch['batch']}: " + ", ".join(
                r["name"] for r in batch["replicas"]))
            for entry in batch["replicas"]:
                what = ("restart in order" if entry["restart"] else
                        "no restart") + f", {len(entry['changes'])} change(s)"
                echo(f"  replica {entry['name']}: {what}")
                for change in entry["changes"]:
                    echo(f"    would change {change}")
                for problem in entry["problems"]:
                    echo(f"    problem {problem}")
    if problems:
        return 1
    return 2 if would else 0
