"""The plan of a dry run (``provision up --check``): what would change, which handlers would run,
on which hosts and in which order, and whether the replica would stop serving, for how long.

Built from the results of the check-mode run (nothing is guessed from the playbook): a handler
is in the plan only when its module said, from the host's present state, that it would act
(``systemd`` with ``if_running``: ``would restart`` only for a unit that runs), or when its
module cannot be simulated in check mode (``command``: listed as ``would run``, not simulated).
The outage estimate is the replica's last measured start-to-serving time, kept in the state
record by the last good ``up`` (``vllm_provision.state``). Terraform's plan is the model: every
action named, then one summary line (``N to change, M restarts, ...``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_provision.results import Status

NOT_SIMULATED = "not run in check mode"


@dataclass
class Step:
    """One handler that would run.

    Attributes:
        handler: its name. scope: ``replica`` (nodes one after another) or ``host`` (together).
        action: ``restart`` (a ``systemd`` restart) or ``run`` (a module check mode cannot
            simulate). targets: ``(host, unit or None)`` in the order they would run.
        replicas: names of the replicas that would stop serving because of this step.
    """

    handler: str
    scope: str
    action: str
    targets: list[tuple[str, str | None]] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)


def build_plan(outcome: Any, inventory: Any, serving_units: Mapping[str, Sequence[str]],
               last_start_s: Mapping[str, float | None]) -> dict[str, Any]:
    """Build the plan (pure) from a check-mode run.

    Args:
        outcome: the ``runner.engine.RunOutcome`` of the dry run (``results`` and
            ``handler_results``).
        inventory: the ``models.Inventory`` (``replica_of(host)``).
        serving_units: host -> the units the host's replica serves with (``vllm.service``; Ray:
            the head, worker and vLLM units): a restart of one of them stops the replica.
        last_start_s: replica name -> its last measured start to serving, in seconds (None:
            never measured).

    Returns:
        ``{"changes": int, "restarts": int, "steps": [{"handler", "scope", "action", "hosts",
        "units", "replicas", "line"}], "replicas": [{"replica", "unavailable", "last_start_s"}],
        "summary": str}``; ``steps`` in the order the handlers would run.
    """
    handler_ids = {id(h.result) for h in outcome.handler_results}
    changes = sum(1 for r in outcome.results
                  if r.status is Status.CHANGED and id(r) not in handler_ids)
    steps: dict[str, Step] = {}
    for item in outcome.handler_results:
        result = item.result
        if result.status is Status.CHANGED and result.message.startswith("would restart"):
            action = "restart"
        elif result.status is Status.CHANGED or (
                result.status is Status.SKIPPED and result.message.startswith(NOT_SIMULATED)):
            action = "run"
        else:
            continue  # ok (nothing to do, e.g. a stopped unit) or skipped by its condition
        step = steps.setdefault(item.handler, Step(item.handler, item.scope, action))
        unit = (result.data or {}).get("name") if isinstance(result.data, Mapping) else None
        step.targets.append((result.host, str(unit) if unit else None))
        replica = inventory.replica_of(result.host)
        stops = (action == "restart" and replica is not None and bool(unit)
                 and unit in serving_units.get(result.host, ()))
        if stops and replica is not None and replica.name not in step.replicas:
            step.replicas.append(replica.name)
    order = {name: index for index, name in enumerate(inventory.hosts)}
    for step in steps.values():
        if step.scope != "replica":  # together: listed in inventory order
            step.targets.sort(key=lambda target: order.get(target[0], len(order)))
    stopped = {name for step in steps.values() for name in step.replicas}
    replicas = [{"replica": r.name, "unavailable": r.name in stopped,
                 "last_start_s": last_start_s.get(r.name)} for r in inventory.replicas]
    restarts = sum(len(s.targets) for s in steps.values() if s.action == "restart")
    return {
        "changes": changes,
        "restarts": restarts,
        "steps": [{"handler": s.handler, "scope": s.scope, "action": s.action,
                   "hosts": [h for h, _ in s.targets], "units": [u for _, u in s.targets],
                   "replicas": s.replicas, "line": step_line(s, last_start_s)}
                  for s in steps.values()],
        "replicas": replicas,
        "summary": summary_line(changes, restarts, replicas),
    }


def step_line(step: Step, last_start_s: Mapping[str, float | None]) -> str:
    """``would restart vllm.service on gpu-b, then gpu-a: the replica 'llm' stops serving during
    the restart (about 7.1 s, its last start to serving)``; hosts of a ``host``-scoped handler
    run together (``on a and b, together``)."""
    units = {u for _, u in step.targets}
    if len(units) == 1:
        unit = next(iter(units))
        places = [h for h, _ in step.targets]
        head = (f"would restart {unit} on " if step.action == "restart" and unit
                else "would run on ")
    else:
        places = [f"{u} on {h}" if u else h for h, u in step.targets]
        head = "would restart " if step.action == "restart" else "would run on "
    if step.scope == "replica" or len(places) == 1:
        where = ", then ".join(places)
    else:
        where = " and ".join(places) + ", together"
    line = f"{step.handler}: {head}{where}"
    if step.action == "run":
        return line + " (check mode cannot tell what it would do)"
    if not step.replicas:
        return line + ": the replica keeps serving"
    outages = [_outage(name, last_start_s.get(name)) for name in step.replicas]
    return line + ": " + "; ".join(outages)


def _outage(replica: str, seconds: float | None) -> str:
    estimate = (f"about {seconds:.1f} s, its last start to serving" if seconds is not None
                else "for how long is unknown: its start to serving was never measured")
    return f"the replica '{replica}' stops serving during the restart ({estimate})"


def summary_line(changes: int, restarts: int, replicas: Sequence[Mapping[str, Any]]) -> str:
    """``N to change, M restarts, replica 'llm' would be unavailable (last start 7.1 s)``."""
    parts = [f"{changes} to change", f"{restarts} restart{'' if restarts == 1 else 's'}"]
    for item in replicas:
        if item["unavailable"]:
            last = item["last_start_s"]
            when = f"last start {last:.1f} s" if last is not None else "last start not measured"
            parts.append(f"replica '{item['replica']}' would be unavailable ({when})")
        else:
            parts.append(f"replica '{item['replica']}' keeps serving")
    return ", ".join(parts)


def plan_lines(plan: Mapping[str, Any]) -> list[str]:
    """The human lines: ``Plan:``, one line per step, then the summary line."""
    lines = ["Plan:"]
    lines += [f"  {step['line']}" for step in plan["steps"]] or ["  no handler would run"]
    lines.append(plan["summary"])
    return lines
