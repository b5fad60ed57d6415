"""`vllm_firewall: nftables` on the lab, for mp and for Ray (docs/security.md, "Network exposure").

The replica runs on h1 and h2; h3 is a lab host outside it (booted by the module when the lab
has only two). For each backend, one `up` with the firewall and `vllm_api_allow_from: [the
controller]` is shared by the checks: from h3 every inter-node port and the API time out
(dropped); from the peer h2 they all answer; from the controller, the allowed source, the API
answers. A second `up` changes nothing, and `down --purge` removes our table and
leaves a table of someone else's (made first) exactly as it was. Every port comes from the
inventory and the variables table, none is written here.

Cost: about 280 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lab_support
import pytest
import yaml

from vllm_provision.facts.gather import host_var
from vllm_provision.inventory import load_inventory
from vllm_provision.settings import firewall

pytestmark = pytest.mark.lab

OTHER_TABLE = "inet vp_test_other"
OURS = f"{firewall.FAMILY} {firewall.TABLE}"
# TCP connects to many ports at once from one host: {port: connected}; a dropped SYN is a
# timeout, a refused one an error, both False.
PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def connect(port):
    try:
        socket.create_connection((sys.argv[1], port), timeout=2).close()
        return True
    except OSError:
        return False
ports = [int(p) for p in sys.argv[2:]]
with ThreadPoolExecutor(len(ports)) as pool:
    print(json.dumps(dict(zip(map(str, ports), pool.map(connect, ports)))))
"""


def reachable(lab: Any, source: str, address: str, ports: list[int]) -> dict[int, bool]:
    """Which of ``ports`` on ``address`` accept a TCP connection from lab host ``source``."""
    done = lab.ssh(source, " ".join(shlex.quote(w) for w in
                                    ["python3", "-c", PROBE, address, *map(str, ports)]))
    assert done.returncode == 0, done.stderr
    return {int(k): v for k, v in json.loads(done.stdout).items()}


def nft(lab: Any, host: str, command: str) -> str:
    done = lab.ssh(host, f"nft {command}")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def third_host(lab: Any) -> Iterator[str]:
    """h3's address: a lab host in no replica (booted here when the lab has two hosts)."""
    added = [] if "h3" in {h.name for h in lab.hosts} else ["h3"]
    lab.add_hosts(added)
    try:
        yield next(h.address for h in lab.hosts if h.name == "h3")
    finally:
        lab.remove_hosts(added)


@pytest.fixture(scope="module")
def other_table(lab: Any) -> Iterator[dict[str, str]]:
    """A table that is not ours, on both nodes, with a base chain on the same hook and a rule:
    ``{host: its listing}`` to compare with after our table came and went."""
    listing = {}
    for host in ("h1", "h2"):
        lab.ssh(host, f"nft delete table {OTHER_TABLE} 2>/dev/null")
        nft(lab, host, f"add table {OTHER_TABLE}")
        nft(lab, host, f"'add chain {OTHER_TABLE} input {{ type filter hook input priority 10; "
                       "policy accept; }'")
        nft(lab, host, f"add rule {OTHER_TABLE} input tcp dport 4444 accept")
        listing[host] = nft(lab, host, f"list table {OTHER_TABLE}")
    yield listing
    for host in ("h1", "h2"):
        lab.ssh(host, f"nft delete table {OTHER_TABLE}")


def firewalled_inventory(lab: Any, kind: str, folder: Path) -> Path:
    """The lab's inventory of ``kind`` with the firewall on and the API open to the controller
    (besides the replica's nodes)."""
    data = yaml.safe_load(lab.inventory_path(kind).read_text())
    group = data["all"]["children"]["vllm_replicas"]["children"]["lab"]
    group["vars"] |= {"vllm_firewall": "nftables",
                      "vllm_api_allow_from": [lab.config.bridge_address]}
    path = folder / f"firewall-{kind}.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module", params=["mp", "ray"])
def deployed(request: pytest.FixtureRequest, lab: Any, third_host: str,
             other_table: dict[str, str], tmp_path_factory: pytest.TempPathFactory,
             ) -> Iterator[dict[str, Any]]:
    """One firewalled `up` per backend; the last test of each takes it down with --purge (the
    fixture does it only when that test did not get so far)."""
    folder = tmp_path_factory.mktemp(f"firewall-{request.param}")
    inventory = firewalled_inventory(lab, request.param, folder)
    [replica] = load_inventory(inventory).replicas
    up = lab_support.provision("up", "-i", str(inventory), state_home=folder)
    assert up.returncode == 0, up.stdout + up.stderr
    state = {"inventory": str(inventory), "replica": replica, "state_home": folder,
             "purged": False}
    try:
        yield state
    finally:
        if not state["purged"]:  # the last test failed before its own `down --purge`
            down = lab_support.provision("down", "--purge", "-i", str(inventory),
                                         state_home=folder)
            assert down.returncode == 0, down.stdout + down.stderr


def inter_node_ports(replica: Any) -> list[int]:
    """The master port (mp) or the GCS and client server port (Ray), and the watchdog port."""
    if replica.backend == "mp":
        return [replica.engine.master_port, firewall.watchdog_port(replica)]
    client = host_var(replica.master.host, "ray_client_server_port")
    return [int(host_var(replica.master.host, "ray_port")),
            int(client) if client is not None else 10001, firewall.watchdog_port(replica)]


def test_only_peers_reach_the_inter_node_ports_and_the_allowed_source_the_api(
        lab: Any, deployed: dict[str, Any]) -> None:
    replica = deployed["replica"]
    head = replica.master.host_ip
    ports = inter_node_ports(replica)
    api = replica.engine.api_port
    # a port nothing serves right now (the stand-in's Ray has no ray[client], so no client
    # server; mp's TCP store may be closed once the group formed) gets a listener of ours on
    # all addresses: the rule is what is under test
    listening = lab.ssh("h1", "ss -Hltn").stdout
    idle = [p for p in ports if f":{p} " not in listening]
    if idle:
        code = (f"import socket, time\nfor p in {idle!r}:\n    s = socket.socket(); "
                "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                "s.bind(('0.0.0.0', p)); s.listen(); globals()[str(p)] = s\ntime.sleep(600)")
        lab.ssh("h1", "systemctl reset-failed vp-fw-listener.service 2>/dev/null; "
                      "systemd-run --unit=vp-fw-listener python3 -c " + shlex.quote(code))
        lab.ssh("h1", f"for i in $(seq 100); do ss -Hltn 'sport = :{idle[-1]}' | grep -q . "
                      "&& break; sleep 0.1; done")
    try:
        from_third = reachable(lab, "h3", head, [*ports, api])
        from_peer = reachable(lab, "h2", head, [*ports, api])
    finally:
        if idle:
            lab.ssh("h1", "systemctl stop vp-fw-listener.service")
    assert from_third == {p: False for p in [*ports, api]}
    assert from_peer == {p: True for p in [*ports, api]}
    assert lab_support.complete(f"http://{head}:{api}", replica.engine.served_model_name
                                or replica.engine.model)
    # the table after a reboot: the unit of ours that loads it is enabled
    assert lab.ssh("h2", "systemctl is-enabled vllm-firewall.service").stdout.strip() == \
        "enabled"


def test_a_second_up_changes_nothing(lab: Any, deployed: dict[str, Any]) -> None:
    before = {h: nft(lab, h, f"list table {OURS}") for h in ("h1", "h2")}
    again = lab_support.provision("up", "-i", deployed["inventory"], "--json",
                                  state_home=deployed["state_home"])
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["changed"] == 0 and summary["failed"] == 0, summary
    assert {h: nft(lab, h, f"list table {OURS}") for h in ("h1", "h2")} == before


def test_down_purge_removes_our_table_only(lab: Any, deployed: dict[str, Any],
                                           other_table: dict[str, str]) -> None:
    down = lab_support.provision("down", "--purge", "-i", deployed["inventory"],
                                 state_home=deployed["state_home"])
    assert down.returncode == 0, down.stdout + down.stderr
    deployed["purged"] = True
    for host in ("h1", "h2"):
        tables = nft(lab, host, "list tables")
        assert f"table {OURS}\n" not in tables and f"table {OTHER_TABLE}\n" in tables
        assert nft(lab, host, f"list table {OTHER_TABLE}") == other_table[host]
        assert lab.ssh(host, "test -e /etc/systemd/system/vllm-firewall.service").returncode == 1
