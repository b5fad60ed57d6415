"""`provision check` / `provision facts` against the lab: each mismatch is one test.

Every test changes one thing on the lab, runs the real CLI over real SSH, and restores the lab
(`provision lab set HOST key=default`, or undoing its own change) in a ``finally``. The product
code never knows it talks to the lab.

Cost: about 128 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lab_support
import pytest

pytestmark = pytest.mark.lab

def provision(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """:func:`lab_support.provision` with this module's 180 s limit."""
    return lab_support.provision(*args, timeout=timeout)


def check(lab: Any, kind: str = "mp", *extra: str) -> tuple[int, list[dict[str, Any]]]:
    result = provision("check", "-i", str(lab.inventory_path(kind)), "--json", *extra)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout)["findings"]


def errors(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["severity"] == "error"]


@contextmanager
def lab_set(host: str, key: str, value: str) -> Iterator[None]:
    result = provision("lab", "set", host, f"{key}={value}")
    assert result.returncode == 0, result.stderr
    try:
        yield
    finally:
        provision("lab", "set", host, f"{key}=default")


def test_clean_lab_passes(lab):
    code, findings = check(lab)
    assert errors(findings) == []
    assert code == 0


@pytest.mark.parametrize(("key", "value", "check_name", "item"), [
    ("nccl", "2.27.3", "parity.nccl", "NCCL version"),
    ("vllm", "0.32.0", "parity.vllm", "vLLM version"),
    ("torch", "2.13.0", "parity.torch", "torch version (with CUDA build)"),
    ("python", "3.11.9", "parity.python", "Python version"),
])
def test_version_difference_on_h2_is_an_error_naming_both_values(lab, key, value, check_name,
                                                                  item):
    with lab_set("h2", key, value):
        code, findings = check(lab)
    [finding] = [f for f in errors(findings) if f["check"] == check_name]
    assert code == 1
    assert finding["host"] == "h2" and finding["item"] == item
    assert "(as on h1)" in finding["expected"] and value in finding["actual"]
    assert "h2" in finding["fix"]


def test_nccl_fix_names_the_package_version_and_venv(lab):
    with lab_set("h2", "nccl", "2.27.3"):
        _, findings = check(lab)
    [finding] = [f for f in errors(findings) if f["check"] == "parity.nccl"]
    assert finding["fix"].startswith("install nvidia-nccl-cu13==") and "/opt/vllm on h2" in \
        finding["fix"]


def test_ray_version_difference_fails_the_ray_inventory_only(lab):
    with lab_set("h2", "ray", "2.59.0"):
        ray_code, ray_findings = check(lab, "ray")
        _, mp_findings = check(lab, "mp")
    assert ray_code == 1
    assert [f["host"] for f in errors(ray_findings) if f["check"] == "parity.ray"] == ["h2"]
    assert not [f for f in mp_findings if f["check"] == "parity.ray"]


def test_driver_patch_difference_is_a_warning_and_exit_zero(lab):
    with lab_set("h2", "driver", "580.82.07"):
        code, findings = check(lab)
    assert code == 0
    assert [(f["host"], f["severity"]) for f in findings if f["check"] == "parity.driver_patch"
            and f["severity"] != "ok"] == [("h2", "warning")]


def test_missing_model_file_on_h2(lab):
    model = "/srv/models/lab-model"
    listing = lab.ssh("h2", f"ls {model}")
    name = sorted(listing.stdout.split())[0]
    lab.ssh("h2", f"mv {model}/{name} /root/{name}.preflight-test")
    try:
        code, findings = check(lab)
    finally:
        lab.ssh("h2", f"mv /root/{name}.preflight-test {model}/{name}")
    [finding] = [f for f in errors(findings) if f["check"] == "parity.model_manifest"]
    assert code == 1 and finding["host"] == "h2" and f"missing {name}" in finding["actual"]


def test_taken_master_port_on_h1(lab):
    # SO_REUSEADDR: an earlier check's reachability listener leaves 29501 in TIME_WAIT
    lab.ssh("h1", "systemctl reset-failed preflight-squatter.service 2>/dev/null; "
                  "systemd-run --unit=preflight-squatter python3 -c "
                  "'import socket,time; s=socket.socket(); "
                  "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                  "s.bind((\"0.0.0.0\", 29501)); s.listen(); time.sleep(600)'")
    try:
        lab.ssh("h1", "for i in $(seq 300); do ss -Hltn 'sport = :29501' | grep -q . && break; "
                      "sleep 0.1; done")
        code, findings = check(lab)
    finally:
        lab.ssh("h1", "systemctl stop preflight-squatter.service")
    port_errors = [f for f in errors(findings) if f["check"] == "network.ports"]
    assert len(port_errors) == 1, findings
    [finding] = port_errors
    assert code == 1 and finding["host"] == "h1" and "29501" in finding["item"]
    assert "preflight-squatter.service" in finding["actual"]


def test_too_small_dev_shm(lab):
    size = lab.ssh("h2", "findmnt -no OPTIONS /dev/shm").stdout
    original = next((o.split("=", 1)[1] for o in size.strip().split(",")
                     if o.startswith("size=")), None)
    lab.ssh("h2", "mount -o remount,size=64M /dev/shm")
    try:
        code, findings = check(lab)
    finally:
        restore = f"size={original}" if original else "size=50%"
        lab.ssh("h2", f"mount -o remount,{restore} /dev/shm")
    [finding] = [f for f in errors(findings) if f["check"] == "host.shm"]
    assert code == 1 and finding["host"] == "h2" and finding["actual"] == "64 MiB"


def test_foreign_process_on_h2_gpus(lab):
    result = provision("lab", "occupy", "h2")
    assert result.returncode == 0, result.stderr
    try:
        code, findings = check(lab)
    finally:
        provision("lab", "occupy", "h2", "--release")
    [finding] = [f for f in errors(findings) if f["check"] == "host.gpu_processes"]
    assert code == 1 and finding["host"] == "h2" and "pid" in finding["actual"]


def test_facts_is_one_ssh_round_trip_per_host(lab, monkeypatch):
    """Count SSH exec channels: exactly one per host after connecting."""
    import paramiko

    from vllm_provision.facts.collect import collect_facts
    from vllm_provision.facts.gather import ProbeOptions
    from vllm_provision.inventory import load_inventory

    calls: list[str] = []
    original = paramiko.Channel.exec_command

    def counting(self: paramiko.Channel, command: str) -> None:
        calls.append(command)
        return original(self, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", counting)
    inventory = load_inventory(lab.inventory_path("mp"))
    hosts = list(inventory.hosts.values())
    facts, errs = collect_facts(inventory, hosts, ProbeOptions())
    assert errs == {}
    assert len(calls) == len(hosts) == len(facts)
    assert all(f.gpus and f.packages.get("vllm") for f in facts.values())
    # which running system each host is (servers.one_node): each lab host has a machine-id of
    # its own, and systemd-nspawn gives each container a boot id of its own too
    assert len({f.machine_id for f in facts.values()}) == len(facts)
    assert all(len(f.machine_id) == 32 and len(f.boot_id) == 36 for f in facts.values())


def test_mtu_mismatch_and_gpu_faults_on_h2_are_errors_on_the_right_gpu(lab):
    """One check run: h2's eth0 at MTU 1400 against h1's 1500, and the stand-in's simulated
    faults on h2 (ECC on GPU 1, MIG on GPU 2, persistence off on GPU 3), and an Xid 79 of
    GPU 0 in h2's kernel log (``provision lab xid``)."""
    # ip, not /sys/class/net: an nspawn guest's sysfs shows the machine's own interfaces
    mtu = json.loads(lab.ssh("h2", "ip -j link show dev eth0").stdout)[0]["mtu"]
    faults = provision("lab", "set", "h2", "ecc_gpus=1", "mig_gpus=2", "persistence_off_gpus=3")
    assert faults.returncode == 0, faults.stderr
    xid = provision("lab", "xid", "h2", "--gpu", "0", "--code", "79")
    assert xid.returncode == 0, xid.stderr
    lab.ssh("h2", "ip link set dev eth0 mtu 1400")
    try:
        code, findings = check(lab)
    finally:
        lab.ssh("h2", f"ip link set dev eth0 mtu {mtu}")
        provision("lab", "xid", "h2", "--clear")
        provision("lab", "set", "h2", "ecc_gpus=default", "mig_gpus=default",
                  "persistence_off_gpus=default")
    assert code == 1
    [mtu_error] = [f for f in errors(findings) if f["check"] == "network.mtu"]
    assert f"h1 eth0 mtu {mtu}" in mtu_error["actual"] and "h2 eth0 mtu 1400" in \
        mtu_error["actual"]
    gpu_errors = {f["item"].split(" (")[0]: f for f in errors(findings)
                  if f["check"] == "gpu.errors"}
    assert sorted(gpu_errors) == ["GPU 0", "GPU 1"], gpu_errors
    assert all(f["host"] == "h2" for f in gpu_errors.values())
    assert "2 uncorrectable ECC errors" in gpu_errors["GPU 1"]["actual"]
    assert gpu_errors["GPU 0"]["actual"] == "Xid 79 in the last 24 h"
    [mig] = [f for f in errors(findings) if f["check"] == "gpu.mig"]
    assert mig["host"] == "h2" and mig["actual"] == "Enabled on GPU 2"
    [persistence] = [f for f in findings if f["check"] == "gpu.persistence"
                     and f["severity"] == "warning"]
    assert persistence["host"] == "h2" and persistence["actual"] == "Disabled on GPU 3"
    assert not [f for f in errors(findings) if f["host"] == "h1"]


def test_firewall_on_h1_dropping_its_peer_is_caught_before_anything_starts(lab):
    """h1 drops TCP from h2 to its master port and its watchdog port (iptables in h1's own
    network namespace, as a host firewall would): reachability names each port and both
    nodes; nothing was started."""
    from vllm_provision.facts.gather import peer_ports
    from vllm_provision.inventory import load_inventory

    [replica] = load_inventory(lab.inventory_path("mp")).replicas
    master_port = replica.engine.master_port
    watchdog_port = next(port for port, what in peer_ports(replica)["h1"]
                         if what == "watchdog port")
    h2_ip = next(h.address for h in lab.hosts if h.name == "h2")
    rules = [["INPUT", "-s", h2_ip, "-p", "tcp", "--dport", str(port), "-j", "DROP"]
             for port in (master_port, watchdog_port)]
    netns = ["ip", "netns", "exec", lab.config.netns("h1"), "iptables"]
    for rule in rules:
        subprocess.run([*netns, "-I", *rule], check=True)
    try:
        code, findings = check(lab)
    finally:
        for rule in rules:
            subprocess.run([*netns, "-D", *rule], check=False)
    assert code == 1
    [rendezvous] = [f for f in errors(findings) if f["check"] == "network.reach"]
    assert rendezvous["host"] == "h2" and f":{master_port}" in rendezvous["item"]
    assert str(master_port) in rendezvous["fix"] and "from h2 to h1" in rendezvous["fix"]
    [watchdog] = [f for f in errors(findings) if f["check"] == "network.peer_reach"]
    assert watchdog["host"] == "h2" and watchdog["item"].startswith("TCP to h1's watchdog port")
    assert f"{watchdog_port} from h2 to h1" in watchdog["fix"]
    assert lab.ssh("h1", "systemctl is-active vllm.service").stdout.strip() != "active"


def test_a_release_without_the_mp_multi_node_options_is_refused_before_anything_starts(lab):
    """Both nodes pretend to run vLLM 0.11.0, which has no ``--nnodes`` (the mp multi-node
    options came with 0.11.1): ``check`` refuses the mp replica naming the release and the fix,
    and the stand-in's own parser (that release's options, from the same table) refuses the
    option the same way, with argparse's exit 2. Then an option no release has is refused
    against the installed release (0.33.0)."""
    with lab_set("h1", "vllm", "0.11.0"), lab_set("h2", "vllm", "0.11.0"):
        code, findings = check(lab)
        started = lab.ssh("h1", "/opt/vllm/bin/vllm serve /srv/models/lab-model --nnodes 2")
    refused = [f for f in errors(findings) if f["check"] == "vllm_serve.options"]
    assert code == 1
    nnodes = [f for f in refused if f["item"].startswith("--nnodes")]
    assert {f["host"] for f in nnodes} == {"h1", "h2"}, refused
    assert "vLLM 0.11.0" in nnodes[0]["actual"] and "0.11.1" in nnodes[0]["fix"], nnodes[0]
    assert started.returncode == 2
    assert "unrecognized arguments: --nnodes 2" in started.stderr

    code, findings = check(lab, "mp", "-e", "vllm_extra_args=[--no-such-flag]")
    [unknown] = [f for f in errors(findings) if f["check"] == "vllm_serve.options"
                 and f["host"] == "h1"]
    assert code == 1 and "--no-such-flag" in unknown["actual"]
    assert "vLLM 0.33.0" in unknown["actual"]
