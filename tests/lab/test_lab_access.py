"""Lab hosts are reached by key with strict host-key checking, as root and as deploy (sudo).

Cost: about 5 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import shutil
from pathlib import Path

import paramiko
import pytest
from vllm_provision_lab import Lab

pytestmark = pytest.mark.lab


# Units the replicas of earlier test modules run (or the lab's test helpers start): one of them
# left failed by a module's faults makes systemd "degraded" without saying anything about the
# host's own boot, which is what this test checks.
REPLICA_UNITS = ("vllm", "ray-", "prometheus-node-exporter", "preflight-squatter")


@pytest.mark.parametrize("name", ["h1", "h2"])
def test_root_login_by_key_reaches_a_running_systemd(lab: Lab, name: str) -> None:
    proc = lab.ssh(name, "hostname; systemctl is-system-running; cat /proc/1/comm; "
                         "systemctl --failed --plain --no-legend | awk '{print $1}'")
    assert proc.returncode == 0, proc.stderr
    host, state, pid1, *failed = proc.stdout.split()
    assert (host, pid1) == (name, "systemd")
    # no unit of the host's own failed (sshd, journald, networkd, ...)
    assert [u for u in failed if not u.startswith(REPLICA_UNITS)] == [], failed
    assert state == ("degraded" if failed else "running"), (state, failed)


@pytest.mark.parametrize("name", ["h1", "h2"])
def test_deploy_user_has_passwordless_sudo(lab: Lab, name: str) -> None:
    proc = lab.ssh(name, "id -un; sudo -n id -u", user="deploy")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["deploy", "0"]


def test_testinfra_sees_sshd_and_the_fixed_address(lab: Lab, lab_host) -> None:
    host = lab_host("h2")
    assert host.service("ssh").is_running
    assert host.socket("tcp://0.0.0.0:22").is_listening
    assert f"inet {lab.hosts[1].address}/24" in host.check_output("ip -4 addr show dev eth0")
    assert host.file("/etc/hosts").contains(f"^{lab.hosts[0].address}\th1$")


def test_guests_have_no_default_route_and_no_dns(lab_host) -> None:
    host = lab_host("h1")
    assert "default" not in host.check_output("ip route")
    assert not host.run("getent hosts deb.debian.org").succeeded


def test_each_host_has_its_own_identity(lab: Lab) -> None:
    ids = {lab.ssh(h.name, "cat /etc/machine-id").stdout for h in lab.hosts[:2]}
    keys = {lab.ssh(h.name, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
            for h in lab.hosts[:2]}
    assert len(ids) == 2 and len(keys) == 2


def test_a_wrong_host_key_is_refused(lab: Lab, tmp_path: Path) -> None:
    # give h1's known_hosts entry h2's key: a strict client must refuse h1
    lines = lab.known_hosts.read_text().splitlines()
    h2_key = next(line.split(" ", 1)[1] for line in lines if line.startswith("h2,"))
    forged = tmp_path / "known_hosts"
    forged.write_text(f"h1,{lab.hosts[0].address} {h2_key}\n")
    config = tmp_path / "ssh_config"
    config.write_text(lab.ssh_config.read_text().replace(str(lab.known_hosts), str(forged)))
    ssh = shutil.which("ssh")
    assert ssh is not None
    import subprocess

    proc = subprocess.run([ssh, "-F", str(config), "h1", "true"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 255
    client = paramiko.SSHClient()
    client.load_host_keys(str(forged))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.BadHostKeyException):
        client.connect(lab.hosts[0].address, username="root", key_filename=str(lab.key_file),
                       look_for_keys=False, allow_agent=False, timeout=10)
