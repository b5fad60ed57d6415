"""Replica ids (``vllm_replica_id`` or derived from the replica's content) and the ownership
decisions that compare them, with records written before ids existed (docs/deploy.md, "Who
owns a host"). No hosts: inventories from YAML text, records as dicts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_runner_support import RecordHost

from vllm_provision import state
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.ownership import check_ownership, conflict, same_owner
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.facts.gather import parse_owner
from vllm_provision.facts.model import HostOwner, UnitStart
from vllm_provision.inventory import load_inventory
from vllm_provision.operations import takeover

RUNNING = {"vllm.service": UnitStart("vllm.service", "inv-1", {}, "active", "inv-1")}


def inventory_data(replicas: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One replica ``llm`` on gpu1 (rank 0) and gpu2 (rank 1), or ``replicas`` as given
    (name -> ``{"vars": ..., "hosts": ...}``)."""
    if replicas is None:
        replicas = {"llm": {"vars": {"vllm_backend": "mp", "vllm_model": "/srv/models/llama"},
                            "hosts": {"gpu1": {"ansible_host": "10.0.0.11", "vllm_node_rank": 0},
                                      "gpu2": {"ansible_host": "10.0.0.12",
                                               "vllm_node_rank": 1}}}}
    return {"all": {"children": {"vllm_replicas": {"children": replicas}}}}


def load(folder: Path, data: dict[str, Any], name: str = "inventory.yml") -> Inventory:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_inventory(path)


def replica_of(folder: Path, data: dict[str, Any]) -> Replica:
    return load(folder, data).replicas[0]


def edited(*changes: Any) -> dict[str, Any]:
    """The inventory data with each of ``changes`` applied, in order, to the group ``llm``."""
    data = inventory_data()
    for change in changes:
        change(data["all"]["children"]["vllm_replicas"]["children"]["llm"])
    return data


# -- the id ----------------------------------------------------------------------------------

def test_the_derived_id_is_the_same_at_any_path_and_in_any_file_name(tmp_path: Path) -> None:
    first = load(tmp_path / "alice" / "repo", inventory_data())
    second = load(tmp_path / "ci" / "checkout", inventory_data(), "prod.yml")
    assert first.path != second.path
    assert first.replicas[0].replica_id == second.replicas[0].replica_id
    assert first.replicas[0].replica_id.startswith("llm@")
    assert first.replicas[0].declared_id is None


def _declare_id(group: dict[str, Any]) -> None:
    group["vars"]["vllm_replica_id"] = "llm-prod"


def _set_model(group: dict[str, Any]) -> None:
    group["vars"]["vllm_model"] = "/srv/models/other"


def _readdress(group: dict[str, Any]) -> None:
    group["hosts"]["gpu2"]["ansible_host"] = "10.0.0.13"


def _swap_ranks(group: dict[str, Any]) -> None:
    group["hosts"]["gpu1"]["vllm_node_rank"], group["hosts"]["gpu2"]["vllm_node_rank"] = 1, 0


def _rename_host(group: dict[str, Any]) -> None:
    group["hosts"]["gpu3"] = group["hosts"].pop("gpu2")


def _add_host(group: dict[str, Any]) -> None:
    group["hosts"]["gpu3"] = {"ansible_host": "10.0.0.13", "vllm_node_rank": 2}


def _cluster_ip(group: dict[str, Any]) -> None:
    group["hosts"]["gpu2"]["vllm_host_ip"] = "192.168.0.12"


@pytest.mark.parametrize("change", [_set_model, _readdress, _swap_ranks, _rename_host, _add_host,
                                    _cluster_ip])
def test_the_derived_id_changes_with_the_hosts_and_the_model(tmp_path: Path, change: Any) -> None:
    before = replica_of(tmp_path / "a", inventory_data()).replica_id
    assert replica_of(tmp_path / "b", edited(change)).replica_id != before


def _backend(group: dict[str, Any]) -> None:
    group["vars"]["vllm_backend"] = "ray"


def _port_and_tp(group: dict[str, Any]) -> None:
    group["vars"].update(vllm_api_port=8001, vllm_tensor_parallel_size=2,
                         vllm_api_key="a-secret-of-16-chars")


def _ssh_address_with_cluster_ip(group: dict[str, Any]) -> None:
    # the cluster address is pinned, so only how this controller reaches gpu1 changes
    group["hosts"]["gpu1"]["vllm_host_ip"] = "10.0.0.11"
    group["hosts"]["gpu1"]["ansible_host"] = "gpu1.bastion.example"


@pytest.mark.parametrize("change", [_backend, _port_and_tp, _ssh_address_with_cluster_ip])
def test_the_derived_id_ignores_backend_ports_engine_secrets_and_ssh_address(
        tmp_path: Path, change: Any) -> None:
    before = replica_of(tmp_path / "a", inventory_data()).replica_id
    assert replica_of(tmp_path / "b", edited(change)).replica_id == before


def test_one_address_written_two_ways_is_one_id(tmp_path: Path) -> None:
    def mapped(group: dict[str, Any]) -> None:
        group["hosts"]["gpu2"]["vllm_host_ip"] = "::ffff:10.0.0.12"

    before = replica_of(tmp_path / "a", inventory_data()).replica_id
    assert replica_of(tmp_path / "b", edited(mapped)).replica_id == before


def test_a_declared_id_wins_and_survives_changes_of_hosts_and_model(tmp_path: Path) -> None:
    declared = replica_of(tmp_path / "a", edited(_declare_id))
    assert (declared.declared_id, declared.replica_id) == ("llm-prod", "llm-prod")
    moved = edited(_declare_id, _set_model, _add_host)
    assert replica_of(tmp_path / "b", moved).replica_id == "llm-prod"


@pytest.mark.parametrize("bad", ["", "-llm", "llm prod", "llm@1", "x" * 64, "llm\x1b[31m",
                                 "{{ name }}", 7])
def test_a_bad_declared_id_is_a_clear_error(tmp_path: Path, bad: Any) -> None:
    def declare(group: dict[str, Any]) -> None:
        group["vars"]["vllm_replica_id"] = bad

    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, edited(declare))
    text = raised.value.render()
    assert "vllm_replica_id" in text and "inventory.yml" in text
    assert "Traceback" not in text


def test_the_kind_names_what_a_replica_id_may_hold() -> None:
    from vllm_provision.settings import kinds

    assert kinds.check_replica_id("llm-prod.v2_a") is None
    assert "1-63 characters" in (kinds.check_replica_id("llm@x") or "")


def test_two_replicas_declaring_one_id_is_an_error_naming_both(tmp_path: Path) -> None:
    def replica(host: str, address: str) -> dict[str, Any]:
        return {"vars": {"vllm_backend": "mp", "vllm_model": "/srv/m",
                         "vllm_replica_id": "shared"},
                "hosts": {host: {"ansible_host": address}}}

    data = inventory_data({"one": replica("gpu1", "10.0.0.11"),
                           "two": replica("gpu2", "10.0.0.12")})
    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, data)
    text = raised.value.render()
    assert "replicas 'one' and 'two' both declare vllm_replica_id 'shared'" in text
    assert "vllm_replicas.children.two.vars.vllm_replica_id" in text
    # distinct ids, or one declared and one derived, load
    data["all"]["children"]["vllm_replicas"]["children"]["two"]["vars"].pop("vllm_replica_id")
    ids = [r.replica_id for r in load(tmp_path, data).replicas]
    assert ids[0] == "shared" and ids[1].startswith("two@")


def test_a_declared_id_must_be_the_same_on_every_node(tmp_path: Path) -> None:
    def per_host(group: dict[str, Any]) -> None:
        group["hosts"]["gpu1"]["vllm_replica_id"] = "a"
        group["hosts"]["gpu2"]["vllm_replica_id"] = "b"

    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, edited(per_host))
    assert "vllm_replica_id differs between nodes" in raised.value.render()


# -- the records -----------------------------------------------------------------------------

def record_of(inventory: Inventory, controller: str = "ctl1") -> dict[str, Any]:
    """What a good ``up`` of ``inventory`` writes (a JSON round trip, as a host reads it)."""
    return json.loads(json.dumps(state.build_record(inventory, {}, {}, controller=controller)))


def host_copy(record: dict[str, Any], host: str) -> dict[str, Any]:
    started = {"vllm.service": {"invocation": "inv-1", "files": {}}}
    hosts = {name: {**entry, "started_from": started} for name, entry in record["hosts"].items()}
    return {**record, "hosts": hosts, "host": host}


def owner_from(record: dict[str, Any], host: str = "gpu1") -> HostOwner:
    found = parse_owner(host, {"record": host_copy(record, host), "invocations": {
        "vllm.service": {"active": "active", "invocation": "inv-1"}}}, [])
    assert found is not None
    return found


def test_the_record_holds_the_id_and_who_wrote_it(tmp_path: Path) -> None:
    inventory = load(tmp_path, inventory_data())
    record = record_of(inventory)
    replica = inventory.replicas[0]
    assert record["replicas"]["llm"]["replica_id"] == replica.replica_id
    assert record["controller"] == "ctl1" and record["inventory"] == str(inventory.path)
    owner = owner_from(record)
    assert (owner.replica_id, owner.controller, owner.nodes, owner.model) == (
        replica.replica_id, "ctl1", ("gpu1", "gpu2"), "/srv/models/llama")
    assert state.build_record(inventory, {}, {})["controller"] == state.controller_name()


def test_the_same_repository_at_another_path_is_the_same_owner(tmp_path: Path) -> None:
    alice = load(tmp_path / "alice", inventory_data())
    ci = load(tmp_path / "ci", inventory_data())
    owner = owner_from(record_of(alice))
    identity = state.inventory_identity(ci.path)
    assert conflict(ci.replicas[0], "gpu1", owner, identity) is None
    [finding] = check_ownership(ci.replicas[0], {"gpu1": owner}, identity)[:1]
    assert finding.severity is Severity.OK


def test_another_inventory_at_the_same_path_is_another_owner(tmp_path: Path) -> None:
    # two controllers, one path: the first deployed llm on gpu1/gpu2, the second's file at
    # the same path names another model on the same hosts
    first = load(tmp_path / "ctl1", inventory_data())
    owner = owner_from(record_of(first, controller="ctl1"))
    second = load(tmp_path / "ctl1", edited(_set_model))
    assert second.path == first.path
    found = conflict(second.replicas[0], "gpu1", owner, state.inventory_identity(second.path))
    assert found is not None
    line = found.describe()
    assert line.startswith(f"gpu1 belongs to replica 'llm' (id {first.replicas[0].replica_id}) "
                           f"of {first.path} on ctl1, not to replica 'llm' "
                           f"(id {second.replicas[0].replica_id}) of {second.path}")


def test_a_declared_id_owns_what_it_deployed_under_another_model(tmp_path: Path) -> None:
    owner = owner_from(record_of(load(tmp_path / "a", edited(_declare_id))))
    later = load(tmp_path / "b", edited(_declare_id, _set_model))
    assert same_owner(later.replicas[0], owner, state.inventory_identity(later.path))
    # an inventory that declares nothing is not the declared owner, even with equal content
    plain = load(tmp_path / "c", edited(lambda group: None))
    assert not same_owner(plain.replicas[0], owner, state.inventory_identity(plain.path))


# -- records written before replica ids ------------------------------------------------------

def old_record(inventory: Inventory) -> dict[str, Any]:
    """A record as the previous version wrote it: no ``replica_id``, no ``controller``."""
    record = record_of(inventory)
    record.pop("controller")
    for entry in record["replicas"].values():
        entry.pop("replica_id")
    return record


def test_an_old_record_of_this_path_is_this_replica_and_others_are_not(tmp_path: Path) -> None:
    inventory = load(tmp_path / "here", inventory_data())
    replica, identity = inventory.replicas[0], state.inventory_identity(inventory.path)
    owner = owner_from(old_record(inventory))
    assert owner.replica_id == "" and owner.controller == ""
    assert conflict(replica, "gpu1", owner, identity) is None
    # the same content at another path: the old record cannot tell, so it is another owner
    moved = load(tmp_path / "moved", inventory_data())
    found = conflict(moved.replicas[0], "gpu1", owner, state.inventory_identity(moved.path))
    assert found is not None
    assert "(no replica id: an older record)" in found.describe()
    assert "--take-over" in takeover.take_over_fix(found)
    # the same path, but the file now names another model: what the old record holds differs
    changed = load(tmp_path / "here", edited(_set_model))
    assert conflict(changed.replicas[0], "gpu1", owner, identity) is not None


def test_an_old_record_of_this_path_passes_a_declared_id_whatever_the_model(
        tmp_path: Path) -> None:
    inventory = load(tmp_path, inventory_data())
    owner = owner_from(old_record(inventory))
    declared = load(tmp_path, edited(_declare_id, _set_model))
    assert conflict(declared.replicas[0], "gpu1", owner,
                    state.inventory_identity(declared.path)) is None


def _guard(inventory: Inventory, record: dict[str, Any]) -> list[Any]:
    hosts = {name: RecordHost(host_copy(record, name)) for name in ("gpu1", "gpu2")}
    return takeover.guard(inventory, list(hosts), {}, hosts, command="up", take_over=False,
                          check_mode=False, echo=lambda line: None)


def test_the_guard_migrates_an_old_record_and_then_follows_the_id(tmp_path: Path) -> None:
    here = load(tmp_path / "here", inventory_data())
    assert _guard(here, old_record(here)) == []
    # the next good up rewrites the record with the id: another checkout is then the same owner
    elsewhere = load(tmp_path / "elsewhere", inventory_data())
    assert _guard(elsewhere, record_of(here)) == []
    with pytest.raises(ProvisionError) as raised:
        _guard(elsewhere, old_record(here))
    text = raised.value.render()
    assert "`provision up` refused: gpu1 belongs to replica 'llm' (no replica id" in text
    assert "nothing was changed" in text


def test_the_guard_refusal_names_both_owners_and_the_ways_out(tmp_path: Path) -> None:
    first = load(tmp_path / "a", inventory_data())
    other = load(tmp_path / "b", edited(_add_host))
    hosts = {name: RecordHost(host_copy(record_of(first, "ctl1"), name))
             for name in ("gpu1", "gpu2")}
    with pytest.raises(ProvisionError) as raised:
        takeover.guard(other, ["gpu1", "gpu2"], {}, hosts, command="up", take_over=False,
                       check_mode=False, echo=lambda line: None)
    [problem, _] = raised.value.problems
    assert f"(id {first.replicas[0].replica_id}) of {first.path} on ctl1" in problem.message
    assert f"not to replica 'llm' (id {other.replicas[0].replica_id}) of {other.path}" \
        in problem.message
    assert "--take-over" in (problem.fix or "") and "vllm_replica_id" in (problem.fix or "")
    assert f"{first.path} on ctl1" in (problem.fix or "")
    assert not [c for h in hosts.values() for c in h.commands if "rm -f" in c]
    lines: list[str] = []
    [take, _] = takeover.guard(other, ["gpu1", "gpu2"], {}, hosts, command="up",
                               take_over=True, check_mode=True, echo=lines.append)
    assert take.to_json()["from_replica_id"] == first.replicas[0].replica_id
    assert take.to_json()["from_controller"] == "ctl1"


def test_serving_time_is_not_carried_from_another_replica_id() -> None:
    begun = datetime(2025, 1, 1, tzinfo=UTC)
    previous = {"replicas": {"llm": {"replica_id": "llm@aaaa", "start_to_serving_s": 7.0,
                                     "deployed_at": "2025-01-01T00:00:00Z"}}}
    kept = state.serving_record(previous, "llm", None, begun, replica_id="llm@aaaa")
    assert kept["start_to_serving_s"] == 7.0
    other = state.serving_record(previous, "llm", None, begun, replica_id="llm@bbbb")
    assert other == {"start_to_serving_s": None, "deployed_at": None, "start_key": None,
                     "last_start": None, "starts": {}}
    old = {"replicas": {"llm": {"start_to_serving_s": 7.0, "deployed_at": None}}}
    assert state.serving_record(old, "llm", None, begun, replica_id="llm@bbbb")[
        "start_to_serving_s"] == 7.0
