"""A Grafana dashboard of the inventory's replicas, generated from vLLM's metric names
(docs/monitoring.md, "Dashboard"): ``provision monitor`` writes ``dashboards/vllm-provision.json``.

Built by code as data and written with ``json.dumps`` (no dashboard JSON is copied): a
``datasource`` template variable (Grafana docs, "Data source variable") and, per replica, one row
of vLLM panels in the metric names of the replica's release
(:mod:`vllm_provision.settings.vllm_metrics`) and one of its nodes' GPU and host panels. Every
query selects its replica with :func:`~vllm_provision.operations.monitor_rules.selector`
(``promql_string``: a replica name is one PromQL string literal, ``$`` escaped so Grafana does not
read it as a variable).

GPU panels read the ``gpu`` job, whichever exporter answers: dcgm-exporter
(``DCGM_FI_DEV_FB_USED`` in MiB, ``DCGM_FI_DEV_GPU_TEMP`` in degrees C, ``DCGM_FI_DEV_GPU_UTIL``
in percent: its etc/default-counters.csv) or nvidia_gpu_exporter
(``nvidia_smi_memory_used_bytes``, ``nvidia_smi_temperature_gpu``,
``nvidia_smi_utilization_gpu_ratio``: its README), joined with PromQL ``or`` after converting to
bytes and a 0-1 ratio. Host panels read the ``node`` job (node_exporter's
``node_cpu_seconds_total`` and ``node_memory_*_bytes``).

Ray replicas get the same rows: ``vllm serve`` exports vLLM's metrics on rank 0's ``/metrics``
(the ``vllm`` job) whatever the executor; the Ray-exported names
(:func:`~vllm_provision.settings.vllm_metrics.ray_exported_name`) appear only under Ray Serve,
which this tool does not run, so no panel reads them.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_provision.core.models import Inventory
from vllm_provision.core.quoting import promql_string
from vllm_provision.operations.monitor_rules import (
    FAILED_REASONS,
    WINDOW,
    ReplicaMetrics,
    quantile,
    selector,
)

DASHBOARD_FILE = "dashboards/vllm-provision.json"
UID = "vllm-provision"
# Grafana's dashboard JSON model version this layout was written against (Grafana 10/11 read
# it and migrate older ones forward: Grafana docs, "JSON model").
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH, HEIGHT, COLUMNS = 6, 8, 4  # Grafana's grid is 24 columns wide.


def display(name: str) -> str:
    """A replica name for a row title: Grafana also replaces ``$name`` in titles, so ``$``
    becomes U+FF04 (the inventory's group-name rule already keeps it out of names)."""
    return name.replace("$", "\uff04")


def _target(expr: str, legend: str, ref: str) -> dict[str, str]:
    return {"refId": ref, "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}


def panel(title: str, unit: str, targets: list[tuple[str, str]],
          kind: str = "timeseries") -> dict[str, Any]:
    """One panel (without ``id`` and ``gridPos``, which :func:`dashboard` sets).

    Args:
        title: fixed text of this module (never inventory text).
        unit: a Grafana unit id (``s``, ``percentunit``, ``bytes``, ``celsius``, ``short``).
        targets: ``(PromQL, legend format)`` pairs; the legend's ``{{label}}`` is Grafana's.
        kind: ``timeseries`` or ``stat``.
    """
    return {"type": kind, "title": title, "datasource": DATASOURCE,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {},
            "targets": [_target(expr, legend, chr(ord("A") + i))
                        for i, (expr, legend) in enumerate(targets)]}


def vllm_panels(m: ReplicaMetrics) -> list[dict[str, Any]]:
    """The vLLM panels of one replica, in its release's metric names."""
    n, match = m.names, selector("vllm", m.replica)
    failed = selector("vllm", m.replica, "finished_reason=~" + promql_string(FAILED_REASONS))
    return [
        panel("Serving (rank 0 /metrics up)", "short", [(f"up{match}", "up")], kind="stat"),
        panel("Requests running and waiting", "short", [
            (f"sum by (replica) ({n.requests_running}{match})", "running"),
            (f"sum by (replica) ({n.requests_waiting}{match})", "waiting")]),
        panel("KV cache use", "percentunit", [
            (f"max by (replica) ({n.kv_cache_usage}{match})", "KV cache")]),
        panel("Tokens per second", "short", [
            (f"sum by (replica) (rate({n.prompt_tokens}{match}[{WINDOW}]))", "prompt"),
            (f"sum by (replica) (rate({n.generation_tokens}{match}[{WINDOW}]))", "generation")]),
        panel("Time to first token", "s", [
            (quantile(0.5, n.ttft, match), "p50"), (quantile(0.99, n.ttft, match), "p99")]),
        panel("Inter-token latency", "s", [
            (quantile(0.5, n.itl, match), "p50"), (quantile(0.99, n.itl, match), "p99")]),
        panel("End-to-end latency", "s", [
            (quantile(0.5, n.e2e, match), "p50"), (quantile(0.99, n.e2e, match), "p99")]),
        panel("Errors, aborts and preemptions per second", "short", [
            (f"sum by (replica, finished_reason) (rate({n.request_success}{failed}[{WINDOW}]))",
             "{{finished_reason}}"),
            (f"sum by (replica) (rate({n.preemptions}{match}[{WINDOW}]))", "preempted")]),
    ]


def node_panels(replica: str) -> list[dict[str, Any]]:
    """The GPU and host panels of one replica's nodes, one series per GPU or host."""
    gpu, node = selector("gpu", replica), selector("node", replica)
    idle = selector("node", replica, 'mode="idle"')
    legend = "{{host}} {{gpu}}{{uuid}}"
    return [
        panel("GPU memory used", "bytes", [
            (f"DCGM_FI_DEV_FB_USED{gpu} * 1048576 or nvidia_smi_memory_used_bytes{gpu}", legend)]),
        panel("GPU temperature", "celsius", [
            (f"DCGM_FI_DEV_GPU_TEMP{gpu} or nvidia_smi_temperature_gpu{gpu}", legend)]),
        panel("GPU utilisation", "percentunit", [
            (f"DCGM_FI_DEV_GPU_UTIL{gpu} / 100 or nvidia_smi_utilization_gpu_ratio{gpu}",
             legend)]),
        panel("Host CPU and memory use", "percentunit", [
            (f"1 - avg by (host) (rate(node_cpu_seconds_total{idle}[{WINDOW}]))", "{{host}} CPU"),
            (f"1 - sum by (host) (node_memory_MemAvailable_bytes{node}) / sum by (host) "
             f"(node_memory_MemTotal_bytes{node})", "{{host}} memory")]),
    ]


def dashboard(inventory: Inventory, metrics: list[ReplicaMetrics]) -> dict[str, Any]:
    """The dashboard as data: per replica a row titled with its name, backend and release,
    then :func:`vllm_panels` and :func:`node_panels` laid out :data:`COLUMNS` to a line.

    Args:
        inventory: the loaded inventory (for each replica's backend).
        metrics: :func:`~vllm_provision.operations.monitor_rules.replica_metrics`.
    """
    backends = {r.name: r.backend for r in inventory.replicas}
    panels: list[dict[str, Any]] = []
    y = 0
    for m in metrics:
        release = m.release or "unknown release"
        panels.append({"type": "row", "collapsed": False, "panels": [],
                       "title": f"Replica {display(m.replica)} ({backends[m.replica]}, vLLM "
                                f"{display(release)})",
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        y += 1
        body = vllm_panels(m) + node_panels(m.replica)
        for i, item in enumerate(body):
            item["gridPos"] = {"h": HEIGHT, "w": WIDTH, "x": (i % COLUMNS) * WIDTH,
                               "y": y + (i // COLUMNS) * HEIGHT}
        y += -(-len(body) // COLUMNS) * HEIGHT
        panels.extend(body)
    for number, item in enumerate(panels, start=1):
        item["id"] = number
    return {
        "uid": UID, "title": "vLLM replicas (vllm-provision)", "tags": ["vllm", "vllm-provision"],
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "browser",
        "annotations": {"list": []},
        "templating": {"list": [{"name": "datasource", "label": "Data source",
                                 "type": "datasource", "query": "prometheus", "hide": 0,
                                 "refresh": 1, "current": {}, "options": []}]},
        "panels": panels,
    }


def render_dashboard(inventory: Inventory, metrics: list[ReplicaMetrics]) -> str:
    """The text of :data:`DASHBOARD_FILE` (``json.dumps``, keys in build order)."""
    return json.dumps(dashboard(inventory, metrics), indent=2) + "\n"
