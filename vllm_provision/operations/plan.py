"""The plan of a dry run (``provision up --check``): what would change, which handlers would run,
on which hosts and in which order, and whether the replica would stop serving, for how long.

Built from the results of the check-mode run (nothing is guessed from the playbook): a handler
is in the plan only when its module said, from the host's present state, that it would act
(``systemd`` with ``if_running``: ``would restart`` only for a unit that runs), or when its
module cannot be simulated in check mode (``command``: listed as ``would run``, not simulated);
a task is in it when it would stop or restart a unit the replica serves with (``down``,
``restart``).
The outage estimate is the replica's last measured start-to-serving time, kept in the state
record by the last good ``up`` (``vllm_provision.state``). Terraform's plan is the model: every
action named, then one summary line (``N to change, M restarts, ...``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_provision.core.results import Status

NOT_SIMULATED = "not run in check mode"


@dataclass
class Step:
    """One handler that would run, or one task that would stop or restart a serving unit.

    Attributes:
        name: the handler's or task's name. scope: ``replica`` (a handler's nodes one after
            another), ``host`` (a handler's hosts together) or ``task`` (each play's hosts
            together, plays one after another).
        action: ``restart``, ``stop`` (a task of ``down``/``restart``), or ``run`` (a handler
            whose module check mode cannot simulate).
        waves: groups of ``(host, unit or None)``, in the order they would run; the hosts of one
            wave run together.
        replicas: names of the replicas that would stop serving because of this step.
        handler: the step is a handler (False: a task).
    """

    name: str
    scope: str
    action: str
    waves: list[list[tuple[str, str | None]]] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)
    handler: bool = True

    @property
    def targets(self) -> list[tuple[str, str | None]]:
        """Every ``(host, unit)`` in run order."""
        return [target for wave in self.waves for target in wave]


def _action(result: Any, *, handler: bool) -> str | None:
    # the systemd module's check-mode message: "would " + its actions, comma-separated
    words = (result.message.removeprefix("would ").split(" (")[0].split(", ")
             if result.status is Status.CHANGED and result.message.startswith("would ") else [])
    if "restart" in words:
        return "restart"
    if not handler:
        return "stop" if "stop" in words else None
    if result.status is Status.CHANGED or (
            result.status is Status.SKIPPED and result.message.startswith(NOT_SIMULATED)):
        return "run"
    return None  # ok (nothing to do, e.g. a stopped unit) or skipped by its condition


def _unit(result: Any) -> str | None:
    unit = result.data.get("name") if isinstance(result.data, Mapping) else None
    return str(unit) if unit else None


def build_plan(outcome: Any, inventory: Any, serving_units: Mapping[str, Sequence[str]],
               last_start_s: Mapping[str, float | None], *,
               starts_again: bool = False) -> dict[str, Any]:
    """Build the plan (pure) from a check-mode run.

    Args:
        outcome: the ``runner.engine.RunOutcome`` of the dry run (``results`` and
            ``handler_results``).
        inventory: the ``models.Inventory`` (``replica_of(host)``).
        serving_units: host -> the units the host's replica serves with (``vllm.service``; Ray:
            the head, worker and vLLM units): a restart or stop of one of them stops the
            replica. Tasks that stop or restart other units (the watchdog) are not steps.
        last_start_s: replica name -> its last measured start to serving, in seconds (None:
            never measured).
        starts_again: the playbook starts what it stopped (``restart``): a stopped replica is
            unavailable for about its last start, not stopped for good (``down``).

    Returns:
        ``{"changes": int, "restarts": int, "steps": [{"handler", "scope", "action", "hosts",
        "units", "replicas", "line"}], "removals": [{"host", "path", "unit"}], "replicas":
        [{"replica", "unavailable", "stopped", "last_start_s"[, "unknown"]}], "incomplete":
        [host], "summary": str}``; ``incomplete``: the hosts whose dry run failed or could not
        connect (a replica's ``unknown``: its nodes among them); ``steps``
        in the order they would run (``handler`` is the step's name, a task's too); removals:
        what an earlier ``up`` installed that this plan removes (``vllm_provision.state.prune``).
    """
    handler_of = {id(h.result): h for h in outcome.handler_results}
    changes = sum(1 for r in outcome.results
                  if r.status is Status.CHANGED and id(r) not in handler_of)
    steps: dict[tuple[bool, str], Step] = {}
    previous: str | None = None  # the task of the last result: a new occurrence is a new wave
    batches = set(getattr(outcome, "batch_starts", ()))
    removals: list[dict[str, Any]] = []
    removing: set[str] = set()
    for index, result in enumerate(outcome.results):
        if index in batches:
            previous = None  # a new play or serial batch runs after the last one
        if _removal(result, steps, removals, removing):
            continue
        item = handler_of.get(id(result))
        handler = item is not None
        action = _action(result, handler=handler)
        unit = _unit(result)
        replica = inventory.replica_of(result.host)
        serving = bool(unit) and unit in serving_units.get(result.host, ())
        same_wave = previous == result.task
        previous = result.task
        if action is None or (not handler and not serving):
            continue
        scope = item.scope if item is not None else "task"
        step = steps.setdefault((handler, result.task), Step(result.task, scope, action,
                                                             handler=handler))
        if step.waves and (scope == "host" or (scope == "task" and same_wave)):
            step.waves[-1].append((result.host, unit))
        else:
            step.waves.append([(result.host, unit)])
        if (action in ("restart", "stop") and serving and replica is not None
                and replica.name not in step.replicas):
            step.replicas.append(replica.name)
    order = {name: index for index, name in enumerate(inventory.hosts)}
    for step in steps.values():
        for wave in step.waves:  # together: listed in inventory order
            wave.sort(key=lambda target: order.get(target[0], len(order)))
    removing_steps = {s.name for s in steps.values() if not s.handler and s.replicas
                      and set(s.replicas) <= removing and s.action == "stop"}
    restarted = {n for s in steps.values() if s.action == "restart" for n in s.replicas}
    stopped = {n for s in steps.values() if s.action == "stop" for n in s.replicas}
    # hosts whose dry run failed or never connected: nothing is known of what would change there
    unread = {r.host for r in outcome.results if r.failed}
    incomplete = [name for name in inventory.hosts if name in unread]
    replicas: list[dict[str, Any]] = []
    for r in inventory.replicas:
        entry: dict[str, Any] = {"replica": r.name,
                                 "unavailable": r.name in restarted or r.name in removing
                                 or (starts_again and r.name in stopped),
                                 "stopped": r.name in stopped and not starts_again,
                                 "last_start_s": last_start_s.get(r.name)}
        unknown = [n.name for n in r.nodes if n.name in incomplete]
        if unknown:  # only then: a complete plan's replicas keep their four keys
            entry["unknown"] = unknown
        replicas.append(entry)
    restarts = sum(len(s.targets) for s in steps.values() if s.action == "restart")
    return {
        "changes": changes,
        "restarts": restarts,
        "steps": [{"handler": s.name, "scope": s.scope, "action": s.action,
                   "hosts": [h for h, _ in s.targets], "units": [u for _, u in s.targets],
                   "replicas": s.replicas,
                   "line": step_line(s, last_start_s, starts_again or s.name in removing_steps)}
                  for s in steps.values()],
        "removals": removals,
        "replicas": replicas,
        "incomplete": incomplete,
        "summary": summary_line(changes, restarts, replicas, len(removals), incomplete),
    }


def _removal(result: Any, steps: dict[tuple[bool, str], Step],
             removals: list[dict[str, Any]], removing: set[str]) -> bool:
    """Read what ``vllm_prune`` reported (a result's ``removal`` data, one per replica); True
    when ``result`` is such a result.

    The stop waves become a step (the old plan's units go down before the new ones start, so
    the replica is unavailable until it serves again: its name joins ``removing``), each
    removed file an entry of ``removals`` (``host``, ``path``, ``unit``: the unit whose file it
    is, or None).
    """
    item = result.data.get("removal") if isinstance(result.data, Mapping) else None
    if not isinstance(item, Mapping):
        return False
    name = str(item.get("replica"))
    if name in removing or any(r["replica"] == name for r in removals):
        return True
    waves: list[list[tuple[str, str | None]]] = [
        [(str(h), str(u)) for h, u in wave] for wave in item.get("waves") or []]
    if waves:  # one step per replica (keyed apart from the task's other steps)
        steps[(False, f"{result.task}\0{name}")] = Step(result.task, "task", "stop", waves, [name],
                                           handler=False)
        removing.add(name)
    for host, paths in (item.get("files") or {}).items():
        units = set((item.get("units") or {}).get(host) or ())
        for path in paths:
            base = str(path).rsplit("/", 1)[-1]
            removals.append({"host": str(host), "path": str(path), "replica": name,
                             "unit": base if base in units else None})
    return True


def step_line(step: Step, last_start_s: Mapping[str, float | None],
              starts_again: bool = False) -> str:
    """``would restart vllm.service on gpu-b, then gpu-a: the replica 'llm' stops serving during
    the restart (about 7.1 s, its last start to serving)``; the hosts of one wave run together
    (``on a and b, together``)."""
    verb = {"restart": "would restart", "stop": "would stop", "run": "would run"}[step.action]
    units = {u for _, u in step.targets}
    same = len(units) == 1 and step.action != "run"
    waves = []
    for wave in step.waves:
        places = [h if same or not u else f"{u} on {h}" for h, u in wave]
        waves.append(" and ".join(places) + (", together" if len(places) > 1 else ""))
    where = ", then ".join(waves)
    if same:
        line = f"{step.name}: {verb} {next(iter(units))} on {where}"
    elif step.action == "run":
        line = f"{step.name}: {verb} on {where}"
    else:
        line = f"{step.name}: {verb} {where}"
    if step.action == "run":
        return line + " (check mode cannot tell what it would do)"
    if not step.replicas:
        return line + ": the replica keeps serving"
    if step.action == "stop" and not starts_again:
        return line + ": " + "; ".join(f"the replica '{name}' stops serving"
                                       for name in step.replicas)
    outages = [_outage(name, last_start_s.get(name), step.action) for name in step.replicas]
    return line + ": " + "; ".join(outages)


def _outage(replica: str, seconds: float | None, action: str) -> str:
    estimate = (f"about {seconds:.1f} s, its last start to serving" if seconds is not None
                else "for how long is unknown: its start to serving was never measured")
    during = "the restart" if action == "restart" else "the stop and the start"
    return f"the replica '{replica}' stops serving during {during} ({estimate})"


def summary_line(changes: int, restarts: int, replicas: Sequence[Mapping[str, Any]],
                 removes: int = 0, incomplete: Sequence[str] = ()) -> str:
    """``N to change, M restarts, replica 'llm' would be unavailable (last start 7.1 s)``; a
    replica that ``down`` would stop: ``replica 'llm' would stop serving``; with files an
    earlier plan installed that this one removes: ``N to change, K to remove, ...``. When the
    dry run could not read some hosts (``incomplete``), the line says so and claims nothing
    about their replicas: ``plan incomplete: h1, h2 not read (unreachable or failed), ...``,
    as Terraform refuses to plan what it could not refresh."""
    parts = [f"{changes} to change", *([f"{removes} to remove"] if removes else []),
             f"{restarts} restart{'' if restarts == 1 else 's'}"]
    if incomplete:
        parts.insert(0, f"plan incomplete: {', '.join(incomplete)} not read (unreachable or "
                        "failed)")
    for item in replicas:
        if item.get("unknown"):
            parts.append(f"replica '{item['replica']}' unknown ({', '.join(item['unknown'])} "
                         "not read)")
        elif item["unavailable"]:
            last = item["last_start_s"]
            when = f"last start {last:.1f} s" if last is not None else "last start not measured"
            parts.append(f"replica '{item['replica']}' would be unavailable ({when})")
        elif item.get("stopped"):
            parts.append(f"replica '{item['replica']}' would stop serving")
        else:
            parts.append(f"replica '{item['replica']}' keeps serving")
    return ", ".join(parts)


def plan_lines(plan: Mapping[str, Any]) -> list[str]:
    """The human lines: ``Plan:``, one line per step, then the summary line."""
    lines = ["Plan:"]
    nothing = ("  nothing would restart or stop on the hosts that were read"
               if plan.get("incomplete") else "  nothing would restart or stop")
    lines += [f"  {step['line']}" for step in plan["steps"]] or [nothing]
    for item in plan.get("removals") or ():
        what = f"unit {item['unit']}, not in the plan" if item["unit"] else "not in the plan"
        lines.append(f"  would remove {item['path']} on {item['host']} ({what})")
    lines.append(plan["summary"])
    return lines
