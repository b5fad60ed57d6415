"""The front door's HTTP API (vllm-router 0.1.17 on the hosts of ``vllm_gateways``), reached
from the controller through the gateway host's SSH connection (docs/front-door.md).

The controller never assumes it can reach the gateway port: every request is one forwarded
TCP channel of the gateway host's SSH connection (``direct-tcpip``, as ``vllm_api_via: ssh``
reaches rank 0's API: :mod:`vllm_provision.transport.tunnel`) to the router's own address on
that host (:attr:`~vllm_provision.inventory.gateways.Gateway.local_host`); a connection without
forwarding (the controller itself) is reached directly.

The routes and their answers, seen by running the router's wheel
(``vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl``, routes in its Rust extension
``vllm_router_rs.abi3.so``) against small HTTP workers; docs/front-door.md, "What the router
offers":

- ``GET /workers``: ``{"workers": [{"url", "is_healthy", "load", ...}], "total", "stats"}``;
  ``load`` is the router's requests in flight to that worker.
- ``POST /remove_worker?url=U``: 200 ``Successfully removed worker: U``, also for a URL it does
  not hold (it logs "not found, skipping removal"); it removes the last worker too (every
  request then gets 503 ``No available workers``). A removed worker stays out: the health
  checks never add it back; a restart of the router does (``--worker-urls``).
- ``POST /add_worker?url=U``: waits until U answers its health check (up to
  ``--worker-startup-timeout-secs``), then 200 ``Successfully added worker: U``; 400
  ``Worker U already exists``; 400 ``Timeout ...`` when U never became healthy. A client that
  gives up cancels the addition.
- A GET of either change route: 405.

:func:`parse_workers`, :func:`replica_view` and :func:`only_healthy` are pure and unit tested;
:class:`RouterClient` and :func:`read_front_doors` do the I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.text import printable
from vllm_provision.inventory.gateways import Gateway, front_doors

# The answer of POST /add_worker for a worker the router already holds (vllm-router 0.1.17).
ALREADY_EXISTS = "already exists"
# Seconds one read or removal may take (the router answers at once; SSH adds a round trip).
REQUEST_TIMEOUT_S = 10.0

# A replica as one front door sees it (status --json: front_door.<host>.state).
HEALTHY, UNHEALTHY, ABSENT, UNKNOWN = "healthy", "unhealthy", "absent", "unknown"


@dataclass(frozen=True)
class WorkerView:
    """One worker as ``GET /workers`` reports it: its ``url``, ``healthy`` (``is_healthy``)
    and ``load`` (the router's requests in flight to it; None when not a number)."""

    url: str
    healthy: bool
    load: int | None

    def to_json(self) -> dict[str, Any]:
        """``{"url", "is_healthy", "load"}``: the router's own names."""
        return {"url": self.url, "is_healthy": self.healthy, "load": self.load}


def parse_workers(body: str) -> dict[str, WorkerView]:
    """The workers of a ``GET /workers`` answer, by URL, in the router's order.

    Args:
        body: the answer's text: ``{"workers": [{"url": str, "is_healthy": bool, "load": int,
            ...}, ...], ...}`` (vllm-router 0.1.17).

    Raises:
        ValueError: not JSON, or not that shape (the message says what was found).
    """
    document = json.loads(body)
    items = document.get("workers") if isinstance(document, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"no list 'workers' in {body[:200]!r}")
    found: dict[str, WorkerView] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            raise ValueError(f"a worker without a url: {str(item)[:200]!r}")
        load = item.get("load")
        found[item["url"]] = WorkerView(item["url"], item.get("is_healthy") is True,
                                        load if isinstance(load, int)
                                        and not isinstance(load, bool) else None)
    return found


@dataclass(frozen=True)
class GatewayRead:
    """What one front door answered: ``host`` (the gateway's inventory name), ``url`` (the
    router's address on that host), ``workers`` (:func:`parse_workers`, None when it could not
    be read) and ``error`` (one line naming the host, or None)."""

    host: str
    url: str
    workers: dict[str, WorkerView] | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``status --json``'s ``gateways.<host>``: ``url``, ``error``, ``workers``."""
        return {"url": self.url, "error": self.error,
                "workers": [w.to_json() for w in (self.workers or {}).values()]}


def replica_view(api_url: str, reads: Mapping[str, GatewayRead]) -> dict[str, dict[str, Any]]:
    """What each front door thinks of one replica: gateway host -> ``{"state", "load",
    "error"}``, ``state`` one of ``healthy``, ``unhealthy``, ``absent`` (not in its worker
    list: removed, or an older list) and ``unknown`` (the router could not be read: ``error``
    says why). Pure.

    Args:
        api_url: the replica's rank-0 API base URL (``Replica.api_url``, the worker URL the
            unit gives the router). reads: :func:`read_front_doors`.
    """
    view: dict[str, dict[str, Any]] = {}
    for host, read in reads.items():
        if read.workers is None:
            view[host] = {"state": UNKNOWN, "load": None, "error": read.error}
            continue
        worker = read.workers.get(api_url)
        if worker is None:
            view[host] = {"state": ABSENT, "load": None, "error": None}
        else:
            view[host] = {"state": HEALTHY if worker.healthy else UNHEALTHY,
                          "load": worker.load, "error": None}
    return view


def describe_view(host: str, seen: Mapping[str, Any]) -> str:
    """One line of ``provision status``: ``front door h1: healthy (load 0)``,
    ``front door h1: absent`` or ``front door h1: unknown (<why>)``."""
    state = seen["state"]
    if state in (HEALTHY, UNHEALTHY) and seen.get("load") is not None:
        return f"front door {host}: {state} (load {seen['load']})"
    if state == UNKNOWN:
        return f"front door {host}: {state} ({seen.get('error') or 'no answer'})"
    return f"front door {host}: {state}"


def only_healthy(url: str, workers: Mapping[str, WorkerView]) -> bool:
    """Whether removing ``url`` would leave the router no healthy worker: no other worker it
    holds is healthy (vllm-router 0.1.17 removes the last one too and then answers every
    request with 503, ``No available workers``). Pure."""
    return not any(w.healthy for u, w in workers.items() if u != url)


class RouterClient:
    """The router of one gateway host, through that host's connection.

    Args:
        gateway: the host's :class:`~vllm_provision.inventory.gateways.Gateway`.
        connection: the gateway host's open connection (anything with ``open_forward``, as
            :class:`~vllm_provision.transport.connection.HostConnection`); one without it (the
            controller's own) is reached directly.
    """

    def __init__(self, gateway: Gateway, connection: Any) -> None:
        self.gateway = gateway
        self.connection = connection

    @property
    def url(self) -> str:
        """The router's base URL as its host reaches it (``http://127.0.0.1:30000``)."""
        return self.gateway.local_url

    def _client(self, timeout_s: float) -> Any:
        from vllm_provision.transport.tunnel import (
            TunnelBackend,
            http_client,
            tunnel_transport,
        )

        forward = getattr(self.connection, "open_forward", None)
        if forward is None:
            return http_client(timeout_s)
        host, port = self.gateway.local_host, self.gateway.port
        backend = TunnelBackend(lambda timeout: forward(host, port, timeout),
                                f"ssh via {self.gateway.host}")
        return http_client(timeout_s, 2, tunnel_transport(backend, 2))

    def _call(self, method: str, path: str, timeout_s: float,
              url: str | None = None) -> tuple[int, str]:
        """``(status, text)`` of one request; ``params`` carries ``url`` as data (percent-encoded
        by httpx, never pasted into the path).

        Raises:
            ProvisionError: no answer (named by host and route).
        """
        import httpx

        try:
            with self._client(timeout_s) as client:
                response = client.request(method, self.url + path,
                                          params={"url": url} if url is not None else None)
                return int(response.status_code), response.content[:1 << 20].decode(
                    "utf-8", "replace")
        except (httpx.HTTPError, OSError) as exc:
            raise ProvisionError.single(
                self.gateway.host, f"the front door at {self.url} (on {self.gateway.host}, "
                f"through its SSH connection) did not answer {method} {path}: "
                f"{printable(' '.join(str(exc).split()))[:300] or type(exc).__name__}",
                fix=f"check vllm-gateway.service on {self.gateway.host} "
                    "(provision logs, systemctl status)") from None

    def workers(self, timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, WorkerView]:
        """``GET /workers``, parsed (:func:`parse_workers`).

        Raises:
            ProvisionError: no answer, a status other than 200, or an answer of another shape
                (each naming the gateway host).
        """
        status, text = self._call("GET", "/workers", timeout_s)
        if status != 200:
            raise self._refused("GET /workers", status, text)
        try:
            return parse_workers(text)
        except ValueError as exc:
            raise ProvisionError.single(self.gateway.host, "the front door's GET /workers "
                                        f"answered an unknown shape: {printable(str(exc))}",
                                        expected="vllm-router 0.1.17's worker list") from None

    def remove(self, worker: str, timeout_s: float = REQUEST_TIMEOUT_S) -> str:
        """``POST /remove_worker?url=<worker>``: new requests stop going to ``worker``
        (requests in flight end where they run). Returns the router's answer.

        Raises:
            ProvisionError: no answer or a status other than 200 (naming host and worker).
        """
        status, text = self._call("POST", "/remove_worker", timeout_s, worker)
        if status != 200:
            raise self._refused(f"POST /remove_worker?url={worker}", status, text)
        return text.strip()

    def add(self, worker: str, timeout_s: float) -> str:
        """``POST /add_worker?url=<worker>``: the router waits until ``worker`` passes a health
        check, then sends to it; a worker it already holds is no error (400 ``already
        exists``). Returns the router's answer.

        Args:
            timeout_s: how long to wait for the answer (giving up cancels the addition).

        Raises:
            ProvisionError: no answer within ``timeout_s``, or a refusal other than
                ``already exists`` (naming host and worker).
        """
        status, text = self._call("POST", "/add_worker", timeout_s, worker)
        if status == 200 or (status == 400 and ALREADY_EXISTS in text):
            return text.strip()
        raise self._refused(f"POST /add_worker?url={worker}", status, text)

    def _refused(self, what: str, status: int, text: str) -> ProvisionError:
        return ProvisionError.single(
            self.gateway.host, f"the front door on {self.gateway.host} answered {what} with "
            f"HTTP {status}: {printable(' '.join(text.split()))[:300]}",
            expected="HTTP 200 (vllm-router 0.1.17)")


def read_front_doors(gateways: Sequence[Gateway], connections: Mapping[str, Any],
                     errors: Mapping[str, str] | None = None,
                     timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, GatewayRead]:
    """``GET /workers`` of every front door at once: gateway host -> :class:`GatewayRead`.
    Never raises for one gateway's failure: its read holds the error and the others are read
    as usual.

    Args:
        gateways: :func:`front_doors`. connections: host name -> open connection.
        errors: host name -> one-line reason, for hosts whose connection did not open.
        timeout_s: seconds per request.
    """
    def one(gateway: Gateway) -> GatewayRead:
        url = gateway.local_url
        if gateway.host not in connections:
            reason = (errors or {}).get(gateway.host) or f"{gateway.host}: no connection"
            return GatewayRead(gateway.host, url, None, reason)
        try:
            found = RouterClient(gateway, connections[gateway.host]).workers(timeout_s)
        except ProvisionError as exc:
            return GatewayRead(gateway.host, url, None,
                               " ".join(p.message for p in exc.problems)[:400])
        return GatewayRead(gateway.host, url, found)

    if not gateways:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(gateways))) as pool:
        return {read.host: read for read in pool.map(one, gateways)}


__all__ = [
    "ABSENT", "ALREADY_EXISTS", "HEALTHY", "UNHEALTHY", "UNKNOWN", "Gateway", "GatewayRead",
    "RouterClient", "WorkerView", "describe_view", "front_doors", "only_healthy",
    "parse_workers", "read_front_doors", "replica_view",
]
