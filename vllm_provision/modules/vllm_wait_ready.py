"""Wait until the replica serves: units active, rank 0's /health 200, /v1/models lists the model.

Run once on the master (``run_once``). While it waits, a line per node shows the seconds
waited, the unit states and the vLLM phase read from the node's journal
(:mod:`vllm_provision.output.progress`, :mod:`vllm_provision.output.phases`). A unit that failed or
is
restarting ends the wait at once with the journal lines of its first failure since it was
started (:func:`vllm_provision.output.phases.first_failure`); for Ray, a placement group that
stays pending is explained with Ray's reason (INFEASIBLE / NO_RESOURCES, or a VLLM_HOST_IP
that is no Ray node). A start where no node progresses for ``vllm_stall_timeout_s`` (the stall
rule, :mod:`vllm_provision.output.stall`) ends the wait at once, naming the node furthest
behind, its phase, its last journal lines and the remedy for that phase, after stopping the
replica's units in reverse start order (``provision down``'s order) so nothing is left
half-started. The result's ``phase_s`` gives each node's seconds per phase.
See :mod:`vllm_provision.transport.api`.

Example task::

    - name: Wait until rank 0 serves the model
      vllm_wait_ready: {timeout_s: "{{ vllm_ready_timeout_s }}"}
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vllm_provision import settings
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Replica
from vllm_provision.core.quoting import shell_join
from vllm_provision.core.results import Status
from vllm_provision.core.text import printable
from vllm_provision.modules import ModuleResult
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext
from vllm_provision.output import progress
from vllm_provision.output.phases import JournalTail, first_failure, split_output
from vllm_provision.output.stall import Budget, StallWatch, phase_budgets, remedy_for
from vllm_provision.settings.variables import READY_POLL_S
from vllm_provision.state import prune
from vllm_provision.transport.api import (
    JOURNAL_LINES,
    Endpoint,
    Observation,
    Stalled,
    UnitState,
    journal_command,
    mask,
    parse_show,
    show_command,
    wait_ready,
)
from vllm_provision.transport.tunnel import ApiRoute, route_for, route_to_node

ARGUMENT_SPEC = ArgumentSpec("vllm_wait_ready", (
    Argument("timeout_s", "float", "seconds to wait in all",
             default_text="the vllm_ready_timeout_s variable (1800)", minimum=0),
    Argument("poll_s", "float", "seconds between polls", default=READY_POLL_S, minimum=0.05),
))


def replica_units(replica: Replica, vars_: Mapping[str, Any]) -> dict[str, list[str]]:
    """Host name -> the units of ours on it, in start order (the backend's
    :meth:`~vllm_provision.backends.Backend.replica_units`).

    mp: every node runs ``vllm_unit_name``. Ray: the head runs ``ray_head_unit_name`` and
    ``vllm_unit_name``; every other node ``ray_worker_unit_name``.
    """
    return replica.backend_type.replica_units(replica, vars_)


def phase_units(replica: Replica, vars_: Mapping[str, Any]) -> dict[str, list[str]]:
    """Host name -> the units whose journal holds vLLM's own lines (the backend's
    ``journal_units`` of kind ``vllm``; none on a Ray worker)."""
    return {node.name: replica.backend_type.journal_units(replica, node, vars_).get("vllm", [])
            for node in replica.nodes}


def poll_commands(replica: Replica, vars_: Mapping[str, Any], tail: JournalTail | None,
                  poll: int = 1) -> dict[str, str]:
    """Host name -> the command one poll sends it: ``systemctl show`` of its units and the
    clock (:func:`~vllm_provision.transport.api.show_command`), with ``tail`` also its new
    vLLM journal lines. The first poll's commands are known before the run (a fresh
    :class:`~vllm_provision.output.phases.JournalTail`), so a batch of reads may carry them
    (:func:`read_command`, :func:`peer_read_commands`); every later poll ends with its number
    (``; : poll N``, a no-op), so it is never answered from a batch: it reads the node now."""
    journal = phase_units(replica, vars_) if tail is not None else {}
    out = {}
    for host, units in replica_units(replica, vars_).items():
        command = show_command(units)
        if tail is not None and journal.get(host):
            command += "; " + tail.command(host, journal[host])
        out[host] = command if poll <= 1 else f"{command}; : poll {poll}"
    return out


def peer_read_commands(ctx: ModuleContext, args: Any) -> dict[str, str]:
    """The first poll's command for every node (the module read protocol,
    vllm_provision.modules, "peer_read_commands"): the followers' batches carry them, so a
    replica that already serves is seen without a round trip of its own; none in check mode
    or off a replica (``run`` polls nothing there)."""
    replica = ctx.replica
    if replica is None or ctx.check_mode:
        return {}
    return poll_commands(replica, ctx.vars, JournalTail())


def read_command(ctx: ModuleContext, args: Any) -> str | None:
    """The first poll's command on the master itself (the module read protocol,
    vllm_provision.modules, "read_command"); None in check mode or off a replica."""
    return peer_read_commands(ctx, args).get(ctx.host.name)


def observe_units(ctx: ModuleContext, replica: Replica, tail: JournalTail | None = None,
                  view: progress.Wait | None = None, poll: int = 1) -> Observation:
    """One ``systemctl show`` per node (:func:`poll_commands`); the master's clock comes with it.

    With ``tail``, the same command also reads each node's new vLLM journal lines
    (:class:`~vllm_provision.output.phases.JournalTail`: no extra round trip); with ``view``, each
    node's row shows its unit states and phase. ``poll``: the poll's number, from 1.
    """
    states: list[UnitState] = []
    master_now = None
    for host, command in poll_commands(replica, ctx.vars, tail, poll).items():
        result = ctx.connections[host].run(command, timeout_s=30)
        shown, lines = split_output(result.stdout)
        host_states, now = parse_show(host, shown)
        if tail is not None and lines:
            tail.feed(host, lines)
        states.extend(host_states)
        if host == replica.master.name:
            master_now = now
        if view is not None:
            view.update(host, state=", ".join(f"{s.unit} {s.describe}" for s in host_states),
                        phase=tail.phase(host) if tail is not None else None)
    return Observation(states, master_now)


# Lines read back to find a unit's first failure since it was started (one read, on failure only).
FAILURE_WINDOW_LINES = 2000


def read_journal(ctx: ModuleContext, replica: Replica, state: UnitState) -> str:
    """The journal lines of one unit's FIRST failure since it was last started by hand (the
    start of this run, :func:`vllm_provision.output.phases.first_failure`), or its last lines
    when none is found; secrets masked, every character printable."""
    result = ctx.connections[state.host].run(
        journal_command(state.unit, FAILURE_WINDOW_LINES), timeout_s=30)
    lines, found = first_failure(result.stdout or result.stderr, JOURNAL_LINES)
    if found:
        lines = "(its first failure since it was started)\n" + lines
    return _shown(ctx, replica, lines)


def last_lines(ctx: ModuleContext, replica: Replica, host: str, unit: str) -> str:
    """The last journal lines of ``unit`` on ``host``, secrets masked, printable."""
    result = ctx.connections[host].run(journal_command(unit), timeout_s=30)
    return _shown(ctx, replica, result.stdout or result.stderr)


def _shown(ctx: ModuleContext, replica: Replica, text: str) -> str:
    """Journal text as the operator may see it: the replica's secrets masked, every
    character printable."""
    secrets = [replica.engine.api_key, ctx.vars.get("vllm_hf_token")]
    return printable(mask(text, secrets), newlines=True)


def stop_in_order(ctx: ModuleContext, replica: Replica) -> list[str]:
    """Stop every unit of ``replica`` in reverse start order, ``provision down``'s order
    (:func:`vllm_provision.state.prune.stop_waves`: mp the master, then the followers; Ray vLLM,
    the workers, the head); return ``host unit`` of each stop, ``(failed)`` appended where
    ``systemctl stop`` failed. Units stay enabled: the next ``up`` starts them again."""
    units = replica_units(replica, ctx.vars)
    installed = [prune.Installed(node.name, node.rank, replica.backend,
                                 tuple(units.get(node.name, ()))) for node in replica.nodes]
    done: list[str] = []
    for wave in prune.stop_waves(installed, units):
        for host, unit in wave:
            result = ctx.connections[host].run(shell_join(["systemctl", "stop", "--", unit]),
                                               timeout_s=180)
            done.append(f"{host} {unit}" + ("" if result.exit_code == 0 else " (failed)"))
    return done


def budgets_for(ctx: ModuleContext, replica: Replica, own: Mapping[str, Any]
                ) -> dict[str, Budget]:
    """The phase budgets of this start (:func:`vllm_provision.output.stall.phase_budgets`):
    the model's size from rank 0's gathered manifest, ``vllm_load_rate_mib_s``,
    ``vllm_phase_budgets_s``, and no graph capture with ``--enforce-eager``."""
    facts = ctx.facts.get(replica.master.name)
    files = getattr(facts, "model_files", None)
    size = sum(f.size for f in files) if files else None
    return phase_budgets(size, float(own["vllm_load_rate_mib_s"]),
                         own.get("vllm_phase_budgets_s"),
                         eager="--enforce-eager" in replica.engine.extra_args)


def stall_problem(ctx: ModuleContext, replica: Replica, watch: StallWatch,
                  now: float) -> Problem | None:
    """The problem of a stalled start at ``now`` (:meth:`StallWatch.stalled`), or None: names
    the node, its phase, how long nothing moved, its last journal lines and the remedy of the
    phase (:data:`vllm_provision.output.stall.REMEDIES`)."""
    stall = watch.stalled(now)
    if stall is None:
        return None
    units = phase_units(replica, ctx.vars).get(stall.host) or ["vllm.service"]
    remedy = remedy_for(stall.phase)
    lines = last_lines(ctx, replica, stall.host, units[-1])
    return Problem(
        f"{stall.host}:{units[-1]}",
        f"the start stalled: no node of replica {replica.name} progressed for "
        f"{stall.silent_s:g} s (vllm_stall_timeout_s {watch.timeout_s:g}); {stall.host} is "
        f"furthest behind, in phase {printable(stall.phase_name)!r} for {stall.in_phase_s:g} s",
        expected=f"a new phase or progress line within {watch.timeout_s:g} s",
        actual=f"{stall.host} in {printable(stall.phase_name)}: {remedy.cause}",
        fix=f"{remedy.fix} (sources: {'; '.join(remedy.sources)})\n"
            f"last journal lines (journalctl -u {units[-1]} on {stall.host}):\n"
            + "\n".join("    " + line for line in lines.rstrip().splitlines()))


def api_route(ctx: ModuleContext, replica: Replica) -> ApiRoute:
    """The route to rank 0's API (``vllm_api_via``; :func:`~vllm_provision.transport.tunnel.
    route_for`): through SSH it uses the run's connection to rank 0."""
    return route_for(replica, ctx.connections.get(replica.master.name))


def wait_api_servers(ctx: ModuleContext, replica: Replica, model: str, deadline: float,
                     poll_s: float) -> None:
    """Wait until every API server of a hybrid data-parallel replica besides rank 0's answers
    ``/health`` 200 and lists ``model`` (each node serves its own engines; rank 0's serving
    says nothing of theirs). Nothing for other replicas.

    Raises:
        ProvisionError: a node's API server did not serve by ``deadline`` (``time.monotonic``
            seconds), naming each such node and what it answered.
    """
    pending = {node.name: node for node in replica.api_nodes if node.rank != 0}
    seen: dict[str, str] = {}
    while pending:
        for name, node in list(pending.items()):
            route = route_to_node(replica, node, ctx.connections.get(name))
            endpoint = Endpoint(route.base_url, replica.engine.api_key, route=route)
            code = endpoint.health()
            if code != 200:
                seen[name] = f"/health {code}" if code else "no answer on the API port"
                continue
            try:
                models = endpoint.served_models()
            except ProvisionError as exc:
                seen[name] = exc.problems[0].message
                continue
            if model in models:
                del pending[name]
            else:
                seen[name] = f"/v1/models lists {models}"
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise ProvisionError([Problem(
                name, f"the API server of node {name} (hybrid data parallel) did not serve",
                expected=f"/health 200 and {model!r} in /v1/models",
                actual=printable(seen.get(name, "")),
                fix=f"read its journal (provision logs -i INV --host {name}); raise "
                    "vllm_ready_timeout_s if it needs longer") for name in pending])
        time.sleep(poll_s)


def served_model(replica: Replica) -> str:
    """The id ``/v1/models`` lists: ``--served-model-name`` or else the model path."""
    return replica.engine.served_model_name or replica.engine.model


def replica_or_skip(ctx: ModuleContext, check_mode_reason: str) -> Replica | ModuleResult:
    """The replica a module run once for it acts on, or the SKIPPED result when the host is not
    a node of a replica, or in check mode (``check_mode_reason``: what check mode leaves out).

    Args:
        ctx: the task context.
        check_mode_reason: the SKIPPED message in check mode (``check mode: ...``).
    """
    replica: Replica | None = ctx.replica
    if replica is None:
        return ModuleResult(Status.SKIPPED, "not a node of a replica")
    if ctx.check_mode:
        return ModuleResult(Status.SKIPPED, check_mode_reason)
    return replica


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Poll until the replica serves (see :func:`vllm_provision.transport.api.wait_ready`).

    Args:
        ctx: the task context. args: see ``ARGUMENT_SPEC`` (docs/modules.md).

    Returns:
        ok with ``data``: ``start_to_serving_s`` (None when not measured),
        ``start_to_serving_reason`` (why not; None when measured), ``waited_s``,
        ``already_serving``, ``served_model``, ``phase_s`` (per node with vLLM's journal, the
        seconds spent in each phase, in order), ``phase_budget_s`` (phase -> its budget) and
        ``over_budget`` (``{"host", "phase", "seconds", "budget_s"}`` of each node that went
        over one; each is also a warning line on stderr when it happens). Raises
        ProvisionError (the runner reports it as failed) otherwise.
    """
    values = ARGUMENT_SPEC.validate(args)
    replica = replica_or_skip(ctx, "check mode: readiness is not polled")
    if isinstance(replica, ModuleResult):
        return replica
    own = settings.layered(ctx.vars)
    timeout_s = float(values["timeout_s"] or own["vllm_ready_timeout_s"])
    stall_s = float(own["vllm_stall_timeout_s"])
    if stall_s < values["poll_s"]:
        raise ProvisionError.single(
            "vllm_stall_timeout_s", "shorter than the readiness wait's poll interval",
            expected=f"at least poll_s ({values['poll_s']:g} s)", actual=f"{stall_s:g}",
            fix="raise vllm_stall_timeout_s or lower the task's poll_s")
    model = served_model(replica)

    tail = JournalTail()
    polls = itertools.count(1)
    journal_hosts = [host for host, units in phase_units(replica, ctx.vars).items() if units]
    budgets = budgets_for(ctx, replica, own)
    watch = StallWatch(journal_hosts, stall_s, time.monotonic(), budgets)

    def stall_check(now: float) -> Problem | None:
        for host in journal_hosts:
            watch.observe(host, tail.phase(host), now)
        for over in watch.over_budget(now):
            sys.stderr.write(f"warning: {replica.name}: {printable(over.describe())}\n")
            sys.stderr.flush()
        return stall_problem(ctx, replica, watch, now)

    started = time.monotonic()
    with progress.wait(f"replica {replica.name}: waiting until rank 0 serves",
                       [node.name for node in replica.nodes]) as view:
        try:
            ready = wait_ready(
                observe=lambda: observe_units(ctx, replica, tail, view, next(polls)),
                journal=lambda state: read_journal(ctx, replica, state),
                endpoint=Endpoint.for_replica(replica, route=api_route(ctx, replica)),
                model=model, timeout_s=timeout_s,
                vllm_units=(str(own["vllm_unit_name"]),),
                poll_s=values["poll_s"],
                extra_check=replica.backend_type.ready_check(ctx, replica),
                stall_check=stall_check)
        except Stalled as exc:
            view.finish("stalled")
            stopped = stop_in_order(ctx, replica)
            first = exc.problems[0]
            note = ("\nstopped the replica in reverse start order: " + ", ".join(stopped)
                    if stopped else "")
            raise ProvisionError([replace(first, fix=first.fix + note),
                                  *exc.problems[1:]]) from None
        if replica.hybrid:
            wait_api_servers(ctx, replica, model, started + timeout_s, values["poll_s"])
        view.finish("already serving" if ready.already_serving else "serving")
    if ready.already_serving:
        message = "already serving"
    elif ready.start_to_serving_s is None:
        message = f"serving; start to serving not measured: {ready.start_to_serving_reason}"
    else:
        message = f"serving {ready.start_to_serving_s} s after start"
    return ModuleResult(Status.OK, message, data={
        "served_model": model, "start_to_serving_s": ready.start_to_serving_s,
        "start_to_serving_reason": ready.start_to_serving_reason,
        "waited_s": ready.waited_s, "already_serving": ready.already_serving,
        "phase_s": watch.phase_seconds(time.monotonic()),
        "phase_budget_s": {phase: b.seconds for phase, b in budgets.items()},
        "over_budget": [{"host": o.host, "phase": o.phase, "seconds": o.seconds,
                         "budget_s": o.budget.seconds} for o in watch.over]})
