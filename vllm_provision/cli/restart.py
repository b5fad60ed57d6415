"""``provision restart``: restart the whole replica in order, then wait and verify."""

from __future__ import annotations

import sys
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, common_options
from vllm_provision.cli.up import TAKE_OVER_HELP, run_deploy_playbook
from vllm_provision.operations.approval import YES_HELP


@click.command("restart", epilog=examples(
    'provision restart -i inventory.yml',
    'provision restart -i inventory.yml --check        # the plan and the outage',
    'provision restart -i inventory.yml --rotate-ray-token   # a new Ray token, then restart'))
@common_options
@click.option("--take-over", is_flag=True, help=TAKE_OVER_HELP)
@click.option("-y", "--yes", "assume_yes", is_flag=True, help=YES_HELP)
@click.option("--rotate-ray-token", is_flag=True,
              help="Make a new Ray token for each Ray replica of the run (vllm_ray_auth: "
                   "token), install it on its nodes, then restart in order (docs/security.md).")
def command(take_over: bool, assume_yes: bool, rotate_ray_token: bool, **kwargs: Any) -> None:
    """Restart the whole replica in order, then wait until it serves and verify.

    Asks only with --take-over (--yes approves): a restart is what was asked for.
    """
    sys.exit(run_deploy_playbook("restart", CommonOptions.from_kwargs(kwargs),
                                 take_over=take_over, assume_yes=assume_yes,
                                 rotate_ray_token=rotate_ray_token))
