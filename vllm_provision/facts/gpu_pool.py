"""Who holds the GPUs a replica needs, and waiting until all of them are free at once.

A shared GPU pool (``vllm_gpu_pool: shared``, docs/preflight.md "Shared GPU pool") has other
jobs come and go on the replica's GPUs. An mp replica needs every node's GPUs at the same moment:
a node started while another node's GPUs are held sits on its own GPUs waiting for a peer that
cannot load (vLLM's worker refuses a GPU with too little free memory,
``vllm/v1/worker/gpu_worker.py``, "Free memory on device ... is less than desired GPU memory
utilization"). This module reads the holders with ``nvidia-smi --query-compute-apps`` and
``/proc/<pid>/cgroup`` (one command per node) and decides, purely, whether the replica may start.

Pure parts: :func:`parse_holders`, :func:`foreign_holders`, :func:`describe`,
:func:`wait_until_free`. I/O: :data:`HOLDERS_COMMAND` (run by the caller on each node).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.facts import parsers

# One fixed command (no inventory value in it): the GPUs' index and uuid, the compute apps, and
# each app's cgroup (the holder's systemd unit, systemd.unit(5) / cgroups(7)). A missing
# nvidia-smi exits 3 so the caller can tell "no GPU tool" from "no holder".
HOLDERS_COMMAND = (
    "command -v nvidia-smi >/dev/null || exit 3; "
    "echo '== gpus'; nvidia-smi --query-gpu=index,uuid --format=csv,noheader || exit 3; "
    "apps=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid "
    "--format=csv,noheader,nounits) || exit 3; "
    "echo '== apps'; printf '%s\\n' \"$apps\"; "
    "for pid in $(printf '%s\\n' \"$apps\" | cut -d, -f1); do "
    "case $pid in ''|*[!0-9]*) continue;; esac; "
    "echo \"== cgroup $pid\"; cat /proc/$pid/cgroup 2>/dev/null; done; true"
)


class GpusHeld(ProvisionError):
    """:func:`wait_until_free` ran out of time; ``problems[0]`` names every holder."""


@dataclass(frozen=True)
class Holder:
    """One process holding one GPU of a node.

    Attributes:
        host: the inventory host name. gpu: the GPU index (nvidia-smi's ``index``; -1 when its
            uuid is not among the node's GPUs). pid: the process id on that host.
        process_name: as nvidia-smi reports it. used_memory_mib: MiB held (None: ``[N/A]``).
        unit: the systemd unit of the pid (``/proc/<pid>/cgroup``), ``""`` when none or gone.
    """

    host: str
    gpu: int
    pid: int
    process_name: str
    used_memory_mib: int | None
    unit: str

    def describe(self) -> str:
        """``h2 GPU 0: pid 75 python3 (120000 MiB) in unit vllm-lab-occupy-0.service``."""
        memory = f" ({self.used_memory_mib} MiB)" if self.used_memory_mib is not None else ""
        unit = f" in unit {self.unit}" if self.unit else " (no systemd unit)"
        gpu = f"GPU {self.gpu}" if self.gpu >= 0 else "a GPU"
        return f"{self.host} {gpu}: pid {self.pid} {self.process_name}{memory}{unit}"


def parse_holders(host: str, text: str) -> list[Holder]:
    """Parse :data:`HOLDERS_COMMAND`'s output into one :class:`Holder` per process and GPU.

    Args:
        host: the inventory name the output came from.
        text: stdout: ``== gpus`` (``index, uuid`` rows), ``== apps`` (``pid, process_name,
            used_memory, gpu_uuid`` rows, nounits), ``== cgroup PID`` blocks.

    Returns:
        The holders, in nvidia-smi's order; a pid whose cgroup could not be read has unit ``""``.
    """
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            sections.setdefault(current, [])
        elif current:
            sections[current].append(line)
    indexes: dict[str, int] = {}
    for row in sections.get("gpus", []):
        parts = [p.strip() for p in row.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            indexes[parts[1]] = int(parts[0])
    holders = []
    for proc in parsers.parse_compute_apps_csv("\n".join(sections.get("apps", []))):
        unit = parsers.unit_from_cgroup("\n".join(sections.get(f"cgroup {proc.pid}", [])))
        holders.append(Holder(host, indexes.get(proc.gpu_uuid, -1), proc.pid, proc.process_name,
                              proc.used_memory_mib, unit))
    return holders


def foreign_holders(holders: Iterable[Holder], used_gpus: Collection[int],
                    own_units: Sequence[str]) -> list[Holder]:
    """The holders that keep the replica from starting on a node.

    Args:
        holders: one node's :func:`parse_holders`.
        used_gpus: the indexes of the GPUs the replica uses on the node
            (``Replica.node_gpus``): its ``vllm_gpus``, else the first local-world-size ones,
            where vLLM places its local ranks (docs/preflight.md, "Used GPUs").
        own_units: units of this replica (``vllm.service``, Ray's units): never foreign.

    Returns:
        Holders on a used GPU (or on a GPU whose index is unknown) that are not in our units.
    """
    return [h for h in holders if (h.gpu < 0 or h.gpu in used_gpus)
            and not (h.unit and h.unit in own_units)]


def describe(holders: Sequence[Holder], limit: int = 8) -> str:
    """The holders as one ``; ``-separated line (at most ``limit``, then ``and N more``)."""
    text = "; ".join(h.describe() for h in holders[:limit])
    if len(holders) > limit:
        text += f"; and {len(holders) - limit} more"
    return text


def wait_until_free(observe: Callable[[], list[Holder]], *, timeout_s: float, where: str,
                    poll_s: float = 2.0,
                    progress: Callable[[list[Holder], float], None] | None = None,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> float:
    """Poll until ``observe()`` finds no foreign holder on any node, in one observation.

    One observation reads every node (the caller's ``observe``), so "free" means every node's
    GPUs were free at (nearly) the same moment, not one node after the other.

    Args:
        observe: returns the foreign holders of every node now.
        timeout_s: seconds to wait in all (``vllm_gpu_wait_timeout_s``); 0 checks once.
        where: the replica, for the error.
        poll_s: seconds between observations.
        progress: called with the holders and the seconds waited after every observation that
            found one (the caller prints a line naming them).
        clock, sleep: injectable time.

    Returns:
        Seconds waited (0.0 when free at the first observation).

    Raises:
        GpusHeld: still held after ``timeout_s``, naming every holder (host, GPU, pid,
            process, memory, unit).
    """
    started = clock()
    while True:
        held = observe()
        waited = clock() - started
        if not held:
            return round(waited, 3)
        if waited >= timeout_s:
            raise GpusHeld([Problem(
                where, f"the GPUs of every node were not free at the same time within "
                       f"{timeout_s:g} s (vllm_gpu_pool: shared)",
                expected="no process outside this replica's units on its GPUs",
                actual=describe(held),
                fix="wait for or stop those jobs (the unit names them), or raise "
                    "vllm_gpu_wait_timeout_s")])
        if progress is not None:
            progress(held, waited)
        sleep(max(0.0, min(poll_s, timeout_s - waited)))
