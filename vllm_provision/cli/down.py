"""``provision down``: stop the replica in reverse start order and disable its units."""

from __future__ import annotations

import sys
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, common_options
from vllm_provision.cli.up import TAKE_OVER_HELP, run_deploy_playbook
from vllm_provision.operations.approval import YES_HELP


@click.command("down", epilog=examples(
    'provision down -i inventory.yml',
    'provision down -i inventory.yml --check          # what would stop',
    'provision down -i inventory.yml --purge          # also remove units and env files'))
@common_options
@click.option("--purge", is_flag=True, help="Also remove the units and environment files.")
@click.option("--take-over", is_flag=True, help=TAKE_OVER_HELP)
@click.option("-y", "--yes", "assume_yes", is_flag=True, help=YES_HELP)
def command(purge: bool, take_over: bool, assume_yes: bool, **kwargs: Any) -> None:
    """Stop the replica in reverse start order and disable its units (--purge: remove them).

    Shows its plan and asks first; --yes approves (without a terminal, --yes is required).
    """
    sys.exit(run_deploy_playbook("down", CommonOptions.from_kwargs(kwargs),
                                 extra_vars={"purge": True} if purge else None,
                                 take_over=take_over, assume_yes=assume_yes))
