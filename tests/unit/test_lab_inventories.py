"""The committed lab inventories are the generator's output for the default lab instance."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_provision_lab.config import LabConfig
from vllm_provision_lab.inventories import KINDS, inventory_text

from vllm_provision.inventory import load_inventory

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", KINDS)
def test_committed_inventory_equals_generated_for_default_instance(kind: str) -> None:
    committed = (REPO / "inventory" / f"lab-{kind}.yml").read_text()
    assert committed == inventory_text(LabConfig(), kind)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_generated_inventory_loads_as_two_node_replica_of_that_instance(
        kind: str, tmp_path: Path) -> None:
    config = LabConfig(state_dir=Path("/srv/lab-x"), name="x1", net="10.9.8")
    path = tmp_path / "inventory.yml"
    path.write_text(inventory_text(config, kind))  # type: ignore[arg-type]
    (replica,) = load_inventory(path).replicas
    assert replica.backend == kind
    assert [(n.host.name, n.rank, n.host.address) for n in replica.nodes] == [
        ("h1", 0, "10.9.8.11"), ("h2", 1, "10.9.8.12")]
    assert replica.engine.tensor_parallel_size == 4
    assert replica.engine.pipeline_parallel_size == 2
    host = replica.nodes[0].host
    assert host.key_file == Path("/srv/lab-x/id_ed25519")
    assert host.known_hosts_files == (Path("/srv/lab-x/known_hosts"),)
    assert host.user == "root"


def test_unknown_inventory_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="mp"):
        inventory_text(LabConfig(), "slurm")  # type: ignore[arg-type]
