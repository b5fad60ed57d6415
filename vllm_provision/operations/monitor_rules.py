"""Prometheus recording and alert rules for the inventory's replicas (docs/monitoring.md,
"Rules"): ``provision monitor`` writes them as ``rules/vllm-provision.rules.yml``.

Built as data and written with ``yaml.safe_dump`` (never from a template). Every expression is
scoped to one replica by a ``replica`` label matcher whose value goes through
:func:`vllm_provision.core.quoting.promql_string`; annotations name the replica only through
Prometheus' own ``{{ $labels.replica }}`` (Prometheus docs, "Alerting rules", "Templating"), so
no inventory value is ever read as PromQL or as a template. The vLLM metric names are those of
the replica's release (:func:`replica_release`, :mod:`vllm_provision.settings.vllm_metrics`).

Jobs read (the labels of docs/monitoring.md, "Targets"): ``vllm`` (rank 0's ``/metrics``),
``node`` (the node exporter of every node, its systemd collector on: the restart alert matches
the replica's own units by name in ``node_systemd_service_restart_total``, node_exporter's
collector/systemd_linux.go, so a restart of another service of the host is not the replica's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from vllm_provision import settings
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.core.quoting import promql_string
from vllm_provision.inventory import gateways
from vllm_provision.settings import variables
from vllm_provision.settings.vllm_metrics import MetricNames, names_for
from vllm_provision.stack import lock as stack_lock

RULES_FILE = "rules/vllm-provision.rules.yml"
# The window of every rate and quantile: 4 scrapes at monitor.SCRAPE_INTERVAL (15 s) is the
# shortest a rate() tolerates one missed scrape in (Prometheus docs, "rate()"); 5m is the
# window vLLM's examples/observability dashboards use.
WINDOW = "5m"
KV_CACHE_FULL = 0.9
# How long a target may be down before its alert fires, unless vllm_alert_down_for_s says.
DOWN_FOR_S = int(variables.VARIABLES["vllm_alert_down_for_s"].default)
# finished_reason values that are not a normal end (vllm/v1/engine/__init__.py FinishReason:
# stop, length, abort, and error in later releases).
FAILED_REASONS = "abort|error"


@dataclass(frozen=True)
class ReplicaMetrics:
    """One replica's metric names and, when they are a guess, why (for the command's output).

    Attributes:
        replica: the replica's name.
        release: its vLLM release (``vllm_version``, else the lock's ``vllm`` pin), or None.
        names: the names :func:`~vllm_provision.settings.vllm_metrics.names_for` gave.
        warning: None when the release is in the table, else the sentence to print.
        units: the replica's units on all its nodes (:func:`replica_units`), sorted.
    """

    replica: str
    release: str | None
    names: MetricNames
    warning: str | None
    units: tuple[str, ...] = ()


def replica_units(inventory: Inventory, replica: Replica) -> tuple[str, ...]:
    """Every unit of ours on ``replica``'s nodes, sorted: the backend's ``journal_units`` of
    each node (vLLM's, Ray's and the watchdog's), under the node's own unit names."""
    units: set[str] = set()
    for node in replica.nodes:
        values = settings.node_settings(replica, node, inventory.extra_vars)
        for names in replica.backend_type.journal_units(replica, node, values).values():
            units.update(names)
    return tuple(sorted(units))


def name_regex(names: tuple[str, ...]) -> str:
    """A RE2 alternation matching exactly ``names`` (PromQL's ``=~`` anchors it; Prometheus
    docs, "Querying basics"): each name's punctuation escaped with a backslash, which RE2
    reads as the character itself."""
    return "|".join(re.escape(name) for name in names)


def replica_release(inventory: Inventory, replica: Replica) -> str | None:
    """The vLLM release ``replica`` runs: its ``vllm_version`` pin, else the ``vllm`` pin of its
    stack lock (``vllm_stack_lock``, docs/stack.md), else None (unknown).

    Raises:
        ProvisionError: the lock exists but cannot be read or parsed, or its path leaves the
            inventory's folder (:func:`vllm_provision.stack.lock.lock_path`).
    """
    pinned = settings.replica_settings(replica, inventory.extra_vars).get("vllm_version")
    if pinned:
        return str(pinned)
    path = stack_lock.lock_path(inventory, replica)
    if path is None or not path.exists():
        return None
    pin = stack_lock.read_lock(path).pins.get("vllm")
    return pin.version if pin is not None else None


def replica_metrics(inventory: Inventory) -> list[ReplicaMetrics]:
    """:class:`ReplicaMetrics` of every replica whose backend serves the OpenAI API (those the
    ``vllm`` job scrapes), in inventory order. Raises ProvisionError as :func:`replica_release`.
    """
    out = []
    for replica in inventory.replicas:
        if not replica.backend_type.serves_openai:
            continue
        release = replica_release(inventory, replica)
        names, warning = names_for(release)
        out.append(ReplicaMetrics(replica.name, release, names, warning,
                                  replica_units(inventory, replica)))
    return out


def selector(job: str, replica: str, extra: str = "") -> str:
    """A PromQL label selector for one job and one replica: ``{job="vllm",replica="..."}``;
    ``extra``: more matchers, written by this module (never inventory text)."""
    more = "," + extra if extra else ""
    return "{job=" + promql_string(job) + ",replica=" + promql_string(replica) + more + "}"


def quantile(q: float, histogram: str, match: str) -> str:
    """``histogram_quantile`` of a vLLM histogram over :data:`WINDOW`, per replica (seconds)."""
    return (f"histogram_quantile({q}, sum by (replica, le) "
            f"(rate({histogram}_bucket{match}[{WINDOW}])))")


def recording_rules(m: ReplicaMetrics) -> list[dict[str, str]]:
    """The recording rules of one replica: series named ``replica:<metric>:<operation>``
    (Prometheus docs, "Recording rules" naming: level:metric:operations), each keeping the
    ``replica`` label."""
    n, match = m.names, selector("vllm", m.replica)
    rows = [
        ("replica:vllm_requests_running:sum", f"sum by (replica) ({n.requests_running}{match})"),
        ("replica:vllm_requests_waiting:sum", f"sum by (replica) ({n.requests_waiting}{match})"),
        ("replica:vllm_kv_cache_usage:max", f"max by (replica) ({n.kv_cache_usage}{match})"),
        ("replica:vllm_ttft_seconds:p50_5m", quantile(0.5, n.ttft, match)),
        ("replica:vllm_ttft_seconds:p99_5m", quantile(0.99, n.ttft, match)),
        ("replica:vllm_itl_seconds:p50_5m", quantile(0.5, n.itl, match)),
        ("replica:vllm_itl_seconds:p99_5m", quantile(0.99, n.itl, match)),
        ("replica:vllm_e2e_seconds:p99_5m", quantile(0.99, n.e2e, match)),
        ("replica:vllm_prompt_tokens:rate5m",
         f"sum by (replica) (rate({n.prompt_tokens}{match}[{WINDOW}]))"),
        ("replica:vllm_generation_tokens:rate5m",
         f"sum by (replica) (rate({n.generation_tokens}{match}[{WINDOW}]))"),
        ("replica:vllm_requests_failed:rate5m",
         f"sum by (replica) (rate({n.request_success}"
         f"{selector('vllm', m.replica, 'finished_reason=~' + promql_string(FAILED_REASONS))}"
         f"[{WINDOW}]))"),
    ]
    # The static replica label (equal to the one the expression keeps) tells the replicas'
    # rules apart: promtool's lint refuses two rules of one name with the same labels.
    return [{"record": record, "expr": expr, "labels": {"replica": m.replica}}
            for record, expr in rows]


def template_literal(value: str) -> str:
    """``value`` as a Prometheus template that expands to exactly ``value``: alert labels are
    Go templates (Prometheus docs, "Alerting rules": label values "can be templated"), and text
    without ``{{`` is literal (Go text/template); text with it becomes one quoted Go string
    action (``promql_string``'s escapes are Go's)."""
    return value if "{{" not in value else "{{ " + promql_string(value) + " }}"


def _alert(replica: str, name: str, expr: str, for_: str, severity: str, summary: str,
           description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": for_,
            "labels": {"severity": severity, "replica": template_literal(replica)},
            "annotations": {"summary": summary, "description": description}}


def duration(seconds: int) -> str:
    """``seconds`` as a Prometheus duration of one unit: ``2m`` for 120, ``90s`` for 90
    (Prometheus docs, "Configuration", ``<duration>``)."""
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def spoken(seconds: int) -> str:
    """``seconds`` for an annotation's prose: ``2 minutes``, ``1 minute``, ``90 seconds``."""
    if seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes} minute" + ("s" if minutes != 1 else "")
    return f"{seconds} second" + ("s" if seconds != 1 else "")


def alert_rules(m: ReplicaMetrics, ttft_p99_s: float,
                down_for_s: int = DOWN_FOR_S) -> list[dict[str, Any]]:
    """The alert rules of one replica; each has ``for:``, a ``severity`` label and
    ``summary``/``description`` annotations naming the replica with ``{{ $labels.replica }}``.

    Args:
        m: the replica's metric names.
        ttft_p99_s: ``vllm_alert_ttft_p99_s``, seconds (> 0, checked at inventory load).
        down_for_s: ``vllm_alert_down_for_s``, seconds (>= 1): how long rank 0's API or a
            node's exporter may go unscraped before its alert fires.
    """
    down, down_words = duration(down_for_s), spoken(down_for_s)
    n = m.names
    vllm, node = selector("vllm", m.replica), selector("node", m.replica)
    ours = selector("node", m.replica, "name=~" + promql_string(name_regex(m.units))) \
        if m.units else node
    waiting = f"sum by (replica) ({n.requests_waiting}{vllm})"
    return [
        _alert(m.replica, "VllmReplicaNotServing",
               f"up{vllm} == 0 or absent(up{vllm})", down, "critical",
               "Replica {{ $labels.replica }} is not serving",
               "Prometheus has not scraped vLLM's /metrics on rank 0 of replica "
               f"{{{{ $labels.replica }}}} for {down_words} (target down or missing): the API "
               "is down or unreachable. Run `provision status` for the replica."),
        _alert(m.replica, "VllmKvCacheFull",
               f"max by (replica) ({n.kv_cache_usage}{vllm}) > {KV_CACHE_FULL}", "5m",
               "warning", "Replica {{ $labels.replica }}'s KV cache is over 90% full",
               "KV cache use of replica {{ $labels.replica }} is {{ $value | humanizePercentage "
               "}} for 5 minutes: new requests wait or preempt running ones."),
        _alert(m.replica, "VllmQueueGrowing",
               f"{waiting} > 0 and sum by (replica) (deriv({n.requests_waiting}{vllm}[10m])) > 0",
               "10m", "warning", "Replica {{ $labels.replica }}'s queue keeps growing",
               "{{ $value }} requests wait on replica {{ $labels.replica }} and the queue has "
               "grown for 10 minutes: the replica is over capacity."),
        _alert(m.replica, "VllmTtftP99High",
               f"{quantile(0.99, n.ttft, vllm)} > {float(ttft_p99_s)!r}", "10m", "warning",
               "Replica {{ $labels.replica }}'s time to first token p99 is high",
               "TTFT p99 over 5 minutes of replica {{ $labels.replica }} is "
               "{{ $value | humanizeDuration }}, above its vllm_alert_ttft_p99_s, for 10 "
               "minutes."),
        _alert(m.replica, "VllmUnitRestarting",
               f"increase(node_systemd_service_restart_total{ours}[15m]) > 0", "1m", "warning",
               "A unit of replica {{ $labels.replica }} restarted",
               "systemd restarted {{ $labels.name }} on host {{ $labels.host }} of replica "
               "{{ $labels.replica }} in the last 15 minutes. See `journalctl -u "
               "{{ $labels.name }}` on that host."),
        _alert(m.replica, "VllmNodeUnreachable",
               f"up{node} == 0", down, "critical",
               "A node of replica {{ $labels.replica }} is unreachable",
               "The node exporter of host {{ $labels.host }} (replica {{ $labels.replica }}) "
               f"has not answered for {down_words}: the host is down or cut off."),
    ]


def gateway_alert(host: str, down_for_s: int = DOWN_FOR_S) -> dict[str, Any]:
    """The alert of one front door host (``vllm_gateways``): ``VllmFrontDoorDown`` when
    Prometheus has not scraped the router's metrics port (job ``gateway``) for ``down_for_s``
    seconds (that host's ``vllm_alert_down_for_s``). Labels ``severity`` and ``host``; the host
    name goes through :func:`~vllm_provision.core.quoting.promql_string` and
    :func:`template_literal`, as a replica name does."""
    match = "{job=" + promql_string("gateway") + ",host=" + promql_string(host) + "}"
    return {"alert": "VllmFrontDoorDown",
            "expr": f"up{match} == 0 or absent(up{match})", "for": duration(down_for_s),
            "labels": {"severity": "critical", "host": template_literal(host)},
            "annotations": {
                "summary": "The front door on {{ $labels.host }} is down",
                "description": "Prometheus has not scraped the router's metrics on "
                               f"{{{{ $labels.host }}}} for {spoken(down_for_s)}: clients of "
                               "that front door get no answer. See `journalctl -u "
                               "vllm-gateway.service` on that host (docs/front-door.md)."}}


def rule_groups(metrics: list[ReplicaMetrics], ttft_p99_s: Mapping[str, float],
                down_for_s: Mapping[str, int] | None = None,
                gateways: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The rule file as data (Prometheus docs, "Recording rules", "Alerting rules": ``groups``
    of ``rules``): group ``vllm-provision-recording`` holds every replica's
    :func:`recording_rules`, ``vllm-provision-alerts`` every replica's :func:`alert_rules` and
    every front door's :func:`gateway_alert`.

    Args:
        metrics: :func:`replica_metrics`.
        ttft_p99_s: replica name -> its ``vllm_alert_ttft_p99_s`` (seconds).
        down_for_s: replica name -> its ``vllm_alert_down_for_s`` (seconds); a replica not in
            it gets :data:`DOWN_FOR_S`.
        gateways: front door host name -> its ``vllm_alert_down_for_s``, in inventory order.
    """
    recording: list[dict[str, Any]] = []
    alerts: list[dict[str, Any]] = []
    for m in metrics:
        recording.extend(recording_rules(m))
        alerts.extend(alert_rules(m, ttft_p99_s[m.replica],
                                  (down_for_s or {}).get(m.replica, DOWN_FOR_S)))
    alerts.extend(gateway_alert(host, seconds) for host, seconds in (gateways or {}).items())
    return {"groups": [{"name": "vllm-provision-recording", "rules": recording},
                       {"name": "vllm-provision-alerts", "rules": alerts}]}


def rule_file(inventory: Inventory, metrics: list[ReplicaMetrics]) -> dict[str, Any]:
    """:func:`rule_groups` with each replica's ``vllm_alert_ttft_p99_s`` and
    ``vllm_alert_down_for_s`` from its settings, and each front door host's
    ``vllm_alert_down_for_s`` from its variables."""
    values = {r.name: settings.replica_settings(r, inventory.extra_vars)
              for r in inventory.replicas}
    return rule_groups(
        metrics, {name: float(v["vllm_alert_ttft_p99_s"]) for name, v in values.items()},
        {name: int(v["vllm_alert_down_for_s"]) for name, v in values.items()},
        {host: int(settings.layered(inventory.hosts[host].vars,
                                    extra_vars=inventory.extra_vars)["vllm_alert_down_for_s"])
         for host in gateways.gateway_hosts(inventory)})


def render_rules(inventory: Inventory, metrics: list[ReplicaMetrics]) -> str:
    """The text of :data:`RULES_FILE` (a header comment, then ``yaml.safe_dump``)."""
    return ("# managed by vllm-provision (provision monitor): recording and alert rules of the "
            "inventory's replicas\n"
            + yaml.safe_dump(rule_file(inventory, metrics), sort_keys=False, width=1000))
