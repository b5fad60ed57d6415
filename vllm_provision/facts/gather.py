"""Gather facts: send the probe to every host at once (one SSH round trip each) and parse the JSON.

The probe is ``probe_script.py``, compressed into the command line itself for
``{vllm_venv}/bin/python -c`` (falling back to ``python3`` when the venv is missing, which it
reports), with its settings as one JSON argument. It needs no standard input, so the run lock's
holder can run it in its first answer (``up``: :func:`probe_commands`, ``transport.runlock``).
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from vllm_provision import settings
from vllm_provision.core import hostjson
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host, Inventory, Replica
from vllm_provision.core.parallel import split_map
from vllm_provision.core.quoting import python_loader
from vllm_provision.core.text import printable
from vllm_provision.facts import extra, parsers, weights
from vllm_provision.facts.model import (
    HostFacts,
    HostOwner,
    Interface,
    Listener,
    ModelFile,
    ModelWeights,
    Reachability,
    Route,
    ServiceUser,
    UnitStart,
    VenvFound,
)
from vllm_provision.settings import instance, variables
from vllm_provision.transport.base import Connection, UnreachableError

PACKAGES: tuple[str, ...] = (
    "vllm", "torch", "ray", "transformers", "nvidia-nccl-cu12", "nvidia-nccl-cu13",
)
# Modules whose presence decides GPUDirect RDMA and GPUDirect Storage (NVIDIA GPUDirect RDMA
# docs: nvidia_peermem replaced nv_peer_mem from driver R470).
KERNEL_MODULES: tuple[str, ...] = ("nvidia_peermem", "nv_peer_mem", "nvidia_fs")
# Seconds a follower keeps trying to reach the master and the master keeps its listener open.
DEFAULT_REACH_TIMEOUT_S = 8.0
# Most safetensors header bytes a node reads for the content fingerprint and the master for the
# memory estimate (all files together): a 1 TB MoE checkpoint's headers are ~20 MB; the format
# caps one header at 100 MB.
WEIGHTS_MAX_BYTES = 256 * 1024 * 1024
# Where ``provision init`` looks for virtual environments holding vLLM (globs on the host; ``~``
# is the SSH user's home); the environment of a ``vllm`` on the PATH is added by the probe.
VENV_SEARCH: tuple[str, ...] = (
    "/opt/*", "/opt/*/venv", "/opt/*/.venv", "/srv/*", "/srv/*/venv", "/srv/*/.venv",
    "/usr/local/*", "/venv", "/opt/conda/envs/*", "~/*", "~/*/venv", "~/*/.venv",
    "~/.venv", "~/.virtualenvs/*", "~/miniconda3/envs/*", "~/anaconda3/envs/*",
)


@dataclass(frozen=True)
class ProbeOptions:
    """What the probe gathers beyond the always-on facts.

    Attributes:
        nccl_loaded: import torch and read ``torch.cuda.nccl.version()`` (slow: seconds).
        torch_cuda_runtime: import torch and read ``torch.version.cuda``.
        sha256: hash every model file (slow on big models: minutes).
        reachability: test TCP from every follower to the master's master_port (mp) or the
            head's ray_port (Ray), with a short-lived listener on the master when the port is free.
        reach_timeout_s: how long followers retry and the master listens, in seconds.
        command_timeout_s: limit of the whole probe round trip, in seconds.
        venv_search: globs of folders that may be virtual environments holding vLLM
            (:data:`VENV_SEARCH`); found ones land in ``HostFacts.vllm_venvs``. Empty: no search.
        peers: peer addresses to read routes to, by host name, for hosts outside any replica
            (``provision init``: the other hosts it was given); a replica's nodes use the
            replica's addresses.
        extra_packages: more distributions whose versions the probe reads (the replica's
            stack lock, ``vllm_provision.stack.lock.lock_packages``), into ``HostFacts.packages``.
    """

    nccl_loaded: bool = False
    torch_cuda_runtime: bool = False
    sha256: bool = False
    reachability: bool = True
    reach_timeout_s: float = DEFAULT_REACH_TIMEOUT_S
    command_timeout_s: float = 120.0
    venv_search: tuple[str, ...] = ()
    peers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    extra_packages: tuple[str, ...] = ()


# where the fact modules' probe functions go: before the script runs main()
MAIN_GUARD = '\nif __name__ == "__main__":\n'


@functools.cache
def probe_source() -> str:
    """Return the text of the remote probe script: ``probe_script.py`` with the probe
    functions of the fact modules (:func:`vllm_provision.facts.extra.probe_additions`) added
    before its ``main()`` runs."""
    base = resources.files("vllm_provision.facts").joinpath("probe_script.py").read_text()
    head, guard, tail = base.rpartition(MAIN_GUARD)
    if not guard:
        raise RuntimeError("probe_script.py has no main guard")  # a bug of ours
    return f"{head}\n\n{extra.probe_additions()}{guard}{tail}"


def host_var(host: Host, name: str) -> Any:
    """Return ``host``'s value of inventory variable ``name``, or the table default."""
    if name in host.vars:
        return host.vars[name]
    return variables.defaults().get(name)


def reach_port(replica: Replica) -> int | None:
    """The port every follower must reach on rank 0 (mp: master_port, Ray: ray_port; the
    backend's :meth:`~vllm_provision.backends.Backend.rendezvous`), or None."""
    meeting = replica.backend_type.rendezvous(replica)
    return meeting[0] if meeting else None


def peer_ports(replica: Replica) -> dict[str, list[tuple[int, str]]]:
    """Ports each node serves to its peers beyond the rendezvous port, by node name (pure).

    Rank 0 serves the API port; every node serves its peer watchdog on
    ``vllm_watchdog_port`` (:func:`vllm_provision.settings.watchdog_port`: the node's own value,
    else the replica's, else the role default; docs/recovery.md). The rendezvous port
    (:func:`reach_port`) is tested apart.
    """
    ports: dict[str, list[tuple[int, str]]] = {}
    for node in replica.nodes:
        own = [(replica.engine.api_port, "API port")] if node.rank == 0 else []
        own.append((settings.watchdog_port(replica, node), "watchdog port"))
        ports[node.name] = own
    return ports


def probe_config(host: Host, replica: Replica | None, options: ProbeOptions) -> dict[str, Any]:
    """Build the probe's JSON settings for one host (pure).

    Args:
        host: the inventory host.
        replica: its replica, or None for a host outside ``vllm_replicas``.
        options: what to gather.

    Returns:
        A JSON-serialisable dict the probe reads from its first argument.
    """
    config: dict[str, Any] = {
        "venv": host_var(host, "vllm_venv"),
        "packages": list(dict.fromkeys((*PACKAGES, *options.extra_packages))),
        "service_user": host_var(host, "vllm_service_user"),
        "model_path": host_var(host, "vllm_model") or "",
        "sha256": options.sha256,
        # the content fingerprint (probe_script.model_content) on every node with a local model
        "content_max_bytes": WEIGHTS_MAX_BYTES,
        "nccl_loaded": options.nccl_loaded,
        "torch_cuda_runtime": options.torch_cuda_runtime,
        "peers": [],
        "state_file": instance.record_file(host.vars),
    }
    if options.venv_search:
        config["venv_search"] = list(options.venv_search)
    if replica is None:
        config["peers"] = list(options.peers.get(host.name, ()))
        return config
    me = next(node for node in replica.nodes if node.name == host.name)
    config["peers"] = [node.host_ip for node in replica.nodes if node.name != host.name]
    config["model_path"] = replica.engine.model if replica.engine.model.startswith("/") else ""
    if me.rank == 0 and config["model_path"]:
        # config.json and the safetensors headers, for the memory estimate (checks/memory.py)
        config["weights"] = True
        config["weights_max_bytes"] = WEIGHTS_MAX_BYTES
    port = reach_port(replica)
    if options.reachability and replica.nnodes > 1 and port is not None:
        if me.rank == 0:
            config["listen"] = {"address": me.host_ip, "port": port,
                                "expect": replica.nnodes - 1,
                                "timeout_s": options.reach_timeout_s}
        else:
            config["connect"] = [{"address": replica.master_addr, "port": port,
                                  "timeout_s": options.reach_timeout_s}]
        served = peer_ports(replica)
        config["listens"] = [{"address": me.host_ip, "port": p, "expect": replica.nnodes - 1,
                              "timeout_s": options.reach_timeout_s}
                             for p, _what in served[me.name]]
        config["connect"] = config.get("connect", []) + [
            {"address": node.host_ip, "port": p, "timeout_s": options.reach_timeout_s}
            for node in replica.nodes if node.name != me.name for p, _what in served[node.name]]
    return config


@functools.cache
def probe_loader() -> str:
    """The probe as one ``python -c`` argument (:func:`~vllm_provision.core.quoting.
    python_loader`, compressed: about 14 KB for its 33 KB)."""
    return python_loader(probe_source(), name="probe_script.py", compress=True)


def probe_command(venv: str, config: Mapping[str, Any]) -> str:
    """The one shell line that runs the probe with the venv's Python or python3; it reads no
    standard input (the script is in the line: :func:`probe_loader`).

    The venv's interpreter is used when it exists because package versions must be read where
    vLLM will import them; otherwise ``python3`` runs it and the result says ``venv_found: false``.
    """
    venv_python = shlex.quote(f"{venv.rstrip('/')}/bin/python")
    found = shlex.quote(json.dumps({**config, "venv_found": True}, separators=(",", ":")))
    missing = shlex.quote(json.dumps({**config, "venv_found": False}, separators=(",", ":")))
    return (f"c={shlex.quote(probe_loader())}; if [ -x {venv_python} ]; then exec "
            f"{venv_python} -c \"$c\" {found}; else exec python3 -c \"$c\" {missing}; fi")


# ``NCCL_*`` variables that are not NCCL settings: NVIDIA's CUDA container images set
# ``NCCL_VERSION`` (``ENV NCCL_VERSION=2.28.3-1``, the libnccl package they were built with;
# NCCL reads no such variable, docs.nvidia.com/deeplearning/nccl "Environment Variables").
# Seen on a real H200 host whose image said 2.28.3-1 while torch loaded 2.28.9
# (tests/data/gpu-h200/README.md): comparing it would flag a container beside a bare host.
NOT_NCCL_SETTINGS = frozenset({"NCCL_VERSION"})


def nccl_settings_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The ``NCCL_*`` variables the probe found that NCCL reads (pure): ``env`` without
    :data:`NOT_NCCL_SETTINGS`, values as strings."""
    return {str(k): str(v) for k, v in env.items() if k not in NOT_NCCL_SETTINGS}


def parse_probe_output(host: str, raw: Mapping[str, Any]) -> HostFacts:
    """Turn the probe's JSON document into :class:`HostFacts` (pure; parsers do the work).

    Args:
        host: inventory host name.
        raw: the decoded JSON the probe printed.
    """
    problems = list(raw.get("errors", []))
    raw_cgroups = raw.get("cgroups") or {}
    cgroups = {int(pid): parsers.unit_from_cgroup(text or "")
               for pid, text in raw_cgroups.items()}
    # A pid whose /proc entry was gone when the probe read its cgroup (null) had exited after
    # `ss` listed its socket: a restarting unit's old process, not a holder of the port.
    exited = {int(pid) for pid, text in raw_cgroups.items() if text is None}

    smi = raw.get("nvidia_smi") or {}
    query = smi.get("query_gpu") or {}
    gpus: list = []
    driver: str | None = None
    cuda: str | None = None
    smi_error = ""
    if query.get("rc") == 0:
        gpus, driver = parsers.parse_gpu_csv(query.get("stdout", ""))
        health = smi.get("health") or {}
        if health.get("rc") == 0:
            gpus = parsers.parse_gpu_health_csv(health.get("stdout", ""), gpus)
        elif health:
            problems.append("nvidia-smi GPU health query failed: "
                            + (health.get("stderr") or health.get("stdout") or "").strip()[:200])
        header_driver, cuda = parsers.parse_smi_header((smi.get("header") or {}).get("stdout", ""))
        driver = driver or header_driver
    else:
        smi_error = (query.get("stderr") or query.get("stdout") or "nvidia-smi failed").strip()
    apps = (smi.get("compute_apps") or {}).get("stdout", "")
    processes = [replace(proc, unit=cgroups.get(proc.pid, ""))
                 for proc in parsers.parse_compute_apps_csv(apps)]

    interfaces: dict[str, Interface] = {}
    ip_addr = raw.get("ip_addr") or {}
    if ip_addr.get("rc") == 0:
        try:
            interfaces = parsers.parse_ip_addr_json(ip_addr.get("stdout", ""))
        except ValueError as exc:
            problems.append(f"ip -j addr: {exc}")
    else:
        problems.append(f"ip -j addr failed: {ip_addr.get('stderr', '').strip()}")
    speeds = raw.get("net_speeds") or {}
    interfaces = {name: replace(i, speed_mbps=parsers.parse_sys_speed(speeds.get(name)))
                  for name, i in interfaces.items()}
    routes = {peer: parsers.parse_ip_route_get_json(peer, out.get("stdout", ""))
              if out.get("rc") == 0 else
              Route(peer=peer, error=out.get("stderr", "").strip() or "no route")
              for peer, out in (raw.get("routes") or {}).items()}

    probe_pid = raw.get("probe_pid")
    ss = raw.get("ss") or {}
    listening = [sock for sock in parsers.parse_ss_listening(ss.get("stdout", ""), cgroups)
                 if sock.pid is None or (sock.pid != probe_pid and sock.pid not in exited)]
    if ss.get("rc") not in (0, None):
        problems.append(f"ss -Hltnp failed: {ss.get('stderr', '').strip()}")

    meminfo = parsers.parse_meminfo(raw.get("meminfo", ""))
    model = raw.get("model") or {}
    model_files = (tuple(ModelFile(name, int(size), digest) for name, size, digest in
                         model.get("files", []))
                   if model.get("exists") and model.get("is_dir", True) else None)
    if model.get("truncated"):
        problems.append("model manifest truncated (too many files)")
    model_content, content_problems = parsers.parse_model_content(raw.get("content"))
    problems.extend(content_problems)

    user = raw.get("user") or {}
    python = raw.get("python") or {}
    packages = dict(raw.get("packages") or {})
    torch_cuda = raw.get("torch_cuda_runtime") or parsers.torch_cuda_build(packages.get("torch"))
    listener_raw = raw.get("listener")
    nccl = raw.get("nccl") or {}
    sshd = raw.get("sshd_version") or {}
    fabric = raw.get("fabric") or {}
    unit = parsers.parse_key_values(((fabric.get("unit") or {}).get("stdout")) or "")
    fabric_manager = ("" if not fabric.get("nvswitch_count") else
                      "not-found" if unit.get("LoadState") in (None, "not-found") else
                      unit.get("ActiveState", "unknown"))
    clock = raw.get("clock") or {}
    # before `problems` is frozen into the facts: both may add to it
    owner = parse_owner(host, raw.get("state") or {}, problems)
    extra_facts = extra.parse_extra(raw.get("extra"), problems)
    return HostFacts(
        host=host,
        python_path=str(python.get("executable", "")),
        venv_found=bool(raw.get("venv_found")),
        python_version=str(python.get("version", "")),
        python_micro=parsers.python_micro(str(python.get("version", ""))),
        packages=packages,
        torch_cuda=torch_cuda,
        nccl_loaded=raw.get("nccl_loaded"),
        driver_version=driver,
        cuda_driver_version=cuda,
        gpus=tuple(gpus),
        gpu_processes=tuple(processes),
        nvidia_smi_error=smi_error,
        hostname=str((raw.get("hostname") or {}).get("hostname", "")),
        hostname_addresses=tuple((raw.get("hostname") or {}).get("addresses", [])),
        machine_id=printable(str((raw.get("hostname") or {}).get("machine_id") or ""), limit=64),
        boot_id=printable(str((raw.get("hostname") or {}).get("boot_id") or ""), limit=64),
        interfaces=interfaces,
        routes=routes,
        shm_bytes=(raw.get("shm") or {}).get("size"),
        mem_total_bytes=meminfo.get("MemTotal"),
        mem_available_bytes=meminfo.get("MemAvailable"),
        disk_free_bytes=(raw.get("disk") or {}).get("free"),
        cpu_count=raw.get("cpu_count"),
        model_path=str(raw.get("model_path") or ""),
        model_files=model_files,
        listening=tuple(listening),
        remove_ipc=parsers.parse_logind_remove_ipc(raw.get("logind") or []),
        service_user=ServiceUser(
            name=str(user.get("name", "")), exists=bool(user.get("exists")), uid=user.get("uid"),
            sys_uid_max=parsers.parse_sys_uid_max(raw.get("login_defs", "")),
        ),
        nccl_env=nccl_settings_env(nccl.get("env") or {}),
        nccl_conf=nccl.get("conf"),
        nccl_net_plugins=tuple(nccl.get("plugins") or ()),
        systemd_version=parsers.parse_systemd_version(
            (raw.get("systemctl_version") or {}).get("stdout", "")),
        openssh_version=parsers.parse_openssh_version(
            f"{sshd.get('stdout', '')}\n{sshd.get('stderr', '')}"),
        kernel_release=str(raw.get("kernel_release") or ""),
        os_release=parsers.parse_os_release(str(raw.get("os_release") or "")),
        kernel_modules=tuple(parsers.parse_modules(str(raw.get("modules") or ""),
                                                   KERNEL_MODULES)),
        rdma_ports=tuple(parsers.parse_infiniband_sysfs(raw.get("infiniband") or {})),
        xid_events=tuple(parsers.parse_xid_lines((raw.get("xid") or {}).get("stdout", ""))),
        nvswitch_count=int(fabric.get("nvswitch_count") or 0),
        fabric_manager=fabric_manager,
        clock=parsers.parse_clock(
            (clock.get("timedatectl") or {}).get("stdout", "")
            if (clock.get("timedatectl") or {}).get("rc") == 0 else "",
            (clock.get("chronyc") or {}).get("stdout", "")
            if (clock.get("chronyc") or {}).get("rc") == 0 else "",
            str(clock.get("container") or "")),
        listener=Listener(
            address=listener_raw["address"], port=int(listener_raw["port"]),
            bound=bool(listener_raw["bound"]), accepted=tuple(listener_raw.get("accepted", [])),
            error=listener_raw.get("error", ""),
        ) if listener_raw else None,
        listeners=tuple(Listener(
            address=item["address"], port=int(item["port"]), bound=bool(item["bound"]),
            accepted=tuple(item.get("accepted", [])), error=item.get("error", ""))
            for item in raw.get("listeners") or []),
        reachability=tuple(Reachability(r["address"], int(r["port"]), bool(r["ok"]),
                                        r.get("error", ""), float(r.get("elapsed_s", 0.0)))
                           for r in raw.get("reach") or []),
        problems=tuple(problems),
        owner=owner,
        model_weights=_weights(raw.get("weights")),
        model_content=model_content,
        vllm_venvs=tuple(VenvFound(str(v.get("path", "")), str(v.get("vllm", "")))
                         for v in raw.get("venvs") or () if isinstance(v, dict)),
        extra=extra_facts,
    )


def _weights(raw: Any) -> ModelWeights | None:
    """The probe's ``weights`` section as :class:`ModelWeights`, None when not asked for."""
    if not isinstance(raw, Mapping):
        return None
    return weights.summarise(raw.get("config"), raw.get("files") or [], raw.get("errors") or [])


def parse_owner(host: str, raw: Mapping[str, Any], problems: list[str]) -> HostOwner | None:
    """The :class:`HostOwner` in the probe's ``state`` section (pure); None when the host has
    no record. A record that is not ours appends to ``problems`` and counts as none.

    The record's ``host`` key names the host's own entry (each host's copy carries it); a
    record written before that key existed is read under the inventory name ``host``.
    """
    if raw.get("error"):
        problems.append(str(raw["error"]))
    record = raw.get("record")
    if not isinstance(record, dict):
        return None
    hosts = record.get("hosts")
    if not isinstance(hosts, dict):
        problems.append("the state record has no hosts")
        return None
    me = str(record.get("host") or host)
    found = hosts.get(me)
    entry: dict[str, Any] = found if isinstance(found, dict) else {}
    invocations = raw.get("invocations") or {}
    started = {}
    for unit, snap in (entry.get("started_from") or {}).items():
        if not isinstance(snap, dict):
            continue
        now = invocations.get(unit) or {}
        started[str(unit)] = UnitStart(
            unit=str(unit), invocation=str(snap.get("invocation") or ""),
            files={str(k): str(v) for k, v in (snap.get("files") or {}).items()},
            active_now=str(now.get("active") or ""),
            invocation_now=str(now.get("invocation") or ""))
    replica = str(entry.get("replica") or "")
    found_about = (record.get("replicas") or {}).get(replica)
    about: dict[str, Any] = found_about if isinstance(found_about, dict) else {}
    units = entry.get("units")
    rank = entry.get("rank")
    nodes = about.get("nodes")
    engine = about.get("engine")
    return HostOwner(inventory=str(record.get("inventory") or ""),
                     replica=replica, host=me,
                     files={str(k): str(v) for k, v in (entry.get("files") or {}).items()},
                     started=started,
                     backend=str(about.get("backend") or ""),
                     rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                     units=tuple(str(u) for u in units) if isinstance(units, list) else None,
                     replica_id=str(about.get("replica_id") or ""),
                     controller=str(record.get("controller") or ""),
                     nodes=tuple(str(n) for n in nodes) if isinstance(nodes, list) else (),
                     model=str(engine.get("model") or "") if isinstance(engine, dict) else "")


def probe_host(host: Host, conn: Connection, replica: Replica | None,
               options: ProbeOptions) -> HostFacts:
    """Probe one host: exactly one ``conn.run`` (one SSH exec channel), then parse.

    Raises:
        UnreachableError: the connection failed or the probe ran past its time limit.
        ProvisionError: the probe did not print JSON (no Python on the host, a crash).
    """
    config = probe_config(host, replica, options)
    result = conn.run(probe_command(str(host_var(host, "vllm_venv")), config),
                      timeout_s=options.command_timeout_s)
    return parse_probe_result(host, config, result.stdout, result.stderr, result.exit_code)


def probe_commands(inventory: Inventory, names: Sequence[str], options: ProbeOptions
                   ) -> dict[str, tuple[dict[str, Any], str]]:
    """Host name -> ``(its probe's settings, the probe command)`` for each of ``names``: what
    :func:`gather_facts` sends, and what a caller that sends the probes itself sends (``up``:
    in the run lock's first answer, all hosts at once, as the reachability test needs) before
    it parses each answer with :func:`parse_probe_result`."""
    from vllm_provision.stack.lock import lock_packages

    commands = {}
    for name in names:
        host = inventory.hosts[name]
        mine = replace(options, extra_packages=lock_packages(inventory, name))
        config = probe_config(host, inventory.replica_of(name), mine)
        commands[name] = config, probe_command(str(host_var(host, "vllm_venv")), config)
    return commands


def parse_probe_result(host: Host, config: Mapping[str, Any], stdout: str, stderr: str,
                       exit_code: int) -> HostFacts:
    """Parse one probe's output (its last line, one JSON document) into ``HostFacts``.

    Args:
        host: the probed host. config: the settings the probe was sent
            (:func:`probe_config`). stdout / stderr / exit_code: what the probe printed.

    Raises:
        ProvisionError: the probe did not print JSON (no Python on the host, a crash).
    """
    try:
        text = stdout.strip()
        raw = hostjson.loads(text.splitlines()[-1]) if text else None
    except json.JSONDecodeError:
        raw = None
    if not isinstance(raw, dict):
        detail = (stderr.strip() or stdout.strip())[-1500:]
        raise ProvisionError.single(
            host.name, "the fact probe did not return facts",
            expected="one JSON document from python3 (>= 3.8)",
            actual=f"exit status {exit_code}: {detail}",
            fix=f"install python3 on {host.name} (or the venv at {host_var(host, 'vllm_venv')})",
        )
    raw = {**raw, "model_path": config.get("model_path", ""),
           "user": {**(raw.get("user") or {}), "name": config.get("service_user", "")}}
    return parse_probe_output(host.name, raw)


def gather_facts(inventory: Inventory, connections: Mapping[str, Connection],
                 options: ProbeOptions | None = None,
                 hosts: Sequence[str] | None = None,
                 ) -> tuple[dict[str, HostFacts], dict[str, ProvisionError]]:
    """Probe every host in parallel, one round trip each.

    All probes run at the same time on purpose: the reachability test needs the master's
    short-lived listener open while the followers connect.

    Args:
        inventory: the loaded inventory.
        connections: open connections by host name (hosts without one are skipped).
        options: what to gather (default :class:`ProbeOptions`).
        hosts: host names to probe (default: every host that has a connection).

    Returns:
        ``(facts by host name, errors by host name)``: each probed host is in exactly one.
    """
    options = options or ProbeOptions()
    names = [name for name in (hosts or list(connections)) if name in connections]
    commands = probe_commands(inventory, names, options)

    def one(name: str) -> tuple[str, HostFacts | ProvisionError]:
        config, command = commands[name]
        try:
            result = connections[name].run(command, timeout_s=options.command_timeout_s)
            return name, parse_probe_result(inventory.hosts[name], config, result.stdout,
                                            result.stderr, result.exit_code)
        except (UnreachableError, ProvisionError) as exc:
            return name, exc

    return split_map(one, names, workers=len(names), failure=ProvisionError)
