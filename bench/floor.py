"""The floor of a no-change run of the bench workload: one connection and one command per host.

What no tool can beat on the workload of bench/README.md: per host, in parallel, one SSH
connection (paramiko, the transport vllm-provision also uses) and ONE remote command that reads
everything a no-change run needs to decide "no change": the kernel release (the workload's one
fact), the sha256, owner, group and mode of the four files, and whether each of the two units is
enabled and active. The controller then renders the four templates locally (plain Jinja2, the
role's defaults, the host's kernel) and compares. Nothing is written; exit status 0 when every
host is as the workload leaves it, 1 otherwise (the differences are printed).

Usage (from the repository root; ``run.py`` times it as the fourth column)::

    .venv/bin/python bench/floor.py -i bench/.out/inventory-2.yml

The inventory is the one ``run.py`` writes (group ``bench``, the lab's key and known_hosts).
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jinja2
import paramiko
import yaml

ROLE = Path(__file__).resolve().parent / "workload" / "roles" / "bench_units"
UNITS = ("bench-a.service", "bench-b.service")


def files(defaults: dict[str, str]) -> dict[str, str]:
    """Destination path -> template name, as the workload's tasks install them."""
    return {f"{defaults['bench_env_dir']}/bench-a": "bench-a.env.j2",
            f"{defaults['bench_env_dir']}/bench-b": "bench-b.env.j2",
            f"{defaults['bench_unit_dir']}/bench-a.service": "bench-a.service.j2",
            f"{defaults['bench_unit_dir']}/bench-b.service": "bench-b.service.j2"}


def probe_command(paths: list[str]) -> str:
    """The one command: ``uname -r``, then per file ``sha256 owner group mode`` (or ABSENT),
    then per unit ``is-enabled is-active``, one line each."""
    parts = ["uname -r"]
    for path in paths:
        q = shlex.quote(path)
        parts.append(f"if [ -f {q} ]; then echo $(sha256sum < {q} | cut -d' ' -f1) "
                     f"$(stat -c '%U %G %a' {q}); else echo ABSENT; fi")
    for unit in UNITS:
        q = shlex.quote(unit)
        parts.append(f"echo $(systemctl is-enabled {q}) $(systemctl is-active {q})")
    return "; ".join(parts)


def check_host(name: str, host: dict[str, object], common: dict[str, object],
               defaults: dict[str, str], env: jinja2.Environment) -> list[str]:
    """Connect, run the one command, compare; return the differences (empty: no change)."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(common["ansible_ssh_common_args"]).split("=", 1)[1])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(str(host["ansible_host"]), port=int(str(common.get("ansible_port", 22))),
                   username=str(common["ansible_user"]),
                   key_filename=str(common["ansible_ssh_private_key_file"]),
                   look_for_keys=False, allow_agent=False, timeout=30)
    try:
        targets = files(defaults)
        _, stdout, _ = client.exec_command(probe_command(list(targets)))
        lines = stdout.read().decode().splitlines()
    finally:
        client.close()
    kernel, rest = lines[0], lines[1:]
    context = {**defaults, "inventory_hostname": name, "bench_kernel": {"stdout": kernel}}
    problems = []
    for (path, template), line in zip(targets.items(), rest, strict=False):
        want = hashlib.sha256(env.get_template(template).render(context).encode()).hexdigest()
        if line != f"{want} root root 644":
            problems.append(f"{name}: {path}: {line}")
    for unit, line in zip(UNITS, rest[len(targets):], strict=False):
        if line != "enabled active":
            problems.append(f"{name}: {unit}: {line}")
    return problems


def main() -> int:
    """Check every host of group ``bench`` in parallel; print the differences; 0 when none."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-i", "--inventory", required=True, type=Path)
    args = parser.parse_args()
    inventory = yaml.safe_load(args.inventory.read_text(encoding="utf-8"))["all"]
    common = inventory["vars"]
    hosts = inventory["children"]["bench"]["hosts"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text(encoding="utf-8"))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLE / "templates")),
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        found = list(pool.map(lambda item: check_host(item[0], item[1], common, defaults, env),
                              hosts.items()))
    problems = [line for host in found for line in host]
    print("\n".join(problems) if problems else f"no change on {len(hosts)} host(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
