"""Pure statistics: sample percentiles and the deltas of vLLM's ``/metrics`` histograms.

Histograms are parsed with ``prometheus_client``'s text parser (Prometheus exposition format
0.0.4), never by hand. Quantiles of a histogram delta are estimated as Prometheus'
``histogram_quantile`` does: linear interpolation inside the bucket that holds the rank
(prometheus/promql/quantile.go).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# vLLM's request histograms (vLLM docs/design/metrics.md, v1 engine; docs/real-vllm.md)
HISTOGRAMS = {"ttft_s": "vllm:time_to_first_token_seconds",
              "itl_s": "vllm:inter_token_latency_seconds",
              "e2e_s": "vllm:e2e_request_latency_seconds"}
QUANTILES = (50, 90, 99)


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every sample of metric ``name`` in a Prometheus text exposition (one per
    label set: model, engine, finished reason), or None when the body has none. Series whose
    names only start with ``name`` (``<name>_created``, another metric) are not counted.

    Args:
        text: the body of ``GET /metrics`` (Prometheus text format 0.0.4: ``name{labels} value``).
        name: the metric's full name, e.g. ``vllm:num_requests_running``.
    """
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest and rest[0] not in "{ ":
            continue  # another metric whose name starts the same
        if "}" in rest:
            rest = rest.rsplit("}", 1)[1]
        words = rest.split()
        if not words:
            continue
        try:
            total = (total or 0.0) + float(words[0])
        except ValueError:
            continue
    return total


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation between closest
    ranks (numpy's default, "linear"); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """``{"n", "mean", "p50", "p90", "p99", "max"}`` of ``values`` (seconds), rounded to 0.1 ms;
    None entries when there are no values."""
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 4)
    return {"n": len(values), "mean": r(sum(values) / len(values)) if values else None,
            **{f"p{q}": r(percentile(values, q)) for q in QUANTILES},
            "max": r(max(values)) if values else None}


@dataclass(frozen=True)
class Histogram:
    """One cumulative histogram: upper bounds (seconds, ``inf`` last) -> cumulative count,
    with its ``_sum`` and ``_count``."""

    buckets: tuple[tuple[float, float], ...]
    total: float
    count: float

    def minus(self, before: Histogram | None) -> Histogram:
        """This histogram less an earlier scrape of it (the observations in between)."""
        if before is None:
            return self
        earlier = dict(before.buckets)
        return Histogram(tuple((b, c - earlier.get(b, 0.0)) for b, c in self.buckets),
                         self.total - before.total, self.count - before.count)

    def quantile(self, q: float) -> float | None:
        """Estimated ``q``-th percentile (0-100), as Prometheus' ``histogram_quantile``; None
        without observations. A rank in the ``+Inf`` bucket gives the last finite bound."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q / 100.0 * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound
                if cumulative == lower_count:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                    cumulative - lower_count)
            lower_bound, lower_count = bound, cumulative
        return lower_bound

    def describe(self) -> dict[str, float | None]:
        """``{"count", "mean", "p50", "p90", "p99"}`` (seconds; quantiles are bucket
        estimates, as coarse as vLLM's bucket bounds)."""
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)
        return {"count": self.count,
                "mean": r(self.total / self.count) if self.count > 0 else None,
                **{f"p{q}": r(self.quantile(q)) for q in QUANTILES}}


def parse_histograms(text: str, model_name: str | None = None) -> dict[str, Histogram]:
    """The request histograms of :data:`HISTOGRAMS` from a ``/metrics`` body, summed over label
    sets other than ``le`` (one engine per replica; vLLM adds ``engine`` and ``model_name``);
    ``model_name`` keeps only that model's samples. Key: ``ttft_s``, ``itl_s``, ``e2e_s``; a
    histogram the body lacks is absent.

    Raises:
        ValueError: the text is not in the Prometheus text format (prometheus_client's error).
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name: key for key, name in HISTOGRAMS.items()}
    found: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        # the parser names a histogram family without the _bucket/_sum/_count suffixes; the
        # colon of vLLM's names is legal in the text format
        key = wanted.get(family.name)
        if key is None:
            continue
        into = found.setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
        for sample in family.samples:
            if model_name is not None and sample.labels.get("model_name", model_name) \
                    != model_name:
                continue
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                into["buckets"][bound] = into["buckets"].get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                into["sum"] += sample.value
            elif sample.name.endswith("_count"):
                into["count"] += sample.value
    return {key: Histogram(tuple(sorted(v["buckets"].items())), v["sum"], v["count"])
            for key, v in found.items()}


def histogram_deltas(before: Mapping[str, Histogram], after: Mapping[str, Histogram],
                     ) -> dict[str, dict[str, float | None]]:
    """Per histogram key, :meth:`Histogram.describe` of ``after`` less ``before``."""
    return {key: hist.minus(before.get(key)).describe() for key, hist in after.items()}


def agrees(client: float | None, server: float | None, tolerance_s: float,
           relative: float) -> bool | None:
    """Whether a client-side and a server-side value agree: ``|client - server| <= tolerance_s
    + relative * server``; None when either is missing."""
    if client is None or server is None:
        return None
    return abs(client - server) <= tolerance_s + relative * abs(server)
