"""Preflight's settings for one replica: the preflight role's defaults under the inventory's
variables (``settings_for``), as :class:`PreflightSettings`.

The lowest module of the checks package: the check context (``checks.context``), the memory
estimate and the runner (``checks.run``) all read it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vllm_provision import settings
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.facts.gather import ProbeOptions

# Activations, CUDA context, NCCL and cuBLAS workspaces and CUDA graphs per GPU, MiB: what
# vLLM's profiling run adds to the weights before it sizes the KV cache (``peak_memory`` in
# ``Worker.determine_available_memory``, vllm/v1/worker/gpu_worker.py). An estimate; the role
# default ``preflight_gpu_overhead_mib`` changes it.
DEFAULT_OVERHEAD_MIB = 2048


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProvisionError.single(str(path), "cannot read the role defaults",
                                    actual=exc.strerror or str(exc)) from None
    except yaml.YAMLError as exc:
        raise ProvisionError.single(str(path), "role defaults are not valid YAML",
                                    actual=str(exc), fix=f"fix the YAML in {path}") from None
    return dict(data or {})


def load_defaults(path: Path | None = None) -> dict[str, Any]:
    """Return the preflight role defaults (``roles/preflight/defaults/main.yml`` of the installed
    package, or ``path``).

    Raises:
        ProvisionError: the file is missing from the installation or is not valid YAML.
    """
    if path is None:
        from vllm_provision import resources

        path = resources.role_file("preflight", "defaults", "main.yml")
    return _read_yaml(path)


@dataclass(frozen=True)
class PreflightSettings:
    """Preflight settings of one replica (role defaults < inventory vars).

    Attributes:
        parity: item -> ``error`` | ``warning`` | ``off``.
        min_shm_mib: smallest /dev/shm in MiB.
        nccl_loaded: probe ``torch.cuda.nccl.version()``.
        model_sha256: hash model files.
        reach_timeout_s: seconds for the TCP reachability test.
        skip_checks: check names (or prefixes such as ``parity``) to skip.
        placement_bundles: custom Ray bundles to check, or None.
        placement_strategy: their strategy.
        watchdog_unit: the peer watchdog's unit, the only one that may hold its port.
        watchdog_port: the replica's watchdog port (group vars, else the role default); a
            node's own vars win (:func:`check_replica`).
        gpu_overhead_mib: MiB per GPU the memory estimate reserves beyond the weights.
    """

    parity: Mapping[str, str] = field(default_factory=dict)
    min_shm_mib: int = 1024
    nccl_loaded: bool = False
    model_sha256: bool = False
    reach_timeout_s: float = 8.0
    skip_checks: tuple[str, ...] = ()
    placement_bundles: Any = None
    placement_strategy: str = "PACK"
    watchdog_unit: str = "vllm-watchdog.service"
    watchdog_port: int = 29510
    gpu_overhead_mib: int = DEFAULT_OVERHEAD_MIB


def settings_for(replica: Replica | None, defaults: Mapping[str, Any] | None = None,
                 ) -> PreflightSettings:
    """Merge the role defaults with the replica's inventory vars (master's host vars win).

    Args:
        replica: the replica (None: defaults only).
        defaults: role defaults (default: :func:`load_defaults`).
    """
    own = dict(load_defaults() if defaults is None else defaults)
    inventory_vars = ({**dict(replica.vars), **dict(replica.master.host.vars)}
                      if replica is not None else {})
    values = settings.layered(inventory_vars, role_defaults=own)
    # A partial mapping adds to the default pins (docs/preflight.md, "Checks"): the one variable
    # whose inventory value is merged into its default rather than replacing it.
    override = inventory_vars.get("preflight_parity")
    if isinstance(override, Mapping):
        pins = settings.layered({}, role_defaults=own)["preflight_parity"]
        values["preflight_parity"] = {**dict(pins), **override}
    return PreflightSettings(
        parity={str(k): str(v) for k, v in dict(values["preflight_parity"]).items()},
        min_shm_mib=int(values["preflight_min_shm_mib"]),
        nccl_loaded=bool(values["preflight_nccl_loaded"]),
        model_sha256=bool(values["preflight_model_sha256"]),
        reach_timeout_s=float(values["preflight_reach_timeout_s"]),
        skip_checks=tuple(str(s) for s in values["preflight_skip_checks"]),
        placement_bundles=values["preflight_placement_bundles"],
        placement_strategy=str(values["preflight_placement_strategy"]),
        watchdog_unit=str(values["vllm_watchdog_unit_name"]),
        # Not the master's host vars: a node without its own value binds the group's.
        watchdog_port=int((settings.replica_settings(replica) if replica is not None
                           else settings.base())["vllm_watchdog_port"]),
        gpu_overhead_mib=int(values["preflight_gpu_overhead_mib"]),
    )


def replicas_on(inventory: Inventory, hosts: Iterable[str]) -> list[Replica]:
    """The replicas with a node among ``hosts`` (host names), in inventory order: the ones a
    fact probe of those hosts checks (preflight's task, ``provision check --limit``, ``up``'s
    first probe)."""
    names = set(hosts)
    return [r for r in inventory.replicas if any(node.name in names for node in r.nodes)]


def probe_for(replicas: Sequence[Replica],
              defaults: Mapping[str, Any] | None = None) -> ProbeOptions:
    """What one fact probe gathers for ``replicas`` (:class:`PreflightSettings`): the first
    replica's reach timeout; NCCL's loaded library (``preflight_nccl_loaded``) and the model
    files' hashes (``preflight_model_sha256``) when any of them asks for them, so that every
    command that probes (``up``, ``check``, ``drift``) gathers the same facts. No replica:
    the role defaults'.

    Args:
        replicas: the replicas the probe serves.
        defaults: the preflight role's defaults (default: :func:`load_defaults`).

    Raises:
        ProvisionError: the role defaults cannot be read.
    """
    found = load_defaults() if defaults is None else defaults
    every = [settings_for(replica, found) for replica in replicas] or [settings_for(None, found)]
    return ProbeOptions(nccl_loaded=any(s.nccl_loaded for s in every),
                        sha256=any(s.model_sha256 for s in every),
                        reach_timeout_s=every[0].reach_timeout_s)
