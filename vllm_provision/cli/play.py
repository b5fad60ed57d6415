"""``provision play -i INVENTORY PLAYBOOK``: run any playbook, like ``ansible-playbook``.

Exit codes: 0 success; 1 a task failed, a host was unreachable, or the input is invalid;
with ``--check``: 0 nothing would change, 2 changes are pending.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, common_options


@click.command("play", epilog=examples(
    'provision play -i inventory.yml my-playbook.yml',
    'provision play -i inventory.yml my-playbook.yml --check -D -l h1'))
@common_options
@click.argument("playbook", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--roles-path", "roles_paths", multiple=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="More folders holding roles (after the playbook's sibling roles/).")
def command(playbook: Path, roles_paths: tuple[Path, ...], **kwargs: Any) -> None:
    """Run PLAYBOOK against the inventory's hosts."""
    opts = CommonOptions.from_kwargs(kwargs)
    sys.exit(run_play(opts, playbook, roles_paths))


def run_play(opts: CommonOptions, playbook: Path, roles_paths: tuple[Path, ...] = (),
             extra: dict[str, Any] | None = None) -> int:
    """Validate the inventory and playbook (no connection yet), run it, report; return the exit
    code.

    Raises:
        ProvisionError: invalid inventory, limit or playbook (rendered by the CLI's main).
    """
    from vllm_provision.output import report
    from vllm_provision.runner import Runner, RunOptions, load_playbook
    from vllm_provision.transport import runlock

    inventory = opts.load_inventory()
    plays = load_playbook(playbook, roles_paths)
    stream = sys.stderr if opts.json else sys.stdout
    reporter = report.HumanReporter(stream, diff_mode=opts.diff, verbosity=opts.verbosity)
    connection = opts.connection_options()
    with runlock.locked_run(runlock.hosts_of_plays(inventory, plays, opts.limit), connection,
                            "play", warn=lambda line: click.echo(f"warning: {line}",
                                                                 err=True)) as factory:
        if not opts.check:  # a playbook may install role ray: its replicas' Ray tokens
            from vllm_provision.state import ray_token

            ray_token.ensure_tokens(inventory, connections=factory.opened)
        runner = Runner(inventory, RunOptions(check_mode=opts.check, diff_mode=opts.diff,
                                              limit=opts.limit, roles_paths=roles_paths,
                                              connection=connection), reporter,
                        connection_factory=factory)
        outcome = runner.run_plays(plays)
    summary = report.summarize(outcome.results, outcome.hosts, check_mode=opts.check,
                               duration_s=outcome.duration_s,
                               extra={**outcome.extra, **(extra or {}),
                                      "stats": report.connection_stats()})
    reporter.recap(summary)
    if opts.json:
        report.print_json(summary)
    return report.exit_code(summary, check_mode=opts.check)
