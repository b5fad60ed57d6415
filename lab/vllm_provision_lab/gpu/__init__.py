"""The lab's simulated GPU stack: stand-in nvidia-smi and vLLM, real Ray, per-host versions.

The lab calls :func:`prepare_host` for each host before booting it; ``provision lab set`` and
``provision lab occupy`` (:mod:`vllm_provision_lab.gpu.cli`) change a running lab over SSH.
See docs/lab-standin.md.
"""

from __future__ import annotations

from pathlib import Path

from .spec import clear_overrides, effective_spec, host_count

__all__ = ["prepare_host", "clear_overrides", "effective_spec", "host_count"]


def prepare_host(root: Path, host_name: str, state_dir: Path, vllm: str = "standin") -> None:
    """Install the simulated GPU stack into one lab host before it boots.

    With ``vllm="real"`` (``lab up --vllm real``) nothing is written: the host keeps the real
    vLLM (CPU build) of its base and has no GPU, so no stand-in nvidia-smi either.

    Args:
        root: the host's merged overlay root (written as if it were ``/``).
        host_name: the lab host name, e.g. ``h1``.
        state_dir: the lab state dir; ``<state_dir>/spec.yml`` (optional) is the lab spec and
            ``<state_dir>/gpu-overrides.json`` holds values set with ``lab set``.

    Raises:
        LabError: the spec is invalid (unknown key, wrong type, unreadable YAML).
        OSError: ``root`` cannot be written.
    """
    if vllm == "real":
        return
    from .install import write_host_root

    write_host_root(Path(root), effective_spec(Path(state_dir), host_name))
