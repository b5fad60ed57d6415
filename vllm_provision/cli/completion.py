"""Shell completion: click's own mechanism (``_PROVISION_COMPLETE``), plus host and group names
of the inventory for ``-l/--limit`` and ``provision completion SHELL`` to print the script.

Enable it once per shell (click's "Shell Completion" documentation)::

    bash: eval "$(_PROVISION_COMPLETE=bash_source provision)"   # in ~/.bashrc
    zsh:  eval "$(_PROVISION_COMPLETE=zsh_source provision)"    # in ~/.zshrc
    fish: _PROVISION_COMPLETE=fish_source provision > ~/.config/fish/completions/provision.fish

or ``provision completion bash`` (zsh, fish), which prints the same script.
"""

from __future__ import annotations

import re
from typing import Any

import click

from vllm_provision.cli.help import examples

# Characters that end one term of a host pattern and start the next (Ansible's patterns:
# ``a:b``, ``a,b``, ``a:&b``, ``a:!b``; vllm_provision.inventory.patterns).
_TERM_START = re.compile(r"^(?P<head>.*[:,][&!]?|[&!])?(?P<term>[^:,&!]*)$")
SHELLS = ("bash", "zsh", "fish")


def limit_names(ctx: click.Context) -> list[str]:
    """Host and group names of the inventory given by ``-i`` on the command line so far, hosts
    first, each once; ``[]`` when there is no ``-i`` or it does not load (completion never
    fails noisily: a half-written inventory just completes nothing)."""
    path = ctx.params.get("inventory")
    if not path:
        return []
    try:
        from vllm_provision.inventory import load_inventory

        inventory = load_inventory(path)
    except Exception:  # any failure means "no candidates" while the user types
        return []
    names = list(inventory.hosts)
    names += [g for g in inventory.groups if g not in ("ungrouped",) and g not in names]
    return names


def complete_limit(ctx: click.Context, _param: click.Parameter,
                   incomplete: str) -> list[Any]:
    """``shell_complete`` callback of ``-l/--limit``: the inventory's host and group names that
    start the last term of the pattern typed so far (``llama:!h`` -> ``llama:!h1``,
    ``llama:!h2``)."""
    from click.shell_completion import CompletionItem

    match = _TERM_START.match(incomplete)
    head, term = (match.group("head") or "", match.group("term")) if match else ("", incomplete)
    return [CompletionItem(head + name) for name in limit_names(ctx) if name.startswith(term)]


def script(shell: str) -> str:
    """The completion script click generates for ``provision`` in ``shell`` (bash, zsh, fish).

    Raises:
        click.BadParameter: an unknown shell.
    """
    from click.shell_completion import get_completion_class

    from vllm_provision.cli import cli

    cls = get_completion_class(shell)
    if cls is None:
        raise click.BadParameter(f"one of {', '.join(SHELLS)}", param_hint="SHELL")
    return cls(cli, {}, "provision", "_PROVISION_COMPLETE").source()


@click.command("completion", epilog=examples(
    'eval "$(provision completion bash)"            # in ~/.bashrc',
    'eval "$(provision completion zsh)"             # in ~/.zshrc',
    "provision completion fish > ~/.config/fish/completions/provision.fish"))
@click.argument("shell", type=click.Choice(SHELLS))
def command(shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, and the inventory's host
    and group names after -l/--limit)."""
    click.echo(script(shell))
