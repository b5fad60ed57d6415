"""``provision lab ...``: boot, inspect, perturb and remove the local lab hosts (needs root).

The ``provision`` command line finds this group through this distribution's entry point
(group ``vllm_provision.commands``, lab/pyproject.toml) and loads it only when ``lab`` runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import click

from vllm_provision.cli.help import examples
from vllm_provision_lab import Lab, base
from vllm_provision_lab.config import MAX_HOSTS, LabConfig
from vllm_provision_lab.gpu.cli import occupy, xid
from vllm_provision_lab.gpu.cli import set as set_gpu
from vllm_provision_lab.system import require_root


@click.group("lab", epilog=examples(
    'provision lab up && provision up -i inventory/lab-mp.yml',
    'provision lab status --json',
    'provision lab down'))
def command() -> None:
    """Throw-away Debian hosts with real systemd and sshd on this machine (needs root).

    The instance is chosen by VLLM_PROVISION_LAB_DIR, VLLM_PROVISION_LAB_NAME,
    VLLM_PROVISION_LAB_NET and VLLM_PROVISION_LAB_CACHE (see docs/architecture.md).
    """


@command.command("up", epilog=examples(
    'provision lab up',
    'provision lab up --hosts 3 --suite bullseye,bookworm,trixie',
    'provision lab up --vllm real'))
@click.option("--hosts", "host_count", type=click.IntRange(1, MAX_HOSTS), default=2,
              show_default=True, help="How many hosts to boot (h1 .. hN).")
@click.option("--spec", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="GPU stand-in spec file (copied to <state dir>/spec.yml).")
@click.option("--install-deps", is_flag=True,
              help="apt-get install the Debian packages the lab needs when missing.")
@click.option("--vllm", "vllm", type=click.Choice(["standin", "real"]), default="standin",
              show_default=True, help="standin: the simulated GPU stack; real: vLLM 0.32.0 CPU "
              "build and a tiny model in the base (docs/real-vllm.md).")
@click.option("--suite", "suite", default="bookworm", show_default=True,
              help="Debian release of the hosts: one for all, or one per host in order, "
              "comma-separated (bullseye, bookworm, trixie), e.g. --suite bullseye,trixie.")
def up(host_count: int, spec: Path | None, install_deps: bool, vllm: str, suite: str) -> None:
    """Boot the lab hosts (cleaning up leftovers first) and wait until each is running."""
    lab = Lab.from_env()
    lab.up(hosts=host_count, spec=spec, install_deps=install_deps,
           vllm="real" if vllm == "real" else "standin",
           suites=[word.strip() for word in suite.split(",")])
    suites = lab.suites()
    for host in lab.hosts:
        click.echo(f"{host.name}  {host.address}  running  {suites.get(host.name, '')}")
    if vllm == "real":
        click.echo(f"ssh: ssh -F {lab.ssh_config} h1    real vLLM inventory: "
                   f"{lab.inventory_path('real')}")
    else:
        click.echo(f"ssh: ssh -F {lab.ssh_config} h1    inventories: "
                   f"{lab.inventory_path('mp')}, {lab.inventory_path('ray')}")


@command.command("build", epilog=examples(
    'provision lab build',
    'provision lab build --vllm real',
    'provision lab build --suite bullseye,trixie'))
@click.option("--vllm", "vllm", type=click.Choice(["standin", "real"]), default="standin",
              show_default=True, help="Which base: the stand-in's, or real vLLM's CPU build.")
@click.option("--suite", "suite", default="bookworm", show_default=True,
              help="Debian releases to build, comma-separated (bullseye, bookworm, trixie).")
def build(vllm: str, suite: str) -> None:
    """Build the base images into the cache without booting a host (a cached one is kept).

    The cache (VLLM_PROVISION_LAB_CACHE) may be shared by several instances; building ahead
    takes the build out of the first `lab up` of each (CI builds while the unit tests run).
    """
    require_root("lab build")
    config = LabConfig.from_env()
    variant: base.Variant = "real" if vllm == "real" else "standin"
    suites = [word.strip() for word in suite.split(",")]
    for name in suites:
        base.base_key(variant, name)  # refuses an unknown release, or real vLLM off bookworm
    for name in suites:
        started = time.monotonic()
        tarball = base.ensure_tarball(config.cache, variant, name)
        click.echo(f"{base.base_key(variant, name)}  {tarball}  "
                   f"{time.monotonic() - started:.0f} s")


@command.command("down", epilog=examples(
    'provision lab down'))
def down() -> None:
    """Stop every host and remove all the lab made (mounts, netns, veths, bridge, cgroups)."""
    Lab.from_env().down()
    click.echo("lab down")


@command.command("status", epilog=examples(
    'provision lab status',
    'provision lab status --json'))
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON object instead of a table (provision schema lab status).")
def status(as_json: bool) -> None:
    """Show each host's address and `systemctl is-system-running` (exit 1 if any is not running)."""
    from vllm_provision.output import report

    report.set_json_mode(as_json)  # an error is then the JSON error object too
    require_root("lab status")
    lab = Lab.from_env()
    states = lab.status()
    if as_json:
        click.echo(json.dumps({"instance": lab.config.name, "state_dir": str(lab.state_dir),
                               "hosts": [dataclasses.asdict(s) for s in states]}, indent=2))
    elif not states:
        click.echo(f"lab '{lab.config.name}' is down")
    else:
        for s in states:
            extra = "  (cut)" if s.cut else ""
            click.echo(f"{s.name}  {s.address}  {s.state}  nspawn pid {s.nspawn_pid}{extra}")
    if any(s.state != "running" for s in states):
        raise SystemExit(1)


@command.command("ssh", context_settings={"ignore_unknown_options": True}, epilog=examples(
    'provision lab ssh h1',
    'provision lab ssh h2 -- systemctl status vllm'))
@click.option("--user", default="root", show_default=True, help="Login user (root or deploy).")
@click.argument("host")
@click.argument("remote_command", nargs=-1, type=click.UNPROCESSED)
def ssh(user: str, host: str, remote_command: tuple[str, ...]) -> None:
    """Open a shell on HOST, or run a command there, with the lab key and strict host keys."""
    require_root("lab ssh")
    lab = Lab.from_env()
    argv = ["ssh", "-F", str(lab.ssh_config), "-l", user, host]
    if remote_command:
        argv += ["--", " ".join(remote_command)]
    os.execvp("ssh", argv)


@command.command("delay", epilog=examples(
    'provision lab delay h2 200',
    'provision lab delay h2 0                         # remove the delay'))
@click.option("--peer", help="Delay only packets to this host (e.g. h2).")
@click.argument("host")
@click.argument("milliseconds", type=click.FloatRange(min=0))
def delay(peer: str | None, host: str, milliseconds: float) -> None:
    """Delay what HOST sends by MILLISECONDS (one way; 0 removes the delay)."""
    Lab.from_env().delay(host, milliseconds, peer=peer)
    target = f" to {peer}" if peer else ""
    click.echo(f"{host}: +{milliseconds:g} ms on egress{target}" if milliseconds
               else f"{host}: delay removed")


@command.command("rate", epilog=examples(
    'provision lab rate h2 1gbit && provision fabric -i inventory/lab-mp.yml',
    'provision lab rate h2 off'))
@click.argument("host")
@click.argument("limit", metavar="RATE")
def rate(host: str, limit: str) -> None:
    """Shape what HOST receives to RATE (tc: 100mbit, 1gbit; off removes it)."""
    lab = Lab.from_env()
    name = lab.config.host_named(host)
    lab.rate(name, limit)
    click.echo(f"{name}: receives at most {limit}" if limit != "off"
               else f"{name}: rate limit removed")


def _traffic(host: str, *, cut: bool) -> None:
    """Cut (``cut``) or restore the traffic of the lab host ``host`` (its name or address, as
    :meth:`LabConfig.host_named` reads it) and say so under its name."""
    lab = Lab.from_env()
    name = lab.config.host_named(host)
    if cut:
        lab.cut(name)
    else:
        lab.heal(name)
    click.echo(f"{name}: traffic {'cut' if cut else 'restored'}")


@command.command("cut", epilog=examples(
    'provision lab cut h2 && provision status -i inventory/lab-mp.yml'))
@click.argument("host")
def cut(host: str) -> None:
    """Drop all traffic of HOST (as if its cable were pulled) until `lab heal`.

    HOST is a lab host's name or address, so that `provision fault --partition` can use it as
    its hook: --partition-command 'provision lab cut' --heal-command 'provision lab heal'."""
    _traffic(host, cut=True)


@command.command("heal", epilog=examples(
    'provision lab heal h2'))
@click.argument("host")
def heal(host: str) -> None:
    """Restore the traffic of HOST after `lab cut` (a lab host's name or address)."""
    _traffic(host, cut=False)


@command.command("reboot", epilog=examples(
    'provision lab reboot h2'))
@click.argument("host")
def reboot(host: str) -> None:
    """Reboot HOST and wait until it is running again."""
    Lab.from_env().reboot(host)
    click.echo(f"{host}: running again")


# the GPU stand-in's commands (lab/vllm_provision_lab/gpu/cli.py)
command.add_command(set_gpu, "set")
command.add_command(occupy, "occupy")
command.add_command(xid, "xid")
