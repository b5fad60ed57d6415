"""``provision monitor``'s rules and dashboard (docs/monitoring.md, "Metric names", "Rules",
"Dashboard"): vLLM's metric names by release, the PromQL string escape, Prometheus recording
and alert rules (checked and run by promtool when it is installed) and the Grafana dashboard,
all generated from the inventory as data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from inventory_support import load_llama

from vllm_provision.cli import cli
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.quoting import promql_string
from vllm_provision.operations import monitor, monitor_dashboard, monitor_rules
from vllm_provision.settings import vllm_metrics
from vllm_provision.settings.vllm_metrics import names_for

SMALL = """\
        small:
          vars: {vllm_backend: mp, vllm_model: /srv/models/small, vllm_api_port: 9000,
                 vllm_version: "0.12.0", vllm_alert_ttft_p99_s: 2.5}
          hosts:
            h3: {ansible_host: 10.0.0.13, vllm_node_rank: 0}
"""
HOSTILE = 'we"ird} or vector(1) # $datasource {{ .Value }}\\ é'
LOCK_HASH = "a" * 64


# --- the metric table -----------------------------------------------------------------------

@pytest.mark.parametrize(("release", "itl"), [
    ("0.10.0", "vllm:time_per_output_token_seconds"),
    *((release, "vllm:inter_token_latency_seconds") for release in ("0.10.2", "0.12.0", "0.30.0")),
])
def test_a_known_release_gives_its_names_and_no_warning(release, itl):
    names, warning = names_for(release)
    assert warning is None
    assert names.itl == itl
    assert names.kv_cache_usage == "vllm:kv_cache_usage_perc"
    assert names.request_success == "vllm:request_success_total"


@pytest.mark.parametrize(("release", "nearest"), [
    ("0.10.1", "0.10.0"), ("0.11.1rc2+cu129", "0.11.0"), ("0.29.9", "0.12.0"),
    ("0.31.0", "0.30.0"), ("1.0.0", "0.30.0")])
def test_an_unknown_release_gives_the_nearest_older_names_and_a_warning_naming_both(
        release, nearest):
    names, warning = names_for(release)
    assert names == vllm_metrics.RELEASES[nearest]
    assert warning is not None and release in warning and f"vLLM {nearest}" in warning


def test_a_release_older_than_the_table_gives_the_oldest_names():
    names, warning = names_for("0.9.2")
    assert names == vllm_metrics.RELEASES["0.10.0"]
    assert warning is not None and "0.9.2" in warning


@pytest.mark.parametrize("release", [None, "main"])
def test_an_unknown_release_gives_the_newest_names_and_says_how_to_tell(release):
    names, warning = names_for(release)
    assert names == vllm_metrics.RELEASES[vllm_metrics.NEWEST]
    assert warning is not None and "vllm_version" in warning


def test_ray_exported_names_are_sanitised_and_prefixed():
    assert vllm_metrics.ray_exported_name("vllm:num_requests_running") == \
        "ray_vllm_num_requests_running"


# --- the escape -----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "literal"), [
    ("llama", '"llama"'),
    ('a"b', '"a\\"b"'),
    ("a\\b", '"a\\\\b"'),
    ("a\nb", '"a\\u000ab"'),
    ("$x", '"\\x24x"'),
    ("é", '"\\u00e9"'),
    ("\U0001f600", '"\\U0001f600"'),
])
def test_promql_string_escapes_quotes_backslashes_dollars_and_non_ascii(value, literal):
    assert promql_string(value) == literal


def test_a_hostile_replica_name_stays_one_string_in_every_query():
    literal = promql_string(HOSTILE)
    body = literal[1:-1].replace('\\"', "").replace("\\\\", "")
    assert '"' not in body and "$" not in literal and "\n" not in literal
    m = monitor_rules.ReplicaMetrics(HOSTILE, None, *names_for(None))
    rows = monitor_rules.recording_rules(m) + monitor_rules.alert_rules(m, 2.0)
    for rule in rows:
        assert HOSTILE not in rule["expr"] and literal in rule["expr"]
    for item in monitor_dashboard.vllm_panels(m) + monitor_dashboard.node_panels(HOSTILE):
        for target in item["targets"]:
            assert "$" not in target["expr"] and literal in target["expr"]


def test_an_alert_label_holding_template_braces_expands_to_the_name_itself():
    assert monitor_rules.template_literal("llama") == "llama"
    assert monitor_rules.template_literal("a{{ .Value }}") == '{{ "a{{ .Value }}" }}'


# --- where a replica's release comes from ---------------------------------------------------

def test_the_release_is_the_vllm_version_pin_else_the_lock_s_vllm_pin_else_unknown(tmp_path):
    (tmp_path / "stack.lock.txt").write_text(f"vllm==0.11.0 --hash=sha256:{LOCK_HASH}\n")
    pinned = load_llama(tmp_path, "ray", vllm_version="0.12.0",
                        vllm_stack_lock="stack.lock.txt")
    locked = load_llama(tmp_path, "ray", vllm_stack_lock="stack.lock.txt")
    neither = load_llama(tmp_path, "ray")
    assert [monitor_rules.replica_release(i, i.replicas[0])
            for i in (pinned, locked, neither)] == ["0.12.0", "0.11.0", None]


# --- rules ----------------------------------------------------------------------------------

def _rules(inventory) -> dict:
    return monitor_rules.rule_file(inventory, monitor_rules.replica_metrics(inventory))


@pytest.mark.parametrize("backend", ["ray", "mp"])
def test_every_alert_has_a_for_a_severity_and_annotations_naming_the_replica(tmp_path, backend):
    inventory = load_llama(tmp_path, backend, more=SMALL)
    recording, alerts = _rules(inventory)["groups"]
    assert {r["labels"]["replica"] for r in recording["rules"]} == {"llama", "small"}
    assert len(alerts["rules"]) == 2 * 6
    for alert in alerts["rules"]:
        assert alert["for"] and alert["labels"]["severity"] in ("warning", "critical")
        assert set(alert["annotations"]) == {"summary", "description"}
        assert "{{ $labels.replica }}" in alert["annotations"]["summary"]
        assert alert["labels"]["replica"] in alert["expr"]


def test_rules_use_the_names_of_each_replica_s_release_and_its_ttft_threshold(tmp_path):
    inventory = load_llama(tmp_path, "ray", vllm_version="0.10.0", more=SMALL)
    recording, alerts = _rules(inventory)["groups"]
    itl = {r["labels"]["replica"]: r["expr"] for r in recording["rules"]
           if r["record"] == "replica:vllm_itl_seconds:p99_5m"}
    assert "vllm:time_per_output_token_seconds_bucket" in itl["llama"]
    assert "vllm:inter_token_latency_seconds_bucket" in itl["small"]
    ttft = {a["labels"]["replica"]: a["expr"] for a in alerts["rules"]
            if a["alert"] == "VllmTtftP99High"}
    assert ttft["llama"].endswith("> 10.0") and ttft["small"].endswith("> 2.5")


@pytest.mark.parametrize("value", [0, -1, "soon"])
def test_a_bad_ttft_threshold_is_refused_at_load_naming_the_variable(tmp_path, value):
    with pytest.raises(ProvisionError, match="vllm_alert_ttft_p99_s"):
        load_llama(tmp_path, "mp", vllm_alert_ttft_p99_s=value)


# --- dashboard ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["ray", "mp"])
def test_the_dashboard_has_a_datasource_variable_and_one_row_per_replica(tmp_path, backend):
    inventory = load_llama(tmp_path, backend, more=SMALL)
    board = monitor_dashboard.dashboard(inventory, monitor_rules.replica_metrics(inventory))
    assert [v["type"] for v in board["templating"]["list"]] == ["datasource"]
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == [f"Replica llama ({backend}, vLLM unknown release)",
                                          "Replica small (mp, vLLM 0.12.0)"]
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(panels) == 2 * 12
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for item in panels:
        assert item["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all('replica="' in t["expr"] for t in item["targets"])
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for name in ("DCGM_FI_DEV_FB_USED", "nvidia_smi_memory_used_bytes", "DCGM_FI_DEV_GPU_TEMP",
                 "nvidia_smi_temperature_gpu", "DCGM_FI_DEV_GPU_UTIL",
                 "nvidia_smi_utilization_gpu_ratio", "node_cpu_seconds_total",
                 "vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds_bucket"):
        assert name in exprs
    assert "ray_vllm" not in exprs  # vllm serve exports the plain names on rank 0


def test_panels_do_not_overlap_on_grafana_s_grid(tmp_path):
    inventory = load_llama(tmp_path, "ray", more=SMALL)
    board = monitor_dashboard.dashboard(inventory, monitor_rules.replica_metrics(inventory))
    cells = set()
    for item in board["panels"]:
        g = item["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells
                cells.add((x, y))


# --- files and the command ------------------------------------------------------------------

def test_monitor_writes_the_rules_and_dashboard_once_and_prometheus_yml_loads_the_rules(tmp_path):
    inventory = load_llama(tmp_path, "ray", more=SMALL)
    out = tmp_path / "out"
    first = monitor.write(inventory, out)
    assert {w.path.relative_to(out).as_posix() for w in first} >= {
        monitor_rules.RULES_FILE, monitor_dashboard.DASHBOARD_FILE}
    assert not any(w.changed for w in monitor.write(inventory, out))
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    assert config["rule_files"] == [monitor_rules.RULES_FILE]
    assert json.loads((out / monitor_dashboard.DASHBOARD_FILE).read_text())["uid"] == \
        "vllm-provision"


def test_targets_only_writes_no_rules_and_no_dashboard(tmp_path):
    inventory = load_llama(tmp_path, "mp")
    written = monitor.write(inventory, tmp_path / "out", config=False)
    assert all(w.path.parent.name == "targets" for w in written)


def test_the_command_warns_naming_the_replica_and_its_release_and_still_writes(tmp_path):
    load_llama(tmp_path, "mp", vllm_version="0.10.1")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["monitor", "-i", str(tmp_path / "inventory.yml"),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "warning: replica llama: vLLM 0.10.1 is not in the metric table" in result.output
    assert "vllm:time_per_output_token_seconds" in (out / monitor_dashboard.DASHBOARD_FILE
                                                    ).read_text()


# --- promtool: the rules' real specification ------------------------------------------------

def _promtool() -> str:
    """promtool from $PROMTOOL, else beside the virtual environment's python (.venv/bin), else
    on PATH, else Debian's package as scripts/setup.sh unpacks it for the lab
    (``vllm_provision_lab.prometheus``); the test is skipped, saying how to get it, when there
    is none."""
    from vllm_provision_lab import prometheus

    beside = Path(sys.executable).parent / "promtool"
    unpacked = prometheus.binaries()
    found = (os.environ.get("PROMTOOL") or (str(beside) if beside.is_file() else None)
             or shutil.which("promtool") or (str(unpacked / "promtool") if unpacked else None))
    if not found or not Path(found).is_file():
        pytest.skip("promtool not found: run scripts/setup.sh (it unpacks Debian's prometheus "
                    "package), or put promtool in .venv/bin or on PATH, or set PROMTOOL to it, "
                    "to check and run the generated rules")
    return found


def _run(*argv: str, cwd: Path) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("backend", ["ray", "mp"])
def test_promtool_accepts_the_config_and_the_rules(tmp_path, backend):
    promtool = _promtool()
    inventory = load_llama(tmp_path, backend, more=SMALL)
    out = tmp_path / "out"
    monitor.write(inventory, out)
    assert "SUCCESS" in _run(promtool, "check", "config", "prometheus.yml", cwd=out)
    # two replicas, 11 recording rules and 6 alerts each
    assert "SUCCESS: 34 rules found" in _run(promtool, "check", "rules",
                                             monitor_rules.RULES_FILE, cwd=out)


def _series(metric: str, values: str, **labels: str) -> dict[str, str]:
    """One promtool input series; label values written with the escape under test."""
    matchers = ",".join(f"{k}={promql_string(v)}" for k, v in labels.items())
    return {"series": f"{metric}{{{matchers}}}", "values": values}


def _not_serving(replica: str, down_for: str = "2 minutes", **more: str) -> dict:
    return {"exp_labels": {"severity": "critical", "replica": replica, "job": "vllm", **more},
            "exp_annotations": {
                "summary": f"Replica {replica} is not serving",
                "description": f"Prometheus has not scraped vLLM's /metrics on rank 0 of replica "
                               f"{replica} for {down_for} (target down or missing): the API is "
                               "down or unreachable. Run `provision status` for the replica."}}


def _kv_full(replica: str) -> dict:
    return {"exp_labels": {"severity": "warning", "replica": replica},
            "exp_annotations": {
                "summary": f"Replica {replica}'s KV cache is over 90% full",
                "description": f"KV cache use of replica {replica} is 95% for 5 minutes: new "
                               "requests wait or preempt running ones."}}


def test_promtool_runs_the_not_serving_and_kv_cache_alerts(tmp_path):
    """The specification: a down target and a missing one are not serving after 2 minutes, a
    healthy one never; a KV cache over 90% fires after 5 minutes, at 90% or after a dip never.
    A hostile replica name is matched as the one label value it is."""
    promtool = _promtool()
    names, _ = names_for("0.12.0")
    down, missing, healthy = HOSTILE, "missing", "healthy"
    metrics = [monitor_rules.ReplicaMetrics(r, "0.12.0", names, None)
               for r in (down, missing, healthy)]
    rules = monitor_rules.rule_groups(metrics, {r.replica: 5.0 for r in metrics})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    kv = names.kv_cache_usage
    spec = {
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                _series("up", "1 1 0 0 0 0 0 0 0 0", job="vllm", replica=down, instance="a:1"),
                _series("up", "1x10", job="vllm", replica=healthy, instance="b:1"),
                _series(kv, "0.5 0.95 0.95 0.95 0.95 0.95 0.95 0.95 0.95 0.95", job="vllm",
                        replica=down, engine="0"),
                _series(kv, "0.9 0.9 0.95 0.95 0.5 0.95 0.95 0.95 0.5 0.5", job="vllm",
                        replica=healthy, engine="0"),
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "VllmReplicaNotServing",
                 "exp_alerts": [_not_serving(missing)]},
                {"eval_time": "5m", "alertname": "VllmReplicaNotServing",
                 "exp_alerts": [_not_serving(down, instance="a:1"), _not_serving(missing)]},
                {"eval_time": "5m", "alertname": "VllmKvCacheFull", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "VllmKvCacheFull",
                 "exp_alerts": [_kv_full(down)]},
                {"eval_time": "9m", "alertname": "VllmKvCacheFull",
                 "exp_alerts": [_kv_full(down)]},
            ],
        }],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "SUCCESS" in _run(promtool, "test", "rules", "test.yml", cwd=tmp_path)


def test_promtool_runs_the_ttft_queue_restart_and_node_alerts(tmp_path):
    """The specification: the same slow TTFT (p99 9.91 s) fires for a replica whose threshold is
    5 s and not for one whose threshold is 20 s; a queue that keeps growing fires, one that stays
    put does not; a unit restart and a node exporter down fire, naming the host; a restart of
    another service of the host is not the replica's."""
    promtool = _promtool()
    names, _ = names_for("0.12.0")
    metrics = [monitor_rules.ReplicaMetrics(r, "0.12.0", names, None,
                                            ("vllm-watchdog.service", "vllm.service"))
               for r in ("strict", "lenient")]
    rules = monitor_rules.rule_groups(metrics, {"strict": 5.0, "lenient": 20.0})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    series = []
    for replica in ("strict", "lenient"):
        for le, values in (("1", "0x20"), ("10", "0+10x20"), ("+Inf", "0+10x20")):
            series.append(_series(f"{names.ttft}_bucket", values, job="vllm", replica=replica,
                                  le=le))
    series += [
        _series(names.requests_waiting, "0+1x20", job="vllm", replica="strict"),
        _series(names.requests_waiting, "5x20", job="vllm", replica="lenient"),
        _series("node_systemd_service_restart_total", "0 0 0 1 1 1 1 1", job="node",
                replica="strict", host="h1", name="vllm.service"),
        _series("node_systemd_service_restart_total", "0 0 0 1 2 3 4 5", job="node",
                replica="strict", host="h1", name="ssh.service"),
        _series("node_systemd_service_restart_total", "0 0 0 1 1 1 1 1", job="node",
                replica="strict", host="h1", name="vllmXservice"),
        _series("up", "1 1 0 0 0 0 0 0", job="node", replica="strict", host="h2",
                instance="10.0.0.12:9100"),
        _series("up", "1x8", job="node", replica="lenient", host="h3",
                instance="10.0.0.13:9100"),
    ]
    ttft = {"exp_labels": {"severity": "warning", "replica": "strict"}, "exp_annotations": {
        "summary": "Replica strict's time to first token p99 is high",
        "description": "TTFT p99 over 5 minutes of replica strict is 9.91s, above its "
                       "vllm_alert_ttft_p99_s, for 10 minutes."}}
    restart = {"exp_labels": {"severity": "warning", "replica": "strict", "job": "node",
                              "host": "h1", "name": "vllm.service"}, "exp_annotations": {
        "summary": "A unit of replica strict restarted",
        "description": "systemd restarted vllm.service on host h1 of replica strict in the "
                       "last 15 minutes. See `journalctl -u vllm.service` on that host."}}
    unreachable = {"exp_labels": {"severity": "critical", "replica": "strict", "job": "node",
                                  "host": "h2", "instance": "10.0.0.12:9100"}, "exp_annotations": {
        "summary": "A node of replica strict is unreachable",
        "description": "The node exporter of host h2 (replica strict) has not answered for 2 "
                       "minutes: the host is down or cut off."}}
    queue = {"exp_labels": {"severity": "warning", "replica": "strict"}, "exp_annotations": {
        "summary": "Replica strict's queue keeps growing",
        "description": "12 requests wait on replica strict and the queue has grown for 10 "
                       "minutes: the replica is over capacity."}}
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "VllmTtftP99High", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "VllmTtftP99High", "exp_alerts": [ttft]},
            {"eval_time": "5m", "alertname": "VllmQueueGrowing", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "VllmQueueGrowing", "exp_alerts": [queue]},
            {"eval_time": "2m", "alertname": "VllmUnitRestarting", "exp_alerts": []},
            {"eval_time": "5m", "alertname": "VllmUnitRestarting", "exp_alerts": [restart]},
            {"eval_time": "3m", "alertname": "VllmNodeUnreachable", "exp_alerts": []},
            {"eval_time": "5m", "alertname": "VllmNodeUnreachable", "exp_alerts": [unreachable]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "SUCCESS" in _run(promtool, "test", "rules", "test.yml", cwd=tmp_path)


def test_a_row_title_never_holds_a_dollar_grafana_would_read_as_a_variable():
    m = monitor_rules.ReplicaMetrics("a$datasource", "0.12.0", *names_for("0.12.0"))
    inventory = type("Fake", (), {"replicas": [type("R", (), {"name": "a$datasource",
                                                              "backend": "mp"})()]})()
    [row] = [p for p in monitor_dashboard.dashboard(inventory, [m])["panels"]
             if p["type"] == "row"]
    assert "$" not in row["title"] and "datasource" in row["title"]


def test_every_name_a_metric_has_had_is_a_candidate_newest_first() -> None:
    assert vllm_metrics.candidates("itl") == ("vllm:inter_token_latency_seconds",
                                              "vllm:time_per_output_token_seconds")
    assert vllm_metrics.candidates("kv_cache_usage") == ("vllm:kv_cache_usage_perc",
                                                         "vllm:gpu_cache_usage_perc")
    assert vllm_metrics.candidates("requests_running") == ("vllm:num_requests_running",)
    with pytest.raises(KeyError):
        vllm_metrics.candidates("not_a_metric")


def test_the_restart_alert_names_the_replica_s_own_units(tmp_path):
    inventory = load_llama(tmp_path, "ray", vllm_unit_name="llm.service")
    [m] = monitor_rules.replica_metrics(inventory)
    assert m.units == ("llm.service", "ray-head.service", "ray-worker.service",
                       "vllm-watchdog.service")
    [restart] = [a for a in monitor_rules.alert_rules(m, 10.0)
                 if a["alert"] == "VllmUnitRestarting"]
    assert 'name=~"llm\\\\.service|ray\\\\-head\\\\.service|' in restart["expr"]


def test_promtool_fires_the_down_alerts_after_vllm_alert_down_for_s_and_the_front_door_s(
        tmp_path):
    """The specification: with vllm_alert_down_for_s 30 (for: 30s) a replica whose rank 0 went
    down fires at 30 s, not at 15 s; a front door whose metrics went unscraped fires
    VllmFrontDoorDown naming its host after its own 60 s, and one that answers never."""
    promtool = _promtool()
    names, _ = names_for("0.12.0")
    metrics = [monitor_rules.ReplicaMetrics("quick", "0.12.0", names, None)]
    rules = monitor_rules.rule_groups(metrics, {"quick": 5.0}, {"quick": 30},
                                      {"gw": 60, "ok": 60})
    [gateway_rule] = [r for r in rules["groups"][1]["rules"]
                      if r["alert"] == "VllmFrontDoorDown" and '"gw"' in r["expr"]]
    assert gateway_rule["for"] == "1m"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [
            _series("up", "1 0 0 0 0 0 0 0", job="vllm", replica="quick", instance="a:1"),
            _series("up", "1 0 0 0 0 0 0 0", job="gateway", host="gw", instance="g:29000"),
            _series("up", "1x8", job="gateway", host="ok", instance="o:29000"),
        ],
        "alert_rule_test": [
            {"eval_time": "30s", "alertname": "VllmReplicaNotServing", "exp_alerts": []},
            {"eval_time": "45s", "alertname": "VllmReplicaNotServing",
             "exp_alerts": [_not_serving("quick", "30 seconds", instance="a:1")]},
            {"eval_time": "45s", "alertname": "VllmFrontDoorDown", "exp_alerts": []},
            {"eval_time": "90s", "alertname": "VllmFrontDoorDown", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "host": "gw", "job": "gateway",
                               "instance": "g:29000"},
                "exp_annotations": {
                    "summary": "The front door on gw is down",
                    "description": "Prometheus has not scraped the router's metrics on gw for "
                                   "1 minute: clients of that front door get no answer. See "
                                   "`journalctl -u vllm-gateway.service` on that host "
                                   "(docs/front-door.md)."}}]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "SUCCESS" in _run(promtool, "test", "rules", "test.yml", cwd=tmp_path)


def test_the_inventory_s_down_for_and_gateways_reach_the_rule_file(tmp_path):
    inventory = load_llama(tmp_path, "mp", more=SMALL, vllm_alert_down_for_s=90)
    rules = monitor_rules.rule_file(inventory, monitor_rules.replica_metrics(inventory))
    fors = {(r["alert"], r["labels"]["replica"]): r["for"] for r in rules["groups"][1]["rules"]
            if r["alert"] in ("VllmReplicaNotServing", "VllmNodeUnreachable")}
    assert fors == {("VllmReplicaNotServing", "llama"): "90s",
                    ("VllmNodeUnreachable", "llama"): "90s",
                    ("VllmReplicaNotServing", "small"): "2m",
                    ("VllmNodeUnreachable", "small"): "2m"}
    assert monitor_rules.duration(3600) == "60m" and monitor_rules.spoken(60) == "1 minute"


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "two", "86401"])
def test_a_bad_down_for_is_refused_at_load(tmp_path, value):
    with pytest.raises(ProvisionError, match="vllm_alert_down_for_s"):
        load_llama(tmp_path, "mp", vllm_alert_down_for_s=value)
