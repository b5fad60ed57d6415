"""Benchmark vllm-provision against ansible-playbook and pyinfra on the lab (bench/README.md).

Runs the same workload (bench/workload/) with the three tools on the running lab instance and
times each WHOLE command from outside (start-up included): wall seconds from a monotonic clock
around the child, CPU seconds (user + system) from the kernel's accounting of finished children
(``resource.getrusage(RUSAGE_CHILDREN)``). One round runs every tool once, in turn, so the
per-round ratio tool/vllm-provision is paired: it stays meaningful when the shared machine's speed
drifts. Figures are printed as median [min-max].

Usage (root, from the repository root, with the lab instance settings in the environment)::

    .venv/bin/python bench/run.py setup                       # the anchor tools' venvs
    .venv/bin/provision lab up --hosts 2
    .venv/bin/python bench/run.py play --hosts 2 --rounds 7   # workload, 3 tools
    .venv/bin/python bench/run.py play --hosts 2 --delay-ms 20
    .venv/bin/python bench/run.py product --rounds 5          # provision check / up, lab-mp
    .venv/bin/python bench/run.py profile --hosts 2           # cProfile + round trips, play
    .venv/bin/python bench/run.py profile --command up        # the same, no-change up on lab-mp
    .venv/bin/python bench/run.py readiness --rounds 3        # port open -> verify request
    .venv/bin/provision lab down

The ``floor`` column is bench/floor.py: one connection and one command per host, the least any
tool can send for the workload's no-change decision.

Each ``play`` scenario first cleans the workload off the hosts, times every tool's FIRST run on
clean hosts (one sample each, cleaned again between tools), then ``--rounds`` no-change rounds,
then checks that a no-change run of each tool really changed nothing. Results are written as JSON
to ``bench/results/<scenario>.json`` and printed as a Markdown table.

``profile`` runs one no-change command under cProfile with ``--json`` and writes the top
functions by cumulative time (``bench/results/profile-*.txt``) and the connection layer's counts
of commands and round trips per host (``stats``, ``bench/results/profile-*.json``).

Errors: a tool that exits non-zero stops the scenario with its log file named (SystemExit).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OUT = BENCH / ".out"
RESULTS = BENCH / "results"
WORKLOAD = BENCH / "workload"
PROVISION = ROOT / ".venv" / "bin" / "provision"
PYTHON = ROOT / ".venv" / "bin" / "python"
TOOLS = ("vllm-provision", "ansible", "ansible-tuned", "pyinfra", "floor")
# how many of the controller's functions the profile lists (by cumulative time)
PROFILE_TOP = 40
ANSIBLE_VENV = BENCH / ".venv-ansible"
PYINFRA_VENV = BENCH / ".venv-pyinfra"
# ansible-core 2.21 (the newest) needs Python >= 3.12 on the controller; this machine has 3.11.
# The 2.17 line runs on a 3.11 controller and manages Debian 12's Python 3.11 on the lab hosts.
ANSIBLE_REQUIREMENT = "ansible-core==2.17.14"
PYINFRA_REQUIREMENTS = ("pyinfra==3.10.0", "PyYAML==6.0.2")
# what the workload leaves on a host; removed before each first run
CLEAN_SCRIPT = ("systemctl disable --now bench-a.service bench-b.service >/dev/null 2>&1; "
                "rm -f /etc/systemd/system/bench-a.service /etc/systemd/system/bench-b.service "
                "/etc/systemd/system/bench-a.service.prev /etc/systemd/system/bench-b.service.prev "
                "/etc/default/bench-a /etc/default/bench-b /etc/default/bench-a.prev "
                "/etc/default/bench-b.prev; rm -rf /var/lib/vllm-provision; "
                "systemctl daemon-reload")


@dataclass(frozen=True)
class Lab:
    """The lab instance from the environment (docs/architecture.md "Lab instances")."""

    state_dir: Path
    net: str

    @classmethod
    def from_env(cls) -> Lab:
        """Read VLLM_PROVISION_LAB_DIR and VLLM_PROVISION_LAB_NET (vllm_provision_lab.config's
        defaults)."""
        return cls(Path(os.environ.get("VLLM_PROVISION_LAB_DIR", "/var/lib/vllm-provision/lab")),
                   os.environ.get("VLLM_PROVISION_LAB_NET", "10.213.0"))

    def address(self, index: int) -> str:
        """Address of host ``h<index>``: .(10 + index) of the lab's /24."""
        return f"{self.net}.{10 + index}"


@dataclass(frozen=True)
class Tool:
    """One command line to time: ``argv`` run in ``cwd`` with ``env`` added."""

    name: str
    argv: tuple[str, ...]
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Samples:
    """Timings of one tool in one scenario, in seconds."""

    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)


def write_inventory(lab: Lab, hosts: int) -> Path:
    """Write the Ansible-YAML inventory of the benchmark: group ``bench`` = h1..h<hosts>.

    Connection variables as the lab's own inventories (root, lab key, lab known_hosts), which all
    three tools read. Returns the file's path (bench/.out/inventory-<hosts>.yml).
    """
    OUT.mkdir(exist_ok=True)
    path = OUT / f"inventory-{hosts}.yml"
    lines = ["all:", "  vars:", "    ansible_user: root", "    ansible_port: 22",
             f"    ansible_ssh_private_key_file: {lab.state_dir / 'id_ed25519'}",
             f"    ansible_ssh_common_args: -o UserKnownHostsFile={lab.state_dir / 'known_hosts'}",
             "  children:", "    bench:", "      hosts:"]
    lines += [f"        h{i}: {{ansible_host: {lab.address(i)}}}" for i in range(1, hosts + 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def workload_tools(inventory: Path, hosts: int, names: list[str]) -> list[Tool]:
    """The workload's command lines, vllm-provision first (the ratios' denominator)."""
    ansible_env = {"ANSIBLE_CONFIG": str(WORKLOAD / "ansible" / "ansible.cfg")}
    tools = {
        "vllm-provision": Tool("vllm-provision", (str(PROVISION), "play", "-i", str(inventory),
                                                  str(WORKLOAD / "site.yml"))),
        "ansible": Tool("ansible", (str(ANSIBLE_VENV / "bin" / "ansible-playbook"), "-i",
                                    str(inventory), str(WORKLOAD / "ansible" / "site.yml")),
                        env=ansible_env),
        "ansible-tuned": Tool("ansible-tuned",
                              (str(ANSIBLE_VENV / "bin" / "ansible-playbook"), "-i",
                               str(inventory), str(WORKLOAD / "ansible" / "site.yml")),
                              env={**ansible_env, "ANSIBLE_PIPELINING": "True",
                                   "ANSIBLE_FORKS": str(max(hosts, 5))}),
        "pyinfra": Tool("pyinfra", (str(PYINFRA_VENV / "bin" / "pyinfra"), "-y", "inventory.py",
                                    "deploy.py"),
                        cwd=WORKLOAD / "pyinfra", env={"BENCH_INVENTORY": str(inventory)}),
        "floor": Tool("floor", (str(PYTHON), str(BENCH / "floor.py"), "-i", str(inventory))),
    }
    return [tools[name] for name in names]


def time_once(tool: Tool, log: Path) -> tuple[float, float]:
    """Run ``tool`` once, output appended to ``log``; return (wall seconds, CPU seconds).

    Raises:
        SystemExit: the command exited non-zero.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n===== {' '.join(tool.argv)}\n")
        out.flush()
        start = time.monotonic()
        code = subprocess.run(tool.argv, cwd=tool.cwd, env={**os.environ, **tool.env},
                              stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              check=False).returncode
        wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit(f"{tool.name} exited {code}; see {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def clean_hosts(lab: Lab, hosts: int) -> None:
    """Remove what the workload installed from h1..h<hosts> (plain ssh with the lab's config)."""
    procs = [subprocess.Popen(["ssh", "-F", str(lab.state_dir / "ssh_config"), f"h{i}",
                               CLEAN_SCRIPT], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(1, hosts + 1)]
    for proc in procs:
        proc.wait()


def no_change_verdict(tool: Tool, log: Path) -> str:
    """Run ``tool`` once more and say whether it reported no change ("ok") or what it reported."""
    result = subprocess.run(tool.argv, cwd=tool.cwd, env={**os.environ, **tool.env},
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    text = result.stdout + result.stderr
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n===== verdict run: {' '.join(tool.argv)}\n{text}")
    if tool.name.startswith("ansible"):
        counts = re.findall(r"changed=(\d+)", text)
        return "ok" if counts and all(c == "0" for c in counts) else "CHANGED"
    if tool.name == "floor":  # it exits 0 only when every host is as the workload leaves it
        return "ok" if result.returncode == 0 else "CHANGED"
    if tool.name == "pyinfra":  # results table: Grand total  <hosts> <success> <error> <no change>
        match = re.search(r"Grand total\s+\d+\s+(\S+)\s+(\S+)", text)
        if match is None:
            return "see log"
        return "ok" if match.group(1) in ("-", "0") and match.group(2) in ("-", "0") else "CHANGED"
    # vllm-provision's recap: "<host>  <ok>  <changed>  <failed>  <skipped>  <unreachable>"
    counts = re.findall(r"^\S+\s+\d+\s+(\d+)\s+\d+\s+\d+\s+\d+\s*$", text, re.MULTILINE)
    if not counts:
        return "see log"
    return "ok" if all(c == "0" for c in counts) else "CHANGED"


def summary(values: list[float]) -> str:
    """``median [min-max]`` with two decimals."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def measure(tools: list[Tool], rounds: int, log: Path,
            first: dict[str, tuple[float, float]] | None = None) -> dict[str, object]:
    """Time ``rounds`` interleaved rounds of ``tools`` (one warm-up round first, not counted).

    Returns the scenario's result: per tool the samples, and the paired ratios to the first tool.
    """
    samples = {tool.name: Samples() for tool in tools}
    for tool in tools:  # warm-up: caches, ControlPersist sockets as a user's second run has them
        time_once(tool, log)
    for _ in range(rounds):
        for tool in tools:
            wall, cpu = time_once(tool, log)
            samples[tool.name].wall_s.append(wall)
            samples[tool.name].cpu_s.append(cpu)
    base = tools[0].name
    result: dict[str, object] = {}
    for tool in tools:
        ratios = [a / b for a, b in zip(samples[tool.name].wall_s, samples[base].wall_s,
                                        strict=True)]
        result[tool.name] = {"wall_s": samples[tool.name].wall_s,
                             "cpu_s": samples[tool.name].cpu_s,
                             f"ratio_to_{base}": ratios,
                             "first_run": first.get(tool.name) if first else None}
    return result


def print_table(title: str, result: dict[str, dict[str, object]]) -> None:
    """Print ``result`` as a Markdown table (seconds, median [min-max])."""
    names = list(result)
    base = names[0]
    print(f"\n### {title}\n")
    print("| tool | first run wall s | no-change wall s | no-change CPU s | wall / "
          f"{base} (paired) | no-change verdict |")
    print("|---|---|---|---|---|---|")
    for name in names:
        row = result[name]
        first = row.get("first_run")
        first_text = f"{first[0]:.2f}" if first else "-"
        print(f"| {name} | {first_text} | {summary(row['wall_s'])} | {summary(row['cpu_s'])} | "
              f"{summary(row[f'ratio_to_{base}'])} | {row.get('verdict', '-')} |")


def cmd_setup(_: argparse.Namespace) -> None:
    """Create bench/.venv-ansible and bench/.venv-pyinfra (this Python) if they are missing."""
    for venv, requirements in ((ANSIBLE_VENV, (ANSIBLE_REQUIREMENT,)),
                               (PYINFRA_VENV, PYINFRA_REQUIREMENTS)):
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *requirements], check=True)


def cmd_play(args: argparse.Namespace) -> None:
    """Time the workload with every tool on h1..h<hosts> (optionally with a per-host delay)."""
    lab = Lab.from_env()
    inventory = write_inventory(lab, args.hosts)
    tools = workload_tools(inventory, args.hosts, args.tools)
    scenario = (f"play-{args.hosts}h" + (f"-delay{args.delay_ms}ms" if args.delay_ms else "")
                + (f"-{args.label}" if args.label else ""))
    log = OUT / f"{scenario}.log"
    log.write_text("", encoding="utf-8")
    if args.delay_ms:
        set_delay(args.hosts, args.delay_ms)
    try:
        first: dict[str, tuple[float, float]] = {}
        if not args.skip_first:
            for tool in tools:
                if tool.name == "floor":  # it only reads: no first run
                    continue
                clean_hosts(lab, args.hosts)
                first[tool.name] = time_once(tool, log)
        result = measure(tools, args.rounds, log, first)
        for tool in tools:
            result[tool.name]["verdict"] = no_change_verdict(tool, log)
    finally:
        if args.delay_ms:
            set_delay(args.hosts, 0)
    save(scenario, args, result)


def cmd_product(args: argparse.Namespace) -> None:
    """Time a no-change ``provision up``, ``check``, ``status``, ``drift`` and ``top --once``
    on the lab-mp inventory, beside the floor of one SSH connection and one command per host
    (``ssh -F <lab ssh_config> hN true`` on both hosts at once), optionally with a one-way
    delay on every host (``--delay-ms``, ``provision lab delay``)."""
    lab = Lab.from_env()
    inventory = lab.state_dir / "inventory" / "lab-mp.yml"
    scenario = "product-lab-mp" + (f"-delay{args.delay_ms}ms" if args.delay_ms else "")
    log = OUT / f"{scenario}.log"
    OUT.mkdir(exist_ok=True)
    log.write_text("", encoding="utf-8")
    # --yes: automation approves, as terraform apply -auto-approve (without it every up first
    # makes the dry run that decides whether to ask: docs/deploy.md, "Approval")
    up = Tool("provision up", (str(PROVISION), "up", "--yes", "-i", str(inventory)))
    first = {up.name: time_once(up, log)}  # deploys the replica when it is not yet there
    # top --once: two refreshes --interval apart (the 0.2 s minimum), against the served replica
    top = Tool("provision top --once", (str(PROVISION), "top", "--once", "--interval", "0.2",
                                        "-i", str(inventory)))
    config = shlex.quote(str(lab.state_dir / "ssh_config"))
    floor = Tool("floor (1 command/host)", ("bash", "-c", " & ".join(
        f"ssh -F {config} -o ControlMaster=no -o ControlPath=none h{i} true"
        for i in (1, 2)) + " & wait"))
    tools = [up, *(Tool(f"provision {name}", (str(PROVISION), name, "-i", str(inventory)))
                   for name in ("check", "status", "drift")), top, floor]
    if args.delay_ms:
        set_delay(2, args.delay_ms)
    try:
        result = measure(tools, args.rounds, log, first)
    finally:
        if args.delay_ms:
            set_delay(2, 0)
    save(scenario, args, result)


def cmd_profile(args: argparse.Namespace) -> None:
    """Run one no-change command under cProfile, with ``--json``; write the top functions by
    cumulative time and the connection counters (``stats``) to bench/results/profile-*.

    ``--command play``: the workload on h1..h<hosts>; ``up`` / ``drift``: the lab-mp inventory.
    One warm-up run first (not profiled), so the run profiled is a no-change one.
    """
    import cProfile  # noqa: F401 - the child imports it; fail here if it is missing
    import pstats

    lab = Lab.from_env()
    if args.command == "play":
        inventory = write_inventory(lab, args.hosts)
        tail: tuple[str, ...] = ("play", "-i", str(inventory), str(WORKLOAD / "site.yml"))
        scenario = f"profile-play-{args.hosts}h"
    else:
        inventory = lab.state_dir / "inventory" / "lab-mp.yml"
        tail = (args.command, *(("--yes",) if args.command == "up" else ()), "-i", str(inventory))
        scenario = f"profile-{args.command}-lab-mp"
    scenario += f"-delay{args.delay_ms}ms" if args.delay_ms else ""
    OUT.mkdir(exist_ok=True)
    RESULTS.mkdir(exist_ok=True)
    prof = OUT / f"{scenario}.prof"
    command = (str(PYTHON), "-m", "cProfile", "-o", str(prof), "-m", "vllm_provision.cli",
               *tail, "--json")
    if args.delay_ms:
        set_delay(args.hosts if args.command == "play" else 2, args.delay_ms)
    try:
        subprocess.run([str(PROVISION), *tail], check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # warm-up: the run profiled changes nothing
        start = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.monotonic() - start
    finally:
        if args.delay_ms:
            set_delay(args.hosts if args.command == "play" else 2, 0)
    if done.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    summary = json.loads(done.stdout)  # one JSON object (drift prints it over several lines)
    stats = summary.get("stats", {})
    listing = io.StringIO()
    pstats.Stats(str(prof), stream=listing).sort_stats("cumulative").print_stats(PROFILE_TOP)
    load = os.getloadavg()
    header = (f"# {' '.join(tail)}: {wall:.2f} s wall under cProfile, load "
              f"{load[0]:.1f} on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}\n")
    (RESULTS / f"{scenario}.txt").write_text(header + listing.getvalue(), encoding="utf-8")
    record = {"scenario": scenario, "command": list(tail), "wall_s_profiled": round(wall, 3),
              "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
              "loadavg_at_end": [round(x, 2) for x in load], "stats": stats,
              "duration_s": summary.get("duration_s")}
    (RESULTS / f"{scenario}.json").write_text(json.dumps(record, indent=1) + "\n",
                                              encoding="utf-8")
    print(header.strip())
    print("| host | connections | remote commands | round trips after connecting |")
    print("|---|---|---|---|")
    for host, counts in stats.items():
        print(f"| {host} | {counts['connects']} | {counts['commands']} | "
              f"{counts['round_trips']} |")
    print(f"\ntop functions: {RESULTS / (scenario + '.txt')}")


def cmd_readiness(args: argparse.Namespace) -> None:
    """Restart the lab-mp replica ``--rounds`` times; per round the delay from the stand-in's
    port opening (its ``Starting vLLM server on`` line, logged right after the socket is bound)
    and from its first ``GET /v1/models`` answered with 200, to the first completion request it
    logs, in journald's microsecond timestamps on rank 0 (h1)."""
    lab = Lab.from_env()
    inventory = lab.state_dir / "inventory" / "lab-mp.yml"
    ssh = ["ssh", "-F", str(lab.state_dir / "ssh_config"), "h1"]
    rounds = []
    for _ in range(args.rounds):
        cursor = subprocess.run([*ssh, "journalctl -n 0 --show-cursor -u vllm.service "
                                       "| sed -n 's/^-- cursor: //p'"],
                                capture_output=True, text=True, check=True).stdout.strip()
        done = subprocess.run([str(PROVISION), "restart", "--yes", "-i", str(inventory)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"provision restart exited {done.returncode}:\n"
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        journal = subprocess.run([*ssh, "journalctl -u vllm.service -o short-unix "
                                        f"--after-cursor {shlex.quote(cursor)}"],
                                 capture_output=True, text=True, check=True).stdout
        port = models = completion = None
        for line in journal.splitlines():
            stamp, _, text = line.partition(" ")
            if not stamp.replace(".", "").isdigit():
                continue
            if port is None and "Starting vLLM server on" in text:
                port = float(stamp)
            elif port is not None and models is None and '"GET /v1/models' in text \
                    and '" 200' in text:
                models = float(stamp)
            elif port is not None and completion is None and '"POST /v1/' in text:
                completion = float(stamp)
        if port is None or completion is None:
            raise SystemExit(f"no port-open or completion line in h1's journal:\n{journal[-3000:]}")
        rounds.append({"port_to_completion_s": round(completion - port, 3),
                       "models_to_completion_s": (round(completion - models, 3)
                                                  if models is not None else None)})
        print(rounds[-1])
    load = os.getloadavg()
    record = {"scenario": "readiness-lab-mp", "rounds": rounds,
              "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(),
              "loadavg_at_end": [round(x, 2) for x in load]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "readiness-lab-mp.json").write_text(json.dumps(record, indent=1) + "\n",
                                                   encoding="utf-8")
    values = [r["port_to_completion_s"] for r in rounds]
    print(f"port open -> first completion request: {summary(values)} s (load {load[0]:.1f})")


def set_delay(hosts: int, delay_ms: int) -> None:
    """``provision lab delay hN <delay_ms>`` on h1..h<hosts> (0 removes it)."""
    for i in range(1, hosts + 1):
        subprocess.run([str(PROVISION), "lab", "delay", f"h{i}", str(delay_ms)],
                       check=delay_ms != 0, stdout=subprocess.DEVNULL)


def save(scenario: str, args: argparse.Namespace, result: dict[str, object]) -> None:
    """Write ``bench/results/<scenario>.json`` and print the table."""
    RESULTS.mkdir(exist_ok=True)
    load = os.getloadavg()
    record = {"scenario": scenario, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d %H:%M"),
              "cores": os.cpu_count(), "loadavg_at_end": [round(x, 2) for x in load],
              "results": result}
    (RESULTS / f"{scenario}.json").write_text(json.dumps(record, indent=1) + "\n",
                                              encoding="utf-8")
    print_table(f"{scenario} ({args.rounds} rounds, load {load[0]:.1f} on "
                f"{os.cpu_count()} cores)", result)


def main() -> None:
    """Parse the command line and run one step (setup, play or product)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("setup", help="create the anchor tools' venvs").set_defaults(func=cmd_setup)
    play = steps.add_parser("play", help="time the workload with each tool")
    play.add_argument("--hosts", type=int, default=2, help="lab hosts h1..hN (booted already)")
    play.add_argument("--rounds", type=int, default=5, help="no-change rounds (>= 5)")
    play.add_argument("--delay-ms", type=int, default=0, help="one-way delay on every host (ms)")
    play.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    play.add_argument("--skip-first", action="store_true", help="do not time first runs")
    play.add_argument("--label", default="", help="suffix of the scenario's result file")
    play.set_defaults(func=cmd_play)
    product = steps.add_parser(
        "product", help="time no-change up, check, status, drift, top --once (lab-mp)")
    product.add_argument("--rounds", type=int, default=5)
    product.add_argument("--delay-ms", type=int, default=0, help="one-way delay on every host")
    product.set_defaults(func=cmd_product)
    profile = steps.add_parser("profile", help="cProfile + connection counters of one run")
    profile.add_argument("--command", choices=["play", "up", "drift"], default="play")
    profile.add_argument("--hosts", type=int, default=2, help="play: lab hosts h1..hN")
    profile.add_argument("--delay-ms", type=int, default=0, help="one-way delay on every host")
    profile.set_defaults(func=cmd_profile)
    readiness = steps.add_parser("readiness", help="stand-in port open -> verify request delay")
    readiness.add_argument("--rounds", type=int, default=3)
    readiness.set_defaults(func=cmd_readiness)
    args = parser.parse_args()
    if getattr(args, "tools", ["vllm-provision"])[0] != "vllm-provision":
        parser.error("--tools must start with vllm-provision (the ratios' denominator)")
    args.func(args)


if __name__ == "__main__":
    main()
