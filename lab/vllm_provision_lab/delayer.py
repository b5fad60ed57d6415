"""Userspace one-way packet delay through an nfnetlink queue, for kernels without sch_netem.

Run it in the network namespace whose traffic it delays (``ip netns exec NS python3 -I
delayer.py --queue 1 --delay-ms 20``) next to an iptables rule ``-j NFQUEUE --queue-num 1
--queue-bypass``. It holds every queued packet for the delay, then accepts it; packets leave in
arrival order (constant delay), so TCP sees no reordering. Standard library only, because it runs
with a bare interpreter (``-I``); needs CAP_NET_ADMIN in that namespace.

Protocol: netlink(7) and the nfnetlink_queue messages of include/uapi/linux/netfilter/
nfnetlink_queue.h (NFQNL_MSG_CONFIG to bind, NFQNL_MSG_PACKET in, NFQNL_MSG_VERDICT out).
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1  # the kernel sends headers only: we never read packet bytes
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id


def netlink_attribute(kind: int, payload: bytes) -> bytes:
    """Encode one netlink attribute (length, type, payload padded to 4 bytes)."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def packet_ids(data: bytes) -> Iterator[int]:
    """Yield the packet id of every NFQNL_MSG_PACKET message in one netlink datagram."""
    offset = 0
    while offset + NLMSG_HEADER.size <= len(data):
        length, kind, _flags, _seq, _port = NLMSG_HEADER.unpack_from(data, offset)
        if length < NLMSG_HEADER.size:
            return
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            attribute = offset + NLMSG_HEADER.size + 4  # after nlmsghdr and nfgenmsg
            while attribute + 4 <= offset + length:
                attribute_length, attribute_kind = struct.unpack_from("=HH", data, attribute)
                if attribute_length < 4:
                    break
                if attribute_kind & 0x7FFF == NFQA_PACKET_HDR:
                    yield struct.unpack_from("!I", data, attribute + 4)[0]
                attribute += (attribute_length + 3) & ~3
        offset += (length + 3) & ~3


class Queue:
    """One bound nfnetlink queue: receive packet ids, send accept verdicts."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.sequence = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))

    def send(self, kind: int, attributes: list[bytes], flags: int = NLM_F_REQUEST) -> None:
        """Send one nfnetlink_queue message with ``attributes``."""
        self.sequence += 1
        body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(self.number))
        body += b"".join(attributes)
        header = NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind,
                                   flags, self.sequence, 0)
        self.sock.send(header + body)

    def bind(self) -> None:
        """Bind to the queue (IPv4), copy metadata only, allow 65536 queued packets.

        Raises:
            OSError: the kernel refused (no CAP_NET_ADMIN, or the queue is taken).
        """
        command = netlink_attribute(NFQA_CFG_CMD,
                                    struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
        self.send(NFQNL_MSG_CONFIG, [command], NLM_F_REQUEST | NLM_F_ACK)
        self._expect_ack()
        params = netlink_attribute(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        maxlen = netlink_attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536))
        self.send(NFQNL_MSG_CONFIG, [params, maxlen], NLM_F_REQUEST | NLM_F_ACK)
        self._expect_ack()

    def _expect_ack(self) -> None:
        data = self.sock.recv(65536)
        _length, kind = struct.unpack_from("=IH", data, 0)
        if kind == NLMSG_ERROR:
            error = struct.unpack_from("=i", data, NLMSG_HEADER.size)[0]
            if error:
                raise OSError(-error, f"nfqueue config: {os.strerror(-error)}")

    def accept(self, packet_id: int) -> None:
        """Let the packet ``packet_id`` go on."""
        self.send(NFQNL_MSG_VERDICT,
                  [netlink_attribute(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))])


def serve(queue: Queue, delay_s: float) -> None:
    """Hold each packet for ``delay_s`` seconds, then accept it, until SIGTERM."""
    pending: collections.deque[tuple[float, int]] = collections.deque()
    try:
        while True:
            timeout = max(0.0, pending[0][0] - time.monotonic()) if pending else None
            readable, _, _ = select.select([queue.sock], [], [], timeout)
            if readable:
                try:
                    data = queue.sock.recv(1 << 16)
                except OSError as error:  # ENOBUFS: the kernel dropped notifications; go on
                    print(f"delayer: recv: {error}", file=sys.stderr, flush=True)
                    continue
                release_at = time.monotonic() + delay_s
                pending.extend((release_at, packet_id) for packet_id in packet_ids(data))
            now = time.monotonic()
            while pending and pending[0][0] <= now:
                queue.accept(pending.popleft()[1])
    finally:
        while pending:  # never strand packets on exit
            queue.accept(pending.popleft()[1])


def main(argv: list[str] | None = None) -> int:
    """Parse ``--queue N --delay-ms MS [--pidfile FILE]``, bind, then delay until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, required=True, help="nfnetlink queue number")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay in ms")
    parser.add_argument("--pidfile", help="written once the queue is bound")
    args = parser.parse_args(argv)
    queue = Queue(args.queue)
    queue.bind()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.pidfile:
        with open(args.pidfile, "w") as handle:
            handle.write(f"{os.getpid()}\n")
    print(f"delayer: queue {args.queue}, +{args.delay_ms} ms, pid {os.getpid()}", flush=True)
    serve(queue, args.delay_ms / 1000.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
