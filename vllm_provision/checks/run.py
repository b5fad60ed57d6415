"""Run every preflight check of every replica: settings from the role defaults and inventory.

``run_checks(inventory, facts)`` is the one entry point used by ``provision check`` and the
``vllm_preflight`` task of ``provision up``; it is pure (facts in, findings out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from vllm_provision import settings
from vllm_provision.checks import (
    fabric,
    gpu_health,
    memory,
    network,
    ownership,
    parity,
    platform,
    topology,
)
from vllm_provision.checks import host as host_checks
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory, Node, Replica
from vllm_provision.facts.gather import ProbeOptions, host_var
from vllm_provision.facts.model import HostFacts
from vllm_provision.settings import node_settings, replica_settings, watchdog_port

SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.OK: 2}


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
    gpu_overhead_mib: int = memory.DEFAULT_OVERHEAD_MIB

    def probe_options(self) -> ProbeOptions:
        """The probe options these settings ask for."""
        return ProbeOptions(nccl_loaded=self.nccl_loaded, sha256=self.model_sha256,
                            reach_timeout_s=self.reach_timeout_s)


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


def shared_pool_wait(replica: Replica) -> float | None:
    """``vllm_gpu_wait_timeout_s`` when the replica's ``vllm_gpu_pool`` is ``shared``, else None
    (docs/preflight.md, "Shared GPU pool")."""
    values = settings.replica_settings(replica)
    if values["vllm_gpu_pool"] != "shared":
        return None
    return float(values["vllm_gpu_wait_timeout_s"])


def is_skipped(check: str, skip: Iterable[str]) -> bool:
    """True when ``check`` equals a skip name or starts with ``<name>.`` (``parity`` skips all)."""
    return any(check == name or check.startswith(name + ".") for name in skip)


def _ports(replica: Replica, rank: int) -> list[tuple[int, str]]:
    return replica.backend_type.listen_ports(replica, rank)


def own_units(replica: Replica, node: Node, facts: HostFacts,
              watchdog_unit: str) -> tuple[list[str], list[str]]:
    """``(planned, leaving)``: the units of this plan on ``node`` (its backend's
    ``node_units``), and the units the host's state record lists that this plan does not have
    (pure).

    Only these may hold the node's ports and GPUs. A unit that is leaving counts only because
    ``provision up`` stops it before anything starts (``vllm_provision.state.prune``, the play
    before
    the install plays), not because it is ours: a unit of the same name that no record of ours
    lists is another job's.
    """
    from vllm_provision.state.prune import unit_names

    planned = list(replica.backend_type.node_units(replica, node, node.host.vars))
    owner = facts.owner
    if owner is None:
        return planned, []
    recorded = owner.units if owner.units is not None else tuple(
        u for u in unit_names(owner.files) if u != watchdog_unit)
    return planned, [u for u in recorded if u not in planned]


def device_counts(facts: Mapping[str, HostFacts], device: str) -> dict[str, int]:
    """Devices per host the topology checks count: GPUs (nvidia-smi), or CPU cores for ``cpu``.

    vLLM's CPU build runs one worker per rank, each bound to its own cores
    (``VLLM_CPU_OMP_THREADS_BIND``, vllm/v1/worker/cpu_worker.py), so a node can hold at most
    as many ranks as it has logical CPUs.
    """
    if device == "cpu":
        return {name: f.cpu_count or 0 for name, f in facts.items()}
    return {name: len(f.gpus) for name, f in facts.items()}


def check_replica(replica: Replica, facts: Mapping[str, HostFacts],
                  settings: PreflightSettings) -> list[Finding]:
    """Every check for one replica (topology, placement, parity, pins, network, host).

    Args:
        replica: the replica.
        facts: facts by host name (nodes without facts get no node-level findings).
        settings: merged preflight settings.
    """
    values = replica_settings(replica)
    device = str(values["vllm_device"])
    gpu_counts = device_counts(facts, device)
    findings = topology.check_topology(replica, gpu_counts)
    findings += replica.backend_type.check_replica(replica, facts, settings)
    findings += parity.check_parity(replica, facts, settings.parity)
    pins = {name: values.get(name) for name in parity.PINS}
    findings += parity.check_pins(replica, facts, pins)
    findings += parity.check_driver_minimum(replica, facts)
    interface = values.get("vllm_cluster_interface")
    findings += network.check_host_ip_unique(replica)
    findings += network.check_routes(replica, facts, interface)
    meeting = replica.backend_type.rendezvous(replica)
    if meeting is not None:
        findings += network.check_reachability(replica, facts, *meeting)
    findings += fabric.check_mtu(replica, facts, interface)
    findings += fabric.check_rdma(replica, facts)
    findings += fabric.check_peer_reach(replica, facts)
    if device != "cpu":
        findings += memory.check_memory_fit(replica, facts, settings.gpu_overhead_mib)[0]
    model_bytes = 0
    master_facts = facts.get(replica.master.name)
    if master_facts is not None and master_facts.model_files:
        model_bytes = sum(f.size for f in master_facts.model_files)
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None:
            continue
        node_interface = node_settings(replica, node).get("vllm_cluster_interface")
        findings += network.check_interface(node, f, node_interface)
        findings += network.check_exposure(node, f, replica, node_interface)
        findings += network.check_hostname(node, f)
        planned, leaving = own_units(replica, node, f, settings.watchdog_unit)
        findings += network.check_ports(node, f, _ports(replica, node.rank), planned,
                                        leaving=leaving)
        findings += network.check_watchdog_port(
            node, f, watchdog_port(replica, node),
            settings.watchdog_unit)
        if device == "cpu":
            findings += host_checks.check_cpu_device(node, f)
        else:
            findings += host_checks.check_gpus_visible(node, f)
            findings += host_checks.check_foreign_gpu_processes(
                node, f, planned, shared_pool_wait(replica), leaving=leaving)
            used = topology.local_world_size(replica)
            findings += gpu_health.check_gpu_errors(node, f, used)
            findings += gpu_health.check_mig(node, f, used)
            findings += gpu_health.check_persistence(node, f, used)
            findings += gpu_health.check_fabric_manager(node, f)
        findings += gpu_health.check_clock(node, f)
        findings += host_checks.check_venv(node, f, str(host_var(node.host, "vllm_venv")),
                                           replica.backend)
        findings += host_checks.check_shm(node, f, settings.min_shm_mib)
        findings += host_checks.check_remove_ipc(node, f)
        findings += host_checks.check_model_present(node, f)
        findings += host_checks.check_memory(node, f, model_bytes // max(1, replica.nnodes))
        findings += platform.check_platform(node, f)
    return findings


def memory_estimates(replicas: Iterable[Replica], facts: Mapping[str, HostFacts],
                     defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Replica name -> its memory estimate as JSON (:mod:`vllm_provision.checks.memory`), or
    ``{"skipped": why}``; CPU replicas are left out. For ``provision check --json`` and
    ``provision facts --json``."""
    out: dict[str, Any] = {}
    for replica in replicas:
        if replica_settings(replica)["vllm_device"] == "cpu":
            continue
        settings = settings_for(replica, defaults)
        try:
            out[replica.name] = memory.estimate(replica, facts,
                                                settings.gpu_overhead_mib).to_json()
        except memory.CannotEstimate as exc:
            out[replica.name] = {"skipped": str(exc)}
    return out


def unreachable_findings(errors: Mapping[str, ProvisionError]) -> list[Finding]:
    """One ``facts`` error per host whose facts could not be gathered."""
    findings = []
    for name, error in errors.items():
        problem = error.problems[0] if error.problems else None
        findings.append(Finding(
            "facts", Severity.ERROR, name, "facts",
            expected="facts gathered over SSH",
            actual=(problem.message + (f": {problem.actual}" if problem and problem.actual
                                       else "")) if problem else str(error),
            fix=(problem.fix if problem and problem.fix else
                 f"check SSH access to {name} (provision facts -i INVENTORY --limit {name})")))
    return findings


def run_checks(inventory: Inventory, facts: Mapping[str, HostFacts],
               errors: Mapping[str, ProvisionError] | None = None,
               skip: Sequence[str] = (), replicas: Sequence[Replica] | None = None,
               defaults: Mapping[str, Any] | None = None) -> list[Finding]:
    """Run all checks on the replicas and return findings sorted by severity, then host.

    Args:
        inventory: the inventory.
        facts: facts by host name.
        errors: hosts whose facts could not be gathered (each becomes an error finding).
        skip: check names or prefixes to leave out (``--skip-check``), besides each replica's
            ``preflight_skip_checks``.
        replicas: the replicas to check (default: all of the inventory).
        defaults: role defaults (default: read ``roles/preflight/defaults/main.yml``).
    """
    from vllm_provision.checks import stack as stack_checks
    from vllm_provision.stack.lock import replica_locks
    from vllm_provision.state import inventory_identity

    defaults = load_defaults() if defaults is None else defaults
    findings = unreachable_findings(errors or {})
    identity = inventory_identity(inventory.path)
    locks = replica_locks(inventory)
    for replica in inventory.replicas if replicas is None else replicas:
        settings = settings_for(replica, defaults)
        skipped = (*skip, *settings.skip_checks)
        owners = {node.name: facts[node.name].owner for node in replica.nodes
                  if node.name in facts}
        found = (check_replica(replica, facts, settings)
                 + ownership.check_ownership(replica, owners, identity))
        if replica.name in locks:
            found += stack_checks.check_lock(replica, facts, locks[replica.name])
        findings += [replace(f, replica=replica.name) for f in found
                     if not is_skipped(f.check, skipped)]
    findings = [f for f in findings if not is_skipped(f.check, skip)]
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.check, f.host))


def findings_of(replica: Replica, findings: Iterable[Finding]) -> list[Finding]:
    """The findings that belong to ``replica``: those its own checks made (``replica`` set to
    its name, replica-wide ``*`` findings included), and host-level findings made outside any
    replica's checks (``replica`` empty, e.g. facts that could not be gathered) on a host that
    is one of its nodes. A finding of another replica never belongs to it, so one replica's
    error does not fail the others.
    """
    nodes = {node.name for node in replica.nodes}
    return [f for f in findings
            if f.replica == replica.name or (not f.replica and f.host in nodes)]


def has_errors(findings: Iterable[Finding]) -> bool:
    """True when any finding is an error."""
    return any(f.severity is Severity.ERROR for f in findings)
