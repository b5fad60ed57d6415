"""vLLM's Prometheus metric names by release, as data (docs/monitoring.md, "Metric names").

The names are those ``vllm serve`` exports on ``/metrics`` through ``PrometheusStatLogger``
(vllm/v1/metrics/loggers.py of the vLLM source); a counter registered as ``vllm:prompt_tokens``
is exposed as ``vllm:prompt_tokens_total`` (prometheus_client adds ``_total``; vLLM
docs/design/metrics.md). Read from the history of loggers.py:

- 0.10.0: ``vllm:kv_cache_usage_perc`` (added in 0.9.2 beside the deprecated
  ``vllm:gpu_cache_usage_perc``, which 0.12.0 no longer has); the inter-token latency histogram
  is ``vllm:time_per_output_token_seconds``.
- 0.10.2: the inter-token latency histogram is ``vllm:inter_token_latency_seconds``; the old
  name stays beside it, marked deprecated ("Deprecated in 0.11"), hidden behind
  ``--show-hidden-metrics-for-version`` in 0.12 and gone later.
- 0.11.0, 0.12.0 and 0.30.0 (the newest release checked): the same names as 0.10.2 for every
  logical metric of :class:`MetricNames`.

vLLM's deprecation rule (docs/usage/metrics.md): a metric deprecated in X.Y is hidden in X.Y+1
(``--show-hidden-metrics-for-version=X.Y`` shows it) and removed in X.Y+2, so a dashboard must
use the names of the release it watches.

Names through Ray: ``RayPrometheusStatLogger`` (vllm/v1/metrics/ray_wrappers.py) registers the
same metrics as ``ray.util.metrics`` objects, replacing every character outside
``[A-Za-z0-9_]`` with ``_`` (``vllm:num_requests_running`` -> ``vllm_num_requests_running``),
and Ray's metrics agent exports application metrics with the prefix ``ray_`` (Ray docs, "Adding
application-level metrics"): ``ray_vllm_num_requests_running``, see :func:`ray_exported_name`.
That logger is used only when a Ray Serve application passes it to vLLM's engine (the
``StatLoggerManager`` "ray case"); ``vllm serve`` with ``--distributed-executor-backend ray``,
which is what a replica of this tool runs, exports the plain names on rank 0's ``/metrics``, so
the ``ray`` job (Ray's metrics agent) carries Ray's own metrics and no vLLM ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NEWEST", "RELEASES", "MetricNames", "candidates", "names_for", "parse_release",
           "ray_exported_name"]


@dataclass(frozen=True)
class MetricNames:
    """The exposed name of each logical vLLM metric in one release (labels ``model_name`` and
    ``engine`` on all of them; ``finished_reason`` on ``request_success``).

    Attributes:
        requests_running: gauge, requests in the running batch.
        requests_waiting: gauge, requests queued for the scheduler.
        kv_cache_usage: gauge, KV cache blocks in use as a fraction 0-1 (despite ``_perc``).
        ttft: histogram of time to first token, seconds (``_bucket``/``_sum``/``_count``).
        itl: histogram of inter-token latency, seconds.
        e2e: histogram of end-to-end request latency, seconds.
        request_success: counter of finished requests by ``finished_reason`` (``stop``,
            ``length``, ``abort``, ...: vllm/v1/engine/__init__.py ``FinishReason``).
        prompt_tokens: counter of prefill tokens processed.
        generation_tokens: counter of generated tokens.
        preemptions: counter of requests preempted by the scheduler.
    """

    requests_running: str
    requests_waiting: str
    kv_cache_usage: str
    ttft: str
    itl: str
    e2e: str
    request_success: str
    prompt_tokens: str
    generation_tokens: str
    preemptions: str


_V0_10_0 = MetricNames(
    requests_running="vllm:num_requests_running",
    requests_waiting="vllm:num_requests_waiting",
    kv_cache_usage="vllm:kv_cache_usage_perc",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:time_per_output_token_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    request_success="vllm:request_success_total",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    preemptions="vllm:num_preemptions_total",
)
_V0_10_2 = MetricNames(**{**_V0_10_0.__dict__, "itl": "vllm:inter_token_latency_seconds"})

# Release -> its names, oldest first: the releases whose loggers.py was read (module docstring).
RELEASES: dict[str, MetricNames] = {
    "0.10.0": _V0_10_0,
    "0.10.2": _V0_10_2,
    "0.11.0": _V0_10_2,
    "0.12.0": _V0_10_2,
    "0.30.0": _V0_10_2,
}
NEWEST = next(reversed(RELEASES))
# Names older than the table's releases that a reader of a live /metrics may still meet:
# vllm:gpu_cache_usage_perc, the KV-cache gauge's name before vllm:kv_cache_usage_perc
# (deprecated in 0.9.2, loggers.py), served by the 0.9 releases.
OLDER_NAMES: dict[str, tuple[str, ...]] = {"kv_cache_usage": ("vllm:gpu_cache_usage_perc",)}

# PEP 440 release segment at the start of a version (0.12.0, 0.11.1rc2, 0.12.0+cu129).
_RELEASE_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_release(version: str) -> tuple[int, int, int] | None:
    """The (major, minor, patch) of a vLLM version such as ``0.12.0+cu129`` or ``0.11.1rc2``
    (a pre-release counts as its release), or None when it does not start with one."""
    match = _RELEASE_RE.match(version.strip())
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def names_for(release: str | None) -> tuple[MetricNames, str | None]:
    """The metric names of a vLLM release, and a warning when they are a guess.

    Args:
        release: a vLLM version (``0.12.0``; a local part or pre-release suffix is ignored), or
            None when the replica's release is unknown.

    Returns:
        ``(names, warning)``: a release of :data:`RELEASES` gives its names and None; another
        release gives the names of the nearest older known release (the oldest one for a
        release before it) and a warning naming both; None or an unreadable version gives the
        newest names and a warning saying how to tell (``vllm_version``).
    """
    parsed = parse_release(release) if release is not None else None
    if parsed is None:
        what = "unknown" if release is None else f"{release!r} (not a version)"
        return RELEASES[NEWEST], (
            f"the vLLM release is {what}: using the metric names of vLLM {NEWEST}; set "
            "vllm_version (or pin vllm== in the replica's vllm_stack_lock) to match the "
            "names to the release")
    known = sorted(RELEASES, key=lambda r: parse_release(r) or (0, 0, 0))
    older = [r for r in known if (parse_release(r) or (0, 0, 0)) <= parsed]
    chosen = older[-1] if older else known[0]
    if parse_release(chosen) == parsed:
        return RELEASES[chosen], None
    return RELEASES[chosen], (
        f"vLLM {release} is not in the metric table (releases {', '.join(known)}): using the "
        f"names of vLLM {chosen}; a renamed metric shows no data")


def candidates(field: str) -> tuple[str, ...]:
    """Every name the logical metric ``field`` (a :class:`MetricNames` field) has had, newest
    release first, then :data:`OLDER_NAMES`: for a reader that takes the first one a live
    ``/metrics`` serves (``provision top``), whatever the release.

    Raises:
        KeyError: ``field`` is not a field of :class:`MetricNames`.
    """
    if field not in MetricNames.__dataclass_fields__:
        raise KeyError(field)
    names = [getattr(RELEASES[r], field) for r in reversed(RELEASES)]
    return tuple(dict.fromkeys([*names, *OLDER_NAMES.get(field, ())]))


def ray_exported_name(name: str) -> str:
    """The name a vLLM metric gets when exported through Ray's metrics agent: characters
    outside ``[A-Za-z0-9_]`` become ``_`` (vllm/v1/metrics/ray_wrappers.py,
    ``_get_sanitized_opentelemetry_name``) and Ray prefixes ``ray_`` (Ray docs, "Adding
    application-level metrics"). ``vllm:num_requests_running`` ->
    ``ray_vllm_num_requests_running``; a counter's ``_total`` follows Ray's exporter."""
    return "ray_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
