#!/usr/bin/python3 -IS
"""Lab stand-in for ``nvidia-smi``: answers from /etc/vllm-lab/spec.json, standard library only.

Installed in each lab guest as /usr/bin/nvidia-smi (a copy of this file, so it imports nothing
from the lab package). Formats follow real outputs kept in tests/data/nvidia-smi/ (R550+
89-column table, ``--format=csv[,noheader][,nounits]``, ``-L``). Compute apps come from the
registry the stand-in vLLM and ``provision lab occupy`` write (one JSON file per process in
/run/vllm-lab/compute-apps/); entries whose process is gone are ignored, as NVML does.

It runs isolated and without the site module (``-IS``): it needs the standard library only, and
the probe of every ``provision`` command runs it four times per host: without the site module a
call takes about 45 ms of CPU instead of 53 (20 calls on a lab host).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
import zlib

SPEC_PATH = os.environ.get("VLLM_LAB_SPEC", "/etc/vllm-lab/spec.json")
APPS_DIR = os.environ.get("VLLM_LAB_APPS_DIR", "/run/vllm-lab/compute-apps")
# Bus ids of an 8-GPU HGX H100/H200 board, in nvidia-smi order.
BUS_IDS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
EXIT_INVALID_ARGUMENT = 2   # NVML_ERROR_INVALID_ARGUMENT
EXIT_NOT_FOUND = 6          # NVML_ERROR_NOT_FOUND
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


def load_spec() -> dict:
    """Return the host's spec (see lab/vllm_provision_lab/gpu/spec.py for the keys)."""
    with open(SPEC_PATH, encoding="utf-8") as handle:
        return json.load(handle)


def gpus(spec: dict) -> list[dict]:
    """Return one dict per simulated GPU: index, name, uuid, bus id, memory (MiB)."""
    used = memory_used_by_gpu(spec)
    result = []
    for index in range(int(spec["gpus"])):
        bus = BUS_IDS[index] if index < len(BUS_IDS) else f"{0xE0 + index:02X}"
        total = int(spec["gpu_memory_mib"])
        used_mib = min(total, used.get(index, 0))
        result.append({
            "index": index, "name": spec["gpu_name"], "bus_id": f"00000000:{bus}:00.0",
            "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{spec['host']}.gpu{index}")),
            "serial": f"16523230{zlib.crc32(spec['host'].encode()) % 10000:04d}{index:02d}",
            "total": total, "used": used_mib, "free": total - used_mib,
        })
    return result


def compute_apps() -> list[dict]:
    """Return live registry entries: pid, process_name, gpus (indexes), used_memory_mib."""
    apps: list[dict] = []
    try:
        names = sorted(os.listdir(APPS_DIR))
    except OSError:
        return apps
    for name in names:
        try:
            with open(os.path.join(APPS_DIR, name), encoding="utf-8") as handle:
                app = json.load(handle)
            os.kill(int(app["pid"]), 0)
        except (OSError, ValueError, KeyError):
            continue  # gone or half-written: NVML does not list dead processes
        apps.append(app)
    return apps


def memory_used_by_gpu(spec: dict) -> dict[int, int]:
    """Return MiB used per GPU index, summed over live compute apps."""
    used: dict[int, int] = {}
    for app in compute_apps():
        for index in app.get("gpus", []):
            used[int(index)] = used.get(int(index), 0) + int(app.get("used_memory_mib", 0))
    return used


def faulty(spec: dict, key: str, index: int) -> bool:
    """True when GPU ``index`` is listed in the spec's ``key`` (``"1,3"``; ``"none"``)."""
    value = str(spec.get(key) or "none")
    return str(index) in [part.strip() for part in value.split(",")]


def _enabled(key: str, when_listed: str, otherwise: str):
    return ("", lambda g, s, u: when_listed if faulty(s, key, g["index"]) else otherwise)


# canonical field -> (header unit or "", value function(gpu, spec, units: bool))
def _mib(key: str):
    return ("MiB", lambda g, s, u: f"{g[key]} MiB" if u else str(g[key]))


GPU_FIELDS = {
    "timestamp": ("", lambda g, s, u: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "driver_version": ("", lambda g, s, u: s["driver"]),
    "count": ("", lambda g, s, u: str(int(s["gpus"]))),
    "name": ("", lambda g, s, u: g["name"]),
    "serial": ("", lambda g, s, u: g["serial"]),
    "uuid": ("", lambda g, s, u: g["uuid"]),
    "pci.bus_id": ("", lambda g, s, u: g["bus_id"]),
    "pci.domain": ("", lambda g, s, u: "0x0000"),
    "pci.bus": ("", lambda g, s, u: "0x" + g["bus_id"][9:11]),
    "pci.device_id": ("", lambda g, s, u: "0x233510DE"),
    "index": ("", lambda g, s, u: str(g["index"])),
    "persistence_mode": _enabled("persistence_off_gpus", "Disabled", "Enabled"),
    "compute_mode": ("", lambda g, s, u: "Default"),
    "compute_cap": ("", lambda g, s, u: "9.0"),
    "pstate": ("", lambda g, s, u: "P0"),
    "vbios_version": ("", lambda g, s, u: "96.00.AF.00.01"),
    "mig.mode.current": _enabled("mig_gpus", "Enabled", "Disabled"),
    "mig.mode.pending": _enabled("mig_gpus", "Enabled", "Disabled"),
    "driver_model.current": ("", lambda g, s, u: "[N/A]"),
    "memory.total": _mib("total"),
    "memory.used": _mib("used"),
    "memory.free": _mib("free"),
    "memory.reserved": ("MiB", lambda g, s, u: "551 MiB" if u else "551"),
    "temperature.gpu": ("", lambda g, s, u: "31"),
    "utilization.gpu": ("%", lambda g, s, u: "0 %" if u else "0"),
    "utilization.memory": ("%", lambda g, s, u: "0 %" if u else "0"),
    "power.draw": ("W", lambda g, s, u: "76.48 W" if u else "76.48"),
    "power.limit": ("W", lambda g, s, u: "700.00 W" if u else "700.00"),
    "clocks.sm": ("MHz", lambda g, s, u: "345 MHz" if u else "345"),
    "clocks.max.sm": ("MHz", lambda g, s, u: "1980 MHz" if u else "1980"),
    "ecc.errors.uncorrected.volatile.total": _enabled("ecc_gpus", "2", "0"),
    "ecc.errors.uncorrected.aggregate.total": _enabled("ecc_gpus", "2", "0"),
    "ecc.errors.corrected.aggregate.total": ("", lambda g, s, u: "0"),
}
GPU_ALIASES = {
    "gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
    "clocks.current.sm": "clocks.sm", "driver_version": "driver_version",
}

APP_FIELDS = {
    "timestamp": ("", lambda a, g, u: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "gpu_name": ("", lambda a, g, u: g["name"]),
    "gpu_bus_id": ("", lambda a, g, u: g["bus_id"]),
    "gpu_serial": ("", lambda a, g, u: g["serial"]),
    "gpu_uuid": ("", lambda a, g, u: g["uuid"]),
    "pid": ("", lambda a, g, u: str(a["pid"])),
    "process_name": ("", lambda a, g, u: a.get("process_name", "python3")),
    "used_gpu_memory": ("MiB", lambda a, g, u: f"{a['used_memory_mib']} MiB" if u
                        else str(a["used_memory_mib"])),
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def parse_args(argv: list[str]) -> dict | None:
    """Parse the options the stand-in knows; return None for anything else (invalid)."""
    opts: dict = {"query_gpu": None, "query_apps": None, "format": None, "ids": None,
                  "list": False, "help": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        takes_value = {"--query-gpu": "query_gpu", "--query-compute-apps": "query_apps",
                       "--format": "format", "--id": "ids", "-i": "ids"}
        if name in takes_value:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                value = argv[i]
            if opts[takes_value[name]] is not None:
                return None
            opts[takes_value[name]] = value
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        elif arg in ("-h", "--help"):
            opts["help"] = True
        else:
            return None
        i += 1
    if opts["query_gpu"] is not None and opts["query_apps"] is not None:
        return None
    return opts


def select(all_gpus: list[dict], ids: str | None) -> list[dict] | None:
    """Filter by ``-i`` (indexes, UUIDs or bus ids, comma separated); None when one is unknown."""
    if ids is None:
        return all_gpus
    chosen: list[dict] = []
    for token in ids.split(","):
        token = token.strip()
        match = [g for g in all_gpus
                 if token in (str(g["index"]), g["uuid"], g["bus_id"], g["bus_id"][4:])]
        if not match:
            return None
        chosen.extend(m for m in match if m not in chosen)
    return chosen


def csv_output(fields: list[str], rows: list[list[str]], units: dict[str, str],
               header: bool, with_units: bool) -> str:
    """Render nvidia-smi CSV: ``", "`` separators, ``name [unit]`` headers unless nounits."""
    lines = []
    if header:
        lines.append(", ".join(f"{f} [{units[f]}]" if units[f] and with_units else f
                               for f in fields))
    lines.extend(", ".join(row) for row in rows)
    return "".join(line + "\n" for line in lines)


def run_query(spec: dict, query: str, fmt: str, ids: str | None, apps: bool) -> int:
    """Answer ``--query-gpu`` / ``--query-compute-apps``; return the exit status."""
    options = [o.strip() for o in fmt.split(",")]
    if "csv" not in options or any(o not in ("csv", "noheader", "nounits") for o in options):
        print(INVALID_ARGS)
        return EXIT_INVALID_ARGUMENT
    table, aliases = (APP_FIELDS, APP_ALIASES) if apps else (GPU_FIELDS, GPU_ALIASES)
    fields = []
    for raw in query.split(","):
        field = aliases.get(raw.strip(), raw.strip())
        if field not in table:
            print(f'Field "{raw.strip()}" is not a valid field to query.\n')
            return EXIT_INVALID_ARGUMENT
        fields.append(field)
    chosen = select(gpus(spec), ids)
    if chosen is None:
        print("No devices were found")
        return EXIT_NOT_FOUND
    with_units = "nounits" not in options
    rows = []
    if apps:
        by_index = {g["index"]: g for g in chosen}
        for app in compute_apps():
            for index in app.get("gpus", []):
                if int(index) in by_index:
                    rows.append([table[f][1](app, by_index[int(index)], with_units)
                                 for f in fields])
    else:
        rows = [[table[f][1](g, spec, with_units) for f in fields] for g in chosen]
    units = {f: table[f][0] for f in fields}
    sys.stdout.write(csv_output(fields, rows, units, "noheader" not in options, with_units))
    return 0


def table_output(spec: dict, chosen: list[dict]) -> str:
    """Render the plain ``nvidia-smi`` table in the R550+ layout (89 columns inside the frame)."""
    def row(text: str) -> str:
        return "|" + text.ljust(89) + "|"

    bar = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    lines = [time.strftime("%a %b %d %H:%M:%S %Y").ljust(30),
             "+" + "-" * 89 + "+",
             row(f" NVIDIA-SMI {spec['driver']:<23}Driver Version: {spec['driver']:<15}"
                 f"CUDA Version: {spec['cuda']}"),
             "|" + bar[1:],
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A |"
             " Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage |"
             " GPU-Util  Compute M. |",
             "|" + " " * 41 + "|" + " " * 24 + "|" + "MIG M. |".rjust(23),
             "|" + bar[1:-1].replace("-", "=") + "|"]
    for gpu in chosen:
        memory = f"{gpu['used']}MiB / {gpu['total']}MiB"
        persistence = "Off" if faulty(spec, "persistence_off_gpus", gpu["index"]) else "On"
        ecc = "2" if faulty(spec, "ecc_gpus", gpu["index"]) else "0"
        mig = "Enabled" if faulty(spec, "mig_gpus", gpu["index"]) else "Disabled"
        lines += [f"| {gpu['index']:>3}  {gpu['name'][:30]:<31}{persistence:<4}|   "
                  f"{gpu['bus_id']} Off |{ecc:>21} |",
                  f"| N/A   31C    P0             76W /  700W | {memory:>22} |"
                  "      0%      Default |",
                  "|" + " " * 41 + "|" + " " * 24 + "|" + f"{mig:>21} |",
                  bar]
    lines += ["", "+" + "-" * 89 + "+", row(" Processes:"),
              row("  GPU   GI   CI              PID   Type   Process name"
                  "                        GPU Memory "),
              row("        ID   ID                                                   "
                  "            Usage      "),
              "|" + "=" * 89 + "|"]
    indexes = {g["index"] for g in chosen}
    apps = [(int(i), a) for a in compute_apps() for i in a.get("gpus", []) if int(i) in indexes]
    if not apps:
        lines.append(row("  No running processes found"))
    for index, app in apps:
        name = str(app.get("process_name", "python3"))[:36]
        used = f"{app['used_memory_mib']}MiB"
        lines.append(row(f" {index:>4}   N/A  N/A  {int(app['pid']):>14}      C   {name:<36}"
                         f"{used:>10} "))
    lines.append("+" + "-" * 89 + "+")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point: behave like nvidia-smi for the options the toolkit uses."""
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts is None:
        print(INVALID_ARGS)
        return EXIT_INVALID_ARGUMENT
    if opts["help"]:
        print("NVIDIA System Management Interface -- v" + load_spec()["driver"]
              + " (lab stand-in)\n\nSupported here: -L, -i, --query-gpu=, "
              "--query-compute-apps=, --format=csv[,noheader][,nounits]")
        return 0
    spec = load_spec()
    query = opts["query_gpu"] if opts["query_gpu"] is not None else opts["query_apps"]
    if query is not None:
        if opts["format"] is None or opts["list"]:
            print(INVALID_ARGS)
            return EXIT_INVALID_ARGUMENT
        return run_query(spec, query, opts["format"], opts["ids"], opts["query_apps"] is not None)
    if opts["format"] is not None:
        print(INVALID_ARGS)
        return EXIT_INVALID_ARGUMENT
    chosen = select(gpus(spec), opts["ids"])
    if chosen is None:
        print("No devices were found")
        return EXIT_NOT_FOUND
    if opts["list"]:
        for gpu in chosen:
            print(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        return 0
    sys.stdout.write(table_output(spec, chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
