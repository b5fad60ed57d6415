"""Platform checks: the host's systemd, OpenSSH server and Python are in the supported range.

The range (README, "Supported hosts") is the oldest stack the lab proves end to end: Debian 11
(systemd 247, OpenSSH 8.4, Python 3.9), the stand-in for Ubuntu 22.04 and RHEL 9. A host below it
is refused with the versions found, before anything on any host is changed; a host whose version
cannot be read gets a warning (another SSH server, a systemctl that prints no version).
"""

from __future__ import annotations

import re

from vllm_provision.checks.context import check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Node
from vllm_provision.facts.model import HostFacts

# systemd 247: the oldest the lab proves. The units need Type=exec (systemd 240,
# systemd.service(5)); readiness reads ExecMainStartTimestampMonotonic (verify.show_command).
MIN_SYSTEMD = 247
# OpenSSH 8.4: the oldest sshd the lab proves (exec channels, ed25519 host keys; sshd(8)).
MIN_OPENSSH = (8, 4)
# Python 3.9: the oldest the lab proves for the venv (facts probe, watchdog, stand-in); the
# probe itself stays valid on 3.8 (facts/probe_script.py). vLLM's own wheels ask for more.
MIN_PYTHON = (3, 9)
SOURCE = "README: Supported hosts (oldest stack proven in the lab: Debian 11)"


def _at_least(check: str, node: Node, item: str, found: str | None,
              minimum: tuple[int, ...], unknown: tuple[str, str], upgrade: str) -> list[Finding]:
    """One version rule: ERROR below ``minimum``, WARNING when ``found`` is unknown, else OK.

    Args:
        check: the check's name (``platform.systemd``).
        node: the node the version was read on.
        item: what is compared (``"systemd version"``).
        found: the version text as gathered (``"8.4p1"``, ``"247"``), or None when unread.
        minimum: the oldest supported version as a tuple of ints.
        unknown: (actual, fix) of the warning when ``found`` is None or has no number.
        upgrade: the fix of the error when ``found`` is below ``minimum``.
    """
    expected = ">= " + ".".join(str(part) for part in minimum)
    version = _version_tuple(found) if found else ()
    if not version:
        return [Finding(check, Severity.WARNING, node.name, item, expected=expected,
                        actual=unknown[0], fix=unknown[1], source=SOURCE)]
    if version[:len(minimum)] < minimum:
        return [Finding(check, Severity.ERROR, node.name, item, expected=expected,
                        actual=str(found), fix=upgrade, source=SOURCE)]
    return [Finding(check, Severity.OK, node.name, item, expected=expected, actual=str(found))]


def check_systemd(node: Node, facts: HostFacts) -> list[Finding]:
    """systemd on the host is at least :data:`MIN_SYSTEMD` (``systemctl --version``)."""
    found = facts.systemd_version
    return _at_least(
        "platform.systemd", node, "systemd version", None if found is None else str(found),
        (MIN_SYSTEMD,),
        ("unknown (systemctl --version printed no version)",
         f"check `systemctl --version` on {node.name}"),
        f"run {node.name} on a release with systemd >= {MIN_SYSTEMD} "
        "(Debian 11+, Ubuntu 22.04+, RHEL/Rocky 9+)")


def check_openssh(node: Node, facts: HostFacts) -> list[Finding]:
    """The OpenSSH server is at least :data:`MIN_OPENSSH` (``sshd -V``)."""
    minimum = ".".join(str(part) for part in MIN_OPENSSH)
    return _at_least(
        "platform.openssh", node, "OpenSSH server version", facts.openssh_version, MIN_OPENSSH,
        ("unknown (no OpenSSH version from sshd -V)",
         f"check `sshd -V` on {node.name}; other SSH servers are not proven"),
        f"upgrade openssh-server on {node.name} to {minimum} or newer")


def check_python(node: Node, facts: HostFacts) -> list[Finding]:
    """The Python that runs vLLM (the venv's, else the host's python3) is at least
    :data:`MIN_PYTHON`."""
    found = facts.python_micro or facts.python_version.split(" ")[0]
    minimum = ".".join(str(part) for part in MIN_PYTHON)
    return _at_least(
        "platform.python", node, f"Python version ({facts.python_path or 'python3'})",
        found or None, MIN_PYTHON, ("unknown", f"check the venv's python on {node.name}"),
        f"rebuild the venv on {node.name} with Python {minimum} or newer")


@check("platform.platform", order=190, scope="node", reads=("node", "facts"))
def check_platform(node: Node, facts: HostFacts) -> list[Finding]:
    """All platform checks of one node."""
    return [*check_systemd(node, facts), *check_openssh(node, facts), *check_python(node, facts)]


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"3.9.2"`` -> ``(3, 9, 2)``; ``"8.4"`` -> ``(8, 4)`` (leading numbers only)."""
    match = re.match(r"[0-9]+(\.[0-9]+)*", text.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()
