"""The pure parts of a rolling upgrade (vllm_provision.operations.fleet): batches, the stop rule,
the
/metrics reading, the hook's argv, the recap and the capacity record; the hook runs without a
shell, and the schema accepts the recap's shape."""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_provision.core.errors import ProvisionError
from vllm_provision.operations import fleet


@given(st.lists(st.text(min_size=1, max_size=4), unique=True, max_size=20),
       st.integers(min_value=1, max_value=8))
def test_batches_keep_the_order_and_hold_at_most_n(names: list[str], size: int) -> None:
    groups = fleet.batches(names, size)
    assert [n for group in groups for n in group] == names
    assert all(1 <= len(group) <= size for group in groups)
    assert all(len(group) == size for group in groups[:-1])


def test_batches_of_8_replicas() -> None:
    names = [f"r{i}" for i in range(1, 9)]
    assert fleet.batches(names, 1) == [[n] for n in names]
    assert fleet.batches(names, 3) == [["r1", "r2", "r3"], ["r4", "r5", "r6"], ["r7", "r8"]]
    with pytest.raises(ValueError):
        fleet.batches(names, 0)


def test_the_upgrade_stops_once_more_than_max_fail_failed() -> None:
    assert not fleet.should_stop(0, 0)
    assert fleet.should_stop(1, 0)
    assert not fleet.should_stop(1, 1) and fleet.should_stop(2, 1)


def test_running_requests_are_summed_over_label_sets() -> None:
    text = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
        "vllm:num_requests_running_total_other 7",
        'vllm:num_requests_waiting{model_name="m"} 5.0'])
    assert fleet.parse_running(text) == 3.0
    assert fleet.parse_running("vllm:num_requests_running 0.0") == 0.0
    assert fleet.parse_running("vllm:num_requests_waiting 4") is None


def test_the_hook_argv_appends_phase_name_and_endpoint_as_words() -> None:
    argv = fleet.hook_argv("lbctl --pool 'api pool'", "drain", "r1; rm -rf /",
                           "http://10.0.0.1:8000")
    assert argv == ["lbctl", "--pool", "api pool", "drain", "r1; rm -rf /",
                    "http://10.0.0.1:8000"]
    for bad in ("", "   ", "lbctl 'open"):
        with pytest.raises(ProvisionError):
            fleet.hook_argv(bad, "drain", "r1", "http://x")


def test_the_hook_gets_its_values_as_argv_and_env_never_through_a_shell(tmp_path: Path) -> None:
    script = tmp_path / "hook.py"
    script.write_text("import json, os, sys\nprint(json.dumps([sys.argv[1:], "
                      "os.environ['VLLM_PROVISION_REPLICA']]))\nsys.exit(3)\n")
    done = fleet.run_hook(f"{sys.executable} {script}", "undrain", "$(touch x)",
                          "http://h:1", timeout_s=30)
    assert not done.ok and done.exit_code == 3
    assert json.loads(done.output) == [["undrain", "$(touch x)", "http://h:1"], "$(touch x)"]
    assert not (Path.cwd() / "x").exists()
    missing = fleet.run_hook(str(tmp_path / "nope"), "drain", "r1", "http://h:1", 5)
    assert not missing.ok and "cannot run" in missing.output


def _entry(name: str, batch: int, outcome: str) -> fleet.ReplicaOutcome:
    return fleet.ReplicaOutcome(name, batch, f"http://{name}:8000", outcome=outcome)


def test_the_recap_lists_every_outcome_in_upgrade_order() -> None:
    entries = [_entry("r1", 1, fleet.UPGRADED), _entry("r2", 2, fleet.UPGRADED),
               _entry("r3", 3, fleet.ROLLED_BACK), _entry("r4", 4, fleet.UNTOUCHED)]
    assert fleet.recap(entries) == {"upgraded": ["r1", "r2"], "rolled back": ["r3"],
                                    "rollback failed": [], "not upgraded": [],
                                    "untouched": ["r4"]}
    capacity = fleet.capacity_summary(
        [{"t_s": 0.0, "serving": 4, "down": []}, {"t_s": 1.0, "serving": 3, "down": ["r3"]}],
        4, 1.0)
    assert (capacity["min_serving"], capacity["min_at_s"]) == (3, 1.0)
    lines = fleet.recap_lines(entries, capacity)
    assert lines[2] == "replica r3 (batch 3): rolled back"
    assert lines[4] == ("upgrade recap: upgraded=2 rolled_back=1 rollback_failed=0 "
                        "not_upgraded=0 untouched=1")
    assert "at least 3 of 4" in lines[5]


def test_no_sample_has_no_minimum() -> None:
    assert fleet.capacity_summary([], 8, 1.0)["min_serving"] is None


def test_snapshot_and_restore_quote_every_path() -> None:
    script = fleet.snapshot_script(["/etc/systemd/system/vllm.service"],
                                   ["/etc/default/it's new"])
    assert "tar -cpf prev.tar.tmp -C / -- etc/systemd/system/vllm.service" in script
    assert "'/etc/default/it'\"'\"'s new'" in script
    assert "mv -f prev.tar.tmp prev.tar" in script
    assert fleet.snapshot_script([], []).count("-T /dev/null") == 1
    assert "systemctl daemon-reload" in fleet.restore_script()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    """A local HTTP server answering /health 200; yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_probe_counts_the_replicas_that_answer_health(health_server: int) -> None:
    probe = fleet.CapacityProbe({"up": f"http://127.0.0.1:{health_server}",
                                 "gone": f"http://127.0.0.1:{_closed_port()}"}, interval_s=0.3)
    probe.run(duration_s=0.7)
    record = fleet.capacity_summary(probe.samples, 2, 0.3)
    assert len(record["samples"]) >= 2
    assert all(s["serving"] == 1 and s["down"] == ["gone"] for s in record["samples"])
    assert record["min_serving"] == 1


def test_status_watch_prints_the_capacity_record(health_server: int, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from referencing import Registry, Resource

    from vllm_provision.cli import cli, json_schemas

    inventory = tmp_path / "fleet.yml"
    replicas = {name: {"vars": {"vllm_api_port": port}, "hosts": {
        host: {"ansible_host": ip, "vllm_host_ip": ip}}}
        for name, host, ip, port in (("r1", "a", "127.0.0.1", health_server),
                                     ("r2", "b", "127.0.0.2", _closed_port()))}
    inventory.write_text(json.dumps({"all": {"children": {"vllm_replicas": {
        "vars": {"vllm_model": "/srv/m", "vllm_api_host": "127.0.0.1"},
        "children": replicas}}}}))
    result = CliRunner().invoke(cli, ["status", "-i", str(inventory), "--watch",
                                      "--interval", "0.3", "--duration", "0.5", "--json"])
    assert result.exit_code == 3, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    common = json_schemas.load("common")
    registry = Registry().with_resource(common["$id"], Resource.from_contents(common))
    jsonschema.Draft202012Validator(json_schemas.load("status"),
                                    registry=registry).validate(record)
    assert record["watch"]["replicas"] == 2 and record["watch"]["min_serving"] == 1
    assert {tuple(s["down"]) for s in record["watch"]["samples"]} == {("r2",)}
