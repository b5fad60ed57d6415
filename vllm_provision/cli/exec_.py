"""``provision exec``: one ad-hoc shell command on the hosts of a pattern, in parallel, like
``ansible PATTERN -m shell -a COMMAND``: output grouped per host, exit codes in the recap."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import HOST_OPTIONS, CommonOptions, shared_options
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status, TaskResult

EXEC_TASK = "exec"


def run_on_hosts(connections: dict[str, Any], command: str, forks: int,
                 timeout_s: float) -> dict[str, TaskResult]:
    """Run ``command`` on every connection, ``forks`` at a time.

    Returns:
        host -> a result: ``changed`` when the command exited 0 (Ansible's shell module: any
        command may have changed something), ``failed`` with ``rc`` otherwise, ``unreachable``
        when the connection failed or the command ran past ``timeout_s``; ``data`` holds
        ``rc``, ``stdout``, ``stderr`` (``rc`` None when unreachable).
    """
    from vllm_provision.transport.base import UnreachableError

    def one(name: str) -> TaskResult:
        started = time.monotonic()
        try:
            result = connections[name].run(command, timeout_s=timeout_s)
        except UnreachableError as exc:
            return TaskResult(name, EXEC_TASK, Status.UNREACHABLE,
                              "; ".join(p.message for p in exc.problems),
                              duration_s=time.monotonic() - started,
                              data={"rc": None, "stdout": "", "stderr": ""})
        status = Status.CHANGED if result.ok else Status.FAILED
        return TaskResult(name, EXEC_TASK, status, f"rc={result.exit_code}",
                          duration_s=result.duration_s,
                          data={"rc": result.exit_code, "stdout": result.stdout,
                                "stderr": result.stderr})

    names = list(connections)
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(names) or 1))) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def print_host(result: TaskResult) -> None:
    """One host's block: ``h1 | CHANGED | rc=0 >>`` then its output (Ansible's layout); every
    character a host sent is made printable first."""
    from vllm_provision.output.progress import printable

    data = result.data or {}
    head = f"{result.host} | {result.status.value.upper()}"
    if data.get("rc") is not None:
        head += f" | rc={data['rc']}"
    click.echo(head + " >>")
    if result.status == Status.UNREACHABLE:
        click.echo(printable(result.message, 2000))
    for stream in ("stdout", "stderr"):
        text = str(data.get(stream) or "").rstrip("\n")
        for line in text.splitlines():
            click.echo(printable(line.replace("\t", "    "), 10_000), err=stream == "stderr")


@click.command("exec", context_settings={"ignore_unknown_options": True}, epilog=examples(
    "provision exec -i inventory.yml -l vllm_followers -- nvidia-smi -L",
    "provision exec -i inventory.yml --json -- 'systemctl is-active vllm.service'"))
@shared_options(HOST_OPTIONS)
@click.argument("words", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- COMMAND")
def command(words: Sequence[str], **kwargs: Any) -> None:
    """Run COMMAND on every host of the inventory (or of -l PATTERN), in parallel.

    COMMAND is your own shell command for the remote hosts: it is run as you typed it by the
    login shell of ansible_user on each host (through sudo when the host has ansible_become),
    with its pipes, globs and quotes, exactly like ``ansible -m shell``. It is not an
    inventory value: no variable is substituted into it. Put it after ``--`` so its options
    are not read as ours; several words are joined with spaces.


    Output: each host's block (``h1 | CHANGED | rc=0 >>`` and its output, stderr on stderr), in
    inventory order once all are done, then a recap with each host's exit code. --timeout (30 s)
    bounds the command. Exit code: 0 when it exited 0 everywhere, 1 otherwise.
    """
    from vllm_provision.inventory import select_hosts
    from vllm_provision.output import report
    from vllm_provision.transport.connection import close_all, open_connections

    opts = CommonOptions.from_kwargs(kwargs)
    inventory = opts.load_inventory()
    line = " ".join(words).strip()
    if not line:
        raise ProvisionError.single("provision exec", "no command given",
                                    expected="a shell command after --",
                                    fix="write e.g. provision exec -i INV -- uptime")
    hosts = select_hosts(inventory, opts.limit) if opts.limit else list(
        inventory.hosts.values())
    started = time.monotonic()
    connections, errors = open_connections(hosts, opts.connection_options())
    try:
        results = run_on_hosts(connections, line, opts.forks, opts.timeout_s)
    finally:
        close_all(connections)
    for name, error in errors.items():
        results[name] = TaskResult(name, EXEC_TASK, Status.UNREACHABLE,
                                   "; ".join(p.message for p in error.problems),
                                   data={"rc": None, "stdout": "", "stderr": ""})
    ordered = [results[h.name] for h in hosts if h.name in results]
    summary = report.summarize(ordered, [h.name for h in hosts], check_mode=False,
                               duration_s=time.monotonic() - started,
                               extra={"command": line,
                                      "rc": {r.host: (r.data or {}).get("rc") for r in ordered}})
    if opts.json:
        report.print_json(summary)
    else:
        for result in ordered:
            print_host(result)
        _recap(ordered, summary["duration_s"])
    sys.exit(report.exit_code(summary, check_mode=False))


def _recap(results: Sequence[TaskResult], duration_s: float) -> None:
    """``EXEC RECAP``: per host its status and exit code (``-`` when unreachable)."""
    from rich.table import Table
    from rich.text import Text

    from vllm_provision.output.report import STATUS_STYLE, shared_console

    console = shared_console(sys.stdout)
    table = Table(title="EXEC RECAP", title_justify="left", box=None, pad_edge=False)
    table.add_column("host", style="bold")
    table.add_column("status")
    table.add_column("rc", justify="right")
    for result in results:
        rc = (result.data or {}).get("rc")
        table.add_row(Text(result.host), Text(result.status.value,
                                              style=STATUS_STYLE[result.status]),
                      Text("-" if rc is None else str(rc)))
    console.print()
    console.print(table)
    failed = sum(r.status != Status.CHANGED for r in results)
    console.print(f"{len(results) - failed} ok, {failed} failed or unreachable; "
                  f"total time {duration_s:.1f} s", highlight=False)

