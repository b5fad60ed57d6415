"""``provision top``: a live view of every replica, read once per refresh (docs/monitoring.md).

Per refresh, in parallel (:func:`vllm_provision.core.parallel.split_map`):

- one SSH command per node (:func:`node_script`): the units' ``systemctl show``
  (:func:`~vllm_provision.transport.api.show_command`, the units the replica's backend declares),
  ``nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits``, and
  per unit the count of restarts systemd scheduled in the last hour (journal);
- one keep-alive HTTP connection per replica to rank 0's API, reached as readiness reaches it
  (:func:`~vllm_provision.transport.tunnel.route_for`: directly or through rank 0's SSH
  connection): ``GET /health`` (serving or not) and ``GET /metrics`` (vLLM's Prometheus text,
  parsed with ``prometheus_client``).

A replica whose rank 0 does not answer within the timeout is shown "not serving"; a node that
cannot be reached shows its reason: neither stops the other replicas (replicas are independent).

The numbers (pure functions, unit-tested): requests running and waiting and the KV-cache usage
are vLLM's gauges of the last scrape; TTFT and ITL p50/p99 are histogram quantiles (Prometheus'
``histogram_quantile``, :class:`vllm_provision.evidence.stats.Histogram`) of the bucket deltas
between the oldest scrape of the window (the last :data:`WINDOW_S` seconds) and the newest;
tokens/s is the rate of ``vllm:generation_tokens_total`` over the same window. With one scrape
(the first refresh) the quantiles are those of the cumulative histograms, "since start" (since
vLLM started). ``--once`` takes two scrapes ``--interval`` apart: tokens/s over that interval,
the quantiles since start (an interval of a second rarely holds a request).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.core.parallel import split_map
from vllm_provision.core.quoting import shell_quote
from vllm_provision.core.text import one_line, printable
from vllm_provision.evidence.stats import Histogram
from vllm_provision.settings import vllm_metrics
from vllm_provision.transport.api import UnitState, parse_show, show_command

# The metrics `top` reads: key -> the names vLLM served them under, newest first, from the one
# table of names by release (settings/vllm_metrics.py); the first
# name the endpoint serves wins (vllm/v1/metrics/loggers.py of the vLLM source; the older
# names are those of the releases before the rename: `vllm:gpu_cache_usage_perc` became
# `vllm:kv_cache_usage_perc`, `vllm:time_per_output_token_seconds` became
# `vllm:inter_token_latency_seconds`). Counters are named without their `_total` suffix, as
# prometheus_client's parser names the family.
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    key: tuple(name.removesuffix("_total") for name in vllm_metrics.candidates(logical))
    for key, logical in (("running", "requests_running"), ("waiting", "requests_waiting"),
                       ("kv_cache", "kv_cache_usage"), ("ttft", "ttft"), ("itl", "itl"),
                       ("generation_tokens", "generation_tokens"))}
HISTOGRAM_KEYS = ("ttft", "itl")
QUANTILES = (50, 99)
WINDOW_S = 60.0
HTTP_TIMEOUT_S = 2.0
SSH_TIMEOUT_S = 10.0
# systemd's catalog id of "Scheduled restart job, restart counter is at N."
# (SD_MESSAGE_UNIT_RESTART_SCHEDULED, systemd's src/systemd/sd-messages.h): one per automatic
# restart that Restart= scheduled; a restart by hand (systemctl restart) logs none.
RESTART_SCHEDULED_ID = "5eb03494b6584870a536b337290809b3"
_GPU_MARK = "== vllm-provision top gpu"
_RESTARTS_MARK = "== vllm-provision top restarts"


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` scrape of rank 0, reduced to what ``top`` shows.

    Attributes:
        at: when it was taken, monotonic seconds on the controller.
        values: ``running``, ``waiting`` (requests, summed over engines), ``kv_cache`` (the
            fraction 0-1 of KV-cache blocks in use, the highest engine's),
            ``generation_tokens`` (the counter, summed): each absent when not served.
        histograms: ``ttft``, ``itl`` -> cumulative histogram (seconds), summed over engines.
        names: key -> the metric name the endpoint served it under (of :data:`METRIC_NAMES`).
    """

    at: float
    values: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)


def parse_metrics(text: str, at: float) -> Scrape:
    """Parse a ``/metrics`` body (Prometheus text format 0.0.4, ``prometheus_client``'s parser).

    For each key of :data:`METRIC_NAMES` the first candidate name the body serves is read; the
    samples of every label set (``engine``, ``model_name``) are summed, but the KV-cache usage
    is the highest engine's (a fraction per engine, vLLM's ``kv_cache_usage_perc`` is 0-1 despite
    its name).

    Args:
        text: the body.
        at: monotonic seconds of the scrape.

    Raises:
        ValueError: the body is not in the text format (prometheus_client's error).
    """
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        # a family whose samples are not adjacent comes back as two: their samples join
        families.setdefault(family.name, []).extend(family.samples)
    for name in list(families):  # a counter read without a TYPE line keeps its suffix
        if name.endswith("_total"):
            families.setdefault(name[:-len("_total")], families[name])
    values: dict[str, float] = {}
    histograms: dict[str, Histogram] = {}
    names: dict[str, str] = {}
    for key, candidates in METRIC_NAMES.items():
        name = next((n for n in candidates if n in families), None)
        if name is None:
            continue
        names[key] = name
        samples = families[name]
        if key in HISTOGRAM_KEYS:
            histograms[key] = _histogram(samples)
            continue
        numbers = [s.value for s in samples if not math.isnan(s.value)
                   and not s.name.endswith(("_created", "_bucket", "_sum", "_count"))]
        if numbers:
            values[key] = max(numbers) if key == "kv_cache" else sum(numbers)
    return Scrape(at, values, histograms, names)


def _histogram(samples: Sequence[Any]) -> Histogram:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for sample in samples:
        if sample.name.endswith("_bucket"):
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
        elif sample.name.endswith("_sum"):
            total += sample.value
        elif sample.name.endswith("_count"):
            count += sample.value
    return Histogram(tuple(sorted(buckets.items())), total, count)


def window(history: Sequence[Scrape], span_s: float = WINDOW_S) -> tuple[Scrape | None, Scrape]:
    """The scrapes that bound the window: (the oldest no older than ``span_s`` before the
    newest, or None when there is only one; the newest).

    Raises:
        ValueError: an empty history.
    """
    if not history:
        raise ValueError("no scrape yet")
    last = history[-1]
    first = next((s for s in history[:-1] if last.at - s.at <= span_s), None)
    return first, last


def latency(first: Scrape | None, last: Scrape, key: str) -> dict[str, float | None]:
    """``{"count", "p50", "p99"}`` of histogram ``key`` (seconds) between two scrapes.

    The observations between ``first`` and ``last`` are the bucket deltas; with ``first`` None,
    or after a counter reset (vLLM restarted: fewer observations than before), the cumulative
    histogram of ``last``. Quantiles: :meth:`Histogram.quantile` (Prometheus'
    ``histogram_quantile``); None without observations or when ``last`` lacks the histogram.
    """
    hist = last.histograms.get(key)
    if hist is None:
        return {"count": None, **{f"p{q}": None for q in QUANTILES}}
    before = first.histograms.get(key) if first is not None else None
    if before is not None and before.count <= hist.count:
        hist = hist.minus(before)
    return {"count": hist.count,
            **{f"p{q}": _round(hist.quantile(q), 4) for q in QUANTILES}}


def rate(first: Scrape | None, last: Scrape, key: str = "generation_tokens") -> float | None:
    """Per-second increase of counter ``key`` from ``first`` to ``last``; None with one scrape,
    no time between them, or a counter either lacks. After a reset (the counter went down:
    vLLM restarted) the increase is the new value, as Prometheus' ``rate`` counts it."""
    if first is None or key not in first.values or key not in last.values:
        return None
    elapsed = last.at - first.at
    if elapsed <= 0:
        return None
    increase = last.values[key] - first.values[key]
    if increase < 0:
        increase = last.values[key]
    return round(increase / elapsed, 2)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def node_script(units: Sequence[str]) -> str:
    """The one shell command ``top`` runs on a node per refresh (parsed by
    :func:`parse_node`): the units' states (:func:`~vllm_provision.transport.api.show_command`),
    the GPUs' memory (``nvidia-smi --query-gpu=index,memory.used,memory.total
    --format=csv,noheader,nounits``, MiB), and per unit the automatic restarts systemd
    scheduled in the last hour (journal entries with MESSAGE_ID
    :data:`RESTART_SCHEDULED_ID`, matched by journalctl itself; ``--output-fields`` needs
    systemd 236). Unit names are
    shell-quoted (:func:`~vllm_provision.core.quoting.shell_quote`).
    """
    # the MESSAGE_ID match reads only the restart entries (the journal indexes the field), not
    # every line the unit logged in the hour, once a second (journalctl(1), "MATCHES"); the
    # grep still counts only them
    restarts = "; ".join(
        f"printf '%s ' {shell_quote(unit)}; journalctl -u {shell_quote(unit)} "
        f"MESSAGE_ID={RESTART_SCHEDULED_ID} --since=-1h --no-pager -o json "
        f"--output-fields=MESSAGE_ID 2>/dev/null | grep -c {RESTART_SCHEDULED_ID}"
        for unit in units)
    return (f"{show_command(units)}; echo '{_GPU_MARK}'; "
            "nvidia-smi --query-gpu=index,memory.used,memory.total "
            "--format=csv,noheader,nounits 2>&1 | head -n 64; "
            f"echo '{_RESTARTS_MARK}'; {restarts}")


@dataclass(frozen=True)
class NodeReading:
    """What one node's :func:`node_script` said.

    Attributes:
        host: inventory host name.
        units: the units' states, in the order asked.
        gpus: ``{"index", "memory_used_mib", "memory_total_mib"}`` per GPU.
        gpu_error: nvidia-smi's own words (made printable, one line) when it gave no table.
        restarts_1h: unit -> automatic restarts in the last hour (None when unread).
    """

    host: str
    units: tuple[UnitState, ...] = ()
    gpus: tuple[dict[str, int], ...] = ()
    gpu_error: str | None = None
    restarts_1h: Mapping[str, int] = field(default_factory=dict)


def parse_node(host: str, text: str) -> NodeReading:
    """Parse :func:`node_script`'s output; a line it does not understand is skipped, a
    nvidia-smi that printed no table gives ``gpu_error`` (its first line, printable)."""
    shown, _, rest = text.partition(_GPU_MARK)
    gpu_text, _, restart_text = rest.partition(_RESTARTS_MARK)
    states, _ = parse_show(host, shown)
    gpus: list[dict[str, int]] = []
    other: list[str] = []
    for line in gpu_text.strip().splitlines():
        words = [w.strip() for w in line.split(",")]
        if len(words) == 3 and all(w.isdigit() for w in words):
            gpus.append({"index": int(words[0]), "memory_used_mib": int(words[1]),
                         "memory_total_mib": int(words[2])})
        elif line.strip():
            other.append(line.strip())
    restarts: dict[str, int] = {}
    for line in restart_text.strip().splitlines():
        unit, _, count = line.strip().rpartition(" ")
        if unit and count.isdigit():
            restarts[unit] = int(count)
    error = printable(other[0], limit=120) if other and not gpus else None
    return NodeReading(host, tuple(states), tuple(gpus), error, restarts)


@dataclass(frozen=True)
class ApiReading:
    """Rank 0's answers: ``health`` (HTTP status or None), the ``/metrics`` body (None when it
    did not answer 200), and ``error`` (why not, one printable line)."""

    health: int | None
    metrics: str | None = None
    error: str | None = None


def read_api(endpoint: Any) -> ApiReading:
    """``GET /health`` and ``GET /metrics`` on one connection to rank 0
    (:class:`~vllm_provision.transport.api.Endpoint`: its route and timeout). Never raises
    for a network error: it is the reading's ``error``."""
    import httpx

    try:
        with endpoint.client() as client:
            health = int(client.get(endpoint.base_url + "/health").status_code)
            answer = client.get(endpoint.base_url + "/metrics")
            if answer.status_code != 200:
                return ApiReading(health, None, f"/metrics answered HTTP {answer.status_code}")
            return ApiReading(health, answer.text)
    except (httpx.HTTPError, OSError) as exc:
        return ApiReading(None, None, printable(f"no answer ({endpoint.path}): {exc}",
                                                limit=200))


@dataclass
class Top:
    """The state of one ``top`` session: the replicas, their routes and scrape histories.

    Attributes:
        replicas: the replicas shown, inventory order.
        run_node: host name -> the node script's output for that host (raises
            :class:`ProvisionError` when the host cannot be reached).
        read_api: replica name -> :class:`ApiReading` (never raises).
        unreachable: host name -> why its connection could not be opened (one line).
        clock: monotonic seconds.
        forks: the most reads at once.
        history: replica name -> its scrapes of the window, oldest first (kept between
            refreshes; at most 600, those older than the window plus 30 s dropped).
    """

    replicas: Sequence[Replica]
    run_node: Callable[[str, str], str]
    read_api: Callable[[str], ApiReading]
    unreachable: Mapping[str, str] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    forks: int = 16
    history: dict[str, deque[Scrape]] = field(default_factory=dict)

    def units(self) -> dict[str, list[str]]:
        """Host name -> the units the replica's backend declares on it
        (:meth:`~vllm_provision.backends.Backend.replica_units`)."""
        found: dict[str, list[str]] = {}
        for replica in self.replicas:
            found.update(replica.backend_type.replica_units(replica, dict(
                replica.master.host.vars)))
        return found

    def refresh(self, *, cumulative: bool = False) -> dict[str, Any]:
        """Read every node and every replica once, in parallel; return the view (the JSON
        document of ``provision top --json``, schema ``vllm_provision/schemas/top.json``).

        Args:
            cumulative: the latency quantiles since start even when the window has two
                scrapes (``--once``).
        """
        units = self.units()
        jobs = [("node", host) for host in units if host not in self.unreachable] + [
            ("api", replica.name) for replica in self.replicas]

        def one(job: tuple[str, str]) -> tuple[str, Any]:
            kind, name = job
            if kind == "api":
                return f"api {name}", self.read_api(name)
            try:
                return f"node {name}", parse_node(name, self.run_node(name, node_script(
                    units[name])))
            except ProvisionError as exc:
                return f"node {name}", exc

        read, failed = split_map(one, jobs, workers=self.forks, failure=ProvisionError)
        now = self.clock()
        replicas = []
        for replica in self.replicas:
            api = read[f"api {replica.name}"]
            history = self.history.setdefault(replica.name, deque(maxlen=600))
            if api.metrics is not None:
                try:
                    history.append(parse_metrics(api.metrics, now))
                except ValueError as exc:
                    api = ApiReading(api.health, None, printable(
                        f"/metrics is not Prometheus text: {exc}", limit=200))
            while history and now - history[0].at > WINDOW_S + 30:
                history.popleft()
            nodes = []
            for node in replica.nodes:
                reason = self.unreachable.get(node.name)
                if f"node {node.name}" in failed:
                    reason = one_line(failed[f"node {node.name}"])
                reading = read.get(f"node {node.name}")
                nodes.append(node_view(node.name, node.rank, units.get(node.name, []),
                                       reading, reason, gpus=node.gpus))
            replicas.append(replica_view(replica, api, list(history), nodes,
                                         cumulative=cumulative,
                                         fresh=api.metrics is not None))
        return {"at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "window_s": WINDOW_S, "replicas": replicas}


def node_view(host: str, rank: int, units: Sequence[str], reading: NodeReading | None,
              reason: str | None, *, gpus: Collection[int] | None = None) -> dict[str, Any]:
    """One node of the view: its units (state, ``NRestarts``, restarts in the last hour), its
    GPUs' memory, and ``error`` (why it was not read; None when it was). Host text is made
    printable (:func:`~vllm_provision.core.text.printable`) here, once.

    Args:
        gpus: the node's ``vllm_gpus`` (``Node.gpus``): only those GPUs are shown, the
            others are not the replica's; None: every GPU nvidia-smi lists.
    """
    if reading is None:
        return {"host": host, "node_rank": rank, "error": printable(reason or "not read",
                                                                    limit=200),
                "units": [{"unit": u, "active_state": None, "sub_state": None,
                           "restarts": None, "restarts_1h": None} for u in units],
                "gpus": [], "gpu_error": None}
    return {"host": host, "node_rank": rank, "error": None,
            "units": [{"unit": printable(s.unit, limit=80),
                       "active_state": printable(s.active_state, limit=40),
                       "sub_state": printable(s.sub_state, limit=40),
                       "restarts": s.restarts,
                       "restarts_1h": reading.restarts_1h.get(s.unit)}
                      for s in reading.units],
            "gpus": [dict(g) for g in reading.gpus if gpus is None or g["index"] in gpus],
            "gpu_error": reading.gpu_error}


def replica_view(replica: Replica, api: ApiReading, history: Sequence[Scrape],
                 nodes: list[dict[str, Any]], *, cumulative: bool = False,
                 fresh: bool = True) -> dict[str, Any]:
    """One replica of the view, from rank 0's answers, its scrape history and its nodes.

    Args:
        replica: the replica.
        api: this refresh's answers of rank 0.
        history: its scrapes, oldest first (the last one this refresh's when ``fresh``).
        nodes: :func:`node_view` of each node, rank order.
        cumulative: quantiles since start (``--once``).
        fresh: this refresh scraped ``/metrics``; otherwise no numbers are shown (old ones
            would look current).

    ``serving``: rank 0's ``/health`` answered 200 (vLLM's engine is alive).
    """
    view: dict[str, Any] = {
        "replica": replica.name, "backend": replica.backend,
        "model": printable(replica.engine.served_model_name or replica.engine.model,
                           limit=120),
        "serving": api.health == 200, "health": api.health, "error": api.error,
        "requests": {"running": None, "waiting": None}, "kv_cache_perc": None,
        "tokens_per_s": None,
        "latency": {"window": None, "window_s": None,
                    **{f"{key}_s": {"count": None, **{f"p{q}": None for q in QUANTILES}}
                       for key in HISTOGRAM_KEYS}},
        "metric_names": {}, "nodes": nodes}
    if not fresh or not history:
        return view
    first, last = window(history)
    span = None if first is None else round(last.at - first.at, 1)
    since_start = cumulative or first is None
    view["requests"] = {"running": last.values.get("running"),
                        "waiting": last.values.get("waiting")}
    kv = last.values.get("kv_cache")
    view["kv_cache_perc"] = None if kv is None else round(100.0 * kv, 1)
    view["tokens_per_s"] = rate(first, last)
    view["latency"] = {"window": "since start" if since_start else f"last {span:g} s",
                       "window_s": None if since_start else span,
                       **{f"{key}_s": latency(None if since_start else first, last, key)
                          for key in HISTOGRAM_KEYS}}
    view["metric_names"] = dict(last.names)
    return view


def chosen_replicas(inventory: Inventory, limit: str | None) -> list[Replica]:
    """The replicas ``top`` shows: every replica, or with ``limit`` (a host pattern,
    docs/inventory.md) those with a node the pattern selects (the whole replica is read).

    Raises:
        InventoryError: an invalid pattern (from ``select_hosts``).
    """
    if not limit:
        return list(inventory.replicas)
    from vllm_provision.inventory import select_hosts

    chosen = {host.name for host in select_hosts(inventory, limit)}
    return [r for r in inventory.replicas if any(n.name in chosen for n in r.nodes)]


def open_top(replicas: Sequence[Replica], options: Any, *,
             http_timeout_s: float = HTTP_TIMEOUT_S) -> tuple[Top, Callable[[], None]]:
    """Open one SSH connection per node of ``replicas`` (the pool,
    :func:`~vllm_provision.transport.connection.open_connections`) and each replica's route to
    rank 0 (:func:`~vllm_provision.transport.tunnel.route_for`); return the :class:`Top` and
    the function that closes them.

    Args:
        replicas: the replicas to show.
        options: :class:`~vllm_provision.transport.base.ConnectionOptions`.
        http_timeout_s: per request to rank 0, seconds.

    A node whose connection fails is shown unreachable (with the reason); a replica reached
    through SSH whose rank 0 has no connection is shown not serving. Nothing raises for them.
    """
    from vllm_provision.transport.api import Endpoint
    from vllm_provision.transport.connection import close_all, open_connections
    from vllm_provision.transport.tunnel import choices_for, route_for

    hosts = {node.name: node.host for replica in replicas for node in replica.nodes}
    connections, errors = open_connections(list(hosts.values()), options)
    unreachable = {host: one_line(error) for host, error in errors.items()}
    choices_for(list(replicas))  # `auto`'s probes side by side; route_for reuses the choices
    endpoints: dict[str, Any] = {}
    for replica in replicas:
        try:
            route = route_for(replica, connections.get(replica.master.name))
            endpoints[replica.name] = Endpoint.for_replica(replica, timeout_s=http_timeout_s,
                                                           route=route)
        except ProvisionError as exc:  # through SSH, and rank 0 has no connection
            endpoints[replica.name] = one_line(exc)

    def run_node(host: str, command: str) -> str:
        return str(connections[host].run(command, timeout_s=SSH_TIMEOUT_S).stdout)

    def api(name: str) -> ApiReading:
        endpoint = endpoints[name]
        if isinstance(endpoint, str):
            return ApiReading(None, None, printable(endpoint, limit=200))
        return read_api(endpoint)

    top = Top(replicas, run_node, api, unreachable,
              forks=max(1, getattr(options, "forks", 16)))
    return top, lambda: close_all(connections)
