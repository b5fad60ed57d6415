"""``provision record``: the deployment decision record from the inventory and the stored bench
and fault results (docs/evidence.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, echo, replica_option


@click.command("record", epilog=examples(
    'provision record -i inventory.yml --out decision.md',
    'provision record -i lab-mp.yml --compare lab-ray.yml --out decision.md'))
@click.option("-i", "--inventory", required=True, type=click.Path(path_type=Path),
              help="Inventory: a YAML or INI file, or a directory of them.")
@click.option("--compare", "other", type=click.Path(path_type=Path),
              help="A second inventory (the other backend on the same hosts): side by side.")
@replica_option()
@click.option("--out", "out_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the Markdown here (default: print it).")
def command(inventory: Path, other: Path | None, replica_name: str | None,
            out_path: Path | None) -> None:
    """Write the decision record: GPU pool, who reserves GPUs and starts workers, what Ray adds
    and does not, how traffic returned after faults, the evidence, refusals where conditions
    differ, and one checkable closing sentence. Reads only stored results: run ``provision
    bench`` (and ``provision fault``) first; reaches no host."""
    from vllm_provision.cli.bench import pick_replica
    from vllm_provision.evidence import record, store

    def one(path: Path) -> dict[str, Any]:
        inv = CommonOptions(inventory=path).load_inventory(require_replica=True)
        return record.facts_of(inv, store.read(inv.path), pick_replica(inv, replica_name))

    text = record.render(one(inventory), one(other) if other else None)
    record.check_complete(text)
    if out_path is None:
        echo(text, nl=False)
    else:
        store.write_text(out_path, text)
        echo(f"record: {out_path}")
