"""A start that stopped moving: the stall rule of the readiness wait and the remedy per phase.

A node's start is the sequence of phases vLLM announces in its own log lines
(:mod:`vllm_provision.output.phases`). The readiness wait reads them at every poll; this module
keeps, per node, its phase, when its phase text last changed (a new phase, or new progress
inside one: ``loading weights 50% (1/2 shards)`` after ``... 0% (0/2 shards)``) and the seconds
spent in each phase. The replica's start is **stalled** when no node of it has progressed for
``vllm_stall_timeout_s`` seconds: the nodes of one start wait on each other (the profile run,
the KV-cache sizing and the graph capture are collectives across every rank), so a node whose
part is done waits in silence for the others, and only a replica where nothing moves is stuck.
The node named is the one furthest behind (the earliest phase in
:data:`~vllm_provision.output.phases.PHASES`; before any phase line counts as earliest; on a
tie the one silent longest): the others wait for it.

vLLM's own wait for a Ray placement group (``waiting for a Ray placement group``) is not timed
here: the Ray backend's placement check explains and bounds it (INFEASIBLE at once, a group
pending for want of free resources after ``vllm_gpu_wait_timeout_s``; docs/preflight.md).

The remedies are data (:data:`REMEDIES`), one row per phase, each naming the documentation it
rests on; docs/deploy.md ("A start that stalls") prints the same table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_provision.output.phases import PHASES, label_of

# Sources of the remedies (documentation pages, never issue threads).
VLLM_TROUBLESHOOTING = "vLLM docs, Troubleshooting (docs.vllm.ai/en/latest/usage/troubleshooting/)"
VLLM_MEMORY = ("vLLM docs, Conserving Memory "
               "(docs.vllm.ai/en/latest/configuration/conserving_memory/)")
NCCL_ENV = ("NCCL User Guide, Environment Variables: NCCL_SOCKET_IFNAME, NCCL_DEBUG "
            "(docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)")
RAY_STATUS = "Ray docs, Cluster Management CLI: ray status (docs.ray.io)"
BEFORE_FIRST_PHASE = "starting (no phase line yet)"
UNTIMED = frozenset({"waiting for a Ray placement group"})


@dataclass(frozen=True)
class Remedy:
    """What a start stuck in one phase usually waits for, and what to do.

    Attributes:
        phase: a phase label of :data:`~vllm_provision.output.phases.PHASES`, or
            :data:`BEFORE_FIRST_PHASE`.
        cause: what the process does in that phase that can hang, one sentence.
        fix: what to check or change, in inventory variables and commands.
        sources: the documentation the advice comes from.
    """

    phase: str
    cause: str
    fix: str
    sources: tuple[str, ...]


_NCCL_FIX = ("check that the nodes reach each other on the cluster network: set "
             "vllm_cluster_interface (NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME) to the interface "
             "of vllm_host_ip, open the firewall between the nodes (vllm_master_port and NCCL's "
             "ports), and rerun with vllm_env: {NCCL_DEBUG: INFO} to see where NCCL waits")

REMEDIES: tuple[Remedy, ...] = (
    Remedy(BEFORE_FIRST_PHASE,
           "the process starts, imports, and joins the other nodes (torch.distributed "
           "rendezvous on rank 0's vllm_master_port, NCCL/gloo init; Ray: its placement group) "
           "before it loads anything",
           _NCCL_FIX + "; with Ray, run `ray status` on the head: every node and its GPUs "
           "listed (ray_num_gpus per node)",
           (NCCL_ENV, VLLM_TROUBLESHOOTING, RAY_STATUS)),
    Remedy("loading weights",
           "the weights are read from vllm_model's path; a slow or shared mount (NFS, a "
           "network file system) or a host swapping makes this take long",
           "check the read throughput of the model's storage on the node (a model path on a "
           "slow mount: copy the model to a local disk), its free memory, and raise "
           "vllm_stall_timeout_s if the load is slow but moving",
           (VLLM_TROUBLESHOOTING,)),
    Remedy("weights loaded",
           "the weights are in; the first collective across every rank (the profile run) waits "
           "for the slowest node to load",
           "find the node still loading (provision status, journalctl -u vllm); if every node "
           "loaded, the collective hangs on the network: " + _NCCL_FIX,
           (VLLM_TROUBLESHOOTING, NCCL_ENV)),
    Remedy("profiling memory",
           "the profile run (a forward pass with dummy inputs on every rank) sizes the memory",
           "lower vllm_gpu_memory_utilization or vllm_max_model_len; a profile run that never "
           "ends across nodes hangs on the network: " + _NCCL_FIX,
           (VLLM_MEMORY, NCCL_ENV)),
    Remedy("sizing the KV cache",
           "the KV cache is sized from the memory left after the profile run and allocated",
           "lower vllm_gpu_memory_utilization (other processes on the GPUs: nvidia-smi), "
           "vllm_max_model_len, or add --enforce-eager to vllm_extra_args to skip the CUDA graph "
           "memory",
           (VLLM_MEMORY,)),
    Remedy("compiling",
           "torch.compile compiles the model (the first start on a host fills the compile "
           "cache)",
           "raise vllm_stall_timeout_s for a first start, or add --enforce-eager to "
           "vllm_extra_args to skip compilation and CUDA graphs",
           (VLLM_MEMORY,)),
    Remedy("capturing CUDA graphs",
           "CUDA graphs are captured for each batch size, on every rank together",
           "add --enforce-eager to vllm_extra_args (no CUDA graphs), or lower "
           "vllm_gpu_memory_utilization; a capture that hangs across nodes waits on the "
           "network: " + _NCCL_FIX,
           (VLLM_MEMORY, NCCL_ENV)),
    Remedy("engine ready",
           "the engine is up; the API server starts",
           "read the journal below: the API server should print `Starting vLLM server on` "
           "within seconds (a port already in use, an API host that is not an address of the "
           "node)",
           (VLLM_TROUBLESHOOTING,)),
    Remedy("API server up",
           "the API server answers; /health or /v1/models does not yet",
           "check rank 0's /health and /v1/models by hand, and vllm_served_model_name",
           (VLLM_TROUBLESHOOTING,)),
)
_BY_PHASE = {remedy.phase: remedy for remedy in REMEDIES}


def remedy_for(phase: str) -> Remedy:
    """The remedy of ``phase`` (a phase text such as ``loading weights 50% (1/2 shards)``, a
    label, or ``""`` before the first phase line); a phase without a row gets the row of
    :data:`BEFORE_FIRST_PHASE` (the distributed start)."""
    return _BY_PHASE.get(label_of(phase) if phase else BEFORE_FIRST_PHASE,
                         _BY_PHASE[BEFORE_FIRST_PHASE])


MIB = 1 << 20
MIN_LOAD_BUDGET_S = 60.0
# vLLM's default CUDA graph capture sizes: 1, 2, 4, then every 8 up to 512 (67 sizes;
# vllm/config/compilation.py, cudagraph_capture_sizes), about a second or two each on a GPU
GRAPH_SIZES, GRAPH_S_EACH = 67, 2.0
DEFAULT_BUDGETS_S: dict[str, float] = {
    "weights loaded": 300.0, "profiling memory": 300.0, "sizing the KV cache": 300.0,
    "compiling": 600.0, "capturing CUDA graphs": GRAPH_SIZES * GRAPH_S_EACH,
    "engine ready": 300.0, "API server up": 300.0}


@dataclass(frozen=True)
class Budget:
    """A phase's budget: ``seconds``, and ``why`` (how it was derived, in words)."""

    seconds: float
    why: str


def phase_budgets(model_bytes: int | None, load_rate_mib_s: float,
                  overrides: Mapping[str, Any] | None = None, *,
                  eager: bool = False) -> dict[str, Budget]:
    """The budget of each phase of a start (pure): loading weights twice the weights' size
    at ``load_rate_mib_s`` (``vllm_load_rate_mib_s``), at least :data:`MIN_LOAD_BUDGET_S`;
    CUDA graph capture :data:`GRAPH_S_EACH` per default capture size (none with
    ``--enforce-eager``: ``eager``); the others :data:`DEFAULT_BUDGETS_S`; ``overrides``
    (``vllm_phase_budgets_s``, phase -> seconds) win.

    Args:
        model_bytes: the model folder's size on rank 0 (the facts' manifest), None when
            unknown (the load budget is then the minimum).
    """
    budgets = {phase: Budget(seconds, "the default") for phase, seconds in
               DEFAULT_BUDGETS_S.items()}
    if model_bytes:
        load = max(MIN_LOAD_BUDGET_S, 2 * model_bytes / (load_rate_mib_s * MIB))
        budgets["loading weights"] = Budget(round(load, 1), (
            f"twice {model_bytes / (1 << 30):.1f} GiB of weights at {load_rate_mib_s:g} MiB/s, "
            "vllm_load_rate_mib_s"))
    else:
        budgets["loading weights"] = Budget(MIN_LOAD_BUDGET_S, "the minimum (size unknown)")
    if not eager:
        budgets["capturing CUDA graphs"] = Budget(
            GRAPH_SIZES * GRAPH_S_EACH,
            f"{GRAPH_S_EACH:g} s for each of vLLM's {GRAPH_SIZES} default capture sizes")
    for phase, seconds in (overrides or {}).items():
        budgets[str(phase)] = Budget(float(seconds), "vllm_phase_budgets_s")
    return budgets


@dataclass(frozen=True)
class OverBudget:
    """A node that has spent longer in a phase than its budget."""

    host: str
    phase: str
    seconds: float
    budget: Budget

    def describe(self) -> str:
        """One line: the node, the phase, the time, the budget and where it came from."""
        return (f"{self.host} has been in phase {self.phase!r} for {self.seconds:.0f} s, over "
                f"its budget of {self.budget.seconds:g} s ({self.budget.why}); the start goes "
                "on while it progresses (vllm_stall_timeout_s ends one that stops)")


def _rank(phase: str) -> int:
    """Where ``phase`` lies in a start: -1 before the first phase line, else its index in
    :data:`~vllm_provision.output.phases.PHASES`."""
    label = label_of(phase) if phase else ""
    return PHASES.index(label) if label in PHASES else -1


@dataclass
class _Node:
    phase: str
    changed_at: float
    phase_started: float
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Stall:
    """A stalled start: the node furthest behind, its phase and how long nothing moved.

    Attributes:
        host: inventory host name. phase: its phase text (``""``: no phase line yet).
        silent_s: seconds since the last progress of any node of the replica.
        in_phase_s: seconds this node has been in its phase.
    """

    host: str
    phase: str
    silent_s: float
    in_phase_s: float

    @property
    def phase_name(self) -> str:
        """The phase text, or :data:`BEFORE_FIRST_PHASE`."""
        return self.phase or BEFORE_FIRST_PHASE


class StallWatch:
    """The stall rule over one wait: feed each node's phase at each poll, ask whether it stalled.

    Args:
        hosts: the nodes whose journal holds vLLM's phase lines (a Ray worker has none).
        timeout_s: ``vllm_stall_timeout_s``, seconds without progress of any node (> 0).
        now: the wait's clock at its start (seconds, monotonic).
    """

    def __init__(self, hosts: Iterable[str], timeout_s: float, now: float,
                 budgets: Mapping[str, Budget] | None = None) -> None:
        self.timeout_s = float(timeout_s)
        self.nodes = {host: _Node("", now, now) for host in hosts}
        self.progressed_at = now
        self.budgets = dict(budgets or {})
        self.over: list[OverBudget] = []

    def over_budget(self, now: float) -> list[OverBudget]:
        """The nodes that went over their phase's budget since the last call (each node and
        phase once), also kept in :attr:`over`."""
        found = []
        reported = {(o.host, o.phase) for o in self.over}
        for host, node in self.nodes.items():
            name = label_of(node.phase) if node.phase else ""
            budget = self.budgets.get(name)
            spent = now - node.phase_started
            if budget is not None and spent > budget.seconds and (host, name) not in reported:
                found.append(OverBudget(host, name, round(spent, 1), budget))
        self.over += found
        return found

    def observe(self, host: str, phase: str, now: float) -> None:
        """Record ``host``'s phase text at ``now``: a text that differs from the last is
        progress (a new phase, or new progress inside one)."""
        node = self.nodes.get(host)
        if node is None or phase == node.phase:
            return
        if label_of(phase) != (label_of(node.phase) if node.phase else ""):
            self._close(node, now)
            node.phase_started = now
        node.phase = phase
        node.changed_at = now
        self.progressed_at = now

    def _close(self, node: _Node, now: float) -> None:
        name = label_of(node.phase) if node.phase else BEFORE_FIRST_PHASE
        node.seconds[name] = round(node.seconds.get(name, 0.0) + now - node.phase_started, 3)

    def stalled(self, now: float) -> Stall | None:
        """The stall at ``now``, or None while some node progressed within the timeout (or a
        node waits for a Ray placement group, which the backend's check bounds)."""
        if not self.nodes or now - self.progressed_at < self.timeout_s:
            return None
        if any(label_of(n.phase) in UNTIMED for n in self.nodes.values() if n.phase):
            return None
        host, node = min(self.nodes.items(),
                         key=lambda item: (_rank(item[1].phase), item[1].changed_at))
        return Stall(host, node.phase, round(now - self.progressed_at, 1),
                     round(now - node.phase_started, 1))

    def phase_seconds(self, now: float) -> dict[str, dict[str, float]]:
        """Per node, the seconds spent in each phase so far (the current one up to ``now``),
        phases in the order they came."""
        result: dict[str, dict[str, float]] = {}
        for host, node in self.nodes.items():
            seconds = dict(node.seconds)
            name = label_of(node.phase) if node.phase else BEFORE_FIRST_PHASE
            seconds[name] = round(seconds.get(name, 0.0) + now - node.phase_started, 3)
            result[host] = seconds
        return result


def render_markdown_table() -> str:
    """The remedy table as Markdown, for docs/deploy.md ("A start that stalls"; a unit test
    keeps the doc equal to it): one row per phase of :data:`REMEDIES`."""
    rows = ["| phase | what it does there | what to do | sources |", "|---|---|---|---|"]
    for remedy in REMEDIES:
        cells = (remedy.phase, remedy.cause, remedy.fix, "; ".join(remedy.sources))
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
