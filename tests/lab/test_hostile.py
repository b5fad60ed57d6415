"""Hostile values on the lab: a value refused at load never reaches a host, a legal value that
looks hostile deploys inert, and ``down --purge`` removes only what the tool installed.

One shared set-up (module fixture): the hosts, held exclusively, purged of our replicas (the
session's ``replicas`` broker purges them unless it knows them purged), then ONE real ``up``
whose served model name is ``$(touch MARKER)``; the refused cases run ``up`` before it and
``down`` after it, and the module ends with ``down --purge`` (the broker is told so). Hosts are
read over the lab's SSH with pytest-testinfra, as an operator would look.

Cost: about 128 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_support import provision

pytestmark = pytest.mark.lab

MARKER = "/tmp/vp-hostile-marker"
INERT_NAME = f"$(touch {MARKER})`touch {MARKER}`"
# One value per class that the loader refuses (tests/data/inventories/hostile has them all).
REFUSED = [
    ("group name", {"group_name": f"lab\nExecStartPre=+/bin/touch {MARKER}"}),
    ("host name", {"host_name": f"h1\nLD_PRELOAD=/x;touch {MARKER}"}),
    ("unit name", {"vllm_unit_name": f"x;touch {MARKER}.service"}),
    ("path", {"vllm_venv": f"/opt/vllm;touch {MARKER}"}),
    ("owned dir", {"vllm_tmp_dir": "/tmp"}),
    ("address zone id", {"vllm_api_host": f"fe80::1%$(touch {MARKER})"}),
    ("interface", {"vllm_cluster_interface": f"eth0;touch {MARKER}"}),
    ("engine argument", {"vllm_model": f"--x=$(touch {MARKER})"}),
    ("env name", {"vllm_env": {f"A;touch {MARKER}": "1"}}),
    ("template", {"vllm_served_model_name":
                  "{{ lipsum.__globals__['os'].popen('touch " + MARKER + "').read() }}"}),
]
PLANTED = ["/etc/systemd/system/planted-not-ours.service", "/etc/vllm-provision-planted",
           "/root/planted", "/usr/local/lib/planted"]


def _variant(lab: Any, tmp: Path, change: dict[str, Any]) -> Path:
    data = yaml.safe_load(Path(lab.inventory_path("mp")).read_text())
    replicas = data["all"]["children"]["vllm_replicas"]["children"]
    group = replicas["lab"]
    for key, value in change.items():
        if key == "group_name":
            replicas.clear()
            replicas[value] = group
        elif key == "host_name":
            group["hosts"] = {value: group["hosts"]["h1"], "h2": group["hosts"]["h2"]}
        else:
            group["vars"][key] = value
    path = tmp / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def _no_marker(lab_host: Any) -> None:
    assert not Path(MARKER).exists(), "a value ran on the controller"
    for name in ("h1", "h2"):
        assert not lab_host(name).file(MARKER).exists, f"a value ran on {name}"


@pytest.fixture(scope="module")
def deployed(lab: Any, replicas: Any, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Path]:
    """The lab's mp replica purged, then deployed once with the hostile-looking served name."""
    subprocess.run(["rm", "-f", MARKER], check=True)
    with replicas.exclusive("mp", start="purged") as lease:
        for host in ("h1", "h2"):
            lab.ssh(host, f"rm -f {MARKER}")
        inventory = _variant(lab, tmp_path_factory.mktemp("inert"),
                             {"vllm_served_model_name": INERT_NAME})
        yield inventory
        purged = provision("down", "-i", str(inventory), "--purge")
        lease.leave("purged" if purged.returncode == 0 else "unknown")


@pytest.mark.parametrize(("what", "change"), REFUSED, ids=[w for w, _ in REFUSED])
def test_a_refused_value_never_reaches_a_host(what: str, change: dict[str, Any], lab: Any,
                                              lab_host: Any, deployed: Path,
                                              tmp_path: Path) -> None:
    run = provision("up", "-i", str(_variant(lab, tmp_path, change)), timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "fix:" in run.stdout + run.stderr
    _no_marker(lab_host)


def test_a_hostile_looking_served_name_deploys_inert(deployed: Path, lab_host: Any) -> None:
    run = provision("up", "-i", str(deployed))
    assert run.returncode == 0, run.stdout + run.stderr
    unit = lab_host("h1").file("/etc/systemd/system/vllm.service").content_string
    # systemd escapes '$' as '$$'; the name is one quoted word of ExecStart
    assert INERT_NAME.replace("$", "$$") in unit
    # the running process got it as one argv word, right after its option
    pid = lab_host("h1").check_output("systemctl show -p MainPID --value vllm.service")
    argv = lab_host("h1").check_output(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
    assert argv[argv.index("--served-model-name") + 1] == INERT_NAME
    _no_marker(lab_host)


def test_purge_removes_only_what_the_tool_installed(deployed: Path, lab: Any,
                                                    lab_host: Any) -> None:
    for host in ("h1", "h2"):
        lab.ssh(host, "touch " + " ".join(PLANTED))
    escape = provision("down", "-i", str(deployed), "--purge", "-e",
                       "vllm_unit_name=../../../root.service", timeout=60)
    assert escape.returncode == 1 and "vllm_unit_name has an invalid value" in escape.stdout + \
        escape.stderr
    run = provision("down", "-i", str(deployed), "--purge")
    assert run.returncode == 0, run.stdout + run.stderr
    for host in ("h1", "h2"):
        machine = lab_host(host)
        assert not machine.file("/etc/systemd/system/vllm.service").exists
        assert not machine.file("/etc/vllm-provision").exists
        for path in PLANTED:
            assert machine.file(path).exists, f"{host}: purge removed {path}"
        assert machine.file("/root").is_directory and machine.file("/etc/passwd").exists
        lab.ssh(host, "rm -f " + " ".join(PLANTED))
    _no_marker(lab_host)
