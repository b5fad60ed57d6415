"""``provision check``: gather facts and run every preflight check; exit 1 when any is an error."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, echo, shared_options
from vllm_provision.core.text import printable


def findings_json(findings: list[Finding], replicas: Sequence[Any] = (),
                  memory: dict[str, Any] | None = None,
                  api_paths: dict[str, dict[str, str]] | None = None) -> dict:
    """The ``--json`` object: every finding (with the replica it belongs to), counts per
    severity, per replica its backend and where the backend came from: ``inventory``
    (``vllm_backend``) or ``default`` (vLLM's rule; ``backend_reason`` says why and cites it),
    and ``memory``: replica name -> its memory estimate (``checks.run.memory_estimates``);
    ``api_paths``: replica name -> how the controller reaches its API
    (``modules.vllm_preflight.api_path_json``), shown as each replica's ``api_path``.
    """
    return {
        "memory": memory or {},
        "ok": not any(f.severity is Severity.ERROR for f in findings),
        "counts": {s.value: sum(1 for f in findings if f.severity is s) for s in Severity},
        "replicas": [{**backend_json(replica),
                      **({"api_path": api_paths[replica.name]}
                         if api_paths and replica.name in api_paths else {})}
                     for replica in replicas],
        "findings": [{"check": f.check, "severity": f.severity.value, "host": f.host,
                      "replica": f.replica, "item": f.item, "expected": f.expected,
                      "actual": f.actual, "fix": f.fix, "source": f.source} for f in findings],
    }


def backend_json(replica: Any) -> dict[str, Any]:
    """``name``, ``backend``, ``backend_source`` (``inventory`` or ``default``) and
    ``backend_reason`` (empty when set in the inventory) of one replica."""
    return {"name": replica.name, "backend": replica.backend,
            "backend_source": "default" if replica.backend_reason else "inventory",
            "backend_reason": replica.backend_reason}


def backend_lines(replicas: Sequence[Any]) -> list[str]:
    """One line per replica: its backend, and for one without ``vllm_backend`` which backend
    vLLM's default rule chose and why."""
    return [f"replica {r.name}: backend {r.backend} "
            + (f"(chosen: {r.backend_reason})" if r.backend_reason else "(vllm_backend)")
            for r in replicas]


def render_backends(replicas: Sequence[Any]) -> None:
    """Print :func:`backend_lines`."""
    for line in backend_lines(replicas):
        echo(line)


# Below this terminal width a seven-column table must break words; findings become blocks.
NARROW_COLUMNS = 100


def _render_narrow(console: Any, group: list[Finding], title: str, style: str) -> None:
    """One block per finding: ``check  replica  host  item``, then its fields on wrapped lines
    (rich wraps at word boundaries; a check name is never split)."""
    from rich.table import Table
    from rich.text import Text

    console.print(Text(title, style=style))
    for f in group:
        console.print(Text.assemble((f.check, "bold"), printable(
            f"  {f.replica or '-'}  {f.host}  {f.item}", newlines=True)), overflow="ignore",
            crop=False, soft_wrap=True)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=10, no_wrap=True)
        grid.add_column(overflow="fold")
        rows = [("expected", f.expected), ("actual", f.actual)]
        if f.severity is not Severity.OK:
            rows.append(("fix", f.fix))
        for label, value in rows:
            if value:
                grid.add_row(Text(f"  {label}"), Text(printable(value, newlines=True)))
        console.print(grid)


def render_findings(findings: list[Finding], *, show_ok: bool = True) -> None:
    """Print findings as one table per severity (error, warning, ok) with a summary line; the
    replica column names the replica each finding belongs to."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    styles = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.OK: "green"}
    for severity in Severity:
        group = [f for f in findings if f.severity is severity]
        if not group or (severity is Severity.OK and not show_ok):
            continue
        if console.width < NARROW_COLUMNS:
            _render_narrow(console, group, f"{severity.value} ({len(group)})",
                           styles[severity])
            continue
        table = Table(title=f"{severity.value} ({len(group)})", title_style=styles[severity],
                      title_justify="left", show_lines=severity is not Severity.OK)
        # A check name is one word the operator copies into --skip-check: never break it.
        table.add_column("check", no_wrap=True,
                         min_width=max(len(f.check) for f in group))
        for column in ("replica", "host", "item", "expected", "actual"):
            table.add_column(column, overflow="fold")
        if severity is not Severity.OK:
            table.add_column("fix", overflow="fold")
        for f in group:
            row = [f.check, f.replica or "-", f.host, f.item, f.expected, f.actual]
            # Text cells: a value such as "[vllm]" or "--x=[1,2]" is data, not rich markup;
            # a host's text (an owner, a version) is made printable (no terminal escape).
            table.add_row(*(Text(printable(cell, newlines=True)) for cell in
                            (row + [f.fix] if severity is not Severity.OK else row)))
        console.print(table)
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    console.print(f"[{styles[Severity.ERROR]}]{counts[Severity.ERROR]} errors[/], "
                  f"[{styles[Severity.WARNING]}]{counts[Severity.WARNING]} warnings[/], "
                  f"[{styles[Severity.OK]}]{counts[Severity.OK]} ok[/]")


@click.command("check", epilog=examples(
    'provision check -i inventory.yml',
    'provision check -i inventory.yml --json | jq .counts',
    'provision check -i inventory.yml -l llm -e vllm_tensor_parallel_size=2'))
@shared_options(HOST_OPTIONS)
@click.option("--skip-check", "skip", multiple=True, metavar="NAME",
              help="Skip a check by name or prefix (e.g. host.shm, parity.transformers, parity); "
                   "repeatable.")
@click.option("--quiet-ok", is_flag=True, help="Do not list the checks that passed.")
def command(skip: tuple[str, ...], quiet_ok: bool, **kwargs: Any) -> None:
    """Gather facts from every node and run all preflight checks.

    With --limit, only the replicas with a host matching the pattern are checked.
    Exit status 0 when no check is an error, 1 otherwise.
    """
    from vllm_provision.checks.options import probe_for, replicas_on
    from vllm_provision.checks.run import has_errors, load_defaults, memory_estimates, run_checks
    from vllm_provision.facts.collect import collect_facts
    from vllm_provision.inventory import select_hosts
    from vllm_provision.modules.vllm_preflight import api_path_json
    from vllm_provision.transport.tunnel import choices_for

    opts = CommonOptions.from_kwargs(kwargs)
    inventory = opts.load_inventory(require_replica=True)
    replicas = list(inventory.replicas)
    if opts.limit:
        replicas = replicas_on(inventory, (h.name for h in select_hosts(inventory, opts.limit)))
    hosts = [node.host for replica in replicas for node in replica.nodes]
    defaults = load_defaults()
    probe = probe_for(replicas, defaults) if replicas else None
    facts, errors = collect_facts(inventory, hosts, probe, opts.connection_options())
    findings = run_checks(inventory, facts, errors, skip=skip, replicas=replicas,
                          defaults=defaults)
    chosen = choices_for(replicas)
    paths = {replica.name: api_path_json(replica, chosen[replica.name]) for replica in replicas}
    if opts.json:
        echo(json.dumps(findings_json(findings, replicas, memory_estimates(
            replicas, facts, defaults), paths), indent=2))
    else:
        render_backends(replicas)
        for name, path in paths.items():
            echo(f"replica {name}: API path: {path['path']} ({path['reason']})")
        render_findings(findings, show_ok=not quiet_ok)
    sys.exit(1 if has_errors(findings) else 0)
