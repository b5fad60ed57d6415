"""Gang start in a shared GPU pool: start a replica's nodes only while every node's GPUs are free.

Run on the master (mp, ``vllm_gpu_pool: shared``; roles/vllm_mp/plays/start.yml). Before it
starts any node it waits, up to ``timeout_s`` in all, until one reading of every node (in
parallel) finds no process outside the replica's units on the GPUs the replica uses
(``Replica.node_gpus``: each node's ``vllm_gpus``, else its first GPUs;
:mod:`vllm_provision.facts.gpu_pool`); then it starts the nodes in mp's order (headless followers
by
rank, then rank 0), reading every node again right before each start, so no node is started
while another node's GPUs are held. While it waits it prints one line to stderr naming each
holder (host, GPU, pid, process, memory, unit), when the holders change and every 10 s. When
the time runs out it stops the units it started itself (units already running before stay as
they were) and fails with the holders. Units already running are left alone. In check mode it
reads the holders once and says what it would wait for.

What it cannot promise (docs/preflight.md, "Shared GPU pool"): nothing is reserved, so another
job may still take a GPU between the last reading and vLLM's allocation.

Example task::

    - name: Start every node once all their GPUs are free (shared pool)
      vllm_gang_start: {}
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from vllm_provision import settings
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Node, Replica
from vllm_provision.core.quoting import shell_join
from vllm_provision.core.results import Status
from vllm_provision.facts import gpu_pool
from vllm_provision.modules import ModuleResult, run_or_fail
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext

ARGUMENT_SPEC = ArgumentSpec("vllm_gang_start", (
    Argument("timeout_s", "float", "seconds to wait in all for the GPUs",
             default_text="the vllm_gpu_wait_timeout_s variable (600)", minimum=0),
    Argument("poll_s", "float", "seconds between readings", default=2.0, minimum=0.05),
))
PROGRESS_EVERY_S = 10.0


def start_order(replica: Replica) -> list[Node]:
    """mp's start order: the headless followers by rank, then rank 0 (docs/deploy.md)."""
    return sorted((n for n in replica.nodes if n.rank != 0), key=lambda n: n.rank) + [
        replica.master]


class _Progress:
    """Prints a waiting line when the holders change, and every :data:`PROGRESS_EVERY_S`."""

    def __init__(self, replica: str, timeout_s: float) -> None:
        self.replica, self.timeout_s = replica, timeout_s
        self.last_text, self.last_at = "", -PROGRESS_EVERY_S

    def __call__(self, held: list[gpu_pool.Holder], waited: float) -> None:
        text = gpu_pool.describe(held)
        if text == self.last_text and waited - self.last_at < PROGRESS_EVERY_S:
            return
        self.last_text, self.last_at = text, waited
        sys.stderr.write(f"{self.replica}: waiting for the GPUs of every node ({waited:.0f} s "
                         f"of {self.timeout_s:g} s, shared pool): held by {text}\n")
        sys.stderr.flush()


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Wait for every node's GPUs at once, then start the nodes in order, re-checking each time.

    Args:
        ctx: the task context (the master; ``connections`` reach every node).
        args: see ``ARGUMENT_SPEC`` (docs/modules.md).

    Returns:
        changed naming the units started and the seconds waited; ok when every unit already ran;
        skipped in check mode (with the holders it would wait for) or outside a replica.

    Raises:
        ProvisionError: the GPUs stayed held past the timeout (after stopping what this task
            started), nvidia-smi could not be read on a node, or a unit failed to start.
    """
    values = ARGUMENT_SPEC.validate(args)
    replica = ctx.replica
    if replica is None or ctx.node is None or ctx.node.rank != 0:
        return ModuleResult(Status.SKIPPED, "not the master of a replica")
    timeout_s = float(values["timeout_s"] if values["timeout_s"] is not None
                      else settings.layered(ctx.vars)["vllm_gpu_wait_timeout_s"])
    # this replica's units on any of its nodes (the backend's, from the inventory): never foreign
    own_units = sorted({unit for node in replica.nodes
                        for unit in replica.backend_type.node_units(replica, node,
                                                                    node.host.vars)})
    units = replica.backend_type.replica_units(replica, ctx.vars)
    nodes = start_order(replica)
    missing = [n.name for n in nodes if n.name not in ctx.connections]
    if missing:
        raise ProvisionError.single(
            f"{replica.name}: gang start", "every node must be reachable to know that all their "
            "GPUs are free at once", expected="a connection to " + ", ".join(n.name for n in nodes),
            actual="none to " + ", ".join(missing),
            fix="run without a --limit that leaves out nodes of this replica")

    def read(node: Node) -> list[gpu_pool.Holder]:
        result = run_or_fail(ctx.connections[node.name], gpu_pool.HOLDERS_COMMAND,
                             where=f"{replica.name}: {node.name}",
                             message="cannot read the GPUs' processes",
                             expected="nvidia-smi --query-compute-apps to answer",
                             fix=f"check nvidia-smi on {node.name}")
        # only the GPUs this replica uses there: its vllm_gpus, else the first ones
        return gpu_pool.foreign_holders(gpu_pool.parse_holders(node.name, result.stdout),
                                        replica.node_gpus(node), own_units)

    pool = ThreadPoolExecutor(max_workers=max(1, len(nodes)))

    def observe() -> list[gpu_pool.Holder]:
        return [h for found in pool.map(read, nodes) for h in found]

    try:
        if ctx.check_mode:
            held = observe()
            return ModuleResult(Status.SKIPPED, "check mode: would wait for " +
                                gpu_pool.describe(held) if held else
                                "check mode: every node's GPUs are free", data={
                                    "holders": [h.describe() for h in held]})
        return _start(ctx, replica, nodes, units, observe, timeout_s, values["poll_s"])
    finally:
        pool.shutdown(wait=False)


def _active(ctx: ModuleContext, node: Node, names: list[str]) -> set[str]:
    result = ctx.connections[node.name].run(shell_join(["systemctl", "is-active", "--", *names]),
                                            timeout_s=30)
    states = result.stdout.split()
    return {name for name, state in zip(names, states, strict=False) if state == "active"}


def _start(ctx: ModuleContext, replica: Replica, nodes: list[Node],
           units: Mapping[str, list[str]], observe: Any, timeout_s: float,
           poll_s: float) -> ModuleResult:
    deadline = time.monotonic() + timeout_s
    progress = _Progress(replica.name, timeout_s)
    started: list[tuple[Node, str]] = []
    waited = 0.0
    try:
        for node in nodes:
            names = units.get(node.name, [])
            todo = [name for name in names if name not in _active(ctx, node, names)]
            if not todo:
                continue
            # every node read again right before this one starts (a GPU taken meanwhile waits)
            waited += gpu_pool.wait_until_free(
                observe, timeout_s=max(0.0, deadline - time.monotonic()),
                where=f"{replica.name}: GPUs before starting {node.name}", poll_s=poll_s,
                progress=progress)
            for name in todo:
                result = ctx.connections[node.name].run(
                    shell_join(["systemctl", "start", "--", name]), timeout_s=120)
                if result.exit_code != 0:
                    raise ProvisionError.single(
                        f"{node.name}: {name}", "systemctl start failed",
                        actual=(result.stderr or result.stdout).strip()[-300:],
                        fix=f"journalctl -u {name} on {node.name}")
                started.append((node, name))
    except ProvisionError as exc:
        undone = _stop(ctx, started)
        note = ("; stopped what this run had started: " + ", ".join(undone) if undone
                else "; no node was started")
        first = exc.problems[0]
        if isinstance(exc, gpu_pool.GpusHeld):
            first = replace(first, message="the GPUs of every node were not free at the same "
                            f"time within {timeout_s:g} s (vllm_gpu_pool: shared){note}")
        else:
            first = replace(first, message=first.message + note)
        raise ProvisionError([first, *exc.problems[1:]]) from None
    if not started:
        return ModuleResult(Status.OK, "every node already runs", data={"gpu_wait_s": 0.0})
    return ModuleResult(Status.CHANGED, f"started {', '.join(f'{n.name} {u}' for n, u in started)}"
                        f" after {waited:g} s waiting for GPUs",
                        data={"gpu_wait_s": round(waited, 3),
                              "started": [f"{n.name} {u}" for n, u in started]})


def _stop(ctx: ModuleContext, started: list[tuple[Node, str]]) -> list[str]:
    """Stop, in reverse order, the units this task started; return ``host unit`` of each."""
    undone = []
    for node, name in reversed(started):
        ctx.connections[node.name].run(shell_join(["systemctl", "stop", "--", name]),
                                       timeout_s=180)
        undone.append(f"{node.name} {name}")
    return undone
