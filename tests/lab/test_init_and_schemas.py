"""`provision init` against the two lab hosts writes an inventory with which `up` serves at once,
with no edit; then every lab-level command's --json (up, status, check, facts, drift, down,
lab status) validates against its schema (vllm_provision/schemas/; the plan of `up --check` is
checked in tests/unit/test_json_schemas.py). One `up` of the module's own inventory, shared by
the module, on hosts the ``replicas`` broker hands over with no replica serving; the replica is
taken down at the end and the broker told so.

Cost: about 67 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_support import complete, provision

from vllm_provision.cli import json_schemas

pytestmark = pytest.mark.lab


def run_json(schema: str, *args: str, state_home: Path,
             codes: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Run `provision ARGS --json`, check its exit code and that stdout is one JSON object valid
    under ``schema``; return the object."""
    result = provision(*args, "--json", state_home=state_home, timeout=300)
    assert result.returncode in codes, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads(result.stdout)
    json_schemas.validate(schema, document)
    return dict(document)


@pytest.fixture(scope="module")
def initialised(lab: Any, replicas: Any, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    """The inventory `provision init` wrote for h1, h2 (by address, as an operator would give
    them), and the --json of the `up` run with it unchanged."""
    with replicas.exclusive("mp", start="stopped") as lease:
        yield from _initialised(lab, tmp_path_factory.mktemp("init"))
        lease.leave("down")


def _initialised(lab: Any, folder: Path) -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    state_home = folder / "state"
    inventory = folder / "inventory.yml"
    addresses = [h.address for h in lab.hosts if h.name in ("h1", "h2")]
    init = provision("init", "--hosts", ",".join(addresses), "--model", "/srv/models/lab-model",
                     "--user", "root", "--key", str(lab.key_file),
                     "--known-hosts", str(lab.known_hosts), "-o", str(inventory),
                     state_home=state_home, timeout=120)
    assert init.returncode == 0, init.stdout + init.stderr
    up = run_json("up", "up", "-i", str(inventory), state_home=state_home)
    try:
        yield inventory, state_home, up
    finally:
        run_json("down", "down", "-i", str(inventory), state_home=state_home)


def test_init_finds_the_lab_layout_and_up_serves_with_it_unedited(
        lab: Any, initialised: tuple[Path, Path, dict[str, Any]]) -> None:
    inventory, _state, up = initialised
    replica = yaml.safe_load(inventory.read_text())["all"]["children"]["vllm_replicas"][
        "children"]["llm"]
    assert {k: replica["vars"][k] for k in ("vllm_tensor_parallel_size",
                                            "vllm_pipeline_parallel_size",
                                            "vllm_cluster_interface", "vllm_venv")} == {
        "vllm_tensor_parallel_size": 4, "vllm_pipeline_parallel_size": 2,
        "vllm_cluster_interface": "eth0", "vllm_venv": "/opt/vllm"}
    assert [(name, host["vllm_node_rank"]) for name, host in replica["hosts"].items()] == [
        ("h1", 0), ("h2", 1)]
    assert "# " in inventory.read_text()
    (result,) = up["replicas"]
    assert (result["name"], result["served"], up["failed"], up["unreachable"]) == (
        "llm", True, 0, 0)
    rank0 = next(h.address for h in lab.hosts if h.name == "h1")
    assert complete(f"http://{rank0}:8000", up["served_model"])


def test_every_lab_level_json_validates(lab: Any,
                                        initialised: tuple[Path, Path, dict[str, Any]]) -> None:
    inventory, state_home, _up = initialised
    where = ("-i", str(inventory))
    status = run_json("status", "status", *where, state_home=state_home)
    assert status["replicas"][0]["verdict"] == "serving"
    check = run_json("check", "check", *where, state_home=state_home)
    assert check["ok"] is True and check["counts"]["error"] == 0
    facts = run_json("facts", "facts", *where, state_home=state_home)
    assert sorted(facts["hosts"]) == ["h1", "h2"] and facts["errors"] == {}
    drift = run_json("drift", "drift", *where, state_home=state_home)
    assert (drift["drift"], drift["exit_code"]) == (False, 0)
    listed = run_json("lab-status", "lab", "status", state_home=state_home)
    assert {h["name"] for h in listed["hosts"]} >= {"h1", "h2"}
