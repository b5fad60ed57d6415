"""``provision down``: stop the replica in reverse start order and disable its units."""

from __future__ import annotations

import sys

import click

from vllm_provision.cli.up import common_options, parse_extra, run_deploy_playbook


@click.command("down")
@common_options
@click.option("--purge", is_flag=True, help="Also remove the units and environment files.")
def command(inventory: str, extra: tuple[str, ...], limit: str | None, check: bool, diff: bool,
            as_json: bool, purge: bool) -> None:
    """Stop the replica in reverse start order and disable its units (--purge: remove them)."""
    from vllm_provision import report

    extra_vars = parse_extra(extra) | ({"purge": True} if purge else {})
    summary = run_deploy_playbook("down", inventory, extra_vars=extra_vars, limit=limit,
                                  check=check, diff=diff, as_json=as_json)
    sys.exit(report.exit_code(summary, check_mode=check))
