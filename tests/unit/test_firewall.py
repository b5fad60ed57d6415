"""The replica's nftables table, the pinned Ray ports and their checks, and the public-address
warning (vllm_provision/settings/firewall.py, docs/security.md "Network exposure")."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from inventory_support import llama_yaml, write_inventory
from inventory_support import load_llama as load
from render_support import rendered_files
from test_checks_parity_host import clean_facts, make_replica

from vllm_provision.checks import network
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import check_replica, settings_for
from vllm_provision.core.errors import ProvisionError
from vllm_provision.facts.model import Interface
from vllm_provision.inventory import load_inventory
from vllm_provision.settings import firewall


def problems(tmp_path: Path, backend: str = "ray", **extra: object) -> str:
    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, backend, **extra)
    return str(raised.value)


# --- rendering --------------------------------------------------------------------------------

def test_mp_table_accepts_master_and_watchdog_ports_from_the_peers_only(tmp_path):
    [replica] = load(tmp_path, "mp", vllm_api_allow_from="[192.168.0.0/16, 'fd00::/8']").replicas
    text = firewall.ruleset(replica, replica.vars["vllm_api_allow_from"])
    assert "table inet vllm_provision\ndelete table inet vllm_provision\n" in text
    assert "elements = { 10.0.0.11, 10.0.0.12 }" in text
    assert "tcp dport { 29501, 29510 } ip saddr @peers4 accept" in text
    assert "tcp dport { 29501, 29510 } drop" in text
    assert "elements = { 192.168.0.0/16 }" in text and "elements = { fd00::/8 }" in text
    assert "tcp dport 8000 ip saddr @peers4 accept\n\t\ttcp dport 8000 ip saddr @api4 accept" \
        in text
    assert "tcp dport 8000 ip6 saddr @api6 accept" in text
    assert text.index("accept\n\t\ttcp dport 8000 drop") > 0
    assert "policy accept" in text and "peers6" not in text  # no IPv6 node, no IPv6 set


def test_ray_table_names_the_gcs_every_pinned_port_and_the_worker_range(tmp_path):
    [replica] = load(tmp_path, "ray", ray_node_manager_port=7001, ray_max_worker_port=11000
                     ).replicas
    ports = {(p.what, p.text()) for p in firewall.peer_only_ports(replica)}
    assert ports == {("Ray GCS port", "6379"), ("ray_node_manager_port", "7001"),
                     ("ray_object_manager_port", "6381"), ("ray_client_server_port", "10001"),
                     ("ray_dashboard_agent_listen_port", "52365"),
                     ("ray_dashboard_agent_grpc_port", "52366"),
                     ("ray_runtime_env_agent_port", "52367"),
                     ("ray_metrics_export_port", "52368"), ("Ray worker ports", "10002-11000"),
                     ("watchdog port", "29510")}
    text = firewall.ruleset(replica)
    assert "10002-11000" in text and "7001" in text
    assert "tcp dport 8000" not in text  # no allow list: the API port is left to other rules


def test_ray_dashboard_port_is_peer_only_when_the_inventory_turns_it_on(tmp_path):
    [off] = load(tmp_path, "ray").replicas
    assert "8265" not in firewall.ruleset(off)
    [on] = load(tmp_path, "ray", ray_include_dashboard="true").replicas
    assert ("Ray dashboard and job API", "8265") in {
        (p.what, p.text()) for p in firewall.peer_only_ports(on)}


@pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None
                    or os.geteuid() != 0, reason="needs nft(8), unshare(1) and root")
def test_rendered_tables_pass_nft_check(tmp_path):
    for backend in ("mp", "ray"):
        [replica] = load(tmp_path, backend, vllm_api_allow_from="[10.1.0.0/16, '2001:db8::1']"
                         ).replicas
        path = tmp_path / f"{backend}.nft"
        path.write_text(firewall.ruleset(replica, replica.vars["vllm_api_allow_from"]))
        # its own network namespace: the check never reaches the controller's ruleset
        done = subprocess.run(["unshare", "-n", "nft", "-c", "-f", str(path)],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr


def test_ray_units_pin_every_port_and_turn_the_dashboard_off(tmp_path):
    files = dict(rendered_files(load(tmp_path, "ray")))
    head, worker = files["h1:ray/ray-head.service.j2"], files["h2:ray/ray-worker.service.j2"]
    for flag in ("--node-manager-port=6380", "--object-manager-port=6381",
                 "--min-worker-port=10002", "--max-worker-port=10999",
                 "--dashboard-agent-listen-port=52365", "--dashboard-agent-grpc-port=52366",
                 "--runtime-env-agent-port=52367", "--metrics-export-port=52368"):
        assert flag in head and flag in worker
    assert "--include-dashboard=false" in head and "--dashboard-host" not in head
    assert "--ray-client-server-port" not in head  # unset: Ray refuses it without ray[client]
    assert "--include-dashboard" not in worker
    head = dict(rendered_files(load(tmp_path, "ray", ray_include_dashboard="true",
                                    ray_client_server_port=11001)))["h1:ray/ray-head.service.j2"]
    assert "--include-dashboard=true --dashboard-host=10.0.0.11 --dashboard-port=8265" in head
    assert "--ray-client-server-port=11001" in head


# --- validation -------------------------------------------------------------------------------

def test_a_bad_allow_from_item_is_refused_naming_it(tmp_path):
    text = problems(tmp_path, "mp", vllm_api_allow_from="['10.0.0.1/8']")
    assert "vllm_api_allow_from" in text and "'10.0.0.1/8'" in text and "host bits" in text
    text = problems(tmp_path, "mp", vllm_api_allow_from="['10.0.0.0/8; drop']")
    assert "vllm_api_allow_from" in text
    assert "vllm_firewall" in problems(tmp_path, "mp", vllm_firewall="iptables")


@pytest.mark.parametrize("extra, first, second", [
    ({"ray_node_manager_port": 8000}, "vllm_api_port", "ray_node_manager_port"),
    ({"ray_object_manager_port": 6379}, "ray_port", "ray_object_manager_port"),
    ({"ray_metrics_export_port": 29510}, "vllm_watchdog_port", "ray_metrics_export_port"),
    ({"ray_client_server_port": 10500}, "ray_client_server_port",
     "ray_min_worker_port-ray_max_worker_port"),
    ({"ray_min_worker_port": 11000}, "ray_min_worker_port", "ray_max_worker_port"),
])
def test_ray_ports_that_overlap_are_refused_naming_both(tmp_path, extra, first, second):
    text = problems(tmp_path, "ray", **extra)
    assert f"{first} and {second} of replica 'llama'" in text


def test_mp_master_port_and_watchdog_port_must_differ(tmp_path):
    text = problems(tmp_path, "mp", vllm_master_port=29510)
    assert "vllm_master_port and vllm_watchdog_port" in text or \
        "vllm_watchdog_port and vllm_master_port" in text
    # Ray's ports are not mp's: an mp replica may use 6380 for its master port
    assert load(tmp_path, "mp", vllm_master_port=6380).replicas


def test_worker_ports_below_1024_are_refused(tmp_path):
    assert "ray_min_worker_port" in problems(tmp_path, "ray", ray_min_worker_port=80)


# --- the public-address check -----------------------------------------------------------------

@pytest.mark.parametrize("address, public", [
    ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False), ("fd12::1", False),
    ("127.0.0.1", False), ("::1", False), ("169.254.1.1", False), ("fe80::1%eth0", False),
    ("100.64.0.1", False), ("8.8.8.8", True), ("2001:4860::8888", True),
    ("::ffff:8.8.8.8", True), ("not-an-ip", False),
])
def test_is_public_follows_ipaddress_is_global(address, public):
    assert firewall.is_public(address) is public


def test_a_public_cluster_address_warns_naming_every_exposed_port():
    replica = make_replica("mp", {"vllm_firewall": "off"})
    facts = clean_facts()
    facts["h1"] = replace(facts["h1"], interfaces={
        "eth0": Interface("eth0", "UP", ("UP", "LOWER_UP"), ("10.0.0.11", "203.0.114.7"))})
    [warning] = [f for f in check_replica(replica, facts, settings_for(replica))
                 if f.check == "network.exposure"]
    assert warning.severity is Severity.WARNING and warning.host == "h1"
    assert warning.actual == ("public 203.0.114.7: exposes TCP 8000 (API port), 29501 (master "
                              "port), 29510 (watchdog port)")
    assert "vllm_firewall: nftables" in warning.fix
    on = make_replica("mp", {"vllm_firewall": "nftables"})
    assert network.check_exposure(on.nodes[0], facts["h1"], on, "eth0") == []
    assert network.check_exposure(replica.nodes[1], facts["h2"], replica, "eth0") == []


def test_a_per_host_watchdog_port_is_peer_only_on_every_node(tmp_path):
    """h2 serves its watchdog on its own port: the table (the same on every node) closes both
    nodes' ports to all but the peers, not only rank 0's."""
    path = write_inventory(tmp_path, llama_yaml("mp").replace(
        "h2: {ansible_host: 10.0.0.12, vllm_node_rank: 1}",
        "h2: {ansible_host: 10.0.0.12, vllm_node_rank: 1, vllm_watchdog_port: 29611}"))
    [replica] = load_inventory(path).replicas
    text = firewall.ruleset(replica)
    assert "tcp dport { 29501, 29510, 29611 } ip saddr @peers4 accept" in text
    assert "tcp dport { 29501, 29510, 29611 } drop" in text
    assert [p.low for p in firewall.exposed_ports(replica) if p.what == "watchdog port"] == [
        29510, 29611]


# --- the front door on a firewalled node (docs/front-door.md) --------------------------------

GATEWAY_ON_H1 = """\
    vllm_gateways:
      vars: {vllm_gateway_wheelhouse: wheels}
      hosts:
        h1: {vllm_gateway_port: 30100, vllm_gateway_metrics_port: 29100}
"""


def _gateway_node_table(tmp_path: Path, **extra: object) -> str:
    """The firewall template rendered for h1, rank 0 and a host of vllm_gateways, with the
    ``gateway`` the runner gives a gateway host (runner/variables.py)."""
    from test_monitoring_exporters import _render

    from vllm_provision.inventory.gateways import gateway_of

    inventory = load_inventory(write_inventory(
        tmp_path, llama_yaml("mp", vllm_firewall="nftables", **extra) + GATEWAY_ON_H1))
    [replica] = inventory.replicas
    return _render(replica, "vllm_firewall", "firewall.nft.j2",
                   gateway=gateway_of(inventory, "h1"))


def test_a_gateway_node_opens_the_gateway_port_and_its_metrics_port_to_prometheus(tmp_path):
    lines = _gateway_node_table(tmp_path, vllm_metrics_allow_from="[10.9.0.0/24]").splitlines()
    assert "\t\ttcp dport 30100 accept" in lines
    assert "\t\ttcp dport 29100 ip saddr @peers4 accept" in lines
    assert "\t\ttcp dport 29100 ip saddr @metrics4 accept" in lines
    # both before the peer-only drop, the metrics port closed to everyone else
    drop = lines.index("\t\ttcp dport { 29501, 29510 } drop")
    assert lines.index("\t\ttcp dport 30100 accept") < drop
    assert lines.index("\t\ttcp dport 29100 ip saddr @metrics4 accept") < \
        lines.index("\t\ttcp dport 29100 drop") < drop
    assert ("# Front door port 30100: from any source; its metrics port 29100: from the peers "
            "and 10.9.0.0/24.") in lines


def test_a_gateway_node_without_metrics_sources_leaves_both_ports_open(tmp_path):
    text = _gateway_node_table(tmp_path)
    assert "\t\ttcp dport 30100 accept\n\t\ttcp dport 29100 accept\n" in text
    assert "29100 drop" not in text and "30100 drop" not in text
    [replica] = load(tmp_path, "mp").replicas
    assert "Front door" not in firewall.ruleset(replica)  # not a gateway host: no rule


@pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None
                    or os.geteuid() != 0, reason="needs nft(8), unshare(1) and root")
def test_a_gateway_node_table_passes_nft_check(tmp_path):
    path = tmp_path / "gateway.nft"
    path.write_text(_gateway_node_table(tmp_path, vllm_metrics_allow_from="[10.9.0.0/24]"))
    done = subprocess.run(["unshare", "-n", "nft", "-c", "-f", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
