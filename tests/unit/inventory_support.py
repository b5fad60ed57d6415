"""Inventory texts several unit test modules share (no tests here): the YAML skeleton every
inventory of replicas has (docs/inventory.md, "Layout": ``all`` > ``vllm_replicas`` > one group
a replica), and the two-node replica ``llama`` the firewall, Ray token and run lock tests load."""

from __future__ import annotations

from pathlib import Path

from vllm_provision.core.models import Inventory
from vllm_provision.inventory import load_inventory


def replicas_yaml(replicas: str, *, all_vars: str = "", others: str = "") -> str:
    """The text of a YAML inventory whose group ``vllm_replicas`` has the children ``replicas``.

    ``replicas`` is YAML written at the depth of those children (its group names indented by 8
    spaces); ``all_vars`` a flow mapping for ``all.vars`` (e.g. ``"{ansible_user: root}"``, none
    when empty); ``others`` YAML of further children of ``all`` (indented by 4 spaces). The
    result is plain text: format a template before or after, not through this.
    """
    head = "all:\n" + (f"  vars: {all_vars}\n" if all_vars else "")
    return head + "  children:\n    vllm_replicas:\n      children:\n" + replicas + others


def llama_yaml(backend: str = "ray", *, net: str = "10.0.0", more: str = "",
               **group_vars: object) -> str:
    """An inventory text with the replica ``llama``: ``backend`` (``mp`` or ``ray``), the model
    ``/srv/models/tiny``, TP=4 x PP=2 over ``h1`` (rank 0, ``<net>.11``) and ``h2`` (rank 1,
    ``<net>.12``).

    ``group_vars`` are further vars of the group ``llama``, each written ``key: value`` with the
    value as YAML text (``str(value)``); ``more`` is YAML of further replicas beside ``llama``
    (group names indented by 8 spaces).
    """
    lines = "".join(f"            {key}: {value}\n" for key, value in group_vars.items())
    return replicas_yaml(f"""\
        llama:
          vars:
            vllm_backend: {backend}
            vllm_model: /srv/models/tiny
            vllm_tensor_parallel_size: 4
            vllm_pipeline_parallel_size: 2
{lines}\
          hosts:
            h1: {{ansible_host: {net}.11, vllm_node_rank: 0}}
            h2: {{ansible_host: {net}.12, vllm_node_rank: 1}}
""" + more)


def write_inventory(folder: Path, text: str, name: str = "inventory.yml") -> Path:
    """Write the inventory ``text`` to ``<folder>/<name>``; return its path."""
    path = folder / name
    path.write_text(text)
    return path


def load_llama(tmp_path: Path, backend: str = "ray", *, more: str = "",
               **group_vars: object) -> Inventory:
    """Load :func:`llama_yaml` (``backend``, ``more``, ``group_vars``) from
    ``<tmp_path>/inventory.yml``; raises what ``load_inventory`` raises for a bad value
    (:class:`~vllm_provision.core.errors.ProvisionError`)."""
    return load_inventory(write_inventory(tmp_path, llama_yaml(backend, more=more, **group_vars)))
