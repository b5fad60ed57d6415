"""What a front door does while one of its replicas fails: ``provision fault --front-door HOST``.

While the fault experiment runs (:func:`vllm_provision.evidence.fault.run`), a
:class:`FrontDoorWatch` keeps a steady load of short streamed completions going through the
front door (``vllm_gateways``, docs/front-door.md) and reads the router's own view of the
replica every :data:`WORKERS_POLL_S` (``GET /workers``: each worker's ``url`` and
``is_healthy``, vllm-router 0.1.17). From the two it reports what a client of the front door
saw and when the router stopped and resumed sending to the replica:

- ``requests``, ``failed`` (did not complete, by kind in ``failures``), ``failed_pct``;
  ``failed_at_s``: seconds after the fault of each failure (at most :data:`KEPT_FAILURES`);
- ``marked_down_s``: fault to the first ``/workers`` read that no longer shows the replica
  healthy (absent or ``is_healthy`` false); None when the router never stopped sending to it;
- ``marked_up_s``: the replica serving again (the experiment's ``recovered_s``) to the first
  read after it that shows it healthy again; None when that did not happen within the bound;
- ``sent_again_s``: the replica serving again to the first time the router really sends it a
  request again: its ``/metrics`` ``vllm:request_success_total`` (read directly, every
  :data:`WORKERS_POLL_S`) grows past its value :data:`SETTLE_S` after it served again (the
  experiment's own recovery probe, sent to the replica directly, ends at ``recovered_s``; the
  margin keeps it out). A router whose ``/workers`` says healthy may still hold a replica out
  behind its circuit breaker: this is the time clients' requests come back to it.

The load goes to the front door only; the experiment's own streams and recovery polls still go
to the replica directly, so ``recovered_s`` is the replica's own. Nothing here contacts a host
over SSH: the router is reached over HTTP as clients reach it
(:func:`vllm_provision.inventory.gateways.client_url`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from vllm_provision.core import hostjson
from vllm_provision.evidence.stats import metric_sum

# How often the router's /workers is read (seconds): a tenth of its 2 s health checks' period
# at the lab's settings is fine enough to time its decisions.
WORKERS_POLL_S = 0.25
# Output tokens per request of the steady load: short, so each stream is one short exchange.
LOAD_MAX_TOKENS = 8
# How many failure times the result keeps.
KEPT_FAILURES = 20
# How long after the replica serves again the watch waits for the router to take it back.
TAKE_BACK_BOUND_S = 30.0
# After the replica serves again, its request count from this long on is the router's (the
# recovery probe's own completion is counted before it).
SETTLE_S = 0.5
# The counter of finished requests on a replica's /metrics (vLLM docs/usage/metrics.md; one
# series per finished_reason, summed).
FINISHED = "vllm:request_success_total"


class FrontDoorWatch:
    """A steady load through one front door and its view of one replica, on threads.

    Args:
        host: the front door's inventory host. url: its base URL
            (:func:`~vllm_provision.inventory.gateways.client_url`).
        worker: the replica's API as the router lists it (``Replica.api_url``).
        model: the served model id. headers: extra request headers (none: a front door
            refuses replicas with an API key at load).
        concurrency: requests in flight through the front door at a time.
        read_timeout_s: seconds without a byte before a stream counts as hung.
    """

    def __init__(self, host: str, url: str, worker: str, model: str, *,
                 headers: Mapping[str, str] | None = None, concurrency: int = 2,
                 read_timeout_s: float = 60.0) -> None:
        self.host, self.url, self.worker, self.model = host, url, worker, model
        self.headers = dict(headers or {})
        self.concurrency = concurrency
        self.read_timeout_s = read_timeout_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._outcomes: list[tuple[float, str | None]] = []  # (end, perf_counter; error kind)
        self._views: list[tuple[float, bool]] = []  # (perf_counter, replica healthy)
        self._counts: list[tuple[float, float]] = []  # (perf_counter, finished on the replica)
        self._threads: list[threading.Thread] = []
        self._client: Any = None

    def start(self) -> None:
        """Start the load threads and the ``/workers`` reader."""
        from vllm_provision.evidence import load

        self._client = load.make_client(self.concurrency + 1, self.read_timeout_s)
        self._threads = [threading.Thread(target=self._load, args=(i,), daemon=True)
                         for i in range(self.concurrency)]
        self._threads.append(threading.Thread(target=self._read_workers, daemon=True))
        for thread in self._threads:
            thread.start()

    def _load(self, lane: int) -> None:
        from vllm_provision.evidence import load

        body = {"model": self.model, "prompt": "front door probe", "temperature": 0,
                "max_tokens": LOAD_MAX_TOKENS, "ignore_eos": True}
        sent = 0
        while not self._stop.is_set():
            sent += 1
            res = load.stream_one(self._client, self.url + "/v1/completions", body,
                                  -(lane * 1_000_000 + sent), self.headers)
            with self._lock:
                self._outcomes.append((time.perf_counter(), None if res.ok else
                                       (res.error or "unknown")))
            if not res.ok:
                self._stop.wait(0.05)  # a refused request returns at once: do not spin

    def healthy(self, text: str) -> bool:
        """Whether a ``/workers`` answer lists :attr:`worker` as healthy (False when absent or
        unreadable)."""
        try:
            workers = hostjson.loads(text).get("workers") or []
        except (ValueError, AttributeError):
            return False
        return any(isinstance(w, dict) and w.get("url") == self.worker
                   and w.get("is_healthy") is True for w in workers)

    def _read_workers(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self._client.get(self.url + "/workers", timeout=2.0)
                seen = answer.status_code == 200 and self.healthy(answer.text)
            except Exception:  # noqa: BLE001 - a front door that does not answer shows nothing
                seen = False
            finished = self._finished()
            with self._lock:
                now = time.perf_counter()
                self._views.append((now, seen))
                if finished is not None:
                    self._counts.append((now, finished))
            self._stop.wait(WORKERS_POLL_S)

    def _finished(self) -> float | None:
        """The replica's finished requests (:data:`FINISHED`, summed), or None when its
        ``/metrics`` does not answer (it is down)."""
        try:
            answer = self._client.get(self.worker + "/metrics", timeout=2.0)
        except Exception:  # noqa: BLE001 - a dead replica has no count
            return None
        if answer.status_code != 200:
            return None
        return finished_count(answer.text)

    def wait_taken_back(self, after_clock: float, bound_s: float = TAKE_BACK_BOUND_S) -> None:
        """Wait until, after ``after_clock`` (a ``perf_counter`` time), ``/workers`` shows the
        replica healthy and the router has sent it a request again, or ``bound_s`` seconds."""
        deadline = time.perf_counter() + bound_s
        while time.perf_counter() < deadline:
            with self._lock:
                healthy = any(t >= after_clock and seen for t, seen in self._views)
                again = sent_again(self._counts, after_clock) is not None
            if healthy and again:
                return
            time.sleep(WORKERS_POLL_S)

    def stop(self) -> None:
        """Stop the load and the reader; the requests in flight end first."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.read_timeout_s + 5)
        if self._client is not None:
            self._client.close()

    def result(self, fault_clock: float, recovered_s: float | None) -> dict[str, Any]:
        """The report (module doc); times in seconds, ``fault_clock`` the fault's
        ``perf_counter`` time, ``recovered_s`` the experiment's (seconds after the fault)."""
        with self._lock:
            outcomes, views, counts = list(self._outcomes), list(self._views), list(self._counts)
        return summarise(self.host, self.url, self.worker, outcomes, views, fault_clock,
                         recovered_s, counts)


def finished_count(text: str) -> float | None:
    """The sum of every :data:`FINISHED` series in a Prometheus text page, or None when it has
    none (pure; :func:`vllm_provision.evidence.stats.metric_sum`)."""
    return metric_sum(text, FINISHED)


def sent_again(counts: list[tuple[float, float]], served_clock: float) -> float | None:
    """The first time (``perf_counter``) the replica's finished count grew past its value
    :data:`SETTLE_S` after ``served_clock``; None when it did not (yet). ``counts``: ``(time,
    count)`` in order."""
    base = None
    for t, count in counts:
        if t < served_clock + SETTLE_S:
            continue
        if base is None:
            base = count
        elif count > base:
            return t
    return None


def summarise(host: str, url: str, worker: str, outcomes: list[tuple[float, str | None]],
              views: list[tuple[float, bool]], fault_clock: float,
              recovered_s: float | None,
              counts: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """:meth:`FrontDoorWatch.result` from its records (pure).

    Args:
        outcomes: ``(end time, error kind or None)`` of every request through the front door.
        views: ``(time, replica healthy)`` of every ``/workers`` read, in order.
        fault_clock: the fault's time; recovered_s: seconds after it the replica served again.
        counts: ``(time, finished requests)`` of the replica's ``/metrics``, in order.
    """
    failed = [(t, kind) for t, kind in outcomes if kind is not None]
    failures: dict[str, int] = {}
    for _, kind in failed:
        failures[str(kind)] = failures.get(str(kind), 0) + 1
    down = next((t for t, seen in views if t >= fault_clock and not seen), None)
    back = again = None
    if recovered_s is not None:
        served = fault_clock + recovered_s
        back = next((t for t, seen in views if t >= served and seen), None)
        again = sent_again(counts or [], served)
    return {"host": host, "url": url, "worker": worker, "requests": len(outcomes),
            "failed": len(failed),
            "failed_pct": round(100.0 * len(failed) / len(outcomes), 3) if outcomes else None,
            "failures": dict(sorted(failures.items())),
            "failed_at_s": [round(t - fault_clock, 3) for t, _ in failed[:KEPT_FAILURES]],
            "marked_down_s": None if down is None else round(down - fault_clock, 3),
            "marked_up_s": None if back is None or recovered_s is None
            else round(back - fault_clock - recovered_s, 3),
            "sent_again_s": None if again is None or recovered_s is None
            else round(again - fault_clock - recovered_s, 3),
            "views": len(views)}
