"""Exporters on the nodes (docs/monitoring.md, "Exporters on the nodes"): the monitoring
variables, their ports at load, the firewall's metrics rules, role vllm_monitoring's drop-in and
the ``package`` module it installs with."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from inventory_support import load_llama as load
from render_support import ROLES, unit_words

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.results import Status
from vllm_provision.modules import package
from vllm_provision.runner.templating import Templar, make_environment
from vllm_provision.settings import firewall, monitoring, variables
from vllm_provision.transport.local import LocalConnection


def problems(tmp_path: Path, backend: str = "mp", **extra: object) -> str:
    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, backend, **extra)
    return str(raised.value)


# --- which exporters a node serves ------------------------------------------------------------

def test_exporters_follow_the_variables_and_the_exporters_own_ports() -> None:
    assert monitoring.exporters({}) == []
    assert monitoring.exporters({"vllm_monitoring": "off", "vllm_gpu_exporter": "none"}) == []
    both = monitoring.exporters({"vllm_monitoring": "node_exporter",
                                 "vllm_node_exporter_port": 9100,
                                 "vllm_gpu_exporter": "dcgm-exporter"})
    assert [(e.job, e.port) for e in both] == [("node", 9100), ("gpu", 9400)]
    assert monitoring.exporter_ports("off", 9100, "nvidia_gpu_exporter", None) == [
        ("GPU exporter nvidia_gpu_exporter", 9835)]
    assert monitoring.exporter_ports("off", 9100, "dcgm-exporter", 9500) == [
        ("GPU exporter dcgm-exporter", 9500)]


def test_the_variables_are_checked_at_load(tmp_path: Path) -> None:
    text = problems(tmp_path, vllm_monitoring="prometheus")
    assert "vllm_monitoring" in text and "node_exporter" in text
    text = problems(tmp_path, vllm_gpu_exporter="dcgm")
    assert "vllm_gpu_exporter" in text and "nvidia_gpu_exporter" in text
    text = problems(tmp_path, vllm_metrics_allow_from="[10.0.0.300]")
    assert "vllm_metrics_allow_from" in text and "10.0.0.300" in text
    text = problems(tmp_path, vllm_node_exporter_port=70000)
    assert "vllm_node_exporter_port" in text


@pytest.mark.parametrize(("backend", "extra", "pair"), [
    ("mp", {"vllm_monitoring": "node_exporter", "vllm_node_exporter_port": 8000},
     "vllm_api_port and vllm_node_exporter_port"),
    ("mp", {"vllm_gpu_exporter": "dcgm-exporter", "vllm_gpu_exporter_port": 29510},
     "vllm_watchdog_port and vllm_gpu_exporter_port"),
    ("ray", {"vllm_monitoring": "node_exporter", "vllm_node_exporter_port": 52368},
     "ray_metrics_export_port and vllm_node_exporter_port"),
    ("ray", {"vllm_gpu_exporter": "nvidia_gpu_exporter", "vllm_gpu_exporter_port": 10500},
     "vllm_gpu_exporter_port and ray_min_worker_port-ray_max_worker_port"),
])
def test_an_exporter_port_that_collides_is_refused_naming_both(tmp_path, backend, extra,
                                                               pair) -> None:
    text = problems(tmp_path, backend, **extra)
    assert pair in text


def test_an_exporter_left_off_takes_no_port(tmp_path: Path) -> None:
    # the node exporter's port equals the API port, but the node exporter is not asked for
    [replica] = load(tmp_path, "mp", vllm_node_exporter_port=8000).replicas
    assert replica.engine.api_port == 8000


# --- the firewall ---------------------------------------------------------------------------

def test_without_metrics_sources_the_exporters_are_open_and_the_table_is_as_before(tmp_path):
    [replica] = load(tmp_path, "ray").replicas
    exporters = monitoring.exporter_ports("node_exporter", 9100, "dcgm-exporter", None)
    assert firewall.ruleset(replica, (), (), exporters, 52368) == firewall.ruleset(replica)
    assert "9100" not in firewall.ruleset(replica, (), (), exporters, 52368)


def test_metrics_sources_reach_the_exporters_rays_metrics_port_and_a_closed_api(tmp_path):
    [replica] = load(tmp_path, "ray").replicas
    exporters = monitoring.exporter_ports("node_exporter", 9100, "dcgm-exporter", None)
    text = firewall.ruleset(replica, ["192.168.0.0/16"], ["10.9.0.5", "fd00:9::/64"],
                            exporters, 52368)
    lines = text.splitlines()
    assert "\t\telements = { 10.9.0.5/32 }" in lines and "\t\telements = { fd00:9::/64 }" in lines
    # Ray's metrics port is peer-only: the Prometheus is accepted before the peer drop
    drop = next(i for i, line in enumerate(lines) if line.endswith("} drop")
                and "52368" in line)
    assert lines.index("\t\ttcp dport 52368 ip saddr @metrics4 accept") < drop
    assert "\t\ttcp dport 52368 ip6 saddr @metrics6 accept" in lines
    # the API port (its /metrics) from the Prometheus too, before the API drop
    assert lines.index("\t\ttcp dport 8000 ip saddr @metrics4 accept") < \
        lines.index("\t\ttcp dport 8000 drop")
    # the exporters: peers and the Prometheus, nobody else
    assert "\t\ttcp dport { 9100, 9400 } ip saddr @peers4 accept" in lines
    assert "\t\ttcp dport { 9100, 9400 } ip saddr @metrics4 accept" in lines
    assert lines[-3] == "\t\ttcp dport { 9100, 9400 } drop"
    assert "# Metrics ports 52368, 9100, 9400: from the peers and 10.9.0.5/32, fd00:9::/64." \
        in lines


def test_an_open_api_stays_open_with_metrics_sources(tmp_path: Path) -> None:
    [replica] = load(tmp_path, "mp").replicas
    text = firewall.ruleset(replica, (), ["10.9.0.5"], [], 52368)
    assert "tcp dport 8000" not in text  # mp: no API rule, and 52368 is no port of mp's
    assert "52368" not in text


def test_the_firewall_template_passes_the_monitoring_variables(tmp_path: Path) -> None:
    [replica] = load(tmp_path, "mp", vllm_firewall="nftables", vllm_monitoring="node_exporter",
                     vllm_metrics_allow_from="[10.9.0.0/24]").replicas
    text = _render(replica, "vllm_firewall", "firewall.nft.j2")
    assert "\t\ttcp dport { 9100 } ip saddr @metrics4 accept" in text.splitlines()
    assert "elements = { 10.9.0.0/24 }" in text


# --- role vllm_monitoring -------------------------------------------------------------------

def _render(replica, role: str, name: str, **more: object) -> str:
    defaults = {**variables.defaults()}
    for each in ("vllm_common", "vllm_monitoring", "vllm_firewall"):
        defaults.update(__import__("yaml").safe_load(
            (ROLES / each / "defaults" / "main.yml").read_text()))
    node = replica.master
    values = {**defaults, **node.host.vars, **more}
    templar = Templar(make_environment([ROLES / role / "templates"]), values, node.name,
                      {"replica": replica, "node": node, "engine": replica.engine,
                       "inventory_hostname": node.name})
    return templar.render((ROLES / role / "templates" / name).read_text(), name)


def test_the_drop_in_replaces_the_packages_command_line_with_ours(tmp_path: Path) -> None:
    [replica] = load(tmp_path, "mp", vllm_monitoring="node_exporter",
                     vllm_node_exporter_port=9111).replicas
    text = _render(replica, "vllm_monitoring", "node-exporter.conf.j2")
    starts = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert starts[0] == "ExecStart="  # clears the package's own
    assert unit_words(starts[1].removeprefix("ExecStart=")) == [
        "/usr/bin/prometheus-node-exporter", "--web.listen-address=:9111", "--collector.systemd",
        "--collector.systemd.enable-restarts-metrics"]


def test_the_role_runs_its_tasks_only_when_asked() -> None:
    import yaml

    tasks = yaml.safe_load((ROLES / "vllm_monitoring" / "tasks" / "main.yml").read_text())
    assert tasks and all(t["when"] == 'vllm_monitoring == "node_exporter"' for t in tasks)
    assert [next(k for k in t if k not in ("name", "when", "notify")) for t in tasks] == [
        "package", "file", "template", "systemd", "systemd"]


# --- the package module ---------------------------------------------------------------------

def _fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed: bool) -> Path:
    """A PATH with a dpkg-query that knows one package and an apt-get that logs its words."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    scripts = {
        "dpkg-query": ("#!/bin/sh\n" + ('printf "install ok installed 1.5.0-1"\n' if installed
                                        else "exit 1\n")),
        "apt-get": f'#!/bin/sh\nprintf "%s\\n" "$DEBIAN_FRONTEND" "$@" > {log}\n',
    }
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def _ctx(check_mode: bool = False) -> SimpleNamespace:
    return SimpleNamespace(conn=LocalConnection("h1"), check_mode=check_mode,
                           on_change_script=lambda: None)


def test_an_installed_package_is_left_alone_in_one_read(tmp_path, monkeypatch) -> None:
    log = _fake_tools(tmp_path, monkeypatch, installed=True)
    result = package.run(_ctx(), {"name": "prometheus-node-exporter"})
    assert result.status is Status.OK and result.data["version"] == "1.5.0-1"
    assert not log.exists()
    assert package.read_command(_ctx(), {"name": "prometheus-node-exporter"}) == \
        package.read_script("prometheus-node-exporter")


def test_a_missing_package_is_installed_without_questions(tmp_path, monkeypatch) -> None:
    log = _fake_tools(tmp_path, monkeypatch, installed=False)
    assert package.run(_ctx(check_mode=True), {"name": "prometheus-node-exporter"}).status \
        is Status.CHANGED
    assert not log.exists()  # check mode installs nothing
    result = package.run(_ctx(), {"name": "prometheus-node-exporter"})
    assert result.status is Status.CHANGED and "installed" in result.message
    assert log.read_text().split() == ["noninteractive", "install", "-y", "-q",
                                       "--no-install-recommends", "--",
                                       "prometheus-node-exporter"]


@pytest.mark.parametrize("name", ["-oDebug::pkgProblemResolver=1", "a b", "x;id", "", "é"])
def test_a_name_that_is_no_package_name_is_refused(name: str) -> None:
    with pytest.raises(ProvisionError, match="not a package name"):
        package.run(_ctx(), {"name": name})
    assert package.read_command(_ctx(), {"name": name}) is None
