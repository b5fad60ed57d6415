"""A unit written over SSH behaves as on a real host, also across a reboot of the host.

Cost: about 9 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import time

import pytest
from vllm_provision_lab import Lab

pytestmark = pytest.mark.lab

UNIT = "lab-demo.service"
UNIT_TEXT = """[Unit]
Description=lab demo
[Service]
ExecStart=/usr/bin/python3 -m http.server 8089
Restart=on-failure
DynamicUser=yes
[Install]
WantedBy=multi-user.target
"""


@pytest.fixture
def demo_unit(lab: Lab, lab_host):
    host = lab_host("h2")
    yield host
    lab.ssh("h2", f"systemctl disable --now {UNIT}; rm -f /etc/systemd/system/{UNIT}; "
            "systemctl daemon-reload")


def _main_pid(host) -> int:
    return int(host.check_output(f"systemctl show -p MainPID --value {UNIT}"))


def test_unit_reload_enable_start_restart_and_journal(demo_unit) -> None:
    host = demo_unit
    host.run_expect([0], f"cat > /etc/systemd/system/{UNIT} <<'EOF'\n{UNIT_TEXT}EOF")
    host.run_expect([0], f"systemctl daemon-reload && systemctl enable --now {UNIT}")
    service = host.service(UNIT)
    assert service.is_enabled and service.is_running
    first = _main_pid(host)
    host.run_expect([0], f"systemctl restart {UNIT}")
    assert service.is_running and _main_pid(host) != first
    journal = host.check_output(f"journalctl -u {UNIT} --no-pager")
    assert journal.count("Started lab-demo.service") >= 2


def test_reboot_brings_the_host_back_with_enabled_units_running(lab: Lab, demo_unit,
                                                               lab_host) -> None:
    host = demo_unit
    host.run_expect([0], f"cat > /etc/systemd/system/{UNIT} <<'EOF'\n{UNIT_TEXT}EOF")
    host.run_expect([0], f"systemctl daemon-reload && systemctl enable --now {UNIT}")
    host.run_expect([0], "touch /run/before-reboot")  # /run is a tmpfs: gone after a boot
    started = time.monotonic()
    lab.reboot("h2")
    assert time.monotonic() - started < 60
    again = lab_host("h2")  # a new connection: the old one died with the reboot
    assert not again.file("/run/before-reboot").exists
    assert again.check_output("systemctl is-system-running") == "running"
    assert again.service(UNIT).is_running
    assert again.socket("tcp://0.0.0.0:8089").is_listening
