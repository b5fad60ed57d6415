"""``provision restart``: restart the whole replica in order, then wait and verify."""

from __future__ import annotations

import sys

import click

from vllm_provision.cli.up import common_options, parse_extra, run_deploy_playbook


@click.command("restart")
@common_options

def command(inventory: str, extra: tuple[str, ...], limit: str | None, check: bool, diff: bool,
            as_json: bool) -> None:
    """Restart the whole replica in order, then wait until it serves and verify."""
    from vllm_provision import report

    extra_vars = parse_extra(extra)
    summary = run_deploy_playbook("restart", inventory, extra_vars=extra_vars, limit=limit,
                                  check=check, diff=diff, as_json=as_json)
    sys.exit(report.exit_code(summary, check_mode=check))
