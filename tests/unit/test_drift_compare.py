"""Unit tests of the pure drift comparison and the state record (no host, no lab)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from vllm_provision import state
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import EngineArgs, Host, Inventory, Node, Replica
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.facts.model import Gpu, HostFacts, ModelFile
from vllm_provision.runner import managed
from vllm_provision.state import drift


def _facts(name: str, nccl: str = "2.28.9", gpus: int = 4, model_size: int = 10) -> HostFacts:
    return HostFacts(
        host=name, python_micro="3.11.2",
        packages={"vllm": "0.11.0", "torch": "2.9.0+cu130", "ray": "2.50.0",
                  "transformers": "4.57.0", "nvidia-nccl-cu13": nccl},
        torch_cuda="cu130", driver_version="580.95.05", cuda_driver_version="13.0",
        gpus=tuple(Gpu(i, "NVIDIA H100 80GB HBM3", 81559, f"GPU-{name}-{i}") for i in range(gpus)),
        model_path="/srv/models/m",
        model_files=(ModelFile("config.json", 100), ModelFile("model.safetensors", model_size)),
    )


def _inventory(max_model_len: int | None = None, hosts: tuple[str, ...] = ("h1", "h2"),
               api_key: str | None = "s3cret-key") -> Inventory:
    host_objs = {n: Host(n, f"10.0.0.{i + 11}") for i, n in enumerate(hosts)}
    nodes = tuple(Node(host_objs[n], i, host_objs[n].address) for i, n in enumerate(hosts))
    engine = EngineArgs(model="/srv/models/m", tensor_parallel_size=4,
                        pipeline_parallel_size=len(hosts), max_model_len=max_model_len,
                        api_key=api_key)
    return Inventory(Path("/tmp/inv/lab.yml"), host_objs, {},
                     (Replica("llama", "mp", nodes, engine),))


def _record(**kwargs: object) -> dict:
    facts = {"h1": _facts("h1"), "h2": _facts("h2")}
    files = {"h1": {"/etc/systemd/system/vllm.service": "a" * 64}}
    return state.build_record(_inventory(**kwargs), facts, files,  # type: ignore[arg-type]
                              now=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))


def test_record_holds_parity_facts_engine_and_file_hashes_but_no_secret() -> None:
    record = _record()
    text = json.dumps(record)
    assert "s3cret-key" not in text
    assert record["time"] == "2025-01-02T03:04:05Z"
    assert record["replicas"]["llama"]["engine"]["api_key_set"] is True
    assert record["replicas"]["llama"]["nodes"] == ["h1", "h2"]
    h2 = record["hosts"]["h2"]
    assert (h2["rank"], h2["facts"]["NCCL"], h2["facts"]["GPU count"]) == (1, "2.28.9", "4")
    assert h2["facts"]["GPU model"] == "NVIDIA H100 80GB HBM3"
    assert record["hosts"]["h1"]["files"] == {"/etc/systemd/system/vllm.service": "a" * 64}
    assert state.parse_record(text, "x") == record


def test_same_facts_and_inventory_mean_no_drift() -> None:
    record = _record()
    changes = (drift.compare_facts(record, {"h1": _facts("h1"), "h2": _facts("h2")})
               + drift.compare_layout(record, _inventory()))
    assert changes == []
    assert drift.exit_code(changes, {}) == drift.EXIT_NO_DRIFT


def test_changed_nccl_names_host_item_and_both_values() -> None:
    changes = drift.compare_facts(_record(), {"h1": _facts("h1"), "h2": _facts("h2", "2.27.3")})
    assert changes == [drift.Change("h2", "NCCL", "2.28.9", "2.27.3", "facts")]
    assert changes[0].line() == "~ h2  NCCL  2.28.9 -> 2.27.3"
    assert drift.exit_code(changes, {}) == drift.EXIT_DRIFT


def test_gpu_count_and_model_manifest_changes_are_facts_drift() -> None:
    changes = drift.compare_facts(_record(), {"h1": _facts("h1", gpus=3, model_size=11)})
    items = {c.item: c for c in changes}
    assert set(items) == {"GPU count", "model manifest"}
    assert (items["GPU count"].recorded, items["GPU count"].current) == ("4", "3")
    assert len(items["model manifest"].recorded or "") == 12  # digests are shortened
    assert items["model manifest"].recorded != items["model manifest"].current


def test_engine_argument_and_added_node_are_config_drift() -> None:
    record = _record()
    changes = drift.compare_layout(record, _inventory(max_model_len=4096,
                                                      hosts=("h1", "h2", "h3")))
    by_item = {(c.host, c.item): c for c in changes}
    assert by_item[("h3", "node")].recorded is None
    assert by_item[("h3", "node")].current == "llama rank 2"
    assert by_item[("h3", "node")].line() == "+ h3  node  llama rank 2"
    engine = by_item[("*", "engine max_model_len (llama)")]
    assert (engine.recorded, engine.current, engine.kind) == ("None", "4096", "config")
    assert ("*", "engine pipeline_parallel_size (llama)") in by_item


def test_a_changed_replica_id_is_config_drift_and_an_older_record_has_none() -> None:
    record = _record()
    same = [c for c in drift.compare_layout(record, _inventory()) if c.item.startswith("replica")]
    assert same == []
    moved = _inventory(hosts=("h1", "h3"))
    [change] = [c for c in drift.compare_layout(record, moved) if c.item == "replica id (llama)"]
    assert (change.recorded, change.current, change.kind) == (
        _inventory().replicas[0].replica_id, moved.replicas[0].replica_id, "config")
    del record["replicas"]["llama"]["replica_id"]
    assert not [c for c in drift.compare_layout(record, moved) if c.item.startswith("replica")]


def test_removed_node_and_limit() -> None:
    changes = drift.compare_layout(_record(), _inventory(hosts=("h1",)))
    assert [c.line() for c in changes if c.item == "node"] == ["- h2  node  llama rank 1"]
    assert [c for c in drift.compare_layout(_record(), _inventory(hosts=("h1",)), ["h1"])
            if c.item == "node"] == []


def test_check_mode_results_become_file_changes_with_the_recorded_hash() -> None:
    results = [
        TaskResult("h1", "Install the vLLM unit", Status.CHANGED, "would change: content",
                   data={"dest": "/etc/systemd/system/vllm.service"}),
        TaskResult("h1", "Install the env file", Status.CHANGED, "(output hidden: no_log)"),
        TaskResult("h1", "Reload systemd if a unit file changed", Status.CHANGED, "reload"),
        TaskResult("h2", "Install the vLLM unit", Status.OK, ""),
    ]
    files = {"h1": {"Install the env file": "/etc/vllm-provision/vllm.env"}}
    changes = drift.config_changes(results, _record(), files,
                                   ["Reload systemd if a unit file changed"])
    assert [(c.host, c.item, c.recorded, c.current) for c in changes] == [
        ("h1", "/etc/systemd/system/vllm.service", "sha256 " + "a" * 12,
         "would change: content"),
        ("h1", "/etc/vllm-provision/vllm.env", "-", "would change"),
    ]
    assert changes[0].line() == \
        "~ h1  /etc/systemd/system/vllm.service  (would change: content)"


def test_errors_win_over_drift_in_the_exit_code() -> None:
    change = drift.Change("h1", "NCCL", "1", "2", "facts")
    assert drift.exit_code([change], {"h2": "unreachable"}) == drift.EXIT_ERROR
    assert drift.exit_code([], {"h2": "unreachable"}) == drift.EXIT_ERROR


def test_summary_line_counts_kinds_and_names_hosts() -> None:
    changes = [drift.Change("h2", "NCCL", "1", "2", "facts"),
               drift.Change("*", "engine x (llama)", "1", "2", "config")]
    line = drift.summary_line(changes, ["h1", "h2"], "T")
    assert "2 change(s) on the replica, h2" in line
    assert "1 in facts, 1 in configuration" in line
    assert drift.summary_line([], ["h1", "h2"], "T").startswith("No drift: h1, h2")


def test_controller_record_round_trip_is_private_and_per_inventory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    first, second = tmp_path / "a" / "lab.yml", tmp_path / "b" / "lab.yml"
    assert state.read_controller_record(first) is None
    path = state.write_controller_record(first, _record())
    assert path.parent == tmp_path / "vllm-provision"
    assert path.stat().st_mode & 0o777 == 0o600
    assert state.read_controller_record(first) == _record()
    assert state.controller_state_path(second) != path
    assert state.read_controller_record(second) is None


def test_a_damaged_record_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match="not JSON"):
        state.parse_record("{", "x")
    with pytest.raises(ProvisionError, match="schema"):
        state.parse_record('{"schema": 99, "hosts": {}}', "x")


def test_sha256sum_output_is_parsed() -> None:
    out = f"{'b' * 64}  /etc/a b.service\n{'c' * 64} */etc/x\nnoise\n"
    assert state.parse_hashes(out) == {"/etc/a b.service": "b" * 64, "/etc/x": "c" * 64}
    assert "'/etc/a b.service'" in state.hash_files_script(["/etc/a b.service"])


def test_install_plays_are_the_template_plays_of_up() -> None:
    from vllm_provision.runner.playbook import load_playbook

    plays = load_playbook(Path(__file__).resolve().parents[2] / "playbooks" / "up.yml")
    chosen = managed.install_plays(plays)
    assert chosen, "up.yml has install plays"
    assert all(any(t.module == "template" for t in p.tasks) for p in chosen)
    assert not any(t.module in ("vllm_preflight", "vllm_verify", "wait_for")
                   for p in chosen for t in p.tasks)


def test_managed_files_name_the_unit_and_env_file_of_every_mp_node() -> None:
    from vllm_provision.inventory import load_inventory
    from vllm_provision.runner.playbook import load_playbook

    root = Path(__file__).resolve().parents[2]
    inventory = load_inventory(root / "inventory" / "lab-mp.yml")
    plays = managed.install_plays(load_playbook(root / "playbooks" / "up.yml"))
    files = managed.managed_files(inventory, plays)
    for node in inventory.replicas[0].nodes:
        paths = set(files[node.name].values())
        assert "/etc/systemd/system/vllm.service" in paths
        assert "/etc/vllm-provision/vllm.env" in paths
        # the watchdog's program and the rules it imports, beside it: recorded, compared by
        # `provision drift` and removed by `down --purge` like every other installed file
        assert {"/usr/local/lib/vllm-provision/vllm_watchdog.py",
                "/usr/local/lib/vllm-provision/vllm_watchdog_rules.py"} <= paths


class _Writes:
    """A host connection that records what it was asked to write."""

    def __init__(self, name: str) -> None:
        self.name, self.written = name, []

    def run(self, command: str, stdin: str | None = None, **_: object) -> object:
        self.written.append(json.loads(stdin or "null"))
        return type("R", (), {"ok": True, "stdout": "", "stderr": "", "exit_code": 0})()


def test_an_equal_record_is_not_written_again_but_a_changed_one_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A no-change up writes no record: a copy equal but for time and controller is left (its
    time is when the content last changed); a host whose copy differs, is missing or cannot be
    read is written, and so is the controller's when it differs."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    inventory = _inventory()
    old = _record()
    later = {**old, "time": "2025-02-02T00:00:00Z", "controller": "another-laptop"}
    assert state.same_record(json.dumps({**old, "host": "h1"}), {**later, "host": "h1"})
    assert not state.same_record(json.dumps({**old, "host": "h1"}), {**later, "host": "h2"})
    assert not state.same_record("{", later) and not state.same_record(None, later)
    path = state.write_controller_record(inventory.path, old)
    stamp = path.stat().st_mtime_ns
    conns = {"h1": _Writes("h1"), "h2": _Writes("h2")}
    found = {"h1": json.dumps({**old, "host": "h1"}), "h2": None}
    state.save_record(inventory, later, conns, found=found,  # type: ignore[arg-type]
                      previous=old)
    assert conns["h1"].written == [] and conns["h2"].written == [{**later, "host": "h2"}]
    assert path.stat().st_mtime_ns == stamp and state.read_controller_record(
        inventory.path) == old
    changed = _record(max_model_len=4096)
    state.save_record(inventory, changed, conns, found=found,  # type: ignore[arg-type]
                      previous=old)
    assert conns["h1"].written == [{**changed, "host": "h1"}]
    assert state.read_controller_record(inventory.path) == changed
    # without what the run read (no run lock), every copy is written
    state.save_record(inventory, changed, conns)  # type: ignore[arg-type]
    assert len(conns["h1"].written) == 2
