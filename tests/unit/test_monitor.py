"""``provision monitor`` (docs/monitoring.md): Prometheus file_sd targets and a prometheus.yml
from the inventory, written on the controller only, idempotently, values kept as data."""

from __future__ import annotations

import json
import stat

import pytest
import yaml
from click.testing import CliRunner
from inventory_support import load_llama

from vllm_provision.cli import cli
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import host_port
from vllm_provision.operations import monitor

SMALL = """\
        small:
          vars: {vllm_backend: mp, vllm_model: /srv/models/small, vllm_api_port: 9000,
                 vllm_served_model_name: "small-v1"}
          hosts:
            h3: {ansible_host: 10.0.0.13, vllm_node_rank: 0}
"""


def _file_sd(entries: list) -> None:
    """The shape Prometheus' file_sd reads: a list of {targets: [str], labels: {str: str}}."""
    for entry in entries:
        assert set(entry) == {"targets", "labels"}
        assert all(isinstance(t, str) and t.rsplit(":", 1)[1].isdigit() for t in entry["targets"])
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in entry["labels"].items())


def test_rank_0_of_every_replica_and_every_ray_node_are_targets_with_their_labels(tmp_path):
    inventory = load_llama(tmp_path, "ray", more=SMALL)
    vllm, ray = monitor.vllm_targets(inventory), monitor.ray_targets(inventory)
    _file_sd(vllm)
    _file_sd(ray)
    assert vllm == [
        {"targets": ["10.0.0.11:8000"], "labels": {"replica": "llama", "backend": "ray",
                                                   "model": "/srv/models/tiny",
                                                   "node_rank": "0", "role": "api",
                                                   "host": "h1"}},
        {"targets": ["10.0.0.13:9000"], "labels": {"replica": "small", "backend": "mp",
                                                   "model": "small-v1", "node_rank": "0",
                                                   "role": "api", "host": "h3"}}]
    assert [(e["targets"], e["labels"]["role"], e["labels"]["node_rank"]) for e in ray] == [
        (["10.0.0.11:52368"], "head", "0"), (["10.0.0.12:52368"], "worker", "1")]
    assert monitor.summary(inventory) == {"vllm": 2, "ray": 2, "node": 0, "gpu": 0,
                                          "gateway": 0}


def test_the_replica_s_ray_metrics_port_and_an_api_bind_address_are_followed(tmp_path):
    inventory = load_llama(tmp_path, "ray", vllm_api_host="10.9.9.9",
                           ray_metrics_export_port=9100)
    assert monitor.vllm_targets(inventory)[0]["targets"] == ["10.9.9.9:8000"]
    assert [e["targets"] for e in monitor.ray_targets(inventory)] == [
        ["10.0.0.11:9100"], ["10.0.0.12:9100"]]


def test_an_mp_replica_has_no_ray_targets_and_ipv6_is_bracketed(tmp_path):
    inventory = load_llama(tmp_path, "mp", more=SMALL)
    assert monitor.ray_targets(inventory) == []
    assert host_port("fd00::1", 52368) == "[fd00::1]:52368"
    assert host_port("10.0.0.1", 80) == "10.0.0.1:80"


def test_the_files_are_written_once_and_a_second_run_changes_nothing(tmp_path):
    inventory = load_llama(tmp_path, "ray", more=SMALL)
    out = tmp_path / "prom"
    first = monitor.write(inventory, out)
    assert [(w.path.relative_to(out).as_posix(), w.changed) for w in first] == [
        ("targets/vllm.json", True), ("targets/ray.json", True), ("targets/node.json", True),
        ("targets/gpu.json", True), ("targets/gateway.json", True),
        ("rules/vllm-provision.rules.yml", True),
        ("dashboards/vllm-provision.json", True), ("prometheus.yml", True)]
    assert all(not w.changed for w in monitor.write(inventory, out))
    assert stat.S_IMODE((out / "prometheus.yml").stat().st_mode) == 0o644
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job["file_sd_configs"][0]["files"][0]
            for job in config["scrape_configs"]}
    assert jobs == monitor.JOBS  # relative to prometheus.yml's folder, as Prometheus reads them
    for path in jobs.values():
        _file_sd(json.loads((out / path).read_text()))
    assert config["global"]["scrape_interval"] == monitor.SCRAPE_INTERVAL


def test_targets_only_leaves_prometheus_yml_alone(tmp_path):
    inventory = load_llama(tmp_path, "mp")
    out = tmp_path / "prom"
    out.mkdir()
    (out / "prometheus.yml").write_text("# the team's own\n")
    written = monitor.write(inventory, out, config=False)
    assert [w.path.name for w in written] == ["vllm.json", "ray.json", "node.json", "gpu.json",
                                              "gateway.json"]
    assert (out / "prometheus.yml").read_text() == "# the team's own\n"


def test_a_hostile_looking_model_name_stays_one_label_value(tmp_path):
    model = "m\\u0022}], \\u0022x\\u0022: [{"
    inventory = load_llama(tmp_path, "mp", vllm_served_model_name=f'"{model}"')
    [entry] = json.loads(monitor.render(inventory)["targets/vllm.json"])
    assert entry["labels"]["model"] == 'm"}], "x": [{' and len(entry) == 2


def test_an_unwritable_folder_is_an_error_naming_the_file(tmp_path):
    inventory = load_llama(tmp_path, "mp")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ProvisionError) as raised:
        monitor.write(inventory, blocker / "prom")
    assert "prom" in str(raised.value) and "--out" in str(raised.value)


def test_the_command_writes_and_says_what_changed(tmp_path):
    load_llama(tmp_path, "ray")
    args = ["monitor", "-i", str(tmp_path / "inventory.yml"), "--out", str(tmp_path / "p")]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert first.output.count("changed ") == 8
    assert ("vllm: 1 target, ray: 2 targets, node: 0 targets, gpu: 0 targets, gateway: 0 "
            "targets") in first.output
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "changed" not in again.output


def test_every_node_s_exporters_are_targets_of_their_jobs(tmp_path):
    inventory = load_llama(tmp_path, "ray", more=SMALL, vllm_monitoring="node_exporter",
                           vllm_gpu_exporter="dcgm-exporter")
    node, gpu = monitor.exporter_targets(inventory, "node"), monitor.exporter_targets(inventory,
                                                                                      "gpu")
    _file_sd(node)
    _file_sd(gpu)
    # the llama replica (Ray, h1 and h2) has both; the small one (mp, h3) has neither
    assert [(e["targets"], e["labels"]["host"], e["labels"]["role"]) for e in node] == [
        (["10.0.0.11:9100"], "h1", "head"), (["10.0.0.12:9100"], "h2", "worker")]
    assert [e["targets"] for e in gpu] == [["10.0.0.11:9400"], ["10.0.0.12:9400"]]
    assert {e["labels"]["replica"] for e in node + gpu} == {"llama"}
    assert monitor.summary(inventory) == {"vllm": 2, "ray": 2, "node": 2, "gpu": 2,
                                          "gateway": 0}


def test_a_host_s_own_exporter_port_is_followed(tmp_path):
    inventory = load_llama(tmp_path, "mp", vllm_gpu_exporter="nvidia_gpu_exporter")
    assert [e["targets"] for e in monitor.exporter_targets(inventory, "gpu")] == [
        ["10.0.0.11:9835"], ["10.0.0.12:9835"]]
    assert monitor.exporter_targets(inventory, "node") == []


def test_the_scrape_interval_is_a_prometheus_duration(tmp_path):
    inventory = load_llama(tmp_path, "mp")
    config = yaml.safe_load(monitor.render(inventory, "2s")["prometheus.yml"])
    assert config["global"] == {"scrape_interval": "2s", "evaluation_interval": "2s"}
    for bad in ("2", "1h30m", "0s", "-1s", "2s\nrule_files: [x]"):
        with pytest.raises(ProvisionError, match="Prometheus duration"):
            monitor.render(inventory, bad)
    result = CliRunner().invoke(cli, ["monitor", "-i", str(tmp_path / "inventory.yml"), "--out",
                                      str(tmp_path / "p"), "--scrape-interval", "soon"])
    assert isinstance(result.exception, ProvisionError)  # the entry point prints it, exit 1
    assert "--scrape-interval" in str(result.exception) and not (tmp_path / "p").exists()


GATEWAYS = """\
    vllm_gateways:
      vars: {vllm_gateway_wheelhouse: wheels}
      hosts:
        h1: {}
        gw: {ansible_host: 10.0.5.20, vllm_gateway_host: 10.0.5.21,
             vllm_gateway_metrics_port: 29100}
"""


def test_every_front_door_is_a_target_of_the_gateway_job(tmp_path):
    """A gateway binding every interface is scraped on its host's address, one binding an
    address on that address; its metrics port is the router's --prometheus-port."""
    from inventory_support import llama_yaml, write_inventory

    from vllm_provision.inventory import load_inventory

    inventory = load_inventory(write_inventory(tmp_path, llama_yaml("mp") + GATEWAYS))
    gateway = monitor.gateway_targets(inventory)
    _file_sd(gateway)
    assert gateway == [
        {"targets": ["10.0.0.11:29000"], "labels": {"role": "gateway", "host": "h1"}},
        {"targets": ["10.0.5.21:29100"], "labels": {"role": "gateway", "host": "gw"}}]
    assert monitor.summary(inventory)["gateway"] == 2
