"""``provision drift``: what changed since the last good ``provision up`` (before an upgrade).

Reads the state record (the controller's copy, else any host's; ``vllm_provision.state``),
gathers facts now (one round trip per host), replays the install plays of ``playbooks/up.yml``
in check mode (so hand edits on hosts AND inventory or ``-e`` edits show up), and prints a plan
like ``terraform plan``. Exit codes as ``terraform plan -detailed-exitcode``: 0 no drift,
1 error or unreachable host, 2 drift found. See docs/drift.md.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import click

from vllm_provision import resources
from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, echo, shared_options
from vllm_provision.runner import managed

NO_RECORD = "no record of a good `provision up`; run it first"


def _probe_options(inventory: Any) -> Any:
    """The probe options preflight uses for these replicas (same facts, same values), without the
    reachability test (drift must not open listeners next to a running replica)."""
    from vllm_provision.checks.options import probe_for

    return replace(probe_for(list(inventory.replicas)), reachability=False)


def _newest(records: list[tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]] | None:
    return max(records, key=lambda pair: str(pair[1].get("time", ""))) if records else None


def _record_time(record: dict[str, Any]) -> str:
    return str(record.get("time", "unknown time"))


def find_drift(opts: CommonOptions) -> dict[str, Any]:
    """Do the whole comparison; return the ``--json`` object.

    Keys: ``drift`` (bool), ``changes`` (list of host/item/recorded/current/kind), ``errors``
    (host -> message), ``hosts`` (checked), ``record`` (source, time, tool_version),
    ``exit_code``.

    Raises:
        ProvisionError: invalid inventory, or no record anywhere (exit 1).
    """
    from vllm_provision import state
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.facts.gather import gather_facts
    from vllm_provision.inventory import select_hosts
    from vllm_provision.output import report
    from vllm_provision.runner.engine import Runner, RunOptions
    from vllm_provision.runner.playbook import load_playbook
    from vllm_provision.state import drift
    from vllm_provision.transport.connection import close_all, open_connections
    from vllm_provision.transport.runlock import lending_factory

    inventory = opts.load_inventory()
    nodes = {node.name for replica in inventory.replicas for node in replica.nodes}
    hosts = [h for h in select_hosts(inventory, opts.limit or "all") if h.name in nodes]
    names = [h.name for h in hosts]
    errors: dict[str, str] = {}

    record = state.read_controller_record(opts.inventory)
    source = str(state.controller_state_path(opts.inventory))
    # one connection per host for the whole command: the record, the facts and the dry run
    connections, unreachable = open_connections(hosts, opts.connection_options())
    errors.update({name: exc.render() for name, exc in unreachable.items()})
    try:
        if record is None:
            found = []
            for name, conn in connections.items():
                try:
                    path = state.host_record_path(inventory.hosts[name].vars)
                    host_record = state.read_host_record(conn, path)
                except ProvisionError as exc:
                    errors[name] = exc.render()
                    continue
                if host_record is not None:
                    found.append((f"{name}:{path}", host_record))
            newest = _newest(found)
            if newest is None:
                where = ", ".join(names) + " and " + source if names else source
                raise ProvisionError.single(
                    where, NO_RECORD,
                    fix=f"run `provision up -i {opts.inventory}`; drift compares with what it "
                        "records after a verified completion")
            source, record = newest
        facts, fact_errors = gather_facts(inventory, connections, _probe_options(inventory),
                                          hosts=list(connections))
        errors.update({name: exc.render() for name, exc in fact_errors.items()})

        plays = managed.install_plays(load_playbook(resources.playbook("up")))
        files = managed.managed_files(inventory, plays, opts.limit)
        reload_tasks = [t.name for p in plays for t in p.tasks
                        if t.module == "systemd" and isinstance(t.args, dict)
                        and set(t.args) <= {"daemon_reload"}]
        # a handler's change only follows a file's (check mode now says "would restart")
        reload_tasks += [h.name for p in plays for h in p.handlers]
        reachable = [n for n in names if n not in errors]
        results = []
        if reachable:
            runner = Runner(inventory, RunOptions(check_mode=True, diff_mode=opts.diff,
                                                  limit=":".join(reachable),
                                                  connection=opts.connection_options()),
                            report.QuietReporter(),
                            connection_factory=lending_factory(connections, unreachable,
                                                               opts.connection_options()))
            # the install plays render with the facts, as `up`'s do after its preflight play
            # (a Ray unit's --num-gpus comes from them: without them every Ray unit drifted)
            runner.facts.update(facts)
            results = runner.run_plays(plays).results
    finally:
        close_all(connections)
    for failed in drift.failed_results(results):
        errors.setdefault(failed.host, f"{failed.task}: {failed.message}")

    order = {name: index for index, name in enumerate(["*", *names])}
    from vllm_provision.stack.lock import replica_locks

    changes = sorted(drift.compare_layout(record, inventory, names)
                     + drift.compare_facts(record, facts)
                     + drift.compare_lock(replica_locks(inventory), inventory, facts)
                     + drift.config_changes(results, record, files, reload_tasks),
                     key=lambda c: (c.kind != "facts", order.get(c.host, len(order))))
    diffs = [{"host": r.host, "task": r.task, "diff": r.diff} for r in results
             if r.diff and r.status.value == "changed"]
    return {
        "drift": bool(changes),
        "changes": [c.to_json() for c in changes],
        "errors": errors,
        "hosts": names,
        "record": {"source": source, "time": record.get("time"),
                   "tool_version": record.get("tool_version")},
        "diffs": diffs,
        "exit_code": drift.exit_code(changes, errors),
        "stats": report.connection_stats(),
    }


def render_plan(outcome: dict[str, Any]) -> str:
    """The human plan: one line per change, errors, then the summary line."""
    from vllm_provision.state.drift import Change, summary_line

    changes = [Change(**c) for c in outcome["changes"]]
    lines = [f"comparing with the last good `provision up` of {outcome['record']['time']} "
             f"(vllm-provision {outcome['record']['tool_version']}, {outcome['record']['source']})",
             ""]
    for kind, title in (("facts", "facts changed"), ("config", "`provision up` would change")):
        mine = [c for c in changes if c.kind == kind]
        if mine:
            lines.append(f"{title}:")
            lines.extend(f"  {c.line()}" for c in mine)
            lines.append("")
    for diff in outcome["diffs"]:
        lines.append(f"--- {diff['host']}: {diff['task']}")
        lines.append(diff["diff"].rstrip("\n"))
    for host, message in outcome["errors"].items():
        lines.append(f"! {host}  could not be checked: {message}")
    lines.append(summary_line(changes, outcome["hosts"], _record_time(outcome["record"])))
    if outcome["errors"]:
        lines.append(f"Error: {len(outcome['errors'])} host(s) could not be checked; "
                     "the plan above is incomplete.")
    return "\n".join(lines)


@click.command("drift", epilog=examples(
    'provision drift -i inventory.yml                 # exit 2 when something changed',
    'provision drift -i inventory.yml -D --json'))
@shared_options((*HOST_OPTIONS, "diff"))  # always a dry run: no -C
def command(**kwargs: Any) -> None:
    """Show what changed since the last good `provision up`: facts and configuration.

    Exit status: 0 no drift, 2 drift found, 1 error (no record, unreachable host, bad input).
    """
    opts = CommonOptions.from_kwargs(kwargs)
    outcome = find_drift(opts)
    if opts.json:
        echo(json.dumps(outcome, indent=2, default=str))
    else:
        echo(render_plan(outcome))
    if opts.verbosity >= 2:
        from vllm_provision.output.report import stats_lines

        for line in stats_lines(outcome["stats"]):
            echo(line, err=True)
    sys.exit(outcome["exit_code"])
