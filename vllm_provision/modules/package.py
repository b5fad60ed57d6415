"""Make sure a distribution package is installed (Ansible's ``package`` module, ``state: present``).

The host's own package manager does the work: ``dpkg-query`` reads and ``apt-get install`` installs
on Debian and Ubuntu; ``rpm -q`` reads and ``dnf install`` installs on RHEL and its rebuilds. An
installed package is left as it is (no upgrade), so a second run sends one read and changes
nothing. A host without the package that cannot reach its repositories (an air-gapped cluster)
fails with the package manager's own message: install the package from your mirror first, or
add the mirror to the host.

One round trip when the package is installed, two when it is not. In check mode nothing is
installed. Example::

    - name: Install the node exporter
      package: {name: prometheus-node-exporter}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext, with_notify
from vllm_provision.settings.kinds import check_package

ARGUMENT_SPEC = ArgumentSpec("package", (
    Argument("name", "str", "the distribution package's name", required=True),
    Argument("state", "str", "what the package must be (installed)", default="present",
             choices=("present",)),
))
# What the read prints first: installed (with the version), absent (with the installer to use),
# or no package manager we know.
INSTALLED, ABSENT, UNKNOWN = "INSTALLED", "ABSENT", "UNKNOWN"
# apt-get without questions, without Recommends (a server gets what the package needs, as
# Ansible's apt module with install_recommends: false); dnf without questions.
INSTALL = {
    "apt": "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -- {}",
    "dnf": "dnf install -y -q -- {}",
}


def _name(args: Mapping[str, Any]) -> str | None:
    name = args.get("name") if isinstance(args, Mapping) else None
    return name if isinstance(name, str) and check_package(name) is None else None


def read_script(name: str) -> str:
    """The read-only shell script for package ``name`` (a checked name, quoted): prints
    ``INSTALLED <version>``, ``ABSENT apt|dnf`` or ``UNKNOWN``."""
    q = quote(name)
    return (
        "if command -v dpkg-query >/dev/null 2>&1; then "
        f"s=$(dpkg-query -W -f='${{Status}} ${{Version}}' {q} 2>/dev/null); "
        f'case "$s" in "install ok installed "*) echo "{INSTALLED} ${{s#install ok installed }}";; '
        f"*) echo {ABSENT} apt;; esac; "
        "elif command -v rpm >/dev/null 2>&1; then "
        f"v=$(rpm -q --qf '%{{VERSION}}-%{{RELEASE}}' {q} 2>/dev/null) "
        f'&& echo "{INSTALLED} $v" || echo {ABSENT} dnf; '
        f"else echo {UNKNOWN}; fi")


def read_command(ctx: ModuleContext, args: Mapping[str, Any]) -> str | None:
    """The read-only first command of :func:`run` (the module read protocol,
    docs/runner-contract.md; the runner batches it), or None for a name :func:`run` refuses."""
    name = _name(args)
    return None if name is None else read_script(name)


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Install package ``name`` when it is missing; see the module docstring.

    Raises:
        ProvisionError: bad arguments (a name that is not a package name: it could be read as
            an option). UnreachableError: the connection failed.
    """
    values = ARGUMENT_SPEC.validate(args)
    name = values["name"]
    expected = check_package(name)
    if expected:
        raise ProvisionError.single("package: name", "is not a package name", expected=expected,
                                    actual=repr(name))
    read = ctx.conn.run(read_script(name))
    word, _, rest = read.stdout.strip().partition(" ")
    if word == INSTALLED:
        return ModuleResult.ok("", name=name, version=rest.strip())
    if word != ABSENT or rest.strip() not in INSTALL:
        return ModuleResult(Status.FAILED, f"cannot tell whether {name} is installed: the host "
                                           "has neither dpkg-query nor rpm")
    diff = f"--- packages\n+++ packages\n+ {name}\n"
    if ctx.check_mode:
        return ModuleResult(Status.CHANGED, f"would install {name}", diff, {"name": name})
    script = INSTALL[rest.strip()].format(quote(name))
    script, notified = with_notify(ctx, script)
    result = ctx.conn.run(script)
    if not result.ok:
        return ModuleResult(Status.FAILED, f"installing {name} failed (a host without its "
                                           "repositories needs it installed from your mirror "
                                           "first): "
                                           f"{(result.stderr or result.stdout).strip()[-1000:]}")
    return ModuleResult(Status.CHANGED, f"installed {name}", diff, {"name": name},
                        persisted_notify=notified)
