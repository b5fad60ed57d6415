"""vLLM's default executor backend, and its errors about the backend (pure).

Which backend a replica gets when ``vllm_backend`` is unset is vLLM's own rule
(``ParallelConfig.__post_init__``, ``vllm/config/parallel.py``). The inventory applies it when it
loads (:func:`backend_choice`); preflight checks it against the GPUs it counted
(``vllm_provision.checks.topology``).
"""

from __future__ import annotations

# ParallelConfig.__post_init__ (vllm/config/parallel.py, PR #30140): the error vLLM raises when
# the backend is unset and the world size does not fit on this node.
WORLD_SIZE_ERROR = (
    "World size ({world}) is larger than the number of available GPUs ({gpus}) in this node. "
    "If this is intentional and you are using:\n"
    "- ray, set '--distributed-executor-backend ray'.\n"
    "- multiprocessing, set '--nnodes' appropriately."
)
# ParallelConfig.__post_init__ (vllm/config/parallel.py): nnodes > 1 with any other backend.
NNODES_BACKEND_ERROR = (
    "nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher."
)


# Where vLLM's default backend rule lives, cited wherever the tool applies it.
DEFAULT_BACKEND_RULE = "ParallelConfig.__post_init__, vllm/config/parallel.py"


def default_backend(world_size: int, nnodes: int, local_gpus: int) -> tuple[str | None, str]:
    """The executor backend vLLM picks when ``--distributed-executor-backend`` is unset (CUDA).

    Source: ``ParallelConfig.__post_init__`` in ``vllm/config/parallel.py`` (>= v0.11.1, PR
    #25775 removed the silent fallback to Ray; PR #30140 added the two-bullet error): with a
    world size above 1 the backend starts as ``mp``; on CUDA ``nnodes > 1`` keeps ``mp``; a
    single node with fewer GPUs than the world size raises; Ray is chosen only for Ray data
    parallelism or inside a Ray placement group (neither applies to a replica started by its
    systemd unit). A world size of 1 gets ``uni``.

    Args:
        world_size: TP x PP.
        nnodes: ``--nnodes``.
        local_gpus: GPUs visible on the node.

    Returns:
        ``(backend, "")`` or ``(None, vLLM's error text)``.
    """
    if world_size <= 1:
        return "uni", ""
    if nnodes > 1:
        return "mp", ""
    if local_gpus < world_size:
        return None, WORLD_SIZE_ERROR.format(world=world_size, gpus=local_gpus)
    return "mp", ""


def backend_choice(world_size: int, nnodes: int) -> tuple[str, str]:
    """The backend a replica without ``vllm_backend`` gets, and why, in words.

    vLLM's rule (:func:`default_backend`) gives ``mp`` whenever the replica can run at all
    without Ray: several nodes, or one node holding the whole world size (whether it does is
    checked by preflight, :func:`check_default_backend`, once the GPUs are counted). For a world
    size of 1 vLLM runs ``uni`` (one process); the mp units run that single worker the same way.

    Args:
        world_size: TP x PP.
        nnodes: the replica's node count.

    Returns:
        ``("mp", reason)``; the reason cites :data:`DEFAULT_BACKEND_RULE`.
    """
    if nnodes > 1:
        why = f"mp when nnodes > 1 on CUDA; this replica has {nnodes} nodes"
    elif world_size > 1:
        why = (f"mp when the world size ({world_size}) fits on the node's GPUs, else vLLM "
               "refuses to start (preflight counts the GPUs)")
    else:
        why = "uni for world size 1 (one process); the mp unit runs that single worker alike"
    return "mp", (f"vllm_backend is not set, so vLLM's own default applies "
                  f"({DEFAULT_BACKEND_RULE}): {why}")
