"""``provision init``: connect to the servers, probe them and print a first, working inventory."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from vllm_provision import backends
from vllm_provision.cli.options import CommonOptions, shared_options
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.operations.scaffold import DEFAULT_BACKEND

EPILOG = """\b
Examples:
  provision init --hosts 10.0.0.11,10.0.0.12 --model /srv/models/Llama-3.1-8B \\
      --user root --key ~/.ssh/id_ed25519 > inventory.yml
  provision init --hosts gpu1,gpu2 --backend ray --model /models/m -o inventory.yml
  provision check -i inventory.yml && provision up -i inventory.yml
"""


def _split_hosts(value: str) -> tuple[str, ...]:
    """``--hosts a,b`` as addresses in order, each checked as an SSH address, none twice.

    Raises:
        click.BadParameter: empty, a bad address or one given twice.
    """
    from vllm_provision.settings import kinds

    addresses = tuple(part.strip() for part in value.split(","))
    if not all(addresses):
        raise click.BadParameter("give addresses separated by commas, e.g. 10.0.0.11,10.0.0.12")
    for address in addresses:
        problem = kinds.check("ansible_host", address)
        if problem:
            raise click.BadParameter(f"{address!r}: {problem}")
    twice = sorted({a for a in addresses if addresses.count(a) > 1})
    if twice:
        raise click.BadParameter(f"{', '.join(twice)} given more than once (each host once)")
    return addresses


def _checked(option: str, name: str, value: Any) -> Any:
    """``value`` of ``option`` checked as the inventory variable ``name`` it becomes.

    Raises:
        ProvisionError: it is not a valid value of that variable (naming the option).
    """
    from vllm_provision.settings import kinds

    problem = kinds.check(name, value)
    if problem:
        raise ProvisionError.single(option, f"invalid {option} (it becomes {name})",
                                    expected=problem, actual=repr(value),
                                    fix=f"give a valid {option}")
    return value


def connection_vars(user: str | None, port: int | None, key: Path | None,
                    known_hosts: Path | None, become: bool) -> dict[str, Any]:
    """The ``all.vars`` connection settings for the options given (absolute paths), in the
    order Ansible users expect; each checked by kind.

    Raises:
        ProvisionError: a user name that is not a valid SSH user.
    """
    values: dict[str, Any] = {}
    if user is not None:
        values["ansible_user"] = _checked("--user", "ansible_user", user)
    if port is not None:
        values["ansible_port"] = port
    if key is not None:
        values["ansible_ssh_private_key_file"] = str(key.expanduser().absolute())
    if known_hosts is not None:
        values["provision_known_hosts_file"] = str(known_hosts.expanduser().absolute())
    if become:
        values["ansible_become"] = True
    return values


def resolve_names(addresses: tuple[str, ...]) -> dict[str, str]:
    """The IP of each address that is a DNS name, as this machine resolves it (IPv4 first):
    the probe reads the routes between the hosts towards IPs.

    Raises:
        ProvisionError: a name that does not resolve (naming it).
    """
    import ipaddress
    import socket

    ips: dict[str, str] = {}
    for address in addresses:
        try:
            ipaddress.ip_address(address)
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(address, None, 0, socket.SOCK_STREAM)
        except OSError as exc:
            raise ProvisionError.single(address, f"the name does not resolve here: {exc}",
                                        fix="give the host's IP address in --hosts") from None
        found = sorted({str(info[4][0]) for info in infos}, key=lambda ip: (":" in ip, ip))
        ips[address] = found[0]
    return ips


def probe_hosts(addresses: tuple[str, ...], conn_vars: dict[str, Any], venv: str | None,
                model: str, opts: CommonOptions, ips: dict[str, str]) -> dict[str, Any]:
    """Connect to every address (the connection settings of ``conn_vars``), run the facts
    probe once on each with the venv search and the routes to the others (towards ``ips`` for
    names, :func:`resolve_names`); return the facts by address.

    Raises:
        ProvisionError: a host is unreachable or its probe failed (every such host named).
    """
    from vllm_provision.core.models import Group, Host, Inventory
    from vllm_provision.facts.collect import collect_facts
    from vllm_provision.facts.gather import VENV_SEARCH, ProbeOptions
    from vllm_provision.settings import variables

    hosts = {}
    for address in addresses:
        key = conn_vars.get("ansible_ssh_private_key_file")
        known = conn_vars.get("provision_known_hosts_file")
        hosts[address] = Host(
            name=address, address=address, port=conn_vars.get("ansible_port", 22),
            user=conn_vars.get("ansible_user"), key_file=Path(key) if key else None,
            known_hosts_files=(Path(known),) if known else (),
            become=bool(conn_vars.get("ansible_become", False)),
            vars={"vllm_venv": venv or variables.defaults()["vllm_venv"],
                  "vllm_model": model, **conn_vars})
    inventory = Inventory(path=Path("provision-init"), hosts=hosts,
                          groups={"all": Group("all", hosts=addresses)})
    probe = ProbeOptions(reachability=False, venv_search=VENV_SEARCH,
                         peers={a: tuple(ips.get(b, b) for b in addresses if b != a)
                                for a in addresses})
    facts, errors = collect_facts(inventory, list(hosts.values()), probe,
                                  opts.connection_options())
    if errors:
        raise ProvisionError([problem for address in addresses if address in errors
                              for problem in errors[address].problems])
    return facts


def check_written(text: str) -> None:
    """Load ``text`` through the inventory loader, as ``provision up`` will (a temporary file).

    Raises:
        ProvisionError: the loader refused it (a bug of init: it says so).
    """
    from vllm_provision.inventory import load_inventory, require_replicas

    with tempfile.TemporaryDirectory(prefix="provision-init-") as folder:
        path = Path(folder) / "inventory.yml"
        path.write_text(text, encoding="utf-8")
        try:
            require_replicas(load_inventory(path))
        except ProvisionError as exc:
            raise ProvisionError([Problem(
                "provision init", f"the inventory written does not load: {p.message}",
                expected=p.expected, actual=p.actual,
                fix="report this as a bug of provision init; meanwhile write the value by hand")
                for p in exc.problems]) from None


def write_output(path: Path, text: str) -> None:
    """Write ``text`` to a new file ``path`` atomically (temporary file in the same folder, then
    rename); never over an existing file.

    Raises:
        ProvisionError: ``path`` exists or cannot be written.
    """
    if path.exists():
        raise ProvisionError.single(str(path), "the file exists; init never overwrites one",
                                    fix="remove it, or give another -o FILE")
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as stream:
                stream.write(text)
                stream.flush()
                os.fsync(stream.fileno())
            os.chmod(temp, 0o644)
            os.link(temp, path)  # fails if the file appeared meanwhile: never overwrites
        finally:
            Path(temp).unlink(missing_ok=True)
    except FileExistsError:
        raise ProvisionError.single(str(path), "the file exists; init never overwrites one",
                                    fix="remove it, or give another -o FILE") from None
    except OSError as exc:
        raise ProvisionError.single(str(path), f"cannot write the inventory: {exc.strerror}",
                                    fix="choose a writable folder") from None


@click.command("init", epilog=EPILOG)
@click.option("--hosts", "addresses", required=True, metavar="ADDR[,ADDR...]",
              callback=lambda _ctx, _param, value: _split_hosts(value),
              help="The servers' SSH addresses, rank 0 (the one serving the API) first.")
@click.option("--backend", type=click.Choice(backends.Names()), default=DEFAULT_BACKEND,
              show_default=True,
              help="How the nodes run the replica.")
@click.option("--model", metavar="PATH", required=True,
              help="The model's folder, the same absolute path on every host (vllm_model): "
                   "the one thing the facts cannot tell.")
@click.option("--venv", metavar="PATH",
              help="The venv holding vLLM (default: the one found on every host).")
@click.option("--tensor-parallel-size", type=click.IntRange(1, 4096), metavar="N",
              help="GPUs per pipeline stage (default: the GPUs of one node).")
@click.option("--pipeline-parallel-size", type=click.IntRange(1, 4096), metavar="N",
              help="Pipeline stages (default: the number of hosts).")
@click.option("--replica", default="llm", show_default=True, metavar="NAME",
              help="The replica's group name.")
@click.option("-u", "--user", metavar="USER", help="SSH user (ansible_user).")
@click.option("--port", type=click.IntRange(1, 65535), help="SSH port (ansible_port).")
@click.option("--key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="SSH private key (ansible_ssh_private_key_file).")
@click.option("--known-hosts", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="One more known_hosts file (provision_known_hosts_file).")
@click.option("--become", is_flag=True, help="Run privileged commands through sudo.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the inventory to a new FILE (default: stdout).")
@shared_options(("forks", "verbose", "host_key_policy", "timeout"))
def command(addresses: tuple[str, ...], backend: str, model: str, venv: str | None,
            tensor_parallel_size: int | None, pipeline_parallel_size: int | None, replica: str,
            user: str | None, port: int | None, key: Path | None, known_hosts: Path | None,
            become: bool, output: Path | None, **kwargs: Any) -> None:
    """Probe the servers and print a first, working inventory.

    Connects to every host (one SSH connection each), runs the facts probe and writes, with a
    comment for each choice: the ranks (in --hosts order), GPUs per node, TP/PP sizes that use
    them, the cluster interface (the one carrying the routes between the hosts), the venv vLLM
    is installed in and how to connect. When the hosts disagree (GPU counts, venv paths) it
    names the host and what to change, and prints nothing.
    """
    from vllm_provision.inventory.tree import check_name
    from vllm_provision.operations.scaffold import InitRequest, plan_inventory, render_inventory

    opts = CommonOptions(inventory=Path(output or "-"), forks=kwargs["forks"],
                         verbosity=kwargs["verbose"], host_key_policy=kwargs["host_key_policy"],
                         timeout_s=kwargs["timeout"])
    opts.apply_globals()
    if check_name(replica, "group") is not None:
        raise ProvisionError.single("--replica", "invalid replica group name",
                                    expected=str(check_name(replica, "group")),
                                    actual=repr(replica), fix="give a plain name such as llm")
    _checked("--model", "vllm_model", model)
    if venv is not None:
        _checked("--venv", "vllm_venv", venv)
    conn_vars = connection_vars(user, port, key, known_hosts, become)
    ips = resolve_names(addresses)
    facts = probe_hosts(addresses, conn_vars, venv, model, opts, ips)
    plan = plan_inventory(InitRequest(
        addresses=addresses, backend=backend, model=model, venv=venv,
        tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
        connection=conn_vars, replica=replica, ips=ips), facts)
    text = render_inventory(plan)
    check_written(text)
    for line in plan.warnings:
        click.echo(f"warning: {line}", err=True)
    if output is None:
        sys.stdout.write(text)
        return
    write_output(output, text)
    click.echo(f"wrote {output} ({len(addresses)} hosts); next: provision check -i {output}",
               err=True)
