"""Platform checks: systemd, OpenSSH server and Python below the supported range are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_checks_parity_host import make_facts, make_replica

from vllm_provision.checks import platform
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import check_replica, settings_for
from vllm_provision.facts.parsers import parse_openssh_version


@pytest.mark.parametrize(("text", "expected"), [
    ("unknown option -- V\nOpenSSH_8.4p1 Debian-5+deb11u3, OpenSSL 1.1.1w  11 Sep 2023\n", "8.4"),
    ("OpenSSH_10.0p2 Debian-7+deb13u4, OpenSSL 3.5.9 29 Sep 2026", "10.0"),
    ("dropbear v2022.83", None), ("", None),
])
def test_openssh_version_from_sshd(text: str, expected: str | None) -> None:
    assert parse_openssh_version(text) == expected


@pytest.mark.parametrize(("changes", "check", "actual"), [
    ({"systemd_version": 239}, "platform.systemd", "239"),
    ({"openssh_version": "8.0"}, "platform.openssh", "8.0"),
    ({"python_micro": "3.8.10"}, "platform.python", "3.8.10"),
])
def test_a_host_below_the_range_is_refused_with_the_version_found(
        changes: dict, check: str, actual: str) -> None:
    replica = make_replica()
    facts = {"h1": make_facts("h1", "10.0.0.11"),
             "h2": make_facts("h2", "10.0.0.12", **changes)}
    errors = [f for f in check_replica(replica, facts, settings_for(replica))
              if f.severity is Severity.ERROR and f.check.startswith("platform.")]
    assert [(f.check, f.host, f.actual) for f in errors] == [(check, "h2", actual)]
    assert errors[0].fix and errors[0].source


@pytest.mark.parametrize("version", ["8.4", "9.2", "10.0"])
def test_openssh_in_range_passes(version: str) -> None:
    node = make_replica().nodes[0]
    facts = make_facts("h1", "10.0.0.11", openssh_version=version)
    assert [f.severity for f in platform.check_openssh(node, facts)] == [Severity.OK]


def test_unknown_versions_warn() -> None:
    node = make_replica().nodes[0]
    facts = replace(make_facts("h1", "10.0.0.11"), systemd_version=None, openssh_version=None)
    severities = {f.check: f.severity for f in platform.check_platform(node, facts)}
    assert severities == {"platform.systemd": Severity.WARNING,
                          "platform.openssh": Severity.WARNING, "platform.python": Severity.OK}
