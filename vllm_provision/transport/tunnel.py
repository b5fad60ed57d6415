"""Rank 0's HTTP API reached however the network allows: directly, or through rank 0's SSH
connection (``vllm_api_via``: ``auto``, ``direct``, ``ssh``; docs/deploy.md, "How the controller
reaches the API").

``direct``: the controller opens TCP connections to ``Replica.api_url`` itself. ``ssh``: every
HTTP connection is one forwarded TCP channel of the SSH connection the run already holds to rank
0 (RFC 4254 section 7.2, ``direct-tcpip``; paramiko ``Transport.open_channel``), to
``127.0.0.1`` on rank 0 when the API binds all interfaces or loopback; no process is started and
no port is opened on the controller, and a ProxyJump route (docs/hosts.md) carries it as it
carries the commands. ``auto`` (the default) tries the direct address from the controller once
(:func:`probe_direct`): a connection, or a refused one (reachable, nothing serving yet) means
``direct``; a timeout or an unreachable network means ``ssh``; an API bound to rank 0's loopback
means ``ssh`` without trying.

httpx carries both: :meth:`ApiRoute.client` gives an ``httpx.Client`` whose transport, for
``ssh``, is an httpcore connection pool over :class:`TunnelBackend` (httpcore's documented
custom network backend: ``ConnectionPool(network_backend=...)``, a ``NetworkBackend`` whose
``connect_tcp`` returns a ``NetworkStream``; httpcore 1.0 ``_backends/base.py``). Every caller
(readiness, verify, status, bench, fault, upgrade) gets its route from :func:`route_for`.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Replica

VIAS = ("auto", "direct", "ssh")
# Seconds the auto probe waits for the controller's TCP connect and for /health's first line.
PROBE_TIMEOUT_S = 2.0


def is_loopback(address: str) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ``::1``)."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def tunnel_destination(api_host: str) -> str:
    """Where a forwarded channel connects on rank 0: the bind address itself, but ``127.0.0.1``
    for an all-interfaces bind (``0.0.0.0``, empty) and ``localhost``, ``::1`` for ``::``."""
    if api_host in ("0.0.0.0", "") or api_host.lower() == "localhost":
        return "127.0.0.1"
    if api_host == "::":
        return "::1"
    return api_host


@dataclass(frozen=True)
class Choice:
    """The path chosen for one replica: ``via`` (``direct`` or ``ssh``), ``setting`` (the
    ``vllm_api_via`` value it came from) and ``reason`` (one sentence: what the probe saw)."""

    via: str
    setting: str
    reason: str


def probe_direct(address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S,
                 ) -> tuple[bool, str]:
    """Try ``address:port`` from the controller: ``(reachable, what was seen)``.

    A refused connection is reachable (a host answered: nothing serves yet, vLLM opens its port
    only when loaded); a timeout or an OS error (no route, network unreachable) is not. On a
    connection, ``GET /health`` is sent and its status line reported (not required).
    """
    try:
        sock = socket.create_connection((address, port), timeout=timeout_s)
    except ConnectionRefusedError:
        return True, "connection refused (the address is reachable; nothing serves yet)"
    except TimeoutError:
        return False, f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return False, exc.strerror or str(exc)
    with sock:
        try:
            sock.sendall(f"GET /health HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
            first = sock.recv(64).split(b"\r\n", 1)[0].decode("ascii", "replace")
        except OSError:
            first = ""
    parts = first.split()  # host output: only a numeric status code is shown
    if first.startswith("HTTP/") and len(parts) > 1 and parts[1].isdigit():
        return True, f"/health answered HTTP {parts[1]}"
    return True, "connected (no HTTP answer yet)"


def choose(api_host: str, address: str, port: int, setting: str,
           probe: Callable[[str, int, float], tuple[bool, str]] = probe_direct,
           timeout_s: float = PROBE_TIMEOUT_S, local: bool = False) -> Choice:
    """The path for an API bound to ``api_host`` and reached directly at ``address:port``.

    Args:
        api_host: ``vllm_api_host``. address: the direct URL's host. port: ``vllm_api_port``.
        setting: ``vllm_api_via`` (one of :data:`VIAS`, checked at inventory load).
        probe: :func:`probe_direct` (injected by tests). timeout_s: its timeout.
        local: rank 0 is the controller itself (its SSH address is loopback): its loopback is
            ours, so a loopback bind is probed like any other.
    """
    if setting in ("direct", "ssh"):
        return Choice(setting, setting, f"vllm_api_via: {setting}")
    if is_loopback(api_host) and not local:
        return Choice("ssh", setting, f"the API binds {api_host}, rank 0's loopback")
    reachable, seen = probe(address, port, timeout_s)
    if reachable:
        return Choice("direct", setting, f"{address}:{port} from the controller: {seen}")
    return Choice("ssh", setting, f"{address}:{port} not reachable from the controller: {seen}")


class ChannelStream:
    """An httpcore ``NetworkStream`` over one forwarded SSH channel (a paramiko ``Channel``, or
    any object with ``recv``, ``sendall``, ``settimeout``, ``close``: a socket in the tests).
    Timeouts map to httpcore's ``ReadTimeout``/``WriteTimeout``, other errors to
    ``ReadError``/``WriteError``, as httpcore's own ``SyncStream`` does."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Up to ``max_bytes`` bytes; ``b""`` at the end of the stream."""
        import httpcore

        try:
            self._channel.settimeout(timeout)
            return bytes(self._channel.recv(max_bytes))
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "read timed out") from exc
        except (OSError, EOFError) as exc:
            raise httpcore.ReadError(str(exc)) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Send all of ``buffer``."""
        import httpcore

        if not buffer:
            return
        try:
            self._channel.settimeout(timeout)
            self._channel.sendall(buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
        except (OSError, EOFError) as exc:
            raise httpcore.WriteError(str(exc)) from exc

    def close(self) -> None:
        """Close the channel (the SSH connection stays)."""
        self._channel.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> Any:
        """Not offered: vLLM's API is plain HTTP here (the SSH channel is the encryption)."""
        import httpcore

        raise httpcore.ConnectError("TLS through the SSH tunnel is not supported")

    def get_extra_info(self, info: str) -> Any:
        """``is_readable`` (httpcore asks it of an idle kept-alive connection: readable means
        the server closed it or sent something unasked): data waiting, EOF or a closed
        channel. Nothing else is known."""
        if info == "is_readable":
            channel = self._channel
            ready = getattr(channel, "recv_ready", None)
            return bool((ready() if ready is not None else False)
                        or getattr(channel, "eof_received", False)
                        or getattr(channel, "closed", False))
        return None


class TunnelBackend:
    """An httpcore ``NetworkBackend`` whose every TCP connection is one channel from ``opener``.

    Args:
        opener: ``opener(timeout_s) -> channel``: opens one forwarded channel to the API on rank
            0 (:meth:`~vllm_provision.transport.connection.HostConnection.open_forward`);
            raises ``TimeoutError`` when it could not within ``timeout_s``, ``ConnectionError``
            when rank 0 could not connect (refused: still loading), ``OSError`` otherwise.
        label: ``ssh via <host>``, in error messages.
    """

    def __init__(self, opener: Callable[[float | None], Any], label: str) -> None:
        self._opener = opener
        self.label = label

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None,
                    ) -> ChannelStream:
        """One forwarded channel; ``host``/``port`` of the URL are not used (the opener knows
        the destination on rank 0). Raises httpcore ``ConnectTimeout``/``ConnectError``."""
        import httpcore

        try:
            return ChannelStream(self._opener(timeout))
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"{self.label}: {exc}") from exc
        except (OSError, EOFError) as exc:
            raise httpcore.ConnectError(f"{self.label}: {exc}") from exc

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> ChannelStream:
        """Not offered (the API is TCP)."""
        import httpcore

        raise httpcore.ConnectError("no unix sockets through the SSH tunnel")

    def sleep(self, seconds: float) -> None:
        """As httpcore's sync backend."""
        import time

        time.sleep(seconds)


_SSL: list[Any] = []
_SSL_LOCK = threading.Lock()


def ssl_context() -> Any:
    """One default SSL context per process, shared by every client: httpx builds one per client
    otherwise (loading the CA bundle: about 0.1 s each, measured), and the API is plain HTTP."""
    with _SSL_LOCK:
        if not _SSL:
            import ssl

            _SSL.append(ssl.create_default_context())
        return _SSL[0]


def http_client(timeout: Any = 10.0, max_connections: int = 10, transport: Any = None) -> Any:
    """An ``httpx.Client`` (``timeout``: seconds or ``httpx.Timeout``; ``max_connections``
    concurrent connections; ``transport``: None for httpx's own TCP connections)."""
    import httpx

    if transport is not None:
        return httpx.Client(timeout=timeout, transport=transport)
    limits = httpx.Limits(max_connections=max_connections,
                          max_keepalive_connections=max_connections)
    return httpx.Client(timeout=timeout, limits=limits, verify=ssl_context())


def tunnel_transport(backend: TunnelBackend, max_connections: int = 10) -> Any:
    """An ``httpx.HTTPTransport`` whose pool opens its connections through ``backend``.

    httpx 0.28 builds its pool in ``HTTPTransport.__init__`` without a ``network_backend``
    argument; the pool is replaced by an equal ``httpcore.ConnectionPool`` given the backend
    (httpx ``_transports/default.py``), so httpx's request and exception mapping stay its own.
    """
    import httpcore
    import httpx

    class _Transport(httpx.HTTPTransport):
        def __init__(self) -> None:
            context = ssl_context()
            super().__init__(verify=context,
                             limits=httpx.Limits(max_connections=max_connections,
                                                 max_keepalive_connections=max_connections))
            # the same TLS context as a direct request (the operator's CA bundle): an https
            # API through the tunnel is verified like one reached directly
            self._pool = httpcore.ConnectionPool(
                ssl_context=context, max_connections=max_connections,
                max_keepalive_connections=max_connections, keepalive_expiry=5.0, http1=True,
                http2=False, network_backend=backend)

    return _Transport()


@dataclass(frozen=True)
class ApiRoute:
    """How the controller reaches one replica's API.

    Attributes:
        base_url: ``http://<host>:<port>`` (:attr:`Replica.api_url`; through SSH only the
            ``Host`` header and the messages read it).
        via: ``direct`` or ``ssh``. host: rank 0's inventory name. choice: why.
        opener: for ``ssh``, ``opener(timeout_s) -> channel`` (:class:`TunnelBackend`).
    """

    base_url: str
    via: str
    host: str
    choice: Choice
    opener: Callable[[float | None], Any] | None = field(default=None, compare=False,
                                                        repr=False)

    @property
    def describe(self) -> str:
        """``direct`` or ``ssh via <rank 0 host>``."""
        return "direct" if self.via == "direct" else f"ssh via {self.host}"

    def as_json(self) -> dict[str, str]:
        """``{"via", "host", "setting", "reason"}`` for ``--json``."""
        return {"via": self.via, "host": self.host, "setting": self.choice.setting,
                "reason": self.choice.reason}

    def transport(self, max_connections: int = 10) -> Any:
        """The httpx transport: None (httpx's own) for ``direct``, a tunnel for ``ssh``."""
        if self.via != "ssh" or self.opener is None:
            return None
        return tunnel_transport(TunnelBackend(self.opener, self.describe), max_connections)

    def client(self, timeout: Any = 10.0, max_connections: int = 10) -> Any:
        """An ``httpx.Client`` on this route (``timeout``: seconds or an ``httpx.Timeout``;
        ``max_connections``: concurrent connections, one channel each through SSH)."""
        return http_client(timeout, max_connections, self.transport(max_connections))


_CHOSEN: dict[tuple[str, str, str], Choice] = {}
_CHOSEN_LOCK = threading.Lock()


def api_via(replica: Replica) -> str:
    """The replica's ``vllm_api_via`` (rank 0's settings over the variables table's default,
    ``auto``)."""
    from vllm_provision import settings

    return str(settings.master_settings(replica)["vllm_api_via"])


def _address(replica: Replica) -> str:
    return replica.api_url.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")


def choice_for(replica: Replica, *, via: str | None = None,
               probe: Callable[[str, int, float], tuple[bool, str]] = probe_direct,
               fresh: bool = False) -> Choice:
    """The path to ``replica``'s API (:func:`choose`), probed once per replica, address and
    process for ``auto``: preflight's choice is the one readiness and verify of the same ``up``
    use; ``fresh`` probes again. ``via`` overrides ``vllm_api_via``; ``probe``: tests."""
    setting = via or api_via(replica)
    key = (replica.name, replica.api_url, setting)
    with _CHOSEN_LOCK:
        chosen = None if fresh else _CHOSEN.get(key)
    if chosen is None:
        chosen = choose(replica.engine.api_host, _address(replica), replica.engine.api_port,
                        setting, probe, local=is_loopback(replica.master.host.address))
        with _CHOSEN_LOCK:
            _CHOSEN[key] = chosen
    return chosen


def choices_for(replicas: Sequence[Replica], *, via: str | None = None,
                probe: Callable[[str, int, float], tuple[bool, str]] = probe_direct
                ) -> dict[str, Choice]:
    """:func:`choice_for` of every replica at once: replica name -> :class:`Choice`. The
    ``auto`` probes run side by side, so a fleet whose APIs the controller cannot reach waits
    one probe timeout (:data:`PROBE_TIMEOUT_S`), not one per replica."""
    if len(replicas) < 2:
        return {r.name: choice_for(r, via=via, probe=probe) for r in replicas}
    with ThreadPoolExecutor(max_workers=min(16, len(replicas))) as pool:
        chosen = list(pool.map(lambda r: choice_for(r, via=via, probe=probe), replicas))
    return {r.name: c for r, c in zip(replicas, chosen, strict=True)}


def describe_choice(replica: Replica, choice: Choice) -> str:
    """``direct`` or ``ssh via <rank 0 host>``: the words ``provision check`` prints."""
    return "direct" if choice.via == "direct" else f"ssh via {replica.master.name}"


def route_for(replica: Replica, connection: Any = None, *, via: str | None = None,
              probe: Callable[[str, int, float], tuple[bool, str]] = probe_direct,
              fresh: bool = False) -> ApiRoute:
    """The route to ``replica``'s API: the one function every caller uses.

    Args:
        replica: the replica. connection: rank 0's open connection (``HostConnection`` or a
            wrapper of it, anything with ``open_forward``), needed for ``ssh``.
        via, probe, fresh: as :func:`choice_for`.

    Raises:
        ProvisionError: ``ssh`` was chosen and no connection to rank 0 was given.
    """
    return _route(replica, replica.master, connection,
                  choice_for(replica, via=via, probe=probe, fresh=fresh))


def route_to_node(replica: Replica, node: Any, connection: Any = None) -> ApiRoute:
    """The route to ``node``'s own API server (every node of a hybrid data-parallel replica
    serves one, docs/serving.md), on the path chosen for the replica (:func:`choice_for`):
    direct to :meth:`Replica.node_api_url`, or a forwarded channel of ``connection`` (the run's
    connection to ``node``).

    Raises:
        ProvisionError: ``ssh`` was chosen and no connection to ``node`` was given.
    """
    return _route(replica, node, connection, choice_for(replica))


def _route(replica: Replica, node: Any, connection: Any, chosen: Choice) -> ApiRoute:
    """The route to ``node``'s API server on the path ``chosen``: direct to
    :meth:`Replica.node_api_url`, or a forwarded channel of ``connection`` (the run's connection
    to ``node``) to the API's bind address on the node."""
    url = replica.node_api_url(node)
    if chosen.via == "direct":
        return ApiRoute(url, "direct", node.name, chosen)
    forward = getattr(connection, "open_forward", None)
    if forward is None:
        who = "rank 0" if node.rank == 0 else node.name
        raise ProvisionError.single(
            node.name, f"{who}'s API is reached through SSH ({chosen.reason}), but there is no "
            f"SSH connection to {who} here", expected=f"an open connection to {who}",
            fix=f"check that {who} is reachable over SSH (provision status), or set "
                "vllm_api_via: direct")
    destination = tunnel_destination(replica.engine.api_host)
    port = replica.engine.api_port
    return ApiRoute(url, "ssh", node.name, chosen,
                    opener=lambda timeout: forward(destination, port, timeout))


def forget() -> None:
    """Forget every choice of this process (tests)."""
    with _CHOSEN_LOCK:
        _CHOSEN.clear()


__all__ = [
    "PROBE_TIMEOUT_S", "VIAS", "ApiRoute", "ChannelStream", "Choice", "TunnelBackend",
    "api_via", "choice_for", "choices_for", "choose", "describe_choice", "forget", "http_client",
    "is_loopback", "probe_direct", "route_for", "ssl_context", "tunnel_destination",
    "tunnel_transport",
]
