"""``provision inventory``: show the inventory as ``ansible-inventory`` does, plus the replicas.

``--list`` prints ansible-inventory's JSON (groups, ``_meta.hostvars``) with one more top-level
key, ``_vllm_provision``: each replica's backend and nodes (rank, role, ``vllm serve``
arguments). ``--graph`` prints the group tree, ``--host NAME`` one host's variables. The
inventory is validated first, as every command validates it; no host is contacted.
"""

from __future__ import annotations

import json
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, shared_options


@click.command(epilog=examples(
    'provision inventory -i inventory.yml --list',
    'provision inventory -i inventory.yml --host h1',
    'provision inventory -i inventory.yml --graph'))
@shared_options(("inventory", "extra_vars", "verbose", "json"))
@click.option("--list", "show_list", is_flag=True,
              help="Every group and host variable, as ansible-inventory --list, and the replicas.")
@click.option("--graph", "show_graph", is_flag=True, help="The group tree.")
@click.option("--host", "host_name", metavar="NAME", help="The variables of one host.")
def command(show_list: bool, show_graph: bool, host_name: str | None, **kwargs: Any) -> None:
    """Show what each host gets after group_vars, host_vars and precedence (no host contacted)."""
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.inventory import view
    from vllm_provision.settings.masking import Masker

    chosen = [flag for flag, on in (("--list", show_list), ("--graph", show_graph),
                                    ("--host", host_name is not None)) if on]
    if len(chosen) != 1:
        raise ProvisionError.single("provision inventory", "give exactly one of --list, "
                                    "--graph and --host NAME",
                                    actual=", ".join(chosen) or "none",
                                    fix="e.g. provision inventory -i hosts.ini --list")
    opts = CommonOptions.from_kwargs(kwargs)
    inventory = opts.load_inventory()
    tree, hostvars = view.read_tree(opts.inventory, opts.extra_vars)
    masker = Masker.from_inventory(inventory)
    if show_graph:
        click.echo(masker.text(view.ansible_graph(tree)))
        return
    if host_name is not None:
        if host_name not in hostvars:
            raise ProvisionError.single(str(opts.inventory), f"no host named {host_name!r} in "
                                        "the inventory", fix="see the hosts with "
                                        "provision inventory -i INV --graph")
        data: dict[str, Any] = view.ansible_host(hostvars[host_name])
    else:
        data = {**view.ansible_list(tree, hostvars),
                view.EXTRA_KEY: view.replicas_view(inventory)}
    click.echo(json.dumps(masker.data(data), indent=4, sort_keys=True))
