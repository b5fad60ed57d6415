"""Every variable and every overridable role default has a declared kind, and each kind's rule
refuses what docs/security.md says it refuses."""

from __future__ import annotations

import pytest

from vllm_provision.core.models import canonical_ip
from vllm_provision.settings import kinds, variables


def test_every_variable_and_role_default_has_a_kind() -> None:
    names = set(variables.VARIABLES) | set(variables.role_defaults())
    assert sorted(names - set(kinds.KINDS)) == []
    assert sorted(set(kinds.KINDS) - names) == []


@pytest.mark.parametrize("path", ["/", "/etc", "/tmp", "/var", "/usr", "/var/lib", "/root",
                                  "/etc/systemd/system", "/usr/local/lib", "/home"])
def test_system_directories_are_never_ours(path: str) -> None:
    assert kinds.check_owned_dir(path) is not None
    assert kinds.check_owned_dir(path, allowed=[path]) is not None


@pytest.mark.parametrize("path", ["/var/lib/vllm", "/var/lib/vllm/tmp", "/etc/vllm-provision",
                                  "/opt/vllm-cache", "/run/vllm-provision"])
def test_directories_below_our_prefixes_are_ours(path: str) -> None:
    assert kinds.check_owned_dir(path) is None


@pytest.mark.parametrize("path", ["/var/lib/vllm/../../etc", "/var/lib//vllm", "/var/lib/vllm/",
                                  "var/lib/vllm", "/var/lib/vllm/./x", "/var/lib/vllm x",
                                  "/var/lib/vllm%h", "/var/lib/vllm$X"])
def test_paths_are_absolute_normalised_and_plain(path: str) -> None:
    assert kinds.check_path(path) is not None


@pytest.mark.parametrize(("value", "ok"), [("fe80::1%eth0", True), ("fe80::1%$(id)", False),
                                           ("fe80::1%a b", False), ("fe80::1%-x", False),
                                           ("10.0.0.1", True), ("10.0.0.1;id", False)])
def test_a_zone_id_is_an_interface_name(value: str, ok: bool) -> None:
    assert (kinds.check_address(value) is None) is ok


def test_one_address_written_two_ways_has_one_canonical_form() -> None:
    assert canonical_ip("::ffff:10.0.0.1") == canonical_ip("10.0.0.1")
    assert canonical_ip("FE80:0::1") == canonical_ip("fe80::1")


def test_every_rule_belongs_to_a_kind_or_variable_in_use() -> None:
    assert sorted(set(kinds.RULES) - set(kinds.KINDS.values())) == []
    assert sorted(set(kinds.OWN_RULES) - set(kinds.KINDS)) == []
