"""The streaming load generator: seeded prompts, OpenAI streaming completions over httpx, timed
on the client.

Why our own and not ``guidellm`` or ``vllm bench serve`` (docs/evidence.md): guidellm 0.8.1
pulls in torch, transformers and datasets and pins ``click~=8.4`` (this tool pins 8.2.1);
``vllm bench serve`` needs vLLM itself on the controller. Both would turn a laptop-sized
controller into a GPU-stack install. httpx (pinned) streams Server-Sent Events line by line,
which is all the timing needs.

Timing follows ``vllm bench serve`` (vllm/benchmarks/lib/endpoint_request_func.py): TTFT is the
time from sending the request to the first chunk carrying text; ITL the gaps between later
chunks carrying text; end-to-end the time to the end of the stream. Clock: ``time.perf_counter``.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_provision.core import hostjson

# A fixed vocabulary: seeded prompts are the same words on every controller and every run.
VOCABULARY = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
              "november oscar papa quebec romeo sierra tango uniform victor whiskey xray "
              "yankee zulu").split()


def seeded_prompts(count: int, prompt_tokens: int, seed: int) -> list[str]:
    """``count`` prompts of ``prompt_tokens`` words each, drawn from :data:`VOCABULARY` with
    ``random.Random(seed)``: the same seed gives the same prompts. (Words, not model tokens:
    a tokenizer turns a word into one or more tokens; the stand-in counts words.)"""
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCABULARY) for _ in range(prompt_tokens)) for _ in range(count)]


def inputs_digest(prompts: Sequence[str], max_tokens: int) -> str:
    """sha256 (hex, 16 digits) of the prompts and ``max_tokens``: two runs with the same digest
    sent the same inputs."""
    data = json.dumps({"prompts": list(prompts), "max_tokens": max_tokens}).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def arrival_offsets(count: int, rate: float | None, seed: int) -> list[float]:
    """Send times (seconds from the start) of ``count`` requests: a Poisson process of ``rate``
    requests per second (exponential gaps, ``random.Random(seed + 1)``, as ``vllm bench serve
    --request-rate`` draws them), or all at 0 when ``rate`` is None (the concurrency limit
    alone paces them)."""
    if rate is None:
        return [0.0] * count
    rng = random.Random(seed + 1)
    out, now = [], 0.0
    for _ in range(count):
        out.append(now)
        now += rng.expovariate(rate)
    return out


@dataclass
class StreamResult:
    """One streamed completion as the client saw it (times in seconds from ``sent``).

    Attributes:
        index: the request's number. sent: ``perf_counter`` when it was sent.
        token_times: offsets of each chunk that carried text. tokens: output tokens (the
            server's ``usage.completion_tokens`` when it sent usage, else chunks with text).
        finish_reason: the last chunk's, None when none came.
        error: None when the stream completed, else its kind (:func:`error_kind`).
        detail: the error's text. end: offset when the stream ended or failed.
        done: ``data: [DONE]`` was received.
    """

    index: int
    sent: float
    token_times: list[float] = field(default_factory=list)
    tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    detail: str = ""
    end: float = 0.0
    done: bool = False

    @property
    def ok(self) -> bool:
        """Completed: ``[DONE]`` after a finish reason, and no error."""
        return self.error is None and self.done and self.finish_reason is not None

    @property
    def ttft(self) -> float | None:
        """Seconds to the first chunk with text, None when none came."""
        return self.token_times[0] if self.token_times else None

    @property
    def itls(self) -> list[float]:
        """Gaps between successive chunks with text, seconds."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, times rounded to 0.1 ms."""
        data = asdict(self)
        data["token_times"] = [round(x, 4) for x in self.token_times]
        data["end"] = round(self.end, 4)
        data.pop("sent")
        return data


def error_kind(exc: BaseException) -> str:
    """A short kind for a failed stream: ``connect`` (refused or unreachable), ``read_timeout``
    (no byte within the read timeout: a hung stream), ``connect_timeout``, ``peer_closed`` (the
    server closed the connection mid-stream: httpx ``RemoteProtocolError``), ``read_error``
    (reset), or the exception's class name."""
    import httpx

    if isinstance(exc, httpx.ConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, httpx.ReadTimeout):
        return "read_timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "peer_closed"
    if isinstance(exc, httpx.ReadError):
        return "read_error"
    return type(exc).__name__


def stream_one(client: Any, url: str, body: dict[str, Any], index: int,
               headers: dict[str, str] | None = None,
               on_token: Callable[[StreamResult], None] | None = None) -> StreamResult:
    """Send one streaming completion and time it; never raises for a failed request.

    Args:
        client: an ``httpx.Client`` (its timeouts bound the connect and each read).
        url: ``<base>/v1/completions``. body: the request (``stream`` is set here).
        index: the request's number. headers: e.g. ``Authorization``.
        on_token: called after each chunk with text (progress, fault triggers).

    Returns:
        the :class:`StreamResult`; ``error`` ``http_<status>`` for a non-200 answer,
        ``incomplete`` for a stream that ended without ``[DONE]``.
    """
    result = StreamResult(index=index, sent=time.perf_counter())
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        with client.stream("POST", url, json=payload, headers=headers or {}) as response:
            if response.status_code != 200:
                text = response.read().decode(errors="replace")
                result.error, result.detail = f"http_{response.status_code}", text[:300]
                return result
            chunks = 0
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    result.done = True
                    break
                event = hostjson.loads(data)
                usage = event.get("usage") or {}
                if usage.get("completion_tokens") is not None:
                    result.tokens = int(usage["completion_tokens"])
                for choice in event.get("choices") or []:
                    if choice.get("text"):
                        result.token_times.append(time.perf_counter() - result.sent)
                        chunks += 1
                        if on_token is not None:
                            on_token(result)
                    if choice.get("finish_reason"):
                        result.finish_reason = str(choice["finish_reason"])
            result.tokens = max(result.tokens, chunks)
            if not result.done:
                result.error, result.detail = "incomplete", "the stream ended without [DONE]"
    except Exception as exc:  # noqa: BLE001 - every failure is a result, by kind
        result.error, result.detail = error_kind(exc), str(exc)[:300]
        result.tokens = max(result.tokens, len(result.token_times))
    finally:
        result.end = time.perf_counter() - result.sent
    return result


def make_client(concurrency: int, read_timeout_s: float, connect_timeout_s: float = 10.0,
                route: Any = None) -> Any:
    """An ``httpx.Client`` with ``concurrency`` connections, no keep-alive reuse limits beyond
    that, and the given read and connect timeouts (seconds). ``route``: how the controller
    reaches rank 0 (:class:`~vllm_provision.transport.tunnel.ApiRoute`; through SSH each
    connection is one forwarded channel); None: direct."""
    import httpx

    from vllm_provision.transport.tunnel import http_client

    timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
    if route is not None:
        return route.client(timeout, max_connections=concurrency)
    return http_client(timeout, concurrency)


def run_load(url: str, model: str, prompts: Sequence[str], max_tokens: int, concurrency: int,
             offsets: Sequence[float], headers: dict[str, str] | None = None,
             read_timeout_s: float = 60.0,
             on_done: Callable[[StreamResult], None] | None = None,
             route: Any = None) -> tuple[list[StreamResult], float]:
    """Send one streamed completion per prompt, at most ``concurrency`` at once, each not before
    its offset (seconds from the start); return the results in request order and the wall time
    of the whole run (seconds). ``temperature`` 0 and ``ignore_eos`` (a vLLM sampling
    parameter) make every request generate ``max_tokens``. ``route``: as :func:`make_client`."""
    results: list[StreamResult | None] = [None] * len(prompts)
    start = time.perf_counter()
    lock = threading.Lock()
    with make_client(concurrency, read_timeout_s, route=route) as client, \
            ThreadPoolExecutor(max_workers=concurrency) as pool:
        def one(i: int) -> None:
            delay = start + offsets[i] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # the arrival schedule, not a wait for a state
            body = {"model": model, "prompt": prompts[i], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            res = stream_one(client, url, body, i, headers)
            with lock:
                results[i] = res
            if on_done is not None:
                on_done(res)
        list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - start
    return [r for r in results if r is not None], wall


def client_summary(results: Sequence[StreamResult], wall_s: float) -> dict[str, Any]:
    """The client-side numbers of a run: requests, completed, completion rate, errors by kind,
    TTFT / ITL / end-to-end summaries (:func:`~vllm_provision.evidence.stats.summary`, ITL over
    every gap of every completed request), output tokens and output tokens per second (all
    requests' tokens over the wall time)."""
    from vllm_provision.evidence.stats import summary

    done = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    tokens = sum(r.tokens for r in results)
    return {"requests": len(results), "completed": len(done),
            "completion_rate": round(len(done) / len(results), 4) if results else None,
            "errors": dict(sorted(errors.items())),
            "ttft_s": summary([r.ttft for r in done if r.ttft is not None]),
            "itl_s": summary([gap for r in done for gap in r.itls]),
            "e2e_s": summary([r.end for r in done]),
            "output_tokens": tokens, "duration_s": round(wall_s, 3),
            "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None}
