"""``provision monitor``: write Prometheus scrape targets for the inventory's replicas.

A thin caller of :mod:`vllm_provision.operations.monitor` (docs/monitoring.md): loads the
inventory, writes the targets files (and ``prometheus.yml``, the rule file and the Grafana
dashboard unless ``--targets-only``) under ``--out``, prints a warning per replica whose vLLM
release has no known metric names, then one line per file (``changed`` or ``ok``) and the
target counts. No host is contacted; a second run with the same inventory changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import CommonOptions, shared_options
from vllm_provision.core.text import printable


@click.command("monitor", epilog=examples(
    'provision monitor -i inventory.yml --out /etc/prometheus/vllm',
    'prometheus --config.file=/etc/prometheus/vllm/prometheus.yml',
    'provision monitor -i inventory.yml --out targets/ --targets-only'))
@shared_options(("inventory", "extra_vars", "verbose"))
@click.option("--out", "out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Folder to write prometheus.yml, targets/*.json, rules/ and dashboards/ "
                   "into (created).")
@click.option("--targets-only", is_flag=True,
              help="Write only targets/*.json, for a Prometheus with its own configuration (no "
                   "prometheus.yml, rules or dashboard).")
@click.option("--scrape-interval", default="15s", show_default=True, metavar="DURATION",
              help="prometheus.yml's scrape and rule evaluation interval (500ms, 15s, 1m).")
def command(out: Path, targets_only: bool, scrape_interval: str, **kwargs: Any) -> None:
    """Write Prometheus scrape targets for every replica (and a prometheus.yml); no host
    contacted.

    Also written, unless --targets-only: recording and alert rules and a Grafana dashboard.

    Targets: rank 0's vLLM /metrics of every replica, the Ray metrics agent of every node of a
    Ray replica, and every node's node and GPU exporters where the inventory has them, labelled
    replica, backend, model, node_rank, role and host. Rules and the dashboard use the vLLM
    metric names of each replica's release (vllm_version, else its stack lock); an unknown
    release is a warning (docs/monitoring.md).
    """
    from vllm_provision.operations import monitor

    opts = CommonOptions.from_kwargs(kwargs)
    inventory = opts.load_inventory(require_replica=True)
    interval = monitor.check_interval(scrape_interval)
    if not targets_only:
        for line in monitor.warnings(inventory):
            click.echo(f"warning: {printable(line)}", err=True)
    for written in monitor.write(inventory, out, config=not targets_only,
                                 scrape_interval=interval):
        click.echo(f"{'changed' if written.changed else 'ok':8} {written.path}")
    counts = monitor.summary(inventory)
    click.echo(", ".join(f"{job}: {n} target{'s' if n != 1 else ''}"
                         for job, n in counts.items()))
