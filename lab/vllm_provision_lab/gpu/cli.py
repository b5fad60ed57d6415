"""``provision lab set`` and ``provision lab occupy``: change a running lab's GPU stack over SSH."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision_lab.errors import LabError

from .install import remote_apply_command
from .spec import (
    finish,
    parse_assignments,
    read_overrides,
    spec_defaults,
    validate_values,
    write_overrides,
)

OCCUPY_UNIT = "vllm-lab-occupy"


def _lab():  # type: ignore[no-untyped-def]
    from vllm_provision_lab import Lab

    return Lab.from_env()


def _run(lab, host: str, command: str) -> str:  # type: ignore[no-untyped-def]
    result = lab.ssh(host, command, timeout_s=60)
    if result.returncode != 0:
        raise LabError.single(host, "command failed on the lab host", expected="exit status 0",
                              actual=f"{result.returncode}: {(result.stderr or '').strip()[-300:]}",
                              fix="check the host with: provision lab status")
    return str(result.stdout)


@click.command("set", epilog=examples(
    "provision lab set h2 nccl=2.27.3                 # version drift on one host",
    "provision lab set h2 nccl=default"))
@click.argument("host")
@click.argument("assignments", nargs=-1, required=True)
def set(host: str, assignments: tuple[str, ...]) -> None:  # noqa: A001 - the command's name
    """Change HOST's simulated GPU stack: KEY=VALUE (or KEY=default) ...

    Keys: gpus, gpu_name, gpu_memory_mib, driver, cuda, nccl, torch, torch_cuda, vllm,
    transformers, ray, python, load_s, ttft_s, token_s, init_timeout_s, pg_timeout_s, stall
    (none, init, load, kv_cache, graphs).
    Example: provision lab set h2 vllm=0.33.1 nccl=2.27.3
    """
    lab = _lab()
    values, resets = parse_assignments(list(assignments))
    checked = validate_values(values, f"lab set {host}")
    validate_values({k: None for k in resets}, f"lab set {host}")
    overrides = read_overrides(lab.state_dir)
    mine = {k: v for k, v in overrides.get(host, {}).items() if k not in resets}
    mine.update(checked)
    overrides[host] = mine
    spec = effective_spec_with(lab.state_dir, host, overrides)
    _run(lab, host, remote_apply_command(spec))
    write_overrides(lab.state_dir, overrides)
    changed = ", ".join(f"{k}={spec[k]}" for k in [*checked, *resets])
    click.echo(f"{host}: {changed}")


def effective_spec_with(state_dir: Path, host: str,
                        overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Return ``host``'s effective spec as if ``overrides`` were stored (nothing is written)."""
    spec = spec_defaults(state_dir, host)
    spec.update(validate_values(overrides.get(host, {}), f"lab set {host}"))
    return finish(spec, host)


@click.command("occupy", epilog=examples(
    "provision lab occupy h1 --gpus 0",
    "provision lab occupy h1 --release"))
@click.argument("host")
@click.option("--gpus", default="0", show_default=True, help="GPU indexes, comma separated")
@click.option("--memory-mib", default=120000, show_default=True, type=int,
              help="memory held on each GPU, MiB")
@click.option("--ray", "through_ray", is_flag=True,
              help="hold as another Ray job: an actor with as many Ray GPUs as --gpus names, "
                   "on HOST's running Ray node (Ray picks which GPUs)")
@click.option("--release", is_flag=True, help="stop every foreign process on HOST")
def occupy(host: str, gpus: str, memory_mib: int, through_ray: bool, release: bool) -> None:
    """Start (or --release) a foreign process that nvidia-smi shows on HOST's GPUs.

    Each runs in its own transient unit (vllm-lab-occupy-<gpus>, or vllm-lab-occupy-ray), so
    the product can name it from /proc/PID/cgroup and --release can end it (docs/lab-standin.md).
    """
    lab = _lab()
    if release:
        _run(lab, host, "systemctl stop 'vllm-lab-occupy-*' 2>/dev/null; "
                        "systemctl reset-failed 'vllm-lab-occupy-*' 2>/dev/null; true")
        click.echo(f"{host}: released")
        return
    if not all(g.strip().isdigit() for g in gpus.split(",")):
        raise LabError.single("--gpus", "not a list of GPU indexes", expected="e.g. 0,1",
                              actual=gpus)
    site = "$(ls -d /opt/vllm/lib/python3*/site-packages | tail -n1)"
    if not through_ray:
        unit = f"{OCCUPY_UNIT}-{gpus.replace(',', '-')}"
        _run(lab, host, f"systemd-run -q --unit={shlex.quote(unit)} -E PYTHONPATH={site} "
                        f"python3 -m vllm_lab_standin.occupy {shlex.quote(gpus)} {memory_mib}")
        click.echo(f"{host}: GPUs {gpus} occupied ({memory_mib} MiB each) by unit {unit}")
        return
    unit, count = f"{OCCUPY_UNIT}-ray", len(gpus.split(","))
    # as the Ray cluster's own user (the lab's vllm_service_user), so its session files stay
    # that user's; with the replica's Ray token when it has one (vllm_ray_auth: token, the
    # token file in the lab's vllm_state_dir: docs/security.md), as another job of the team
    # would; returns once the actor holds its GPUs (nvidia-smi lists it), or fails
    token = "/var/lib/vllm/ray_auth_token"
    # (printf, not echo: echo would take the first -E as its own option)
    auth = (f"$(test -s {token} && printf -- '-E %s ' RAY_AUTH_MODE=token "
            f"RAY_AUTH_TOKEN_PATH={token})")
    _run(lab, host, f"systemd-run -q --unit={unit} -p User=vllm -E HOME=/var/lib/vllm {auth} "
                    f"/opt/vllm/bin/python -m vllm_lab_standin.occupy --ray {count} {memory_mib}"
                    f" && for i in $(seq 240); do nvidia-smi --query-compute-apps=process_name "
                    f"--format=csv,noheader | grep -q 'ray::GpuHolder' && exit 0; "
                    f"systemctl -q is-active {unit} || break; sleep 0.5; done; "
                    f"journalctl -u {unit} -n 20 --no-pager >&2; exit 1")
    click.echo(f"{host}: {count} Ray GPU(s) held by actor GpuHolder ({memory_mib} MiB each), "
               f"driver in unit {unit}")


@click.command("xid", epilog=examples(
    "provision lab xid h2 --gpu 1 --code 79",
    "provision lab xid h2 --clear"))
@click.argument("host")
@click.option("--gpu", type=click.IntRange(0, 63), default=0, show_default=True,
              help="GPU index whose PCI address the line names")
@click.option("--code", type=click.IntRange(1, 999), default=79, show_default=True,
              help="Xid number (79: fallen off the bus, 48: double-bit ECC, ...)")
@click.option("--clear", is_flag=True, help="remove every Xid line the lab put on HOST")
def xid(host: str, gpu: int, code: int, clear: bool) -> None:
    """Put an NVIDIA Xid line into HOST's kernel log (journalctl -k), as the driver would."""
    from .xid import CLEAR_COMMAND, GUEST_IDS, inject_command

    lab = _lab()
    if clear:
        _run(lab, host, CLEAR_COMMAND)
        click.echo(f"{host}: Xid lines removed")
        return
    command, line = inject_command(_run(lab, host, GUEST_IDS), gpu, code)
    _run(lab, host, command)
    click.echo(f"{host}: kernel: {line}")


__all__ = ["set", "occupy", "xid"]
