"""``provision check``: gather facts and run every preflight check; exit 1 when any is an error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from vllm_provision.checks.finding import Finding, Severity


def findings_json(findings: list[Finding]) -> dict:
    """The ``--json`` object: every finding plus counts per severity."""
    return {
        "ok": not any(f.severity is Severity.ERROR for f in findings),
        "counts": {s.value: sum(1 for f in findings if f.severity is s) for s in Severity},
        "findings": [{"check": f.check, "severity": f.severity.value, "host": f.host,
                      "item": f.item, "expected": f.expected, "actual": f.actual, "fix": f.fix,
                      "source": f.source} for f in findings],
    }


def render_findings(findings: list[Finding], *, show_ok: bool = True) -> None:
    """Print findings as one table per severity (error, warning, ok) with a summary line."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    styles = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.OK: "green"}
    for severity in Severity:
        group = [f for f in findings if f.severity is severity]
        if not group or (severity is Severity.OK and not show_ok):
            continue
        table = Table(title=f"{severity.value} ({len(group)})", title_style=styles[severity],
                      title_justify="left", show_lines=severity is not Severity.OK)
        for column in ("check", "host", "item", "expected", "actual"):
            table.add_column(column, overflow="fold")
        if severity is not Severity.OK:
            table.add_column("fix", overflow="fold")
        for f in group:
            row = [f.check, f.host, f.item, f.expected, f.actual]
            table.add_row(*(row + [f.fix] if severity is not Severity.OK else row))
        console.print(table)
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    console.print(f"[{styles[Severity.ERROR]}]{counts[Severity.ERROR]} errors[/], "
                  f"[{styles[Severity.WARNING]}]{counts[Severity.WARNING]} warnings[/], "
                  f"[{styles[Severity.OK]}]{counts[Severity.OK]} ok[/]")


@click.command("check")
@click.option("-i", "--inventory", "inventory_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Inventory YAML file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--skip-check", "skip", multiple=True, metavar="NAME",
              help="Skip a check by name or prefix (e.g. host.shm, parity.transformers, parity); "
                   "repeatable.")
@click.option("-l", "--limit", default=None, metavar="PATTERN",
              help="Only the replicas with a host matching this Ansible host pattern.")
@click.option("--quiet-ok", is_flag=True, help="Do not list the checks that passed.")
def command(inventory_path: Path, as_json: bool, skip: tuple[str, ...], limit: str | None,
            quiet_ok: bool) -> None:
    """Gather facts from every node and run all preflight checks.

    Exit status 0 when no check is an error, 1 otherwise.
    """
    from vllm_provision.checks.run import has_errors, load_defaults, run_checks, settings_for
    from vllm_provision.facts.collect import collect_facts
    from vllm_provision.inventory import load_inventory, require_replicas, select_hosts

    inventory = load_inventory(inventory_path)
    require_replicas(inventory)
    replicas = list(inventory.replicas)
    if limit:
        wanted = {host.name for host in select_hosts(inventory, limit)}
        replicas = [r for r in replicas if any(node.name in wanted for node in r.nodes)]
    hosts = [node.host for replica in replicas for node in replica.nodes]
    defaults = load_defaults()
    settings = [settings_for(replica, defaults) for replica in replicas]
    probe = settings[0].probe_options() if settings else None
    if probe is not None and any(s.nccl_loaded for s in settings):
        from dataclasses import replace

        probe = replace(probe, nccl_loaded=True)
    facts, errors = collect_facts(inventory, hosts, probe)
    findings = run_checks(inventory, facts, errors, skip=skip, replicas=replicas,
                          defaults=defaults)
    if as_json:
        click.echo(json.dumps(findings_json(findings), indent=2))
    else:
        render_findings(findings, show_ok=not quiet_ok)
    sys.exit(1 if has_errors(findings) else 0)
