"""``provision up``: install, start in order, wait until the replica serves, send one completion."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def run_deploy_playbook(name: str, inventory_path: str, *, extra_vars: dict[str, Any],
                        limit: str | None, check: bool, diff: bool, as_json: bool,
                        skip_checks: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``playbooks/<name>.yml`` and print the recap (or ``--json``); return the summary.

    The summary gains ``completion``, ``served_model``, ``ttft_s``, ``start_to_serving_s`` and
    ``vllm_version`` when the readiness and verify tasks ran.

    Raises:
        ProvisionError: invalid inventory or playbook (nothing was changed then).
    """
    from vllm_provision import report
    from vllm_provision.inventory.loader import load_inventory
    from vllm_provision.runner.engine import Runner, RunOptions

    if skip_checks:
        extra_vars = extra_vars | {"vllm_skip_checks": list(skip_checks)}
    report.set_json_mode(as_json)
    inventory = load_inventory(Path(inventory_path), extra_vars)
    reporter = report.HumanReporter(sys.stderr if as_json else sys.stdout, diff_mode=diff)
    runner = Runner(inventory, RunOptions(check_mode=check, diff_mode=diff, limit=limit),
                    reporter)
    outcome = runner.run_playbook(PLAYBOOKS / f"{name}.yml")
    extra: dict[str, Any] = {}
    for result in outcome.results:
        if result.data and result.task.startswith(("Wait until rank 0", "Send one completion")):
            extra.update({k: v for k, v in result.data.items()
                          if k in ("completion", "served_model", "ttft_s", "completion_s",
                                   "start_to_serving_s", "vllm_version", "already_serving")})
    if (name == "up" and not check and not limit and "completion" in extra
            and not any(r.failed for r in outcome.results)):
        extra.update(_record_good_up(inventory, runner))
    summary = report.summarize(outcome.results, outcome.hosts, check_mode=check,
                               duration_s=outcome.duration_s, extra=extra)
    if as_json:
        report.print_json(summary)
    else:
        click.echo(f"\nchanged={summary['changed']} ok={summary['ok']} "
                   f"failed={summary['failed']} unreachable={summary['unreachable']}")
        if "completion" in extra:
            click.echo(f"completion from {extra.get('served_model')}: {extra['completion']!r}")
            click.echo(f"start to serving: {extra.get('start_to_serving_s')} s"
                       f"{' (already serving)' if extra.get('already_serving') else ''}; "
                       f"time to first token: {extra.get('ttft_s')} s")
    return summary


def _record_good_up(inventory: Any, runner: Any) -> dict[str, str]:
    """Write the state record of a verified `up` for `provision drift` (vllm_provision.state);
    return ``state_record`` (controller path) or ``state_record_error`` (also on stderr)."""
    from vllm_provision import state
    from vllm_provision.errors import ProvisionError
    from vllm_provision.runner.playbook import load_playbook

    try:
        return {"state_record": str(state.record_after_up(
            inventory, runner.facts, load_playbook(PLAYBOOKS / "up.yml"),
            runner.options.connection))}
    except ProvisionError as exc:
        click.echo(f"warning: the state record for `provision drift` was not written: {exc}",
                   err=True)
        return {"state_record_error": exc.render()}


def common_options(func: Any) -> Any:
    """``-i INVENTORY``, ``-e k=v``, ``--limit``, ``--check``, ``--diff``, ``--json``."""
    for option in reversed([
        click.option("-i", "--inventory", "inventory", required=True,
                     type=click.Path(exists=True, dir_okay=False), help="Inventory file."),
        click.option("-e", "--extra-vars", "extra", multiple=True, metavar="KEY=VALUE",
                     help="Extra variable (highest precedence); repeatable."),
        click.option("--limit", default=None, help="Host pattern to restrict every play to."),
        click.option("--check", is_flag=True, help="Change nothing; report what would change."),
        click.option("--diff", is_flag=True, help="Show diffs of changed files."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
    ]):
        func = option(func)
    return func


def parse_extra(values: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs -> dict; VALUE is read as YAML (``true``, ``4096``, ``[a, b]``).

    Raises:
        click.BadParameter: a pair without ``=``.
    """
    import yaml

    extra: dict[str, Any] = {}
    for value in values:
        key, sep, raw = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint="-e")
        extra[key] = yaml.safe_load(raw) if raw else ""
    return extra


@click.command("up")
@common_options
@click.option("--skip-check", "skip_checks", multiple=True, metavar="NAME",
              help="Preflight check to skip (by its name, e.g. parity.nccl); repeatable.")
def command(inventory: str, extra: tuple[str, ...], limit: str | None, check: bool, diff: bool,
            as_json: bool, skip_checks: tuple[str, ...]) -> None:
    """Deploy the replica: preflight, install, start in order, wait until it serves, verify."""
    from vllm_provision import report

    summary = run_deploy_playbook("up", inventory, extra_vars=parse_extra(extra), limit=limit,
                                  check=check, diff=diff, as_json=as_json,
                                  skip_checks=skip_checks)
    sys.exit(report.exit_code(summary, check_mode=check))
