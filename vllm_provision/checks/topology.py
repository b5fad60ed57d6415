"""Topology rules: parallel sizes, node ranks, GPUs per node and backend arguments of a replica.

Pure functions from a :class:`~vllm_provision.core.models.Replica` (and per-node GPU counts) to
findings. Each rule names its source: vLLM's ``ParallelConfig`` (``vllm/config/parallel.py``),
the multi-node mp executor (PR #23691), the Ray executor (``vllm/v1/executor/ray_utils.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_provision.backends.choice import (  # noqa: F401 - the rules' names, checked here
    DEFAULT_BACKEND_RULE,
    NNODES_BACKEND_ERROR,
    WORLD_SIZE_ERROR,
    backend_choice,
    default_backend,
)
from vllm_provision.checks.context import ReplicaScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica


def check_default_backend(replica: Replica, gpu_counts: Mapping[str, int]) -> list[Finding]:
    """A replica whose backend came from vLLM's default rule (``vllm_backend`` unset): say which
    backend was chosen and why; an error where vLLM itself would refuse to start (one node
    with fewer GPUs than the world size: vLLM's "World size (N) is larger than the number of
    available GPUs" error). Nothing for a replica with ``vllm_backend`` set.

    Source: :func:`default_backend` (``ParallelConfig.__post_init__``,
    ``vllm/config/parallel.py``).

    Args:
        replica: the replica.
        gpu_counts: GPUs (devices) found per host name.
    """
    if not replica.backend_reason:
        return []
    source = "vllm/config/parallel.py ParallelConfig.__post_init__"
    master = replica.master.name
    world = replica.engine.world_size
    if replica.nnodes == 1 and world > 1 and master in gpu_counts:
        chosen, error = default_backend(world, 1, gpu_counts[master])
        if chosen is None:
            return [Finding(
                "topology.backend_default", Severity.ERROR, master, "default executor backend",
                expected=f"one node with >= {world} GPUs for vLLM's default (mp)",
                actual=error.replace("\n", " "),
                fix="set vllm_backend: ray for a Ray cluster, or add nodes to the replica (mp "
                    "over several nodes), or lower TP x PP to the node's GPUs",
                source=source)]
    return [Finding("topology.backend_default", Severity.OK, "*", "default executor backend",
                    expected="vllm_backend, or vLLM's default rule",
                    actual=f"{replica.backend}: {replica.backend_reason}", source=source)]


def check_parallel_sizes(replica: Replica) -> list[Finding]:
    """TP and PP are >= 1 and TP x PP = world size = nnodes x local world size.

    Source: ``ParallelConfig.world_size = pipeline_parallel_size * tensor_parallel_size``
    (``vllm/config/parallel.py``); the mp executor gives every node ``world_size // nnodes``
    workers (``vllm/v1/executor/multiproc_executor.py``, PR #23691), so the world size must be
    a multiple of the node count or some GPUs get no worker and ranks do not line up.
    """
    engine = replica.engine
    tp, pp, world, n = (engine.tensor_parallel_size, engine.pipeline_parallel_size,
                        engine.world_size, replica.nnodes)
    if replica.data_parallel and tp >= 1 and pp >= 1:
        local = replica.dp_size_local
        return [Finding("topology.world_size", Severity.OK, "*", "world size",
                        expected="TP x PP per engine, on one node; engines = nodes x engines "
                                 "per node",
                        actual=f"{engine.data_parallel_size} engines of {tp} x {pp} = {world} "
                               f"GPUs: {n} nodes x {local} engines x {world} = "
                               f"{n} x {replica.gpus_per_node} GPUs",
                        source="vLLM docs, Data Parallel Deployment")]
    if tp < 1 or pp < 1:
        return [Finding("topology.world_size", Severity.ERROR, "*", "parallel sizes",
                        expected="tensor and pipeline parallel sizes >= 1",
                        actual=f"TP={tp}, PP={pp}",
                        fix="set vllm_tensor_parallel_size and vllm_pipeline_parallel_size >= 1",
                        source="vllm/config/parallel.py")]
    if world % n != 0:
        return [Finding("topology.world_size", Severity.ERROR, "*", "world size per node",
                        expected=f"TP x PP a multiple of the {n} nodes",
                        actual=f"TP x PP = {tp} x {pp} = {world}, not divisible by {n}",
                        fix=f"choose TP and PP so that TP x PP = {n} x GPUs per node "
                            f"(e.g. TP=GPUs per node, PP={n})",
                        source="vllm/v1/executor/multiproc_executor.py (PR #23691)")]
    if world < n:
        return [Finding("topology.world_size", Severity.ERROR, "*", "world size per node",
                        expected=f"at least one GPU worker per node ({n} nodes)",
                        actual=f"TP x PP = {world}",
                        fix="raise TP/PP or remove nodes from the replica",
                        source="vllm/v1/executor/multiproc_executor.py (PR #23691)")]
    return [Finding("topology.world_size", Severity.OK, "*", "world size",
                    expected="TP x PP = nodes x GPUs per node",
                    actual=f"{tp} x {pp} = {world} = {n} nodes x {world // n}",
                    source="vllm/config/parallel.py")]


def check_gpus_per_node(replica: Replica, gpu_counts: Mapping[str, int]) -> list[Finding]:
    """Every node has at least ``local world size`` GPUs: of its ``vllm_gpus`` when set (the
    only ones CUDA shows its processes; :func:`~vllm_provision.checks.context.device_counts`).

    Source: vLLM asserts "local_world_size (16) must be less than or equal to the number of
    visible devices (8)" (PR #28873); the Ray executor waits for world-size GPU bundles.

    Args:
        replica: the replica.
        gpu_counts: GPUs found per host name (hosts without facts are left out); for a node
            with ``vllm_gpus``, those of its set that the host has.
    """
    need = replica.gpus_per_node
    findings = []
    for node in replica.nodes:
        if node.name not in gpu_counts:
            continue
        have = gpu_counts[node.name]
        item = "GPUs on the node" if node.gpus is None else "GPUs of vllm_gpus on the node"
        if have < need:
            if node.gpus is not None:  # the load checked the list's length: indexes are missing
                fix = (f"list {need} GPUs that {node.name} has in its vllm_gpus (host.gpus "
                       "names the missing ones)")
            elif replica.data_parallel:
                fix = (f"lower vllm_data_parallel_size_local or TP x PP so that their product "
                       f"is at most {have}, or use nodes with {need} GPUs")
            else:
                fix = f"lower TP x PP to {replica.nnodes} x {have}, or use nodes with {need} GPUs"
            findings.append(Finding(
                "topology.gpus", Severity.ERROR, node.name, item,
                expected=(f">= {need} ({replica.dp_size_local} data-parallel engines x TP x PP "
                          f"{replica.engine.world_size})" if replica.data_parallel else
                          f">= {need} (world size {replica.engine.world_size} / "
                          f"{replica.nnodes} nodes)"),
                actual=str(have), fix=fix,
                source="vLLM local_world_size assertion (PR #28873)"))
        else:
            findings.append(Finding("topology.gpus", Severity.OK, node.name, item,
                                    expected=f">= {need}", actual=str(have)))
    return findings


def check_tensor_parallel_in_node(replica: Replica) -> list[Finding]:
    """TP should stay inside one node (warning when it would span nodes).

    Source: vLLM's Ray executor warns "Tensor parallel workers can be spread out to 2+ nodes"
    (``_verify_bundles`` in ``vllm/v1/executor/ray_utils.py``); docs
    ``serving/parallelism_scaling.md``: TP inside a node, PP across nodes.
    """
    tp, local = replica.engine.tensor_parallel_size, replica.gpus_per_node
    if replica.nnodes > 1 and tp > local:
        return [Finding("topology.tp_in_node", Severity.WARNING, "*", "tensor parallel group",
                        expected=f"TP <= GPUs used per node ({local})",
                        actual=f"TP={tp} spans {-(-tp // max(1, local))} nodes",
                        fix=f"set TP={local} and PP={replica.engine.world_size // max(1, local)} "
                            "so all-reduce stays on NVLink inside a node",
                        source="vllm/v1/executor/ray_utils.py _verify_bundles")]
    return [Finding("topology.tp_in_node", Severity.OK, "*", "tensor parallel group",
                    expected=f"TP <= {local}", actual=f"TP={tp}")]


def check_node_ranks(replica: Replica) -> list[Finding]:
    """Node ranks are 0..N-1, unique and complete; exactly one master (rank 0).

    Source: ``--node-rank`` / ``--nnodes`` of the mp multi-node path (PR #23691): rank 0 runs the
    TCP store and the API server, every other rank is ``--headless``.
    """
    ranks = [node.rank for node in replica.nodes]
    findings = []
    duplicates = sorted({rank for rank in ranks if ranks.count(rank) > 1})
    missing = sorted(set(range(len(ranks))) - set(ranks))
    by_rank = ", ".join(f"{node.name}={node.rank}" for node in replica.nodes)
    if duplicates or missing or sorted(ranks) != list(range(len(ranks))):
        findings.append(Finding(
            "topology.ranks", Severity.ERROR, "*", "node ranks",
            expected=f"0..{len(ranks) - 1}, each once",
            actual=by_rank + (f" (duplicate {duplicates})" if duplicates else "")
            + (f" (missing {missing})" if missing else ""),
            fix="give each host of the replica a distinct vllm_node_rank from 0 to N-1",
            source="vLLM --node-rank/--nnodes (PR #23691)"))
    masters = [node.name for node in replica.nodes if node.rank == 0]
    if len(masters) != 1:
        findings.append(Finding(
            "topology.master", Severity.ERROR, "*", "master (rank 0)",
            expected="exactly one node with vllm_node_rank 0",
            actual=", ".join(masters) or "none",
            fix="set vllm_node_rank: 0 on exactly one host of the replica",
            source="vLLM --node-rank (PR #23691)"))
    if not findings:
        findings.append(Finding("topology.ranks", Severity.OK, "*", "node ranks",
                                expected=f"0..{len(ranks) - 1}", actual=by_rank))
    return findings


CONTROLLED = ("--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port",
              "--headless", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp")


def _extra_words(replica: Replica) -> list[tuple[str, str, str | None, str]]:
    """``(word, the option it means, its value, how)`` for every option word of
    ``vllm_extra_args``, read as the replica's release reads it (its ``vllm_version`` pin, else
    the table's newest: :func:`vllm_provision.inventory.extra_args.release_surface`): ``how``
    is ``""`` for an exact name, else what the word abbreviates. Without the table, exact names
    only (``_`` read as ``-``)."""
    from vllm_provision.inventory.extra_args import release_surface
    from vllm_provision.settings.vllm_cli.argv import abbreviated, read_argv, spelled

    args = [str(a) for a in replica.engine.extra_args]
    surface, _pinned = release_surface(replica.vars.get("vllm_version"))
    if surface is None:
        words = []
        for position, word in enumerate(args):
            if not word.startswith("-"):
                continue
            option, _, inline = word.partition("=")
            value = inline if "=" in word else (
                args[position + 1] if position + 1 < len(args) else None)
            words.append((option, spelled(option), value, ""))
        return words
    found = []
    for option in read_argv(surface, args):
        if option.flag is None:
            continue
        how = (f"{option.word} abbreviates {option.flag.name} for vLLM {surface.release}"
               if abbreviated(option) else "")
        controlled = [s for s in option.flag.spellings() if s in CONTROLLED]
        found.append((option.word, controlled[0] if controlled else option.flag.name,
                      option.value, how))
    return found


def check_backend_args(replica: Replica) -> list[Finding]:
    """The backend is explicit and its arguments are consistent.

    mp: every node gets ``--distributed-executor-backend mp`` and ``--nnodes`` (the unit
    templates render them); nothing in ``vllm_extra_args`` may override them, in any spelling
    vLLM's parser accepts (``--tensor_parallel_size``, an abbreviation such as ``--nnode``:
    :func:`_extra_words`). Ray: never ``--nnodes`` (vLLM: "nnodes > 1 can only be set when
    distributed executor backend is mp, uni or external_launcher."). Source:
    ``ParallelConfig.__post_init__``, ``vllm/config/parallel.py``
    (https://github.com/vllm-project/vllm).
    """
    words = _extra_words(replica)
    findings = []
    for word, name, value, how in words:
        if name == "--distributed-executor-backend" and value is not None \
                and value != replica.backend:
            findings.append(Finding(
                "topology.backend", Severity.ERROR, "*", "executor backend",
                expected=f"--distributed-executor-backend {replica.backend} (vllm_backend)",
                actual=f"vllm_extra_args sets {word} {value}" + (f" ({how})" if how else ""),
                fix=f"remove {word} from vllm_extra_args; set vllm_backend instead",
                source="vllm/config/parallel.py"))
    for word, name, _value, how in words:
        if name in CONTROLLED:
            expected, text = replica.backend_type.flag_finding(name)
            findings.append(Finding(
                "topology.backend", Severity.ERROR, "*", f"{word} in vllm_extra_args",
                expected=expected, actual=text + (f" ({how})" if how else ""),
                fix=f"remove {word} from vllm_extra_args; the inventory's ranks and sizes "
                    "give it",
                source="vllm/config/parallel.py"))
    if not findings:
        findings.append(Finding(
            "topology.backend", Severity.OK, "*", "executor backend",
            expected="explicit" if not replica.backend_reason else
                     "explicit in the unit (vLLM's default rule chose it)",
            actual=" ".join(replica.backend_type.rendered_flags(replica))))
    return findings


def check_topology(replica: Replica, gpu_counts: Mapping[str, int]) -> list[Finding]:
    """Run every topology rule on one replica (see the functions above for each source)."""
    return (check_parallel_sizes(replica) + check_gpus_per_node(replica, gpu_counts)
            + check_tensor_parallel_in_node(replica) + check_node_ranks(replica)
            + check_default_backend(replica, gpu_counts) + check_backend_args(replica))


# -- checks that read their scope (checks/context.py) -----------------------------------

@check("topology.topology", order=10, scope="replica")
def _topology(scope: ReplicaScope) -> list[Finding]:
    """Parallel sizes against the nodes' GPUs (CPU cores on ``cpu``)."""
    from vllm_provision.checks.context import device_counts

    return check_topology(scope.replica, device_counts(scope.facts, scope.device,
                                                       scope.replica))
