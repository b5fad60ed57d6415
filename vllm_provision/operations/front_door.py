"""``provision upgrade`` at the front door: take a replica out of every gateway's router before
its batch restarts, and put it back once it serves (docs/upgrade.md, docs/front-door.md).

Drain: ``POST /remove_worker?url=<replica api_url>`` on every router of ``vllm_gateways`` that
holds the replica, so new requests go to the other replicas while the ones in flight end where
they run; never the router's only healthy worker (vllm-router 0.1.17 removes the last worker
too, and then answers every request with 503 until one is added: left in, the replica keeps
serving until it stops, and only then do requests fail). Undrain: ``POST /add_worker`` on each
router that removed it (the router answers once the replica passes its health check), then
``GET /workers`` until it reports the replica healthy, bounded by ``timeout_s``.

Never raises for a gateway's failure: each step's record says what happened, and the upgrade
goes on (the router's own health checks still take a stopped replica out, 2 failed checks
apart). An upgrade cut short leaves the replica out of the router's running list; the next
``provision up`` puts every missing worker back (module ``vllm_gateway_workers``), as does any
restart of the router (``--worker-urls``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.inventory.gateways import Gateway
from vllm_provision.transport import router

# Seconds the undrain waits, per gateway, for the router to take the replica back and report it
# healthy (it checks a worker every 2 s: --worker-startup-check-interval, gateways.py).
UNDRAIN_TIMEOUT_S = 60.0

ONLY_HEALTHY = ("left in: the only healthy worker of this front door (vllm-router 0.1.17 would "
                "answer every request with 503 until it is back; left in, it serves until it "
                "stops)")


def _step(gateway: str, phase: str, ok: bool, action: str, detail: str,
          started: float, worker: str) -> dict[str, Any]:
    """One gateway's record of one phase for one worker URL (``upgrade --json``:
    ``replicas[].front_door``)."""
    return {"gateway": gateway, "worker": worker, "phase": phase, "ok": ok, "action": action,
            "detail": detail, "duration_s": round(time.monotonic() - started, 3)}


class FrontDoors:
    """The routers of the inventory's gateways, reached through the run's connections.

    Args:
        gateways: :func:`vllm_provision.transport.router.front_doors` of the inventory.
        connect: host name -> an open connection to that gateway host (the run lock's
            factory); may raise :class:`ProvisionError` (recorded as that gateway's failure).
    """

    def __init__(self, gateways: Sequence[Gateway], connect: Callable[[str], Any]) -> None:
        self.gateways = list(gateways)
        self.connect = connect

    def __bool__(self) -> bool:
        return bool(self.gateways)

    def _client(self, gateway: Gateway) -> router.RouterClient:
        return router.RouterClient(gateway, self.connect(gateway.host))

    def drain(self, url: str) -> list[dict[str, Any]]:
        """Take the worker ``url`` out of every router, one gateway after another (so two
        replicas of one batch never both count on the other as healthy). One record per
        gateway: ``action`` ``removed``, ``kept`` (its only healthy worker), ``absent`` (not in
        its list) or ``failed`` (``ok`` false; ``detail`` names host and step)."""
        out = []
        for gateway in self.gateways:
            started = time.monotonic()
            try:
                client = self._client(gateway)
                workers = client.workers()
                if url not in workers:
                    out.append(_step(gateway.host, "drain", True, "absent",
                                     "not in its worker list", started, url))
                elif router.only_healthy(url, workers):
                    out.append(_step(gateway.host, "drain", True, "kept", ONLY_HEALTHY,
                                     started, url))
                else:
                    out.append(_step(gateway.host, "drain", True, "removed",
                                     client.remove(url), started, url))
            except ProvisionError as exc:
                out.append(_step(gateway.host, "drain", False, "failed",
                                 " ".join(p.message for p in exc.problems)[:400], started, url))
        return out

    def undrain(self, url: str, drained: Sequence[dict[str, Any]],
                timeout_s: float = UNDRAIN_TIMEOUT_S) -> list[dict[str, Any]]:
        """Put ``url`` back on every router whose drain record (``drained``) says
        ``removed``, all gateways at once, and wait until each reports it healthy (at most
        ``timeout_s`` per gateway). One record per such gateway: ``action`` ``added`` (``ok``)
        or ``failed`` with the reason."""
        removed = [g for g in self.gateways
                   if any(d["gateway"] == g.host and d["action"] == "removed"
                          and d.get("worker", url) == url for d in drained)]

        def one(gateway: Gateway) -> dict[str, Any]:
            started = time.monotonic()
            try:
                client = self._client(gateway)
                said = client.add(url, timeout_s)
                while True:
                    seen = client.workers().get(url)
                    if seen is not None and seen.healthy:
                        return _step(gateway.host, "undrain", True, "added", said, started, url)
                    if time.monotonic() - started >= timeout_s:
                        return _step(gateway.host, "undrain", False, "failed",
                                     f"{gateway.host}: not reported healthy within "
                                     f"{timeout_s:g} s after {said!r}", started, url)
                    time.sleep(0.5)
            except ProvisionError as exc:
                return _step(gateway.host, "undrain", False, "failed",
                             " ".join(p.message for p in exc.problems)[:400], started, url)

        if not removed:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(removed))) as pool:
            return list(pool.map(one, removed))


def describe(step: dict[str, Any]) -> str:
    """One progress line: ``front door h1: removed`` or ``front door h1: failed (<why>)``."""
    if step["action"] in ("removed", "added", "absent"):
        return f"front door {step['gateway']}: {step['action']}"
    return f"front door {step['gateway']}: {step['action']} ({step['detail']})"
