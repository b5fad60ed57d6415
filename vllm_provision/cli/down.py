"""``provision down``: stop the replica in reverse start order and disable its units."""

from __future__ import annotations

import sys
from typing import Any

import click

from vllm_provision.cli.options import CommonOptions, common_options
from vllm_provision.cli.up import run_deploy_playbook


@click.command("down")
@common_options
@click.option("--purge", is_flag=True, help="Also remove the units and environment files.")
def command(purge: bool, **kwargs: Any) -> None:
    """Stop the replica in reverse start order and disable its units (--purge: remove them)."""
    sys.exit(run_deploy_playbook("down", CommonOptions.from_kwargs(kwargs),
                                 extra_vars={"purge": True} if purge else None))
