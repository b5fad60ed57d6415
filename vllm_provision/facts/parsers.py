"""Pure parsers from raw command output (nvidia-smi, ip, ss, logind, login.defs) to fact records.

Each parser skips lines it does not understand instead of failing: nvidia-smi's text output
"is not guaranteed to be backwards compatible" (nvidia-smi(1)), so a warning line or a new
column must not break preflight.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_provision.facts.model import (
    ClockSync,
    Gpu,
    GpuProcess,
    Interface,
    ListeningSocket,
    ModelContent,
    RdmaPort,
    Route,
    XidEvent,
    content_digest,
)
from vllm_provision.output.progress import printable

# The query the probe sends; the parser is told the fields so real outputs of other queries parse.
GPU_QUERY_FIELDS: tuple[str, ...] = (
    "index", "name", "driver_version", "memory.total", "uuid", "pci.bus_id",
)
# GPU health, queried apart so an older driver's "not a valid field" cannot hide the GPU list;
# field names as ``nvidia-smi --help-query-gpu`` lists them.
GPU_HEALTH_FIELDS: tuple[str, ...] = (
    "index", "memory.used", "ecc.errors.uncorrected.aggregate.total", "persistence_mode",
    "mig.mode.current",
)
COMPUTE_APPS_FIELDS: tuple[str, ...] = ("pid", "process_name", "used_memory", "gpu_uuid")

_NOT_AVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported", ""}
# nvidia-smi header: "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8 |"
# R610 renames them "KMD Version" / "CUDA UMD Version" (sgl-project/sglang #27487).
_CUDA_VERSION_RE = re.compile(r"CUDA (?:UMD )?Version\s*:\s*([0-9]+\.[0-9]+)")
_DRIVER_VERSION_RE = re.compile(r"(?:Driver|KMD) Version\s*:\s*([0-9][0-9.]*)")
# Numbers with an optional unit, as nvidia-smi prints without "nounits": "81559 MiB".
_NUMBER_RE = re.compile(r"^\s*([0-9]+)(?:\s*MiB)?\s*$")


def _int_or_none(text: str) -> int | None:
    match = _NUMBER_RE.match(text)
    return int(match.group(1)) if match else None


def _split_csv_row(line: str, fields: Sequence[str], free_text_field: str) -> dict[str, str] | None:
    """Split one nvidia-smi CSV row into fields; extra commas belong to ``free_text_field``.

    nvidia-smi does not quote values, and a GPU or process name may contain a comma (MIG device
    names), so surplus parts are joined back into the free-text field.
    """
    parts = [part.strip() for part in line.split(",")]
    if len(parts) < len(fields):
        return None
    surplus = len(parts) - len(fields)
    position = fields.index(free_text_field)
    merged = parts[:position] + [", ".join(parts[position:position + surplus + 1])]
    merged += parts[position + surplus + 1:]
    return dict(zip(fields, merged, strict=True))


def _is_header(row: dict[str, str], fields: Sequence[str]) -> bool:
    return row.get(fields[0], "").lower().startswith(fields[0].split(".")[0].lower())


def parse_gpu_csv(text: str, fields: Sequence[str] = GPU_QUERY_FIELDS,
                  ) -> tuple[list[Gpu], str | None]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]``.

    Args:
        text: stdout; a header line, unit suffixes (``MiB``) and warning lines are tolerated.
        fields: the queried field names in order (default: :data:`GPU_QUERY_FIELDS`).

    Returns:
        (GPUs sorted by index, the driver version if ``driver_version`` was queried and all
        rows agree on it, else the first row's, or None when there are no rows).
    """
    gpus: list[Gpu] = []
    drivers: list[str] = []
    for line in text.splitlines():
        if not line.strip() or "," not in line:
            continue
        row = _split_csv_row(line, fields, "name" if "name" in fields else fields[-1])
        if row is None or _is_header(row, fields):
            continue
        index = _int_or_none(row.get("index", ""))
        if "index" in fields and index is None:
            continue
        uuid = row.get("uuid", "")
        gpus.append(Gpu(
            index=index if index is not None else len(gpus),
            name=row.get("name", ""),
            memory_total_mib=_int_or_none(row.get("memory.total", "")),
            uuid="" if uuid.lower() in _NOT_AVAILABLE else uuid,
            pci_bus_id=row.get("pci.bus_id", ""),
        ))
        if row.get("driver_version"):
            drivers.append(row["driver_version"])
    gpus.sort(key=lambda gpu: gpu.index)
    return gpus, (drivers[0] if drivers else None)


def parse_compute_apps_csv(text: str, fields: Sequence[str] = COMPUTE_APPS_FIELDS,
                           ) -> list[GpuProcess]:
    """Parse ``nvidia-smi --query-compute-apps=<fields> --format=csv,noheader[,nounits]``.

    Args:
        text: stdout; ``No running processes found`` and header lines yield nothing.
        fields: queried field names in order (default: :data:`COMPUTE_APPS_FIELDS`).

    Returns:
        One :class:`GpuProcess` per row, ``unit`` empty (the probe fills it from /proc).
    """
    processes: list[GpuProcess] = []
    for line in text.splitlines():
        if "," not in line:
            continue
        free_text = "process_name" if "process_name" in fields else fields[-1]
        row = _split_csv_row(line, fields, free_text)
        if row is None:
            continue
        pid = _int_or_none(row.get("pid", ""))
        if pid is None:
            continue
        processes.append(GpuProcess(
            pid=pid,
            process_name=row.get("process_name", ""),
            used_memory_mib=_int_or_none(row.get("used_memory", "")),
            gpu_uuid=row.get("gpu_uuid", ""),
        ))
    return processes


def parse_smi_header(text: str) -> tuple[str | None, str | None]:
    """Read the driver version and the highest CUDA version the driver supports.

    Works on the plain ``nvidia-smi`` table header (all driver generations: the 515 series'
    narrow table, the 535+ wide one) and on ``nvidia-smi -q`` (``CUDA Version : 12.7``).
    There is no documented ``--query-gpu`` field for the CUDA version (``nvidia-smi
    --help-query-gpu`` lists none), so the header's "CUDA Version" is the source.

    Returns:
        (driver version or None, CUDA version ``"12.8"`` or None).
    """
    driver = _DRIVER_VERSION_RE.search(text)
    cuda = _CUDA_VERSION_RE.search(text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def parse_ip_addr_json(text: str) -> dict[str, Interface]:
    """Parse ``ip -j addr`` (or ``ip -j link``, which has no addresses) into interfaces by name.

    Raises:
        ValueError: the text is not the JSON array iproute2 prints.
    """
    data = json.loads(text or "[]")
    if not isinstance(data, list):
        raise ValueError("ip -j addr did not print a JSON array")
    interfaces: dict[str, Interface] = {}
    for entry in data:
        if not isinstance(entry, dict) or "ifname" not in entry:
            continue
        addresses = tuple(
            str(info["local"]) for info in entry.get("addr_info", []) if "local" in info
        )
        interfaces[entry["ifname"]] = Interface(
            name=entry["ifname"],
            state=str(entry.get("operstate", "UNKNOWN")),
            flags=tuple(entry.get("flags", ())),
            addresses=addresses,
            mtu=entry.get("mtu"),
        )
    return interfaces


def parse_ip_route_get_json(peer: str, text: str) -> Route:
    """Parse ``ip -j route get <peer>``; an empty or invalid text yields a Route with ``error``."""
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError as exc:
        return Route(peer=peer, error=f"unreadable ip route output: {exc}")
    if not data or not isinstance(data, list):
        return Route(peer=peer, error="no route")
    first: dict[str, Any] = data[0]
    return Route(peer=peer, dev=str(first.get("dev", "")), src=str(first.get("prefsrc", "")))


# ss -p column: users:(("python3",pid=1234,fd=7),("python3",pid=1240,fd=7))
_SS_USER_RE = re.compile(r'\("(?P<name>[^"]*)",pid=(?P<pid>[0-9]+)')


def _split_host_port(local: str) -> tuple[str, int] | None:
    address, _, port = local.rpartition(":")
    if not port.isdigit():
        return None
    address = address.strip("[]")
    if "%" in address:  # "0.0.0.0%lo" / "[::1]%lo": bound to an interface
        address = address.split("%", 1)[0]
    return address or "*", int(port)


def parse_ss_listening(text: str, units: dict[int, str] | None = None) -> list[ListeningSocket]:
    """Parse ``ss -Hltnp`` (no header; State Recv-Q Send-Q Local:Port Peer:Port [Process]).

    Args:
        text: stdout of ``ss -Hltnp``; also accepts output with a header line.
        units: pid -> systemd unit (from /proc/<pid>/cgroup) to attach to each socket.

    Returns:
        One socket per listening address (the first owning process, if ss showed one).
    """
    sockets: list[ListeningSocket] = []
    for line in text.splitlines():
        columns = line.split()
        if len(columns) < 5 or columns[0] != "LISTEN":
            continue
        local = _split_host_port(columns[3])
        if local is None:
            continue
        match = _SS_USER_RE.search(line)
        pid = int(match.group("pid")) if match else None
        sockets.append(ListeningSocket(
            address=local[0],
            port=local[1],
            process=match.group("name") if match else "",
            pid=pid,
            unit=(units or {}).get(pid, "") if pid is not None else "",
        ))
    return sockets


def unit_from_cgroup(text: str) -> str:
    """Return the systemd unit of a process from ``/proc/<pid>/cgroup`` text, or ``""``.

    Reads the unified line (``0::/system.slice/vllm.service``) or the v1 ``name=systemd``
    line; the unit is the last path element ending in ``.service`` or ``.scope``.
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or parts[1] not in ("", "name=systemd"):
            continue
        for element in reversed(parts[2].split("/")):
            if element.endswith((".service", ".scope")):
                return element
    return ""


def _parse_bool(value: str) -> bool | None:
    # systemd's boolean grammar (systemd.syntax(7)): 1/yes/y/true/t/on and 0/no/n/false/f/off.
    lowered = value.strip().lower()
    if lowered in ("1", "yes", "y", "true", "t", "on"):
        return True
    if lowered in ("0", "no", "n", "false", "f", "off"):
        return False
    return None


def parse_logind_remove_ipc(texts: Iterable[str]) -> bool:
    """Return logind's effective ``RemoveIPC`` from logind.conf then its drop-ins, in order.

    Args:
        texts: contents of ``/etc/systemd/logind.conf`` followed by the ``logind.conf.d/*.conf``
            files in lexical order (later settings win; logind.conf(5)).

    Returns:
        The value in effect; ``True`` (the compiled-in default, logind.conf(5)) when unset.
    """
    value = True
    for text in texts:
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, setting = line.partition("=")
            if sep and section == "Login" and key.strip() == "RemoveIPC":
                parsed = _parse_bool(setting)
                if parsed is not None:
                    value = parsed
    return value


def parse_sys_uid_max(text: str) -> int:
    """Return ``SYS_UID_MAX`` from ``/etc/login.defs`` text, or 999 (login.defs(5) default)."""
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) >= 2 and parts[0] == "SYS_UID_MAX" and parts[1].isdigit():
            return int(parts[1])
    return 999


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse ``/proc/meminfo`` into bytes by key (``MemTotal``, ``MemAvailable``, ...)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            factor = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            values[key.strip()] = int(parts[0]) * factor
    return values


def parse_systemd_version(text: str) -> int | None:
    """Read the number from ``systemctl --version``'s first line (``systemd 252 (252.38-1)``)."""
    match = re.match(r"\s*systemd\s+([0-9]+)", text)
    return int(match.group(1)) if match else None


def parse_openssh_version(text: str) -> str | None:
    """Read OpenSSH's ``major.minor`` from ``sshd -V`` (or its usage text on older sshd).

    ``OpenSSH_8.4p1 Debian-5+deb11u3, OpenSSL 1.1.1w  11 Sep 2023`` -> ``"8.4"``; None when
    no OpenSSH version is in the text (another SSH server, or sshd missing).
    """
    match = re.search(r"OpenSSH_([0-9]+)\.([0-9]+)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def torch_cuda_build(torch_version: str | None) -> str | None:
    """Return the CUDA build tag of a torch version: ``"2.9.0+cu130"`` -> ``"cu130"``.

    The PyTorch wheel index encodes the CUDA variant in the PEP 440 local version label;
    a torch without a label (PyPI's default wheel) returns None.
    """
    if not torch_version or "+" not in torch_version:
        return None
    return torch_version.split("+", 1)[1] or None


def cuda_major_of_build(build: str | None) -> int | None:
    """CUDA major version of a torch build tag or version: ``cu130`` -> 13, ``12.8`` -> 12."""
    if not build:
        return None
    match = re.match(r"cu([0-9]+)$", build)
    if match:
        digits = match.group(1)
        return int(digits[:-1]) if len(digits) >= 3 else int(digits[:1])
    match = re.match(r"([0-9]+)\.", build)
    return int(match.group(1)) if match else None


def python_micro(sys_version: str) -> str:
    """``"3.11.2 (main, Mar 13 2023, ...)"`` -> ``"3.11.2"``."""
    return sys_version.split()[0] if sys_version else ""


def _enabled(text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered == "enabled":
        return True
    if lowered == "disabled":
        return False
    return None


def parse_gpu_health_csv(text: str, gpus: Sequence[Gpu],
                         fields: Sequence[str] = GPU_HEALTH_FIELDS) -> list[Gpu]:
    """Merge ``nvidia-smi --query-gpu=<GPU_HEALTH_FIELDS> --format=csv,noheader,nounits`` rows
    into ``gpus`` by index.

    ``[N/A]`` (ECC off, MIG unsupported) and ``[Not Supported]`` become None; a row for an
    index not in ``gpus`` is ignored.

    Returns:
        ``gpus`` with ``memory_used_mib``, ``ecc_uncorrected``, ``persistence_mode`` and
        ``mig_mode`` filled in where the output had them.
    """
    rows: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        if "," not in line:
            continue
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != len(fields):
            continue
        row = dict(zip(fields, parts, strict=True))
        index = _int_or_none(row.get("index", ""))
        if index is not None:
            rows[index] = row
    merged = []
    for gpu in gpus:
        if gpu.index not in rows:
            merged.append(gpu)
            continue
        row = rows[gpu.index]
        merged.append(Gpu(
            index=gpu.index, name=gpu.name, memory_total_mib=gpu.memory_total_mib,
            uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id,
            memory_used_mib=_int_or_none(row.get("memory.used", "")),
            ecc_uncorrected=_int_or_none(row.get("ecc.errors.uncorrected.aggregate.total", "")),
            persistence_mode=_enabled(row.get("persistence_mode", "")),
            mig_mode=_enabled(row.get("mig.mode.current", "")),
        ))
    return merged


# "NVRM: Xid (PCI:0000:44:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)\): ([0-9]+)")


def parse_xid_lines(text: str) -> list[XidEvent]:
    """Parse kernel log lines (``journalctl -k`` or ``dmesg``) for NVIDIA Xid errors.

    The line format is the driver's ``NVRM: Xid (PCI:<domain:bus:device>): <code>, ...``
    (NVIDIA "Xid Errors" documentation); other lines are skipped.
    """
    events = []
    for line in text.splitlines():
        match = _XID_RE.search(line)
        if match:
            events.append(XidEvent(pci=match.group(1), code=int(match.group(2)),
                                   line=line.strip()[:200]))
    return events


def parse_sys_speed(text: str | None) -> int | None:
    """``/sys/class/net/<if>/speed`` in Mb/s; None for ``-1``, empty or unreadable (virtual
    links and links without carrier report -1 or fail to read: kernel ABI sysfs-class-net)."""
    if text is None:
        return None
    value = text.strip()
    if value.lstrip("-").isdigit() and int(value) > 0:
        return int(value)
    return None


def parse_infiniband_sysfs(raw: Mapping[str, Any]) -> list[RdmaPort]:
    """Parse the probe's read of ``/sys/class/infiniband``.

    Args:
        raw: device -> ``{"fw_ver": text, "ports": {number: {"state": "4: ACTIVE",
            "link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)"}}}`` (file contents as
            the kernel prints them; Documentation/ABI/stable/sysfs-class-infiniband).

    Returns:
        One :class:`RdmaPort` per port, sorted by device and port.
    """
    ports = []
    for device, info in sorted(raw.items()):
        if not isinstance(info, Mapping):
            continue
        firmware = str(info.get("fw_ver") or "").strip()
        for number, port in sorted((info.get("ports") or {}).items(),
                                   key=lambda item: int(item[0]) if str(item[0]).isdigit()
                                   else 0):
            if not str(number).isdigit() or not isinstance(port, Mapping):
                continue
            state = str(port.get("state") or "").strip()
            state = state.split(":", 1)[1].strip() if ":" in state else state
            ports.append(RdmaPort(device=device, port=int(number), state=state.upper(),
                                  link_layer=str(port.get("link_layer") or "").strip(),
                                  firmware=firmware, rate=str(port.get("rate") or "").strip()))
    return ports


def parse_ibv_devinfo(text: str) -> list[RdmaPort]:
    """Parse ``ibv_devinfo`` (libibverbs) output into ports: ``hca_id``, ``fw_ver``,
    ``port:``, ``state: PORT_ACTIVE (4)``, ``link_layer:`` lines."""
    ports: list[RdmaPort] = []
    device = firmware = ""
    current: dict[str, str] | None = None

    def flush() -> None:
        if current is not None:
            ports.append(RdmaPort(device=device, port=int(current["port"]),
                                  state=current.get("state", ""),
                                  link_layer=current.get("link_layer", ""), firmware=firmware))

    for raw in text.splitlines():
        key, sep, value = raw.strip().partition(":")
        if not sep:
            continue
        value = value.strip()
        if key == "hca_id":
            flush()
            current, device, firmware = None, value, ""
        elif key == "fw_ver":
            firmware = value
        elif key == "port" and value.isdigit():
            flush()
            current = {"port": value}
        elif current is not None and key == "state":
            current["state"] = value.split()[0].removeprefix("PORT_") if value else ""
        elif current is not None and key == "link_layer":
            current["link_layer"] = value
    flush()
    return ports


def parse_modules(text: str, wanted: Iterable[str]) -> list[str]:
    """Names from ``/proc/modules`` (first word of each line) that are in ``wanted``, sorted."""
    names = set(wanted)
    return sorted({line.split()[0] for line in text.splitlines()
                   if line.split() and line.split()[0] in names})


def parse_os_release(text: str) -> str:
    """``PRETTY_NAME`` of ``/etc/os-release`` (os-release(5)), else ``NAME VERSION_ID``."""
    values = parse_key_values(text)
    pretty = values.get("PRETTY_NAME", "").strip('"')
    if pretty:
        return pretty
    return " ".join(v.strip('"') for v in (values.get("NAME", ""), values.get("VERSION_ID", ""))
                    if v).strip()


def parse_key_values(text: str) -> dict[str, str]:
    """``KEY=value`` lines (``timedatectl show``, ``systemctl show``, os-release) to a dict."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value.strip()
    return values


# chronyc(1) tracking: "System time     : 0.000001501 seconds slow of NTP time"
_CHRONY_OFFSET_RE = re.compile(r"^System time\s*:\s*([0-9.]+) seconds (slow|fast)", re.M)


def parse_chronyc_offset(text: str) -> float | None:
    """The current offset from ``chronyc tracking``, seconds; negative when the clock is slow.

    chronyc(1): "System time: ... the system clock is [this many seconds] slow or fast of
    NTP time"; None when the line is absent (chronyd not running).
    """
    match = _CHRONY_OFFSET_RE.search(text)
    if not match:
        return None
    value = float(match.group(1))
    return -value if match.group(2) == "slow" else value


def parse_clock(timedatectl: str, chronyc: str, container: str = "") -> ClockSync:
    """Combine ``timedatectl show`` (``NTP=``, ``NTPSynchronized=``) and ``chronyc tracking``;
    ``container`` is the text of ``/run/systemd/container`` (systemd's container interface)."""
    values = parse_key_values(timedatectl)
    offset = parse_chronyc_offset(chronyc)
    source = "chrony" if offset is not None else ("timedatectl" if values else "")
    return ClockSync(ntp_enabled=_parse_bool(values["NTP"]) if "NTP" in values else None,
                     synchronized=(_parse_bool(values["NTPSynchronized"])
                                   if "NTPSynchronized" in values else None),
                     offset_s=offset, source=source, container=container.strip())


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def parse_model_content(raw: Any) -> tuple[ModelContent | None, list[str]]:
    """The probe's ``content`` section (``probe_script.model_content``) as
    :class:`ModelContent`, with the problems it holds (pure).

    Args:
        raw: ``{"files": [[name, sha256 hex], ...], "errors": [str], "bytes_read": int}``,
            or None when the model path was not a folder (or the fingerprint not asked for).

    Returns:
        ``(content or None, problems)``. Names are host output: shown through
        :func:`~vllm_provision.output.progress.printable`; an entry that is not a name and a
        64-digit hex digest is dropped and named in the problems.
    """
    if not isinstance(raw, Mapping):
        return None, []
    files: dict[str, str] = {}
    problems: list[str] = []
    for entry in raw.get("files") or ():
        if (isinstance(entry, list | tuple) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], str) and _SHA256_RE.match(entry[1])):
            files[printable(entry[0], 200)] = entry[1]
        else:
            problems.append(f"model content: not a file hash: {printable(repr(entry), 80)}")
    errors = tuple(printable(str(e)) for e in raw.get("errors") or ())
    read = raw.get("bytes_read")
    return ModelContent(digest=content_digest(files), files=files, errors=errors,
                        bytes_read=read if isinstance(read, int) and read >= 0 else 0), problems
