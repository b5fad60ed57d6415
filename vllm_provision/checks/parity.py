"""Parity: the nodes of one replica must run an identical execution environment.

vLLM docs (``serving/parallelism_scaling.md``): "Ensure that every node provides an identical
execution environment, including the model path and Python packages." Ray refuses a node whose
Ray or Python version differs (``Version mismatch``, ray #50511); NCCL hangs or reports "Message
truncated" across different NCCL versions or settings (NVIDIA/nccl #354, #1328, #1273).
Each item's severity comes from the policy (``roles/preflight/defaults/main.yml``,
``preflight_parity``), overridable in the inventory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_provision import settings
from vllm_provision.checks.context import ReplicaScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Replica
from vllm_provision.facts.model import HostFacts, first_different_file

# NVIDIA CUDA minor-version compatibility: minimum driver branch per CUDA major
# (docs.nvidia.com/deploy/cuda-compatibility: "CUDA 12.x >= 525", "CUDA 13.x >= 580").
CUDA_MIN_DRIVER: Mapping[int, int] = {11: 450, 12: 525, 13: 580}
SEVERITIES: Mapping[str, Severity | None] = {
    "error": Severity.ERROR, "warning": Severity.WARNING, "off": None, "ignore": None,
}


@dataclass(frozen=True)
class ParityItem:
    """One value that must be equal on every node.

    Attributes:
        key: policy key and check-name suffix (``nccl`` -> ``parity.nccl``).
        label: words for the finding's item (``"NCCL version"``).
        read: facts -> comparable text (None when unknown or absent).
        fix: template for the fix; ``{host}``, ``{want}``, ``{venv}``, ``{package}``, ``{master}``,
            ``{model}`` (the replica's model path).
        ray_only: compared only for Ray replicas.
        source: where the rule comes from.
    """

    key: str
    label: str
    read: Callable[[HostFacts], str | None]
    fix: str
    ray_only: bool = False
    source: str = "vLLM docs serving/parallelism_scaling.md (identical execution environment)"


def _package(name: str) -> Callable[[HostFacts], str | None]:
    return lambda facts: facts.packages.get(name)


def _manifest(facts: HostFacts) -> str | None:
    if facts.model_files is None:
        return None
    return f"{len(facts.model_files)} files, {sum(f.size for f in facts.model_files)} bytes"


def _content(facts: HostFacts) -> str | None:
    if facts.model_content is None or not facts.model_content.digest:
        return None
    return facts.model_content.digest[:12]


def _driver_branch(facts: HostFacts) -> str | None:
    return facts.driver_version.split(".")[0] if facts.driver_version else None


def _nccl_env(facts: HostFacts) -> str | None:
    return " ".join(f"{k}={v}" for k, v in sorted(facts.nccl_env.items())) or "(none)"


def _nccl_conf(facts: HostFacts) -> str | None:
    if facts.nccl_conf is None:
        return "(no /etc/nccl.conf)"
    lines = [line.strip() for line in facts.nccl_conf.splitlines()
             if line.strip() and not line.strip().startswith("#")]
    return "; ".join(lines) or "(empty)"


def _plugins(facts: HostFacts) -> str | None:
    return ", ".join(sorted(p.rsplit("/", 1)[-1] for p in facts.nccl_net_plugins)) or "(none)"


_PIP_FIX = "install {package}=={want} in {venv} on {host}, or pin every node to the same version"


def _pip_item(package: str, label: str, **kwargs: Any) -> ParityItem:
    """The item for the version of the pip package ``package`` in the venv: keyed by its name,
    fixed by installing the same version (:data:`_PIP_FIX`); ``kwargs`` as :class:`ParityItem`'s.
    """
    return ParityItem(package, label, _package(package), _PIP_FIX.replace("{package}", package),
                      **kwargs)


ITEMS: tuple[ParityItem, ...] = (
    _pip_item("vllm", "vLLM version"),
    _pip_item("torch", "torch version (with CUDA build)"),
    ParityItem("torch_cuda", "torch CUDA build", lambda f: f.torch_cuda,
               "install the {want} build of torch in {venv} on {host}"),
    ParityItem("nccl", "NCCL version", lambda f: f.nccl_version, _PIP_FIX,
               source="NVIDIA/nccl #354, #1328 (NCCL must match on every rank)"),
    _pip_item("ray", "Ray version", ray_only=True, source="Ray: Version mismatch (ray #50511)"),
    ParityItem("python", "Python version", lambda f: f.python_micro or None,
               "rebuild {venv} on {host} with Python {want} (as on {master})",
               source="Ray compares Python to the patch level (ray #50511); pickles cross nodes"),
    _pip_item("transformers", "transformers version"),
    ParityItem("gpu_model", "GPU model", lambda f: f.gpu_model,
               "use the same GPU model on every node of the replica",
               source="GPUStack mp prerequisite: same number and model of GPUs"),
    ParityItem("gpu_count", "GPU count", lambda f: str(len(f.gpus)) if f.gpus else None,
               "use nodes with the same number of GPUs ({want} as on {master}), or list as "
               "many in each node's vllm_gpus",
               source="GPUStack mp prerequisite: same number and model of GPUs"),
    ParityItem("model_manifest", "model files", _manifest,
               "copy the model to the same path on {host} (same files and sizes as on {master})",
               source="vLLM docs parallelism_scaling.md (same model path); vllm #2289"),
    ParityItem("model_content", "model content", _content,
               "copy the model folder {model} from {master} to {host} (rsync -a --delete from "
               "the one node whose copy is right), so every node loads the same revision",
               source="vLLM docs parallelism_scaling.md (identical environment); safetensors "
                      "docs, Format (the header holds every tensor's dtype, shape, offsets)"),
    ParityItem("driver_branch", "NVIDIA driver branch", _driver_branch,
               "install the {want} driver branch on {host} (as on {master})",
               source="NCCL: every rank of a communicator runs the same version (vllm #4114)"),
    ParityItem("driver_patch", "NVIDIA driver version", lambda f: f.driver_version,
               "align the driver on {host} with {master} ({want}) at the next maintenance",
               source="vllm #4114 (patch differences are common; warn)"),
    ParityItem("nccl_env", "NCCL_* settings", _nccl_env,
               "set the same NCCL_* variables on {host} as on {master}",
               source="NVIDIA/nccl #1273 (configuration mismatch between nodes)"),
    ParityItem("nccl_conf", "/etc/nccl.conf", _nccl_conf,
               "make /etc/nccl.conf on {host} equal to {master}'s",
               source="NCCL 2.0.5 release notes (/etc/nccl.conf); NVIDIA/nccl #1273"),
    ParityItem("nccl_net_plugin", "NCCL net plugin", _plugins,
               "install (or remove) the same libnccl-net plugin on {host} as on {master}",
               source="NVIDIA/nccl #1634 (plugin present on only some nodes)"),
)
ITEM_KEYS = tuple(item.key for item in ITEMS)


def _severity(policy: Mapping[str, str], key: str) -> Severity | None:
    return SEVERITIES.get(str(policy.get(key, "error")).lower(), Severity.ERROR)


def _missing_files(master: HostFacts, other: HostFacts) -> str:
    if master.model_files is None or other.model_files is None:
        return ""
    mine = {f.name: f for f in master.model_files}
    theirs = {f.name: f for f in other.model_files}
    parts = []
    missing = sorted(set(mine) - set(theirs))
    extra = sorted(set(theirs) - set(mine))
    differ = sorted(n for n in set(mine) & set(theirs)
                    if (mine[n].size, mine[n].sha256) != (theirs[n].size, theirs[n].sha256))
    if missing:
        parts.append("missing " + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
    if extra:
        parts.append("extra " + ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else ""))
    if differ:
        parts.append("different " + ", ".join(
            f"{n} ({theirs[n].size} vs {mine[n].size} bytes)" for n in differ[:5]))
    return "; ".join(parts)


def _content_difference(master: HostFacts, other: HostFacts) -> str:
    """Why ``other``'s model content differs from the master's: the first file whose hash
    differs (or that one node lacks), or the files a node could not fingerprint; ``""`` when
    both fingerprints are equal and complete."""
    mine, theirs = master.model_content, other.model_content
    if mine is None or theirs is None:
        return ""  # the model path is missing: model_manifest says it
    unread = [f"{node.host} could not read {'; '.join(c.errors[:2])}"
              for node, c in ((other, theirs), (master, mine)) if c.errors]
    name = first_different_file(mine.files, theirs.files)
    if name is None:
        return "; ".join(unread)
    what = ("header and data samples of " if name.endswith(".safetensors") else "") + name
    if name not in theirs.files:
        first = f"first difference: {name} is not fingerprinted on {other.host}"
    elif name not in mine.files:
        first = f"first difference: {name} is not fingerprinted on {master.host}"
    else:
        first = (f"first difference: {what} ({theirs.files[name][:12]} on {other.host}, "
                 f"{mine.files[name][:12]} on {master.host})")
    return "; ".join([first, *unread])


def check_parity(replica: Replica, facts: Mapping[str, HostFacts],
                 policy: Mapping[str, str]) -> list[Finding]:
    """Compare every parity item of every node with the master's (rank 0) value.

    Args:
        replica: the replica.
        facts: facts by host name (nodes without facts are skipped).
        policy: item key -> ``error`` | ``warning`` | ``off`` (missing keys: ``error``).

    Returns:
        One finding per differing node and item (naming both hosts and values and the fix),
        and one ``ok`` finding per item that matches everywhere.
    """
    nodes = [node for node in replica.nodes if node.name in facts]
    if len(nodes) < 2:
        return []
    master = facts[nodes[0].name]
    venv = str(settings.replica_settings(replica)["vllm_venv"])
    findings: list[Finding] = []
    manifest_on = _severity(policy, "model_manifest") is not None
    for item in ITEMS:
        severity = _severity(policy, item.key)
        if severity is None or (item.ray_only and not replica.backend_type.ray_cluster):
            continue
        if item.key == "driver_patch":
            branches = {_driver_branch(facts[n.name]) for n in nodes}
            if len(branches) > 1:
                continue  # the branch finding already says it
        want = item.read(master)
        differing = False
        for node in nodes[1:]:
            other = facts[node.name]
            got = item.read(other)
            if item.key == "model_manifest":
                detail = _missing_files(master, other)
                if got == want and not detail:
                    continue
                got = (f"{got}: {detail}" if detail and got else
                       "model path missing" if got is None else got)
            elif item.key == "model_content":
                if manifest_on and (_manifest(other) != _manifest(master)
                                    or _missing_files(master, other)):
                    continue  # the model_manifest finding already says it
                detail = _content_difference(master, other)
                if not detail:
                    continue
                got = f"{got or 'nothing fingerprinted'}: {detail}"
            elif got == want:
                continue
            differing = True
            package = other.nccl_package if item.key == "nccl" else ""
            findings.append(Finding(
                f"parity.{item.key}", severity, node.name, item.label,
                expected=f"{want if want is not None else 'absent'} (as on {master.host})",
                actual=f"{got if got is not None else 'absent'} (on {node.name})",
                fix=item.fix.format(host=node.name, want=want, venv=venv, package=package,
                                    master=master.host, model=replica.engine.model),
                source=item.source))
        if not differing:
            findings.append(Finding(f"parity.{item.key}", Severity.OK, "*", item.label,
                                    expected="equal on all nodes",
                                    actual=str(want) if want is not None else "absent everywhere",
                                    source=item.source))
    return findings


PINS: Mapping[str, tuple[str, str, Callable[[HostFacts], str | None]]] = {
    "vllm_version": ("vLLM version", "vllm", _package("vllm")),
    "torch_version": ("torch version", "torch", _package("torch")),
    "nccl_version": ("NCCL version", "", lambda f: f.nccl_version),
    "ray_version": ("Ray version", "ray", _package("ray")),
}


def check_pins(replica: Replica, facts: Mapping[str, HostFacts],
               pins: Mapping[str, str | None]) -> list[Finding]:
    """Every node runs the versions pinned in the inventory (``vllm_version`` ...).

    Args:
        replica: the replica.
        facts: facts by host name.
        pins: pin variable -> wanted version (None or absent: not pinned).
    """
    venv = str(settings.replica_settings(replica)["vllm_venv"])
    findings = []
    for variable, (label, package, read) in PINS.items():
        want = pins.get(variable)
        if not want or (variable == "ray_version" and not replica.backend_type.ray_cluster):
            continue
        for node in replica.nodes:
            if node.name not in facts:
                continue
            got = read(facts[node.name])
            name = package or facts[node.name].nccl_package
            if got == str(want):
                findings.append(Finding(f"pins.{package or 'nccl'}", Severity.OK, node.name,
                                        label, expected=str(want), actual=got))
                continue
            findings.append(Finding(
                f"pins.{package or 'nccl'}", Severity.ERROR, node.name, label,
                expected=f"{want} ({variable})", actual=got or "not installed",
                fix=f"install {name}=={want} in {venv} on {node.name}, or change {variable}",
                source="inventory pin"))
    return findings


def _major(version: str | None) -> int | None:
    match = re.match(r"([0-9]+)", version or "")
    return int(match.group(1)) if match else None


@check("parity.driver_minimum", order=50, scope="replica", reads=("replica", "facts"))
def check_driver_minimum(replica: Replica, facts: Mapping[str, HostFacts]) -> list[Finding]:
    """Each node's driver meets the minimum for torch's CUDA major (12.x >= 525, 13.x >= 580).

    Source: NVIDIA CUDA compatibility guide (minor-version compatibility table); vLLM >= 0.20
    ships CUDA 13 wheels by default, so a 570 driver cannot run them (vLLM's GPU installation
    docs).
    """
    from vllm_provision.facts.parsers import cuda_major_of_build

    findings = []
    for node in replica.nodes:
        f = facts.get(node.name)
        if f is None or not f.driver_version:
            continue
        cuda_major = cuda_major_of_build(f.torch_cuda)
        if cuda_major is None or cuda_major not in CUDA_MIN_DRIVER:
            continue
        minimum, branch = CUDA_MIN_DRIVER[cuda_major], _major(f.driver_version)
        if branch is not None and branch < minimum:
            findings.append(Finding(
                "driver.minimum", Severity.ERROR, node.name, "NVIDIA driver for CUDA "
                f"{cuda_major}", expected=f">= {minimum} (torch {f.torch_cuda})",
                actual=f.driver_version,
                fix=f"install driver branch >= {minimum} on {node.name}, or a torch built for "
                    "the CUDA the driver supports (e.g. --torch-backend=cu129)",
                source="NVIDIA CUDA compatibility: CUDA 12.x >= 525, 13.x >= 580"))
        else:
            findings.append(Finding("driver.minimum", Severity.OK, node.name,
                                    f"NVIDIA driver for CUDA {cuda_major}",
                                    expected=f">= {minimum}", actual=f.driver_version))
    return findings


# -- checks that read their scope (checks/context.py) -----------------------------------

@check("parity.parity", order=30, scope="replica")
def _parity(scope: ReplicaScope) -> list[Finding]:
    """The same versions on every node (``preflight_parity``); GPU model and count of the
    GPUs each node gives the replica (its ``vllm_gpus``: ``context.gpu_view``)."""
    from vllm_provision.checks.context import gpu_view

    return check_parity(scope.replica, gpu_view(scope.replica, scope.facts),
                        scope.settings.parity)


@check("parity.pins", order=40, scope="replica")
def _pins(scope: ReplicaScope) -> list[Finding]:
    """The pinned versions (:data:`PINS`) where the inventory sets them."""
    pins = {name: scope.values.get(name) for name in PINS}
    return check_pins(scope.replica, scope.facts, pins)


