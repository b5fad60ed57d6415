"""The lab's network: a private bridge, one netns + veth per host, delay, cut and heal.

The guests get no default route and the main machine's ip_forward is untouched, so they reach only
the bridge /24 (the main machine and each other): no internet, no DNS (probe gotcha 12).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from vllm_provision_lab import cgroups
from vllm_provision_lab.config import LabConfig, host_index
from vllm_provision_lab.errors import LabError
from vllm_provision_lab.system import run

NETNS_DIR = Path("/run/netns")
CUT_CHAIN = "VP_CUT"
DELAY_CHAIN = "VP_DELAY"
DELAYER = Path(__file__).with_name("delayer.py")


def link_exists(name: str) -> bool:
    """True when a network interface ``name`` exists in the main machine's namespace."""
    return Path("/sys/class/net", name).exists()


def ensure_bridge(config: LabConfig) -> None:
    """Create the instance's bridge with address ``<net>.1/24`` and bring it up (idempotent)."""
    if not link_exists(config.bridge):
        run(["ip", "link", "add", config.bridge, "type", "bridge"])
    addresses = run(["ip", "-o", "-4", "addr", "show", "dev", config.bridge]).stdout
    if f" {config.bridge_address}/24 " not in addresses:
        run(["ip", "addr", "add", f"{config.bridge_address}/24", "dev", config.bridge])
    run(["ip", "link", "set", config.bridge, "up"])


def add_host_network(config: LabConfig, host: str) -> None:
    """Create the host's netns and a veth: ``eth0`` inside with its fixed /24 address, the other
    end (named like the netns) on the bridge. No default route is added."""
    netns = config.netns(host)
    run(["ip", "netns", "add", netns])
    run(["ip", "link", "add", netns, "type", "veth", "peer", "name", "eth0", "netns", netns])
    run(["ip", "link", "set", netns, "master", config.bridge, "up"])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])
    run(["ip", "-n", netns, "addr", "add", f"{config.address(host)}/24", "dev", "eth0"])
    run(["ip", "-n", netns, "link", "set", "eth0", "up"])


def remove_host_network(config: LabConfig, host: str) -> None:
    """Delete the host's netns (which destroys its veth pair) and the veth if it survived."""
    netns = config.netns(host)
    if (NETNS_DIR / netns).exists():
        run(["ip", "netns", "del", netns], check=False)
    if link_exists(netns):
        run(["ip", "link", "del", netns], check=False)


def leftover_hosts(config: LabConfig) -> list[str]:
    """Return host names of this instance that still have a netns or a host-side veth."""
    pattern = re.compile(rf"^{re.escape(config.name)}-(h\d+)$")
    names: set[str] = set()
    if NETNS_DIR.is_dir():
        names.update(m.group(1) for p in NETNS_DIR.iterdir() if (m := pattern.match(p.name)))
    names.update(m.group(1) for p in Path("/sys/class/net").iterdir()
                 if (m := pattern.match(p.name)))
    return sorted(names)


def remove_bridge(config: LabConfig) -> None:
    """Delete the instance's bridge if it exists."""
    if link_exists(config.bridge):
        run(["ip", "link", "del", config.bridge], check=False)


def _iptables(config: LabConfig, host: str, *args: str, check: bool = True,
              ) -> subprocess.CompletedProcess[str]:
    return run(["ip", "netns", "exec", config.netns(host), "iptables", "-w", *args], check=check)


def _ensure_chain(config: LabConfig, host: str, table: str, chain: str,
                  hooks: tuple[str, ...]) -> None:
    """Create (or flush) ``chain`` in ``table`` of the host's netns; jump to it from ``hooks``."""
    if _iptables(config, host, "-t", table, "-N", chain, check=False).returncode != 0:
        _iptables(config, host, "-t", table, "-F", chain)
    for hook in hooks:
        if _iptables(config, host, "-t", table, "-C", hook, "-j", chain, check=False).returncode:
            _iptables(config, host, "-t", table, "-A", hook, "-j", chain)


def cut(config: LabConfig, host: str) -> None:
    """Drop every packet the host sends or receives (iptables DROP in its netns).

    ARP still works, so peers see a silent black hole: TCP connects time out rather than fail
    fast, as on a real partition.
    """
    _require_netns(config, host)
    _ensure_chain(config, host, "filter", CUT_CHAIN, ("INPUT", "OUTPUT"))
    _iptables(config, host, "-t", "filter", "-A", CUT_CHAIN, "!", "-i", "lo", "-j", "DROP")
    _iptables(config, host, "-t", "filter", "-A", CUT_CHAIN, "!", "-o", "lo", "-j", "DROP")


def heal(config: LabConfig, host: str) -> None:
    """Undo :func:`cut`: the host's traffic flows again."""
    _require_netns(config, host)
    _ensure_chain(config, host, "filter", CUT_CHAIN, ("INPUT", "OUTPUT"))


def is_cut(config: LabConfig, host: str) -> bool:
    """True when the host's cut chain holds DROP rules."""
    proc = _iptables(config, host, "-t", "filter", "-S", CUT_CHAIN, check=False)
    return proc.returncode == 0 and "DROP" in proc.stdout


def delay(config: LabConfig, host: str, delay_ms: float, run_dir: Path,
          peer_address: str | None = None) -> None:
    """Delay every packet ``host`` sends on eth0 (to ``peer_address`` only, if given) by
    ``delay_ms`` milliseconds, so round trips through it grow by that much; 0 removes the delay.

    netem is not in this kernel (``CONFIG_NET_SCH_NETEM`` unset, probe "Latency"), so an iptables
    NFQUEUE rule (mangle POSTROUTING) hands packets to :mod:`vllm_provision_lab.delayer`, which
    runs in the host's netns and accepts each packet after the delay. ``--queue-bypass`` lets
    packets pass if the delayer dies.

    Raises:
        LabError: the host has no netns, or the delayer did not start (its log is quoted).
    """
    _require_netns(config, host)
    if delay_ms < 0:
        raise LabError.single("lab delay", "a delay cannot be negative", expected="MS >= 0",
                              actual=str(delay_ms))
    stop_delayer(run_dir)
    _ensure_chain(config, host, "mangle", DELAY_CHAIN, ("POSTROUTING",))
    if delay_ms == 0:
        return
    queue = str(host_index(host))
    pid_file, log_file = run_dir / "delay.pid", run_dir / "delay.log"
    with open(log_file, "w") as log_handle:
        # the delayer is stdlib-only: run it by path with -I (no site dir, no project imports)
        process = subprocess.Popen(
            ["ip", "netns", "exec", config.netns(host), sys.executable, "-I", str(DELAYER),
             "--queue", queue, "--delay-ms", str(delay_ms), "--pidfile", str(pid_file)],
            stdin=subprocess.DEVNULL, stdout=log_handle, stderr=subprocess.STDOUT,
            start_new_session=True)
    # in the host's cgroup, so `down` (cgroup.kill) never leaves a delayer behind
    cgroups.join(config.cgroup_subtree, host, process.pid)
    deadline = time.monotonic() + 5
    while not pid_file.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not pid_file.exists():
        process.kill()
        raise LabError.single(f"lab delay {host}", "the packet delayer did not start",
                              actual=log_file.read_text().strip()[-500:])
    match = ["-d", peer_address] if peer_address else []
    _iptables(config, host, "-t", "mangle", "-A", DELAY_CHAIN, "-o", "eth0", *match,
              "-j", "NFQUEUE", "--queue-num", queue, "--queue-bypass")


RATE_PATTERN = re.compile(r"^[1-9][0-9]{0,6}(kbit|mbit|gbit)$")


def rate(config: LabConfig, host: str, limit: str) -> None:
    """Shape what ``host`` receives to ``limit`` (tc's units: ``100mbit``, ``1gbit``) with a
    token bucket (``tbf``, in this kernel: ``CONFIG_NET_SCH_TBF=y``) on the host-side end of its
    veth, whose egress is the host's ingress; ``off`` removes it. The guest's ``eth0`` keeps
    reporting the veth's 10000 Mb/s, as a real NIC reports its rated speed whatever the path.

    Raises:
        LabError: the host has no netns, or ``limit`` is not ``off`` or ``<n>kbit|mbit|gbit``.
    """
    _require_netns(config, host)
    link = config.netns(host)
    if limit == "off":
        run(["tc", "qdisc", "del", "dev", link, "root"], check=False)
        return
    if not RATE_PATTERN.match(limit):
        raise LabError.single("lab rate", f"{limit!r} is not a rate",
                              expected="off, or a number with kbit, mbit or gbit (100mbit)")
    # burst: a few milliseconds at the rate, at least 64 KiB (a TSO segment), so the bucket
    # does not cut large segments and the rate holds within a percent or two
    run(["tc", "qdisc", "replace", "dev", link, "root", "tbf", "rate", limit,
         "burst", "256kb", "latency", "100ms"])


def stop_delayer(run_dir: Path) -> None:
    """Stop the host's delayer process, if one runs (its pid is in ``<run_dir>/delay.pid``)."""
    pid_file = run_dir / "delay.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().strip() or 0)
    if pid and _cmdline(pid).find("delayer.py") >= 0:
        run(["kill", "-TERM", str(pid)], check=False)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.05)
    pid_file.unlink(missing_ok=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _require_netns(config: LabConfig, host: str) -> None:
    host_index(host)
    if not (NETNS_DIR / config.netns(host)).exists():
        raise LabError.single(host, "is not up in this lab instance",
                              actual=f"no network namespace {config.netns(host)}",
                              fix="run `provision lab up` (or check VLLM_PROVISION_LAB_NAME)")
