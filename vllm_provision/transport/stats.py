"""Connection statistics: what the connection layer sent, per host, for the whole process.

:data:`STATS` is counted by :class:`~vllm_provision.transport.connection.HostConnection` itself;
``provision -vv`` prints it after a run and ``--json`` puts it under ``stats``
(``vllm_provision.output.report``; docs/engine.md).
"""

from __future__ import annotations

import threading

# Round trips of one remote command after the connection is open, as
# :meth:`~vllm_provision.transport.connection.HostConnection._exec` waits for them: the channel
# open confirmation, the reply to the exec request (paramiko sends it with want-reply and waits,
# ``Channel.exec_command``), and the end of the output (exit status, EOF). Standard input is sent
# without waiting. RFC 4254 sections 5.1, 6.5, 6.10.
COMMAND_ROUND_TRIPS = 3
# A channel started and left open (:meth:`HostConnection.start`): open confirmation + exec reply.
START_ROUND_TRIPS = 2


class ConnectionStats:
    """Counters of what the connection layer sent, per host, for the whole process.

    Kept by :class:`~vllm_provision.transport.connection.HostConnection` itself (not by its
    callers), so every command counts, a module's, the runner's, the run lock's or a fact
    probe's. Per host name:

    - ``connects``: SSH connections opened (handshake and authentication done);
    - ``commands``: remote commands sent (one exec channel each);
    - ``round_trips``: the waits on the host those commands cost after connecting
      (:data:`COMMAND_ROUND_TRIPS` per command, :data:`START_ROUND_TRIPS` per started channel,
      1 per exchange); the connect handshake is not included (TCP, key exchange and
      authentication take about 4 more, RFC 4253 section 7 and RFC 4252);
    - ``exchanges``: short reads sent over the run lock's channel, already open
      (``RunLock.exchange`` in ``vllm_provision.transport.runlock``): no channel of their own,
      one round trip each.

    Thread-safe. ``provision -vv`` prints them at the end of a run, ``--json`` puts
    :meth:`snapshot` under ``stats``.
    """

    KEYS = ("connects", "commands", "round_trips", "exchanges")

    def __init__(self) -> None:
        """Start with no host counted."""
        self._lock = threading.Lock()
        self._hosts: dict[str, dict[str, int]] = {}

    def add(self, host: str, *, connects: int = 0, commands: int = 0,
            round_trips: int = 0, exchanges: int = 0) -> None:
        """Add to ``host``'s counters (ints >= 0)."""
        with self._lock:
            counts = self._hosts.setdefault(host, dict.fromkeys(self.KEYS, 0))
            counts["connects"] += connects
            counts["commands"] += commands
            counts["round_trips"] += round_trips
            counts["exchanges"] += exchanges

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Return ``{host: {"connects", "commands", "round_trips", "exchanges"}}``, hosts in
        first-use order (a copy)."""
        with self._lock:
            return {host: dict(counts) for host, counts in self._hosts.items()}

    def reset(self) -> None:
        """Forget every count (tests, or a caller measuring one step)."""
        with self._lock:
            self._hosts.clear()


#: the process's counters (one CLI command per process)
STATS = ConnectionStats()


__all__ = ["COMMAND_ROUND_TRIPS", "START_ROUND_TRIPS", "STATS", "ConnectionStats"]
