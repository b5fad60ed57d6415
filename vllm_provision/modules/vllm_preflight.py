"""Gather facts and run every preflight check before anything is changed (controller module).

Runs once per play batch on the controller: probes every node of the replicas in the play (one
SSH round trip each, in parallel), stores the facts for later tasks (the ``facts`` variable),
and fails every node of a replica that has an error finding, so ``provision up`` touches no
host of it; the other replicas pass on their own findings (``checks.run.findings_of``). Each
node's result carries its replica's name and findings (``provision up`` reports per replica).
Read-only: it runs the same in check mode. When the same command already probed every node of
the task under the run lock it still holds (``up`` sends the probe in the run lock's first
answer; the approval's dry run probed too), those facts are checked instead of probing again
(:data:`GATHERED`).

It also chooses how the controller reaches each replica's API (``vllm_api_via``; ``auto``
probes the direct address once, :mod:`vllm_provision.transport.tunnel`) and says which in each
node's message (``API path: direct`` or ``ssh via <rank 0>``) and in ``data["api_paths"]``;
readiness and verify of the same run use that choice.

The task's ``skip_checks`` are merged with the ``preflight_skip_checks`` variable and the
``skip_checks`` extra variable (``--skip-check``).

Example task::

    - name: Check versions, topology, network and hosts of every node
      vllm_preflight: {}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.checks.options import probe_for, replicas_on
from vllm_provision.checks.run import findings_of, load_defaults, run_checks
from vllm_provision.core.models import Replica
from vllm_provision.core.results import Status
from vllm_provision.facts.gather import gather_facts
from vllm_provision.modules import ModuleResult
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext
from vllm_provision.transport.tunnel import Choice, choices_for, describe_choice

RUNS_ON = "controller"
# The key, in a host's per-run scratch space (``TaskContext.run_state``), of facts the same
# command already gathered under its run lock (the approval's dry run, operations/deploy.py):
# when every host of the task has them, the task checks those instead of probing again.
GATHERED = "facts_gathered_this_run"
# ... and the probe options they were gathered with (absent: this task's own, as in the
# approval's dry run): facts gathered with other options are not used.
GATHERED_WITH = "facts_gathered_with"
ARGUMENT_SPEC = ArgumentSpec("vllm_preflight", (
    Argument("skip_checks", ("list", "str"), "check names or prefixes to skip, as --skip-check "
             "(a string: comma-separated)"),
))


def _as_list(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(item) for item in value]


def finding_dict(finding: Finding) -> dict[str, str]:
    """One finding as the task's JSON data shows it (check, severity, host, replica, item,
    expected, actual, fix, source)."""
    return {"check": finding.check, "severity": finding.severity.value, "host": finding.host,
            "replica": finding.replica, "item": finding.item, "expected": finding.expected,
            "actual": finding.actual, "fix": finding.fix, "source": finding.source}


def api_path_json(replica: Replica, choice: Choice) -> dict[str, str]:
    """How the controller reaches ``replica``'s API (``vllm_api_via``): ``via`` (``direct`` or
    ``ssh``), ``host`` (rank 0), ``path`` (``direct`` / ``ssh via <host>``), ``setting`` and
    ``reason`` (what the probe saw; :func:`~vllm_provision.transport.tunnel.choose`)."""
    return {"via": choice.via, "host": replica.master.name,
            "path": describe_choice(replica, choice), "setting": choice.setting,
            "reason": choice.reason}



def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Probe the play's replicas, run the checks, store facts, fail on any error finding.

    Args:
        ctx: the runner's TaskContext (``connections``, ``inventory``, ``facts``, ``vars``).
        args: ``skip_checks`` (optional list of check names or prefixes).

    Returns:
        ModuleResult: ``ok`` with per-host results, or ``failed`` on every node of a replica
        with an error finding (the message lists them: host, item, expected, actual, fix).
    """
    values = ARGUMENT_SPEC.validate(args)
    inventory = ctx.inventory
    replicas = replicas_on(inventory, ctx.connections)
    if not replicas:
        return ModuleResult(Status.SKIPPED, "no replica among the play's hosts")
    skip = (_as_list(values["skip_checks"]) + _as_list(ctx.vars.get("skip_checks"))
            + _as_list(ctx.vars.get("preflight_skip_checks")))
    defaults = load_defaults()
    probe = probe_for(replicas, defaults)
    names = [node.name for replica in replicas for node in replica.nodes
             if node.name in ctx.connections]
    earlier = {name: ctx.run_state.get(name, {}).get(GATHERED) for name in names}
    same = all(ctx.run_state.get(name, {}).get(GATHERED_WITH, probe) == probe for name in names)
    if names and all(earlier.values()) and same:
        # this same command probed these hosts seconds ago, under the run lock this run still
        # holds (operations/deploy.py: the lock's first answer, or the approval's dry run):
        # not probed twice
        facts, errors = dict(earlier), {}
    else:
        facts, errors = gather_facts(inventory, ctx.connections, probe, hosts=names)
    ctx.facts.update(facts)
    findings = run_checks(inventory, facts, errors, skip=skip, replicas=replicas,
                          defaults=defaults)
    failing = [f for f in findings if f.severity is Severity.ERROR]
    warnings = [f for f in findings if f.severity is Severity.WARNING]
    data = {"errors": len(failing), "warnings": len(warnings),
            "findings": [finding_dict(f) for f in findings if f.severity is not Severity.OK]}
    host_results: dict[str, ModuleResult] = {}
    paths = choices_for(replicas)
    data["api_paths"] = {replica.name: api_path_json(replica, paths[replica.name])
                         for replica in replicas}
    for replica in replicas:
        own_findings = findings_of(replica, findings)
        mine = [f for f in own_findings if f.severity is Severity.ERROR]
        # every node's result carries its replica's findings: `provision up` reports per replica
        replica_data = {"replica": replica.name, "errors": len(mine),
                        "findings": [finding_dict(f) for f in own_findings
                                     if f.severity is not Severity.OK],
                        "api_path": data["api_paths"][replica.name]}
        path_line = f"API path: {describe_choice(replica, paths[replica.name])}"
        for node in replica.nodes:
            if node.name not in ctx.connections and node.name not in errors:
                continue
            if mine:
                lines = [f"{f.host}: {f.item}: expected {f.expected}, got {f.actual}"
                         + (f" (fix: {f.fix})" if f.fix else "") for f in mine]
                host_results[node.name] = ModuleResult(
                    Status.FAILED, f"preflight of replica {replica.name} found {len(mine)} "
                                   "error(s); nothing was changed:\n" + "\n".join(lines),
                    data=replica_data)
            else:
                own = [f for f in warnings if f.host == node.name]
                host_results[node.name] = ModuleResult(
                    Status.OK, (f"preflight passed ({len(own)} warning(s))" if own
                                else "preflight passed") + f"; {path_line}", data=replica_data)
    status = Status.FAILED if failing else Status.OK
    message = (f"{len(failing)} preflight error(s), {len(warnings)} warning(s)" if failing
               else f"preflight passed, {len(warnings)} warning(s)")
    return ModuleResult(status, message, data=data, host_results=host_results)
