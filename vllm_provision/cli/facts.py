"""``provision facts``: probe every host (one SSH round trip each), show facts side by side."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, shared_options
from vllm_provision.core.text import printable
from vllm_provision.facts.extra import Fact, all_facts
from vllm_provision.facts.model import HostFacts

MIB = 1024 * 1024


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value // MIB} MiB"


def _ports(f: HostFacts) -> str:
    return ", ".join(sorted({f"{s.port}" + (f" ({s.unit or s.process})" if s.unit or s.process
                                            else "") for s in f.listening}))


def _model(f: HostFacts) -> str:
    if f.model_files is None:
        return f"{f.model_path}: missing" if f.model_path else "-"
    return (f"{f.model_path}: {len(f.model_files)} files, "
            f"{sum(m.size for m in f.model_files)} bytes")


def _weights(f: HostFacts) -> str:
    w = f.model_weights
    if w is None:
        return "-"
    dtypes = ", ".join(f"{d} {n / 2**30:.2f} GiB" for d, n in sorted(w.by_dtype.items()))
    text = f"{w.files} safetensors, {w.tensors} tensors, {dtypes or '0 bytes'}"
    return text + (f" ({'; '.join(w.errors[:2])})" if w.errors else "")


def _content(f: HostFacts) -> str:
    c = f.model_content
    if c is None:
        return "-"
    text = f"{c.digest[:12]} ({len(c.files)} files)" if c.digest else "nothing to fingerprint"
    return text + (f" ({'; '.join(c.errors[:2])})" if c.errors else "")


def _user(f: HostFacts) -> str:
    user = f.service_user
    if user is None or not user.name:
        return "-"
    if not user.exists:
        return f"{user.name}: absent"
    return f"{user.name}: uid {user.uid} ({'system' if user.is_system else 'login'})"


def gpu_processes_text(f: HostFacts) -> str:
    """Every compute process once per GPU it runs on, with the GPU index (``GPU 0: 4711
    VLLM::Worker [vllm.service]``), in GPU order."""
    index = {gpu.uuid: gpu.index for gpu in f.gpus}
    rows = sorted(((index.get(p.gpu_uuid, -1), p.pid, p) for p in f.gpu_processes),
                  key=lambda row: (row[0], row[1]))
    return ", ".join(
        f"GPU {i if i >= 0 else p.gpu_uuid or '?'}: {p.pid} {p.process_name}"
        + (f" [{p.unit}]" if p.unit else "") for i, _pid, p in rows) or "none"


def _per_gpu(f: HostFacts, read: Callable[[Any], Any], healthy: str) -> str:
    words = {True: "on", False: "off", None: "?"}
    values = [(g.index, read(g)) for g in f.gpus]
    texts = [(i, words[v] if isinstance(v, bool) or v is None else str(v)) for i, v in values]
    if texts and all(text == healthy for _i, text in texts):
        return f"{healthy} (all)"
    return ", ".join(f"{i}: {text}" for i, text in texts) or "-"


def _clock(f: HostFacts) -> str:
    c = f.clock
    if not c.source:
        return "?"
    sync = {True: "synchronised", False: "NOT synchronised", None: "?"}[c.synchronized]
    return (sync + (f", offset {c.offset_s:+.6f} s" if c.offset_s is not None else "")
            + (f" (in {c.container}: the host's clock)" if c.container else ""))


ROWS: tuple[tuple[str, Callable[[HostFacts], str]], ...] = (
    ("python (probe)", lambda f: f"{f.python_path}" + ("" if f.venv_found else " (no venv)")),
    ("python", lambda f: f.python_micro),
    ("vllm", lambda f: str(f.packages.get("vllm"))),
    ("torch", lambda f: str(f.packages.get("torch"))),
    ("torch CUDA build", lambda f: str(f.torch_cuda)),
    ("NCCL", lambda f: f"{f.nccl_version} ({f.nccl_package})" if f.nccl_version else "None"),
    ("ray", lambda f: str(f.packages.get("ray"))),
    ("transformers", lambda f: str(f.packages.get("transformers"))),
    ("driver", lambda f: str(f.driver_version) if not f.nvidia_smi_error else f.nvidia_smi_error),
    ("CUDA (driver)", lambda f: str(f.cuda_driver_version)),
    ("GPUs", lambda f: f"{len(f.gpus)} x {f.gpu_model}" if f.gpus else "0"),
    ("GPU memory", lambda f: ", ".join(sorted({f"{g.memory_total_mib} MiB" for g in f.gpus}))),
    ("GPU processes", lambda f: gpu_processes_text(f)),
    ("GPU memory used", lambda f: ", ".join(
        f"{g.index}: {'?' if g.memory_used_mib is None else g.memory_used_mib} MiB"
        for g in f.gpus) or "-"),
    ("GPU ECC uncorrectable", lambda f: _per_gpu(f, lambda g: g.ecc_uncorrected, "0")),
    ("GPU persistence mode", lambda f: _per_gpu(f, lambda g: g.persistence_mode, "on")),
    ("GPU MIG mode", lambda f: _per_gpu(f, lambda g: g.mig_mode, "off")),
    ("Xid (24 h)", lambda f: ", ".join(f"Xid {e.code} on {e.pci}" for e in f.xid_events)
     or "none"),
    ("NVSwitch / fabric manager", lambda f: f"{f.nvswitch_count} / {f.fabric_manager}"
     if f.nvswitch_count else "no NVSwitch"),
    ("hostname", lambda f: f"{f.hostname} -> {', '.join(f.hostname_addresses) or '?'}"),
    ("interfaces", lambda f: ", ".join(
        f"{i.name} {i.state} {'/'.join(i.addresses)}" for i in f.interfaces.values()
        if i.name != "lo")),
    ("MTU", lambda f: ", ".join(f"{i.name} {i.mtu}" + (f" {i.speed_mbps} Mb/s" if i.speed_mbps
                                                         else "")
                                for i in f.interfaces.values() if i.name != "lo")),
    ("RDMA ports", lambda f: ", ".join(
        f"{p.device}/{p.port} {p.state} {p.link_layer} fw {p.firmware}" for p in f.rdma_ports)
     or "none"),
    ("kernel modules", lambda f: ", ".join(f.kernel_modules) or "none"),
    ("kernel", lambda f: f.kernel_release or "?"),
    ("OS", lambda f: f.os_release or "?"),
    ("clock", lambda f: _clock(f)),
    ("routes", lambda f: ", ".join(f"{p} via {r.dev or r.error}" for p, r in f.routes.items())),
    ("/dev/shm", lambda f: _mib(f.shm_bytes)),
    ("memory available", lambda f: _mib(f.mem_available_bytes)),
    ("disk free (model fs)", lambda f: _mib(f.disk_free_bytes)),
    ("CPUs", lambda f: str(f.cpu_count)),
    ("model", _model),
    ("model weights", lambda f: _weights(f)),
    ("model content", _content),
    ("listening TCP", _ports),
    ("logind RemoveIPC", lambda f: "yes" if f.remove_ipc else "no"),
    ("service user", _user),
    ("NCCL_* env", lambda f: " ".join(f"{k}={v}" for k, v in sorted(f.nccl_env.items()))
     or "none"),
    ("/etc/nccl.conf", lambda f: "absent" if f.nccl_conf is None else
     f.nccl_conf.strip().replace("\n", "; ") or "empty"),
    ("NCCL net plugins", lambda f: ", ".join(f.nccl_net_plugins) or "none"),
    ("systemd", lambda f: str(f.systemd_version)),
    ("OpenSSH server", lambda f: str(f.openssh_version)),
)
# Last, after the rows of the fact modules (all_rows).
PROBLEMS_ROW: tuple[str, Callable[[HostFacts], str]] = (
    "probe problems", lambda f: "; ".join(f.problems) or "none")
# Rows whose values differ per host by nature: never highlighted.
NOT_COMPARED = {"hostname", "interfaces", "routes", "GPU memory used", "clock",
                "memory available", "disk free (model fs)", "listening TCP", "GPU processes",
                "python (probe)", "probe problems", "model weights"}


def all_rows() -> list[tuple[str, Callable[[HostFacts], str]]]:
    """The rows of the table: :data:`ROWS`, a row per fact module
    (``vllm_provision/facts/extra/``: its label and its ``text``; ``-`` where the host could
    not read it or the probe did not gather it), then :data:`PROBLEMS_ROW`."""
    def read(item: Fact) -> Callable[[HostFacts], str]:
        return lambda f: "-" if f.extra.get(item.name) is None else item.text(f.extra[item.name])

    return [*ROWS, *((item.label, read(item)) for item in all_facts()), PROBLEMS_ROW]


def facts_table_rows(facts: Mapping[str, HostFacts], groups: list[list[str]],
                     ) -> list[tuple[str, list[tuple[str, bool]]]]:
    """Rows of the facts table: (label, [(value, differs within the host's replica)] per host).

    Args:
        facts: facts by host name, in column order.
        groups: host names per replica; a value is flagged when it differs from another host
            of the same group.
    """
    names = list(facts)
    group_of = {name: group for group in groups for name in group}
    not_compared = NOT_COMPARED | {item.label for item in all_facts() if not item.compared}
    rows = []
    for label, read in all_rows():
        values = {name: read(facts[name]) for name in names}
        cells = []
        for name in names:
            peers = [p for p in group_of.get(name, [name]) if p in values]
            differs = (label not in not_compared
                       and len({values[p] for p in peers}) > 1)
            cells.append((values[name], differs))
        rows.append((label, cells))
    return rows


DIFFERS_MARK = "* "


def facts_table(facts: Mapping[str, HostFacts], groups: list[list[str]]) -> Any:
    """The facts as a ``rich`` table, hosts as columns (:func:`facts_table_rows`).

    Every value is made printable (:func:`vllm_provision.core.text.printable`) and never read
    as rich markup. A value that differs within its replica is marked ``* `` and printed bold
    red, so the difference shows in a pipe (no colour) as well. Long values wrap at spaces and
    commas; only a word longer than its column (a long path) is folded. At 80 columns the fact
    names never break: the first column is as wide as the longest name.
    """
    from rich.table import Table
    from rich.text import Text

    table = Table(title="facts (* = differs within the replica)", title_justify="left",
                  show_lines=False, padding=(0, 1))
    table.add_column("fact", style="bold", no_wrap=True)
    for name in facts:
        table.add_column(name, overflow="fold", ratio=1)
    for label, cells in facts_table_rows(facts, groups):
        # A value is the host's text: printable (no terminal escape), a Text (no markup).
        table.add_row(label, *(Text(printable(DIFFERS_MARK + value if differs else value,
                                              newlines=True),
                                    style="bold red" if differs else "")
                               for value, differs in cells))
    return table


@click.command("facts", epilog=examples(
    'provision facts -i inventory.yml',
    'provision facts -i inventory.yml -l h2 --json',
    'provision facts -i inventory.yml --nccl-loaded --sha256'))
@shared_options(HOST_OPTIONS)
@click.option("--nccl-loaded", is_flag=True,
              help="Also import torch and read the NCCL it loads (slow).")
@click.option("--sha256", is_flag=True, help="Hash every model file (slow on big models).")
def command(nccl_loaded: bool, sha256: bool, **kwargs: Any) -> None:
    """Probe every host in one SSH round trip each and print the facts, hosts as columns.

    --limit selects the hosts to probe (default: all). Values that differ between the nodes of
    one replica are highlighted.
    """
    from vllm_provision.facts.collect import collect_facts
    from vllm_provision.facts.gather import ProbeOptions
    from vllm_provision.inventory import select_hosts

    opts = CommonOptions.from_kwargs(kwargs)
    as_json = opts.json
    inventory = opts.load_inventory()
    hosts = select_hosts(inventory, opts.limit or "all")
    facts, errors = collect_facts(inventory, hosts, ProbeOptions(
        nccl_loaded=nccl_loaded, sha256=sha256, reachability=False), opts.connection_options())
    ordered = {h.name: facts[h.name] for h in hosts if h.name in facts}
    if as_json:
        from vllm_provision.checks.run import memory_estimates

        click.echo(json.dumps({
            "hosts": {name: f.to_json() for name, f in ordered.items()},
            "memory": memory_estimates(inventory.replicas, ordered),
            "errors": {name: e.render() for name, e in errors.items()},
        }, indent=2, default=str))
        sys.exit(1 if errors else 0)
    from rich.console import Console
    from rich.text import Text

    console = Console()
    groups = [[n.name for n in r.nodes] for r in inventory.replicas]
    if ordered:
        console.print(facts_table(ordered, groups))
    for name, error in errors.items():
        console.print(Text(printable(f"{name}: {error.render()}", newlines=True),
                           style="bold red"))
    sys.exit(1 if errors else 0)
