"""The lab's Ansible-compatible inventories (mp and Ray) for one lab instance."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from vllm_provision.lab.config import LabConfig

InventoryKind = Literal["mp", "ray"]
KINDS: tuple[InventoryKind, ...] = ("mp", "ray")
REPLICA_GROUP = "lab"
# the GPU stand-in's model dir, created on every host by vllm_provision.lab.gpu
LAB_MODEL = "/srv/models/lab-model"
# the reference scenario (shared/docs/domain.md): TP=4 inside each node, PP=2 across two nodes
TENSOR_PARALLEL_SIZE = 4
PIPELINE_PARALLEL_SIZE = 2
NODES = ("h1", "h2")


def inventory_text(config: LabConfig, kind: InventoryKind) -> str:
    """Return the inventory YAML for ``kind`` ("mp" or "ray") of the lab instance ``config``.

    Shape: docs/architecture.md "Inventory shape": replica group ``lab`` under ``vllm_replicas``,
    h1 rank 0 and h2 rank 1 at the instance's fixed addresses, the lab key and known_hosts.

    Raises:
        ValueError: ``kind`` is neither "mp" nor "ray".
    """
    if kind not in KINDS:
        raise ValueError(f"inventory kind must be one of {KINDS}, got {kind!r}")
    key_file = config.state_dir / "id_ed25519"
    known_hosts = config.state_dir / "known_hosts"
    hosts = "".join(
        f"            {name}: {{ansible_host: {config.address(name)}, vllm_node_rank: {rank}}}\n"
        for rank, name in enumerate(NODES))
    return (
        f"# Lab inventory ({kind} backend) for lab instance '{config.name}' ({config.net}.0/24,\n"
        f"# state dir {config.state_dir}). Written by `provision lab up`; the committed\n"
        f"# inventory/lab-{kind}.yml is the default instance's copy\n"
        "# (tests/unit/test_lab_inventories.py keeps them equal).\n"
        "all:\n"
        "  vars:\n"
        "    ansible_user: root\n"
        "    ansible_port: 22\n"
        f"    ansible_ssh_private_key_file: {key_file}\n"
        f"    ansible_ssh_common_args: -o UserKnownHostsFile={known_hosts}\n"
        "  children:\n"
        "    vllm_replicas:\n"
        "      children:\n"
        f"        {REPLICA_GROUP}:\n"
        "          vars:\n"
        f"            vllm_backend: {kind}\n"
        f"            vllm_model: {LAB_MODEL}\n"
        f"            vllm_tensor_parallel_size: {TENSOR_PARALLEL_SIZE}\n"
        f"            vllm_pipeline_parallel_size: {PIPELINE_PARALLEL_SIZE}\n"
        "            vllm_cluster_interface: eth0\n"
        "          hosts:\n"
        f"{hosts}")


def inventory_file(state_dir: Path, kind: InventoryKind) -> Path:
    """Where ``lab up`` writes the ``kind`` inventory: ``<state_dir>/inventory/lab-<kind>.yml``."""
    return state_dir / "inventory" / f"lab-{kind}.yml"
