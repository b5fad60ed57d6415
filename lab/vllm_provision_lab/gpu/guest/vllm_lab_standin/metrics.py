"""Prometheus text for the metric names vLLM exports (vLLM ``docs/design/metrics.md``, v1)."""

from __future__ import annotations

import threading

# Bucket bounds, seconds, as in vLLM's vllm/v1/metrics/loggers.py.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]

# the share of the KV cache one running request holds on the stand-in (it has no cache)
KV_SHARE_PER_REQUEST = 0.02


class Histogram:
    """A cumulative Prometheus histogram (seconds)."""

    def __init__(self, name: str, help_text: str, buckets: list[float]) -> None:
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self.counts = [0] * len(buckets)
        self.total, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        """Add one observation, seconds."""
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def render(self, labels: str) -> list[str]:
        """Return the text lines: HELP, TYPE, buckets, +Inf, _sum, _count."""
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        # no zip(strict=): the guests run Python 3.9 (bullseye) to 3.13; both lists have one
        # entry per bucket
        for bound, count in zip(self.buckets, self.counts):  # noqa: B905
            lines.append(f'{self.name}_bucket{{le="{bound}",{labels}}} {float(count)}')
        lines.append(f'{self.name}_bucket{{le="+Inf",{labels}}} {float(self.count)}')
        lines.append(f"{self.name}_sum{{{labels}}} {self.total}")
        lines.append(f"{self.name}_count{{{labels}}} {float(self.count)}")
        return lines


class Metrics:
    """The request metrics of one served model."""

    def __init__(self, model_name: str) -> None:
        self.labels = f'engine="0",model_name="{model_name}"'
        self.lock = threading.Lock()
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", E2E_BUCKETS)
        self.success: dict[str, int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.running = 0

    def finished(self, reason: str, ttft_s: float, itls_s: list[float], e2e_s: float,
                 prompt_tokens: int, generated: int) -> None:
        """Record one finished request (times in seconds)."""
        with self.lock:
            self.ttft.observe(ttft_s)
            for itl in itls_s:
                self.itl.observe(itl)
            self.e2e.observe(e2e_s)
            self.success[reason] = self.success.get(reason, 0) + 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generated

    def render(self) -> str:
        """Return the whole /metrics body (Prometheus text format 0.0.4)."""
        with self.lock:
            lab = self.labels
            lines = ["# HELP vllm:num_requests_running Number of requests in model execution "
                     "batches.", "# TYPE vllm:num_requests_running gauge",
                     f"vllm:num_requests_running{{{lab}}} {float(self.running)}",
                     "# HELP vllm:num_requests_waiting Number of requests waiting to be "
                     "processed.", "# TYPE vllm:num_requests_waiting gauge",
                     f"vllm:num_requests_waiting{{{lab}}} 0.0",
                     # vLLM's gauge is the fraction (0-1) of KV-cache blocks in use
                     # (vllm/v1/metrics/loggers.py); the stand-in has no cache: each running
                     # request counts as KV_BLOCKS_PER_REQUEST of it
                     "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent "
                     "usage.", "# TYPE vllm:kv_cache_usage_perc gauge",
                     f"vllm:kv_cache_usage_perc{{{lab}}} "
                     f"{min(1.0, self.running * KV_SHARE_PER_REQUEST)}",
                     "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
                     "# TYPE vllm:prompt_tokens_total counter",
                     f"vllm:prompt_tokens_total{{{lab}}} {float(self.prompt_tokens)}",
                     "# HELP vllm:generation_tokens_total Number of generation tokens "
                     "processed.", "# TYPE vllm:generation_tokens_total counter",
                     f"vllm:generation_tokens_total{{{lab}}} {float(self.generation_tokens)}",
                     "# HELP vllm:request_success_total Count of successfully processed "
                     "requests.", "# TYPE vllm:request_success_total counter"]
            for reason in sorted(set(self.success) | {"length", "stop", "abort"}):
                lines.append(f'vllm:request_success_total{{{lab},finished_reason="{reason}"}} '
                             f"{float(self.success.get(reason, 0))}")
            for hist in (self.ttft, self.itl, self.e2e):
                lines += hist.render(lab)
        return "\n".join(lines) + "\n"
