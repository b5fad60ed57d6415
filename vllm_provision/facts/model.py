"""Typed, frozen records of what one probe found on one host (``HostFacts`` and its parts)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi --query-gpu`` lists it.

    Attributes:
        index: nvidia-smi index (0-based, PCI order unless ``CUDA_DEVICE_ORDER`` says otherwise).
        name: product name (``"NVIDIA H100 80GB HBM3"``).
        memory_total_mib: framebuffer size in MiB.
        uuid: ``GPU-...`` identifier, stable across reboots.
        pci_bus_id: ``00000000:18:00.0``; empty when not queried.
        memory_used_mib: framebuffer in use, MiB (``memory.used``), None when unknown.
        ecc_uncorrected: lifetime uncorrectable ECC errors
            (``ecc.errors.uncorrected.aggregate.total``), None when ECC is off or unsupported.
        persistence_mode: True when ``persistence_mode`` is ``Enabled``, None when unknown.
        mig_mode: True when ``mig.mode.current`` is ``Enabled``, None when unsupported.
    """

    index: int
    name: str
    memory_total_mib: int | None
    uuid: str
    pci_bus_id: str = ""
    memory_used_mib: int | None = None
    ecc_uncorrected: int | None = None
    persistence_mode: bool | None = None
    mig_mode: bool | None = None

    @property
    def pci_key(self) -> str:
        """``domain:bus:device`` in lower case without leading domain zeros (``0:18:00``), the
        form both ``pci.bus_id`` (``00000000:18:00.0``) and kernel Xid lines
        (``PCI:0000:18:00``) reduce to."""
        return pci_key(self.pci_bus_id)


def pci_key(bus_id: str) -> str:
    """Normalise a PCI address (``00000000:18:00.0``, ``0000:18:00``) to ``0:18:00``; ``""``
    when it is not one."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) < 3 or not all(parts[:3]):
        return ""
    try:
        domain = int(parts[0], 16)
    except ValueError:
        return ""
    return f"{domain:x}:{parts[1]}:{parts[2].split('.')[0]}"


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid`` line of the kernel log (NVIDIA "Xid Errors" catalogue).

    Attributes:
        pci: the GPU's PCI address as the line prints it (``0000:18:00``).
        code: the Xid number (``79``: fallen off the bus; ``48``: double-bit ECC; ...).
        line: the log line, shortened to 200 characters.
    """

    pci: str
    code: int
    line: str


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device (``/sys/class/infiniband/<dev>/ports/<n>``).

    Attributes:
        device: ``mlx5_0``.
        port: port number (1-based).
        state: ``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED`` (from ``state``: ``4: ACTIVE``).
        link_layer: ``InfiniBand`` or ``Ethernet`` (RoCE).
        firmware: the device's ``fw_ver``.
        rate: ``rate`` text (``400 Gb/sec (4X NDR)``), ``""`` when unreadable.
    """

    device: str
    port: int
    state: str
    link_layer: str = ""
    firmware: str = ""
    rate: str = ""

    @property
    def active(self) -> bool:
        """True when the port can carry traffic (state ``ACTIVE``)."""
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class ClockSync:
    """Clock synchronisation as ``timedatectl show`` and ``chronyc tracking`` report it.

    Attributes:
        ntp_enabled: ``NTP=yes`` (a sync service is enabled), None when unknown.
        synchronized: ``NTPSynchronized=yes``, None when unknown.
        offset_s: chrony's current ``System time`` offset, seconds (negative: slow), None
            when chrony is not running.
        source: ``chrony``, ``timedatectl`` or ``""`` (nothing answered).
        container: the container manager from ``/run/systemd/container`` (``systemd-nspawn``,
            ``docker``), ``""`` on a host of its own; a container's clock is its host's.
    """

    ntp_enabled: bool | None = None
    synchronized: bool | None = None
    offset_s: float | None = None
    source: str = ""
    container: str = ""


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a GPU (``nvidia-smi --query-compute-apps``).

    Attributes:
        pid: process id on the host.
        process_name: executable name or path as nvidia-smi reports it.
        used_memory_mib: GPU memory held, MiB (None when nvidia-smi says ``[N/A]``).
        gpu_uuid: the GPU it runs on.
        unit: the systemd unit owning the pid (from ``/proc/<pid>/cgroup``), or ``""``.
    """

    pid: int
    process_name: str
    used_memory_mib: int | None
    gpu_uuid: str
    unit: str = ""


@dataclass(frozen=True)
class Interface:
    """A network interface from ``ip -j addr``/``ip -j link``.

    Attributes:
        name: ``eth0``.
        state: ``operstate`` (``UP``, ``DOWN``, ``UNKNOWN``, ...).
        flags: link flags (``UP``, ``LOWER_UP``, ...).
        addresses: IPv4/IPv6 addresses without prefix length.
        mtu: MTU in bytes.
        speed_mbps: link speed from ``/sys/class/net/<name>/speed`` in Mb/s, None when
            unknown (virtual links, link down).
    """

    name: str
    state: str
    flags: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    mtu: int | None = None
    speed_mbps: int | None = None

    @property
    def is_up(self) -> bool:
        """True when the link is administratively up and has carrier (or state is UP)."""
        return self.state == "UP" or ("UP" in self.flags and "LOWER_UP" in self.flags)


@dataclass(frozen=True)
class Route:
    """The kernel's route to one peer (``ip -j route get <peer>``): device and source address."""

    peer: str
    dev: str = ""
    src: str = ""
    error: str = ""


@dataclass(frozen=True)
class ListeningSocket:
    """A listening TCP socket from ``ss -Hltnp``.

    Attributes:
        address: local address (``0.0.0.0``, ``::``, ``10.0.0.1``, ``*``).
        port: TCP port.
        process: process name, ``""`` when ss could not tell (no root).
        pid: owning pid, or None.
        unit: systemd unit owning the pid, or ``""``.
    """

    address: str
    port: int
    process: str = ""
    pid: int | None = None
    unit: str = ""


@dataclass(frozen=True)
class ModelFile:
    """One file of the model directory: path relative to it, size in bytes, optional sha256."""

    name: str
    size: int
    sha256: str = ""


@dataclass(frozen=True)
class ModelContent:
    """The model folder's content fingerprint, read on every node by the probe
    (``probe_script.model_content``; docs/preflight.md, "Model content").

    Attributes:
        digest: sha256 hex of the sorted ``name<TAB>sha256<LF>`` lines of ``files``
            (:func:`content_digest`); ``""`` when the folder holds
            none of those files.
        files: file name -> sha256 hex: ``config.json`` and ``model.safetensors.index.json``
            whole, each ``*.safetensors`` file vLLM loads by its header (the 8-byte length and
            the JSON) and four 64 KiB samples of its data.
        errors: files that could not be fingerprinted and why (a header over 100 MB, a JSON
            file over 64 MiB, unreadable); such a file is left out of ``files``.
        bytes_read: bytes the probe read for it.
    """

    digest: str = ""
    files: Mapping[str, str] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    bytes_read: int = 0


def content_digest(files: Mapping[str, str]) -> str:
    """The model fingerprint of per-file hashes (pure): sha256 hex of the sorted
    ``name<TAB>sha256<LF>`` lines; ``""`` for no file.

    Args:
        files: file name -> sha256 hex (:attr:`ModelContent.files`).
    """
    if not files:
        return ""
    lines = "".join(f"{name}\t{files[name]}\n" for name in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def first_different_file(want: Mapping[str, str], got: Mapping[str, str]) -> str | None:
    """The first file name, in sorted order, whose hash differs between ``want`` and ``got``
    or that only one of them holds; None when both are equal (pure).

    Args:
        want, got: file name -> sha256 hex (:attr:`ModelContent.files`, or the state record's
            ``model_content``).
    """
    for name in sorted(set(want) | set(got)):
        if want.get(name) != got.get(name):
            return name
    return None


@dataclass(frozen=True)
class ModelWeights:
    """What the master read of the model without loading it: config.json and the safetensors
    headers (``facts/weights.py`` builds it; ``checks/memory.py`` uses it).

    Attributes:
        config: the keys of config.json the memory estimate reads (``text_config`` keys of a
            multimodal model merged over the top level), ``{}`` when unreadable.
        files: safetensors files whose header was read.
        tensors: tensors in those headers.
        total_bytes: the sum of every tensor's stored size (``data_offsets`` end - begin).
        by_dtype: safetensors dtype (``BF16``, ``F8_E4M3``, ``I32``) -> stored bytes.
        groups: where a tensor goes when vLLM splits the model: ``embed``, ``lm_head``,
            ``layer.<N>`` (decoder layer N) or ``other`` (final norm, vision tower, ...) ->
            dtype -> stored bytes.
        errors: why a file could not be read (the estimate is then incomplete).
    """

    config: Mapping[str, Any] = field(default_factory=dict)
    files: int = 0
    tensors: int = 0
    total_bytes: int = 0
    by_dtype: Mapping[str, int] = field(default_factory=dict)
    groups: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServiceUser:
    """The account the vLLM unit runs as.

    Attributes:
        name: user name (``vllm``).
        exists: present in the passwd database.
        uid: its uid, when it exists.
        sys_uid_max: ``SYS_UID_MAX`` from ``/etc/login.defs`` (999 when absent).
    """

    name: str
    exists: bool
    uid: int | None = None
    sys_uid_max: int = 999

    @property
    def is_system(self) -> bool:
        """True for a system account (uid <= SYS_UID_MAX; login.defs(5))."""
        return self.uid is not None and self.uid <= self.sys_uid_max


@dataclass(frozen=True)
class Reachability:
    """Whether this host reached ``address:port`` over TCP during the probe.

    Attributes:
        address: the peer address tried.
        port: the TCP port.
        ok: a TCP connection was established.
        error: the last connect error when not ok (``"[Errno 111] Connection refused"``).
        elapsed_s: seconds until success or giving up.
    """

    address: str
    port: int
    ok: bool
    error: str = ""
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Listener:
    """The short-lived TCP listener the probe opened on the master for the reachability test.

    Attributes:
        address: bound address.
        port: TCP port.
        bound: the bind succeeded (False when something already listens there).
        accepted: peers (addresses) that connected while it listened.
        error: bind error text when not bound.
    """

    address: str
    port: int
    bound: bool
    accepted: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class VenvFound:
    """A Python virtual environment holding vLLM, found by the probe's venv search.

    Attributes:
        path: the environment's folder (``/opt/vllm``): ``vllm_venv``.
        vllm: the vLLM version its ``vllm-<version>.dist-info`` names.
    """

    path: str
    vllm: str


# systemd ActiveState values of a unit that runs or is about to (systemctl(1), "is-active").
RUNNING_STATES = frozenset({"active", "activating", "reloading"})


@dataclass(frozen=True)
class UnitStart:
    """What one unit on a host started from, and whether that process still runs.

    Attributes:
        unit: the unit name (``vllm.service``).
        invocation: the InvocationID the state record saw (systemd.exec(5)).
        files: installed file path -> sha256 hex that the unit's process started with.
        active_now: the unit's ActiveState when the probe ran (``active``, ``inactive``, ...).
        invocation_now: its InvocationID when the probe ran (``""`` when none).
    """

    unit: str
    invocation: str
    files: Mapping[str, str] = field(default_factory=dict)
    active_now: str = ""
    invocation_now: str = ""

    @property
    def same_process(self) -> bool:
        """True when the process the record saw still runs: active, with the same
        InvocationID (systemd gives every start of a unit a new one)."""
        return (self.active_now == "active" and bool(self.invocation)
                and self.invocation_now == self.invocation)


@dataclass(frozen=True)
class HostOwner:
    """Who deployed a host last, from its state record (``vllm_provision.state``).

    Attributes:
        inventory: the inventory path the record holds (resolved absolute path).
        replica: the replica the host belonged to (``""`` when the record lacks the host).
        host: the host's name in that inventory.
        files: installed file path -> sha256 hex, as recorded.
        started: unit name -> :class:`UnitStart`.
        backend: the backend of the host's replica in the record (``""``: not recorded).
        rank: the host's node rank in the record (None: not recorded).
        units: the backend's units the record lists on the host, in start order; None for a
            record written before it held them (``vllm_provision.state.prune.from_record``).
        replica_id: the owner id of the host's replica (``Replica.replica_id``); ``""`` for a
            record written before it held one.
        controller: the host name of the controller that wrote the record (``""``: unknown).
        nodes: the replica's node names in the record, in node-rank order.
        model: the replica's ``vllm_model`` in the record (``""``: not recorded).
    """

    inventory: str
    replica: str
    host: str
    files: Mapping[str, str] = field(default_factory=dict)
    started: Mapping[str, UnitStart] = field(default_factory=dict)
    backend: str = ""
    rank: int | None = None
    units: tuple[str, ...] | None = None
    replica_id: str = ""
    controller: str = ""
    nodes: tuple[str, ...] = ()
    model: str = ""

    @property
    def running(self) -> bool:
        """True while the owner's replica runs here: a process it started still runs, that is a
        unit it started is active, activating or reloading now with the InvocationID the record
        saw (a record without started units counts as running). A unit of the same name that a
        later run started (the shared watchdog unit, say) is another run's process, not the
        owner's. After ``provision down`` the host is free (docs/deploy.md, "Who owns a
        host")."""
        if not self.started:
            return True
        return any(start.active_now in RUNNING_STATES and bool(start.invocation)
                   and start.invocation_now == start.invocation
                   for start in self.started.values())


@dataclass(frozen=True)
class HostFacts:
    """Everything preflight knows about one host, from one probe (one SSH round trip).

    Sizes are bytes unless the name says MiB. A value of None means "could not be read";
    ``problems`` says why.

    Attributes:
        host: inventory host name.
        python_path: interpreter that ran the probe (``/opt/vllm/bin/python`` or ``python3``).
        venv_found: the inventory's venv Python existed and ran the probe.
        python_version: full ``sys.version`` (``"3.11.2 (main, ...) [GCC 12.2.0]"``).
        python_micro: ``"3.11.2"``.
        packages: distribution name -> version (None when not installed): vllm, torch, ray,
            transformers, nvidia-nccl-cu12, nvidia-nccl-cu13.
        torch_cuda: torch's CUDA build: ``"cu130"`` from the local version ``2.9.0+cu130``, or
            ``torch.version.cuda`` when asked for; None when unknown.
        nccl_loaded: ``torch.cuda.nccl.version()`` as ``"2.27.3"`` when asked for, else None.
        driver_version: NVIDIA driver (``"580.95.05"``), None when nvidia-smi failed.
        cuda_driver_version: highest CUDA the driver supports (``"13.0"``), from the header.
        gpus: GPUs in index order.
        gpu_processes: compute processes on any GPU.
        nvidia_smi_error: why nvidia-smi could not be read, else ``""``.
        hostname: ``socket.gethostname()``.
        hostname_addresses: what the hostname resolves to.
        machine_id: ``/etc/machine-id`` (machine-id(5): one per installation), ``""`` unread.
        boot_id: ``/proc/sys/kernel/random/boot_id`` (one per boot; systemd-nspawn gives each
            container its own), ``""`` unread. Together: which running system the host is.
        interfaces: by name.
        routes: route to each peer address, by peer address.
        shm_bytes: size of /dev/shm.
        mem_total_bytes, mem_available_bytes: from /proc/meminfo.
        disk_free_bytes: free bytes on the filesystem holding the model path (or /).
        cpu_count: logical CPUs.
        model_path: the model path probed.
        model_files: its manifest, sorted by name; None when the path does not exist.
        listening: listening TCP sockets.
        remove_ipc: logind ``RemoveIPC`` in effect (default yes; logind.conf(5)).
        service_user: the unit's account.
        nccl_env: ``NCCL_*`` variables of the probe's environment and ``/etc/environment``.
        nccl_conf: text of ``/etc/nccl.conf``, None when absent.
        nccl_net_plugins: ``libnccl-net*.so`` files found on the library path.
        systemd_version: systemd's version number (252), None when unknown.
        openssh_version: the OpenSSH server's ``major.minor`` (``"9.2"``, from ``sshd -V``),
            None when unknown.
        kernel_release: ``uname -r``.
        os_release: ``PRETTY_NAME`` of ``/etc/os-release``.
        kernel_modules: loaded modules of interest (``nvidia_peermem``, ``nvidia_fs``).
        rdma_ports: RDMA ports from ``/sys/class/infiniband``.
        xid_events: ``NVRM: Xid`` lines of the kernel log of the last 24 hours.
        nvswitch_count: NVSwitch devices the driver knows (``/proc/driver/nvidia-nvswitch``).
        fabric_manager: ``ActiveState`` of ``nvidia-fabricmanager.service`` (``active``,
            ``inactive``, ``failed``), ``not-found`` when it is not installed, ``""`` when not
            asked (no NVSwitch).
        clock: clock synchronisation state.
        listener: the reachability listener (master only), or None.
        listeners: the short-lived listeners on the ports this node serves its peers (API
            port on rank 0, watchdog port), opened where nothing listened yet.
        reachability: TCP tests to the master/head, one per target.
        problems: probe-side errors (a command missing, a file unreadable).
        owner: the host's state record (last good ``provision up``), None when it has none.
        model_weights: config.json and safetensors headers of the model, read on a replica's
            rank 0 only (None elsewhere, or when the model path is not a local folder).
        model_content: the model folder's content fingerprint (config.json, the safetensors
            index, every shard's header and data samples), None when the model path is not a
            local folder.
        vllm_venvs: environments holding vLLM, when the probe was asked to search
            (``ProbeOptions.venv_search``: ``provision init``), sorted by path; else empty.
        extra: the facts of the fact modules (``vllm_provision/facts/extra/``), by name: each
            module's docstring says what its value holds; None where the host could not
            read it.
    """

    host: str
    python_path: str = ""
    venv_found: bool = False
    python_version: str = ""
    python_micro: str = ""
    packages: Mapping[str, str | None] = field(default_factory=dict)
    torch_cuda: str | None = None
    nccl_loaded: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()
    nvidia_smi_error: str = ""
    hostname: str = ""
    hostname_addresses: tuple[str, ...] = ()
    machine_id: str = ""
    boot_id: str = ""
    interfaces: Mapping[str, Interface] = field(default_factory=dict)
    routes: Mapping[str, Route] = field(default_factory=dict)
    shm_bytes: int | None = None
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    disk_free_bytes: int | None = None
    cpu_count: int | None = None
    model_path: str = ""
    model_files: tuple[ModelFile, ...] | None = None
    listening: tuple[ListeningSocket, ...] = ()
    remove_ipc: bool = True
    service_user: ServiceUser | None = None
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    nccl_conf: str | None = None
    nccl_net_plugins: tuple[str, ...] = ()
    systemd_version: int | None = None
    openssh_version: str | None = None
    kernel_release: str = ""
    os_release: str = ""
    kernel_modules: tuple[str, ...] = ()
    rdma_ports: tuple[RdmaPort, ...] = ()
    xid_events: tuple[XidEvent, ...] = ()
    nvswitch_count: int = 0
    fabric_manager: str = ""
    clock: ClockSync = field(default_factory=ClockSync)
    listener: Listener | None = None
    listeners: tuple[Listener, ...] = ()
    reachability: tuple[Reachability, ...] = ()
    problems: tuple[str, ...] = ()
    owner: HostOwner | None = None
    model_weights: ModelWeights | None = None
    model_content: ModelContent | None = None
    vllm_venvs: tuple[VenvFound, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def nccl_version(self) -> str | None:
        """The NCCL a worker will load: the loaded one when probed, else the nvidia-nccl package.

        vLLM loads the ``libnccl.so.2`` torch brings (``find_nccl_library``), i.e. the
        ``nvidia-nccl-cu13`` (or ``-cu12``) wheel in the venv.
        """
        if self.nccl_loaded:
            return self.nccl_loaded
        return self.packages.get("nvidia-nccl-cu13") or self.packages.get("nvidia-nccl-cu12")

    @property
    def nccl_package(self) -> str:
        """The installed NCCL wheel's name (``nvidia-nccl-cu13``), or the cu13 name by default."""
        if self.packages.get("nvidia-nccl-cu13"):
            return "nvidia-nccl-cu13"
        if self.packages.get("nvidia-nccl-cu12"):
            return "nvidia-nccl-cu12"
        return "nvidia-nccl-cu13"

    @property
    def gpu_model(self) -> str | None:
        """The GPU product name all GPUs share, ``"mixed: a, b"`` otherwise, None if no GPU."""
        names = sorted({gpu.name for gpu in self.gpus})
        if not names:
            return None
        return names[0] if len(names) == 1 else "mixed: " + ", ".join(names)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (tuples become lists, nested records dicts)."""
        return asdict(self)
