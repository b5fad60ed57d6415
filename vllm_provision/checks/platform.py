"""Platform checks: the host's systemd, OpenSSH server and Python are in the supported range.

The range (README, "Supported hosts") is the oldest stack the lab proves end to end: Debian 11
(systemd 247, OpenSSH 8.4, Python 3.9), the stand-in for Ubuntu 22.04 and RHEL 9. A host below it
is refused with the versions found, before anything on any host is changed; a host whose version
cannot be read gets a warning (another SSH server, a systemctl that prints no version).
"""

from __future__ import annotations

import re

from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.facts.model import HostFacts
from vllm_provision.models import Node

# systemd 247: the oldest the lab proves. The units need Type=exec (systemd 240,
# systemd.service(5)); readiness reads ExecMainStartTimestampMonotonic (verify.show_command).
MIN_SYSTEMD = 247
# OpenSSH 8.4: the oldest sshd the lab proves (exec channels, ed25519 host keys; sshd(8)).
MIN_OPENSSH = (8, 4)
# Python 3.9: the oldest the lab proves for the venv (facts probe, watchdog, stand-in); the
# probe itself stays valid on 3.8 (facts/probe_script.py). vLLM's own wheels ask for more.
MIN_PYTHON = (3, 9)
SOURCE = "README: Supported hosts (oldest stack proven in the lab: Debian 11)"


def check_systemd(node: Node, facts: HostFacts) -> list[Finding]:
    """systemd on the host is at least :data:`MIN_SYSTEMD` (``systemctl --version``)."""
    found = facts.systemd_version
    item = "systemd version"
    expected = f">= {MIN_SYSTEMD}"
    if found is None:
        return [Finding("platform.systemd", Severity.WARNING, node.name, item, expected=expected,
                        actual="unknown (systemctl --version printed no version)",
                        fix=f"check `systemctl --version` on {node.name}", source=SOURCE)]
    if found < MIN_SYSTEMD:
        return [Finding("platform.systemd", Severity.ERROR, node.name, item, expected=expected,
                        actual=str(found),
                        fix=f"run {node.name} on a release with systemd >= {MIN_SYSTEMD} "
                            "(Debian 11+, Ubuntu 22.04+, RHEL/Rocky 9+)", source=SOURCE)]
    return [Finding("platform.systemd", Severity.OK, node.name, item, expected=expected,
                    actual=str(found))]


def check_openssh(node: Node, facts: HostFacts) -> list[Finding]:
    """The OpenSSH server is at least :data:`MIN_OPENSSH` (``sshd -V``)."""
    found = facts.openssh_version
    item = "OpenSSH server version"
    expected = ">= {}.{}".format(*MIN_OPENSSH)
    if found is None:
        return [Finding("platform.openssh", Severity.WARNING, node.name, item, expected=expected,
                        actual="unknown (no OpenSSH version from sshd -V)",
                        fix=f"check `sshd -V` on {node.name}; other SSH servers are not proven",
                        source=SOURCE)]
    if _version_tuple(found) < MIN_OPENSSH:
        return [Finding("platform.openssh", Severity.ERROR, node.name, item, expected=expected,
                        actual=found,
                        fix=f"upgrade openssh-server on {node.name} to {expected[3:]} or newer",
                        source=SOURCE)]
    return [Finding("platform.openssh", Severity.OK, node.name, item, expected=expected,
                    actual=found)]


def check_python(node: Node, facts: HostFacts) -> list[Finding]:
    """The Python that runs vLLM (the venv's, else the host's python3) is at least
    :data:`MIN_PYTHON`."""
    found = facts.python_micro or facts.python_version.split(" ")[0]
    item = f"Python version ({facts.python_path or 'python3'})"
    expected = ">= {}.{}".format(*MIN_PYTHON)
    if not found:
        return [Finding("platform.python", Severity.WARNING, node.name, item, expected=expected,
                        actual="unknown", fix=f"check the venv's python on {node.name}",
                        source=SOURCE)]
    if _version_tuple(found)[:2] < MIN_PYTHON:
        return [Finding("platform.python", Severity.ERROR, node.name, item, expected=expected,
                        actual=found,
                        fix=f"rebuild the venv on {node.name} with Python {expected[3:]} or newer",
                        source=SOURCE)]
    return [Finding("platform.python", Severity.OK, node.name, item, expected=expected,
                    actual=found)]


def check_platform(node: Node, facts: HostFacts) -> list[Finding]:
    """All platform checks of one node."""
    return [*check_systemd(node, facts), *check_openssh(node, facts), *check_python(node, facts)]


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"3.9.2"`` -> ``(3, 9, 2)``; ``"8.4"`` -> ``(8, 4)`` (leading numbers only)."""
    match = re.match(r"[0-9]+(\.[0-9]+)*", text.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()
