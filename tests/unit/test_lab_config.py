"""Lab instance settings: names, addresses and directories from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_provision_lab import system
from vllm_provision_lab.config import LabConfig, host_index, host_names
from vllm_provision_lab.errors import LabError


def test_defaults_match_architecture_doc() -> None:
    config = LabConfig.from_env({})
    assert config.state_dir == Path("/var/lib/vllm-provision/lab")
    assert (config.netns("h1"), config.bridge) == ("vp-h1", "vpbr0")
    assert config.cgroup_subtree == "vllm-provision-vp"
    assert (config.bridge_address, config.address("h1"), config.address("h16")) == (
        "10.213.0.1", "10.213.0.11", "10.213.0.26")
    assert config.cache == Path("/var/lib/vllm-provision/lab/cache")


def test_instance_settings_come_from_env() -> None:
    config = LabConfig.from_env({
        "VLLM_PROVISION_LAB_DIR": "/tmp/lab-t1", "VLLM_PROVISION_LAB_NAME": "t1",
        "VLLM_PROVISION_LAB_NET": "10.213.1", "VLLM_PROVISION_LAB_CACHE": "/tmp/cache"})
    assert (config.netns("h2"), config.bridge, config.address("h2")) == (
        "t1-h2", "t1br0", "10.213.1.12")
    assert config.cache == Path("/tmp/cache")
    assert config.run_dir == Path("/tmp/lab-t1/run")
    assert config.nice == 0 and LabConfig.from_env({"VLLM_PROVISION_LAB_NICE": "-5"}).nice == -5



def test_each_test_worker_gets_its_own_instance_and_shares_the_base_cache() -> None:
    base = LabConfig.from_env({})
    first, second = base.worker(0), base.worker(1)
    assert (first.name, first.net, first.state_dir) == (
        "vpw0", "10.213.1", Path("/var/lib/vllm-provision/lab-w0"))
    assert (second.name, second.net, second.state_dir) == (
        "vpw1", "10.213.2", Path("/var/lib/vllm-provision/lab-w1"))
    assert first.cache == second.cache == base.cache
    assert LabConfig.from_env(second.environ()) == second
    favoured = LabConfig.from_env({"VLLM_PROVISION_LAB_NICE": "-5"}).worker(2)
    assert favoured.nice == -5 and LabConfig.from_env(favoured.environ()) == favoured


def test_a_worker_name_fits_and_a_worker_past_the_last_net_is_refused() -> None:
    assert LabConfig(name="abcdefghij").worker(12).name == "abcdefgw12"
    long = LabConfig(name="abcdefghij", net="10.213.250")
    assert long.worker(4).net == "10.213.255"
    with pytest.raises(LabError) as caught:
        long.worker(5)
    assert caught.value.problems[0].where == "VLLM_PROVISION_LAB_NET"

UNUSABLE = {
    "VLLM_PROVISION_LAB_NAME": ("with-dash", "muchtoolongname"),  # "<name>-h16" > IFNAMSIZ
    "VLLM_PROVISION_LAB_NET": ("10.213", "10.300.0"),
    "VLLM_PROVISION_LAB_DIR": ("relative/dir",),
    "VLLM_PROVISION_LAB_NICE": ("-25", "low"),
}


@pytest.mark.parametrize(("variable", "value"), [
    (variable, value) for variable, values in UNUSABLE.items() for value in values])
def test_unusable_setting_names_the_variable(variable: str, value: str) -> None:
    with pytest.raises(LabError) as caught:
        LabConfig.from_env({variable: value})
    assert caught.value.problems[0].where == variable
    assert caught.value.problems[0].actual == value


def test_longest_interface_names_fit_ifnamsiz() -> None:
    config = LabConfig(name="abcdefghij")
    assert len(config.netns("h16")) <= 15 and len(config.bridge) <= 15


@pytest.mark.parametrize("name", ["h0", "h65", "x1", "h01", "h"])
def test_host_names_outside_h1_to_h16_are_refused(name: str) -> None:
    with pytest.raises(LabError):
        host_index(name)


def test_host_names_counts() -> None:
    assert host_names(3) == ["h1", "h2", "h3"]
    with pytest.raises(LabError):
        host_names(65)


def test_not_root_is_said_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    with pytest.raises(LabError) as caught:
        system.require_root("lab up")
    assert "needs root" in caught.value.render()
    assert "sudo provision lab up" in caught.value.render()


def test_host_suites_one_for_all_or_one_per_host() -> None:
    from vllm_provision_lab import _host_suites

    assert _host_suites(["h1", "h2"], None) == {"h1": "bookworm", "h2": "bookworm"}
    assert _host_suites(["h1", "h2"], ["trixie"]) == {"h1": "trixie", "h2": "trixie"}
    assert _host_suites(["h1", "h2"], ["bullseye", "trixie"]) == {"h1": "bullseye",
                                                                  "h2": "trixie"}
    with pytest.raises(LabError, match="one per host"):
        _host_suites(["h1", "h2"], ["bullseye", "trixie", "bookworm"])
    with pytest.raises(LabError, match="Debian release"):
        _host_suites(["h1"], ["jessie"])
