"""Prometheus scrape targets from the inventory: ``provision monitor`` (docs/monitoring.md).

Pure: an inventory in, the files a Prometheus server needs out, written on the controller only
(no host is contacted). Prometheus reads the targets through file-based service discovery
(``file_sd_configs``: a JSON list of ``{"targets": ["host:port"], "labels": {...}}``, re-read
when the file changes; Prometheus docs, "Configuration", ``<file_sd_config>``), so a Prometheus
that loads :func:`prometheus_config` once follows every later ``monitor`` run without a reload.

Targets (docs/monitoring.md, "Targets"):

- ``vllm``: rank 0 of every replica that serves the OpenAI API, its ``/metrics`` on the API port
  (``vllm serve`` exposes it beside ``/v1``; ``--api-key`` guards ``/v1`` routes only: vLLM
  docs/usage/metrics.md and vllm/entrypoints/openai/api_server.py).
- ``ray``: every node of a Ray replica, the Ray metrics agent on ``ray_metrics_export_port``
  (``ray start --metrics-export-port``; Ray docs, "Collecting and monitoring metrics").
- ``node`` and ``gpu``: every node's node exporter and GPU exporter, where the replica has them
  (``vllm_monitoring``, ``vllm_gpu_exporter``: :mod:`vllm_provision.settings.monitoring`).
- ``gateway``: the front door's own metrics on every host of ``vllm_gateways``
  (``vllm-router --prometheus-port``, ``vllm_gateway_metrics_port``; docs/front-door.md).

With the configuration come the rule file (:mod:`~vllm_provision.operations.monitor_rules`,
named in ``rule_files``) and a Grafana dashboard
(:mod:`~vllm_provision.operations.monitor_dashboard`), both in the vLLM metric names of each
replica's release.

Every target of a replica carries the labels ``replica``, ``backend``, ``model``, ``node_rank``,
``role`` (``api``, ``head``, ``worker``) and ``host`` (the inventory host name), so one dashboard
or rule groups by replica across the jobs; a front door serves every replica and carries
``role`` ``gateway`` and ``host`` only.
Values are data: the files are written with ``json.dumps`` and ``yaml.safe_dump``, never from a
template, and a label value holds the inventory's text as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vllm_provision import settings
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.files import replace_atomically
from vllm_provision.core.models import Inventory, Node, Replica, host_port
from vllm_provision.inventory import gateways
from vllm_provision.operations import monitor_dashboard, monitor_rules
from vllm_provision.settings import monitoring

# The scrape jobs, in the order prometheus.yml lists them: job name -> its targets file under
# ``targets/`` (relative paths in file_sd_configs are resolved against the configuration file's
# folder: Prometheus docs, "Configuration", <file_sd_config>).
JOBS = {"vllm": "targets/vllm.json", "ray": "targets/ray.json", "node": "targets/node.json",
        "gpu": "targets/gpu.json", "gateway": "targets/gateway.json"}
# Prometheus' own defaults (global scrape_interval 1m) are coarse for a serving fleet; 15 s is
# the interval of Prometheus' example configuration and of vLLM's examples/online_serving
# /prometheus_grafana/prometheus.yaml (which uses 5 s for a single server).
SCRAPE_INTERVAL = "15s"
# One Prometheus duration of one unit (Prometheus' <duration> allows unit sequences such as
# 1h30m too; one unit is what an interval needs).
DURATION_RE = re.compile(r"^[1-9][0-9]{0,5}(ms|s|m|h)$")


@dataclass(frozen=True)
class Written:
    """One file :func:`write` handled: its path and whether its content changed."""

    path: Path
    changed: bool


def _labels(replica: Replica, node: Node, role: str) -> dict[str, str]:
    """The labels of one target (Prometheus label values are strings)."""
    return {"replica": replica.name, "backend": replica.backend,
            "model": replica.engine.served_model_name or replica.engine.model,
            "node_rank": str(node.rank), "role": role, "host": node.name}


def _node_role(node: Node) -> str:
    """``head`` for rank 0 (vLLM's docs call the node that runs the API server the head node
    with both backends), ``worker`` for the others."""
    return "head" if node.rank == 0 else "worker"


def vllm_targets(inventory: Inventory) -> list[dict[str, Any]]:
    """The ``vllm`` job's file_sd entries: one per API server of every replica whose backend
    serves the OpenAI API: rank 0's API address (``Replica.node_api_url``: an all-interfaces
    bind is reached on the node's cluster IP), and every node's of a hybrid data-parallel
    replica (each serves the metrics of its own engines)."""
    out = []
    for replica in inventory.replicas:
        if not replica.backend_type.serves_openai:
            continue
        for node in replica.api_nodes:
            host_port = replica.node_api_url(node).removeprefix("http://")
            out.append({"targets": [host_port], "labels": _labels(replica, node, "api")})
    return out


def ray_targets(inventory: Inventory) -> list[dict[str, Any]]:
    """The ``ray`` job's file_sd entries: one per node of every replica whose backend runs a
    Ray cluster, the node's cluster IP and ``ray_metrics_export_port`` (``settings.node_settings``;
    the inventory's load keeps it the same on every node of a replica)."""
    out = []
    for replica in inventory.replicas:
        if not replica.backend_type.ray_cluster:
            continue
        for node in replica.nodes:
            port = int(settings.node_settings(replica, node, inventory.extra_vars)
                       ["ray_metrics_export_port"])
            out.append({"targets": [host_port(node.host_ip, port)],
                        "labels": _labels(replica, node, _node_role(node))})
    return out


def exporter_targets(inventory: Inventory, job: str) -> list[dict[str, Any]]:
    """The ``node`` or ``gpu`` job's file_sd entries: one per node of every replica that has
    that exporter (:func:`vllm_provision.settings.monitoring.exporters` of the node's
    settings), the node's cluster IP and the exporter's port."""
    out = []
    for replica in inventory.replicas:
        for node in replica.nodes:
            values = settings.node_settings(replica, node, inventory.extra_vars)
            for exporter in monitoring.exporters(values):
                if exporter.job == job:
                    out.append({"targets": [host_port(node.host_ip, exporter.port)],
                                "labels": _labels(replica, node, _node_role(node))})
    return out


def gateway_targets(inventory: Inventory) -> list[dict[str, Any]]:
    """The ``gateway`` job's file_sd entries: one per host of ``vllm_gateways``, the router's
    metrics port (``vllm_gateway_metrics_port``, where ``vllm-router --prometheus-port`` serves
    ``/metrics``) on the address it binds (``vllm_gateway_host``), or on the host's address
    (``ansible_host``) when it binds every interface. Labels: ``role`` ``gateway`` and
    ``host``; a front door belongs to no one replica."""
    return [{"targets": [host_port(gateway.reached_at(inventory.hosts[gateway.host].address),
                                   gateway.metrics_port)],
             "labels": {"role": "gateway", "host": gateway.host}}
            for gateway in gateways.front_doors(inventory)]


def prometheus_config(scrape_interval: str = SCRAPE_INTERVAL) -> dict[str, Any]:
    """A complete ``prometheus.yml`` (as data) for a team without one: one scrape job per
    :data:`JOBS` entry, each reading its targets file (``file_sd_configs``), and the rule file
    (``rule_files``, :mod:`~vllm_provision.operations.monitor_rules`)."""
    return {"global": {"scrape_interval": scrape_interval,
                       "evaluation_interval": scrape_interval},
            "rule_files": [monitor_rules.RULES_FILE],
            "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                                "file_sd_configs": [{"files": [path]}]}
                               for job, path in JOBS.items()]}


def check_interval(text: str) -> str:
    """``text`` when it is a Prometheus duration of one unit (``15s``, ``500ms``, ``1m``:
    Prometheus docs, "Configuration", ``<duration>``), for ``--scrape-interval``.

    Raises:
        ProvisionError: anything else, naming the option and an example.
    """
    if not DURATION_RE.match(text):
        raise ProvisionError.single("--scrape-interval", "is not a Prometheus duration",
                                    expected="a number and one unit: 500ms, 15s, 1m",
                                    actual=repr(text))
    return text


def render(inventory: Inventory, scrape_interval: str = SCRAPE_INTERVAL) -> dict[str, str]:
    """Every file ``monitor`` writes, by path relative to the output folder -> its text
    (``scrape_interval``: checked by :func:`check_interval`)."""
    targets = all_targets(inventory)
    files = {JOBS[job]: json.dumps(entries, indent=2) + "\n" for job, entries in targets.items()}
    metrics = monitor_rules.replica_metrics(inventory)
    files[monitor_rules.RULES_FILE] = monitor_rules.render_rules(inventory, metrics)
    files[monitor_dashboard.DASHBOARD_FILE] = monitor_dashboard.render_dashboard(inventory,
                                                                                metrics)
    files["prometheus.yml"] = ("# managed by vllm-provision (provision monitor): the scrape "
                               "jobs of the inventory's replicas\n"
                               + yaml.safe_dump(prometheus_config(check_interval(
                                   scrape_interval)), sort_keys=False))
    return files


def write(inventory: Inventory, out: Path, *, config: bool = True,
          scrape_interval: str = SCRAPE_INTERVAL) -> list[Written]:
    """Write :func:`render`'s files under ``out`` (created when missing), each atomically and
    only when its content differs (a second run changes nothing).

    Args:
        inventory: the loaded inventory.
        out: the output folder (Prometheus' configuration folder, or one it can read).
        config: also write ``prometheus.yml``, the rule file and the dashboard (False: the
            targets only, for a Prometheus whose own configuration names them).
        scrape_interval: ``prometheus.yml``'s scrape and evaluation interval.

    Raises:
        ProvisionError: a file cannot be written, naming it and what to do.
    """
    done = []
    for relative, text in render(inventory, scrape_interval).items():
        if not config and not relative.startswith("targets/"):
            continue
        path = out / relative
        try:
            old = path.read_text(encoding="utf-8") if path.is_file() else None
            if old != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                replace_atomically(path, text, mode=0o644)
        except OSError as exc:
            raise ProvisionError.single(str(path), f"cannot write it: {exc.strerror or exc}",
                                        fix="choose a folder you can write (--out)") from None
        done.append(Written(path, old != text))
    return done


def all_targets(inventory: Inventory) -> dict[str, list[dict[str, Any]]]:
    """Every job's file_sd entries, by job name, in :data:`JOBS` order."""
    return {"vllm": vllm_targets(inventory), "ray": ray_targets(inventory),
            "node": exporter_targets(inventory, "node"),
            "gpu": exporter_targets(inventory, "gpu"), "gateway": gateway_targets(inventory)}


def warnings(inventory: Inventory) -> list[str]:
    """One line per replica whose vLLM release is not in the metric table (or unknown): the
    rules and dashboard use the nearest names (``vllm_metrics.names_for``)."""
    return [f"replica {m.replica}: {m.warning}" for m in monitor_rules.replica_metrics(inventory)
            if m.warning]


def summary(inventory: Inventory) -> Mapping[str, int]:
    """How many targets each job has (for the command's last line)."""
    return {job: len(entries) for job, entries in all_targets(inventory).items()}
