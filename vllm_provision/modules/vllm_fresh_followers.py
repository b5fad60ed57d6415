"""Stop the headless followers of an mp replica whose rank 0 no longer runs, before the start.

vLLM's headless nodes join rank 0's rendezvous once, when they start; when rank 0 goes away (a
`provision down` of another inventory on the same hosts, a stop by hand, a crash that exhausted
its restarts) a headless node stays up, joined to nothing (docs/real-vllm.md: "rank 0 killed:
the headless node stays up"). The ordered start (followers, then rank 0) would find such a
follower running and leave it, and the new rank 0 would wait in its rendezvous for a node that
never comes: a start that stalls. So, run on the master before the start plays
(roles/vllm_mp/plays/start.yml), this module reads rank 0's unit and, when it is not running,
stops every follower whose unit runs; the start after it starts them fresh, each joining the
new rank 0. With rank 0 running it changes nothing (one ``systemctl is-active`` on rank 0).

Example task::

    - name: Stop followers left from a rank 0 that no longer runs
      vllm_fresh_followers: {}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_provision import settings
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import shell_join
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, run_or_fail
from vllm_provision.modules.arguments import ArgumentSpec
from vllm_provision.modules.context import ModuleContext

ARGUMENT_SPEC = ArgumentSpec("vllm_fresh_followers", ())
RUNNING = ("active", "activating", "reloading")


def _state(ctx: ModuleContext, host: str, unit: str) -> str:
    """``systemctl is-active`` of ``unit`` on ``host`` (``inactive`` when it cannot say)."""
    result = ctx.connections[host].run(_unit_state_command(unit), timeout_s=60)
    return (result.stdout or "").strip() or "inactive"


def _unit_state_command(unit: str) -> str:
    """``systemctl is-active -- UNIT``, the command :func:`_state` sends."""
    return shell_join(["systemctl", "is-active", "--", unit])


def read_command(ctx: ModuleContext, args: Any) -> str | None:
    """The read-only first command of :func:`run` on the master (the module read protocol,
    vllm_provision.modules, "read_command"): rank 0's ``systemctl is-active``, so the play's
    batch of reads carries it and a run whose rank 0 runs sends nothing of its own; None on
    any other host (``run`` skips there)."""
    if ctx.replica is None or ctx.node is None or ctx.node.rank != 0:
        return None
    return _unit_state_command(str(settings.layered(ctx.vars)["vllm_unit_name"]))


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Stop the running followers of a replica whose rank 0 does not run.

    Args:
        ctx: the task context (the master; ``connections`` reach every node).
        args: none (docs/modules.md).

    Returns:
        ok when rank 0 runs or no follower does; changed naming the followers stopped; skipped
        outside the master of a replica, or in check mode (naming what it would stop).

    Raises:
        ProvisionError: a follower could not be reached or stopped.
    """
    ARGUMENT_SPEC.validate(args)
    replica = ctx.replica
    if replica is None or ctx.node is None or ctx.node.rank != 0:
        return ModuleResult(Status.SKIPPED, "not the master of a replica")
    unit = str(settings.layered(ctx.vars)["vllm_unit_name"])
    master = _state(ctx, replica.master.name, unit)
    if master in RUNNING:
        return ModuleResult(Status.OK, f"rank 0 runs ({master}): its followers joined it")
    followers = sorted((n for n in replica.nodes if n.rank != 0), key=lambda n: n.rank)
    missing = [n.name for n in followers if n.name not in ctx.connections]
    if missing:
        raise ProvisionError.single(
            f"{replica.name}: followers", "rank 0 does not run, and a follower left from it "
            "would keep the new rank 0 waiting", expected="a connection to every follower",
            actual="none to " + ", ".join(missing),
            fix="run without a --limit that leaves out nodes of this replica")
    units = {n.name: str(settings.layered(n.host.vars)["vllm_unit_name"]) for n in followers}
    orphans = [n for n in followers if _state(ctx, n.name, units[n.name]) in RUNNING]
    if not orphans:
        return ModuleResult(Status.OK, f"rank 0 does not run ({master}), nor does any follower")
    names = ", ".join(f"{n.name} {units[n.name]}" for n in orphans)
    if ctx.check_mode:
        return ModuleResult(Status.SKIPPED, f"check mode: rank 0 does not run ({master}); would "
                            f"stop {names} so they join the new rank 0")
    for node in orphans:
        node_unit = units[node.name]
        run_or_fail(ctx.connections[node.name],
                    shell_join(["systemctl", "stop", "--", node_unit]), timeout_s=180,
                    where=f"{node.name}:{node_unit}",
                    message="cannot stop a follower left from an earlier rank 0",
                    expected="systemctl stop to succeed",
                    fix=f"stop it by hand (systemctl stop {node_unit} on {node.name}), then rerun")
    return ModuleResult(Status.CHANGED, f"rank 0 did not run ({master}): stopped {names}, so "
                        "they start again with the new rank 0", data={
                            "stopped": [n.name for n in orphans]})
