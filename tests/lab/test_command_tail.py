"""A command's last line arrives, also when sshd sends it after the exit status.

OpenSSH's sshd sends ``exit-status`` when the child exits, and the output still in the pipe
after it, then EOF (session.c ``session_exit_message``: "there could be some more data waiting in
the pipe"). sshd reads the child's pipe only while the client's channel window has room
(channels.c), so output larger than paramiko's 2 MiB window that ends right before the exit is
often still in the pipe when the exit status goes out. The command here starts after a delay,
writes 4 MiB and then its last line right before it exits; 120 times in a row, on a lab host
kept busy by CPU burners inside it. The loop that stopped at the exit status once the receive
buffer looked empty lost the tail in 46 of 200 runs (measured on the lab), so 120 runs without a
loss leave it no chance (0.77^120). The runs stay under 512 MiB on the one connection
(paramiko rekeys after 2^29 bytes received, paramiko/packet.py ``REKEY_BYTES``): with 200 runs
(800 MiB) the rekey fell inside the test, and once, on a CI machine where the burners starved
h1's sshd, the key exchange outlasted paramiko's 30 s wait for it (``clear_to_send_timeout``)
and the connection was lost: a test of the command's tail, not of rekeying under starvation.

Cost: about 68 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vllm_provision.transport.base import ConnectionOptions
from vllm_provision.transport.connection import HostConnection

pytestmark = pytest.mark.lab

RUNS = 120  # 480 MiB: under paramiko's rekey threshold (module docstring)
BULK = 4 * 1024 * 1024  # twice paramiko's default channel window (paramiko.common)
BURNERS = ("vp-tail-burn-1.service", "vp-tail-burn-2.service", "vp-tail-burn-3.service")


@pytest.fixture
def loaded_host(lab: object) -> Iterator[HostConnection]:
    """A connection to h1 while CPU burners (transient units) keep h1 busy; stopped after."""
    from vllm_provision.inventory import load_inventory

    host = load_inventory(lab.inventory_path("mp")).hosts["h1"]  # type: ignore[attr-defined]
    conn = HostConnection(host, ConnectionOptions())
    conn.open()
    try:
        for unit in BURNERS:
            conn.run(f"systemd-run --quiet --collect --unit {unit} /bin/sh -c "
                     "'while :; do :; done'", check=True)
        active = conn.run(f"systemctl is-active {' '.join(BURNERS)}")
        assert active.stdout.split() == ["active"] * len(BURNERS), active.stdout
        yield conn
    finally:
        conn.run(f"systemctl stop {' '.join(BURNERS)}")
        conn.close()


def test_the_last_line_written_right_before_exit_arrives_every_time(
        loaded_host: HostConnection) -> None:
    lost: list[tuple[int, str]] = []
    for run in range(RUNS):
        result = loaded_host.run(
            f"echo first; sleep 0.02; head -c {BULK} /dev/zero | tr '\\0' x; echo; "
            f"echo last line {run}; exit 3", timeout_s=60)
        assert result.exit_code == 3
        expected = f"first\n{'x' * BULK}\nlast line {run}\n"
        if result.stdout != expected:
            lost.append((run, f"{len(expected) - len(result.stdout)} bytes short, ends "
                              f"{result.stdout[-20:]!r}"))
    assert lost == [], f"{len(lost)} of {RUNS} runs lost output: {lost[:5]}"
