"""Multi-node mp executor of the stand-in: rank 0's rendezvous, the headless node's worker.

Real vLLM (``--nnodes N --node-rank R --master-addr A --master-port P``): rank 0 hosts the
torch.distributed TCPStore on ``A:P`` (all interfaces); every other node connects to it
(vllm/distributed/parallel_state.py). Measured failure behaviour reproduced here
(docs/measured.md, "vLLM mp: failed starts and stops" and "vLLM mp: a node dies"; vLLM 0.32.0):

* rank 0 waiting for peers has no HTTP port and ignores SIGTERM;
* a vLLM/torch/NCCL mismatch hangs the group (like NCCL init) until the init timeout;
* rank 0 notices a dead peer only at the next request: that request gets a 500 and rank 0 exits
  with status 0 about a second later; ``/health`` says 200 until then;
* the headless node's worker ignores SIGTERM and outlives a ``kill -9`` of its parent;
* a headless node whose rank 0 died stays up indefinitely;
* a frozen headless node (SIGSTOP: alive, connection open, never answers): every engine step
  needs every rank (TP/PP across nodes), so rank 0's requests hang with ``/health`` 200 until
  the collective timeout (the torch.distributed timeout, ``init_timeout_s``), as a hung NCCL or
  gloo collective does; then torch's watchdog line, and the engine dies as with a dead peer.

Data parallel over nodes (``--data-parallel-size`` with ``--data-parallel-size-local`` below
it) meets the same way, on ``--data-parallel-address``:``--data-parallel-rpc-port``
(:class:`~.args.ServeConfig`): as a mixture-of-experts model's engines, which run their steps in
lockstep (``DPEngineCoreProc`` all-reduces the unfinished-requests flag over the data-parallel
group, vllm/v1/engine/core.py; a dense model's engines are independent, not reproduced here),
a dead engine fails the others' next step as a dead TP/PP peer does;
a headless member whose rank 0 died stays up (vllm-project/vllm#32136). A hybrid member
(``--data-parallel-hybrid-lb``) serves HTTP for its own engines (:class:`HybridMember`): its
next request after rank 0 is gone gets a 500 and it exits, as rank 0 does for a dead peer.

Wire protocol (lab only): newline-delimited JSON; hello -> go -> loaded -> step/ok.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from .args import ServeConfig
from .common import (
    check_free_memory,
    log,
    register_compute_app,
    startup_phases,
    versions,
    visible_gpus,
)
from .server import EngineDead


def init_timeout_s(config: ServeConfig, spec: dict[str, Any]) -> float:
    """Return the init timeout, seconds: ``--distributed-timeout-seconds`` or the spec's."""
    if config.distributed_timeout_s:
        return float(config.distributed_timeout_s)
    return float(spec["init_timeout_s"])


def watchdog_timeout_message(rank: int, timeout_s: float) -> str:
    """Return the line torch's NCCL watchdog prints when a collective never completes."""
    ms = int(timeout_s * 1000)
    return (f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
            f"OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)={ms}) ran for {ms} "
            "milliseconds before timing out.")


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _read_line(reader: Any) -> dict[str, Any]:
    line = reader.readline()
    if not line:
        raise ConnectionError("Connection closed by peer")
    return json.loads(line)


class Master:
    """Rank 0 of a multi-node mp replica: waits for every node, then drives them per request."""

    def __init__(self, config: ServeConfig, spec: dict[str, Any]) -> None:
        self.config, self.spec = config, spec
        self.peers: dict[int, tuple[socket.socket, Any]] = {}
        self.lock = threading.Lock()
        self.steps = 0

    def rendezvous(self) -> None:
        """Block until every node joined with the same versions, then load with them.

        SIGTERM is ignored meanwhile (measured). Raises TimeoutError after the init timeout
        (a peer that never came, or a version mismatch that makes NCCL init hang).
        """
        config = self.config
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        timeout_s = init_timeout_s(config, self.spec)
        deadline = time.monotonic() + timeout_s
        mine = versions(self.spec)
        server = socket.create_server(("0.0.0.0", config.master_port))
        log("INFO", "parallel_state.py:1", f"world_size={config.world_size} rank=0 local_rank=0 "
            f"distributed_init_method=tcp://{config.master_addr}:{config.master_port} "
            "backend=nccl")
        hanging = False
        while len(self.peers) < config.nnodes - 1 or hanging:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(watchdog_timeout_message(0, timeout_s))
            server.settimeout(min(remaining, 1.0))
            try:
                sock, address = server.accept()
            except (socket.timeout, TimeoutError):  # noqa: UP041 (distinct before Python 3.10)
                continue
            sock.settimeout(10)
            reader = sock.makefile("r")
            try:
                hello = _read_line(reader)
            except (OSError, ValueError):
                sock.close()
                continue
            sock.settimeout(None)
            rank = int(hello.get("node_rank", -1))
            self.peers[rank] = (sock, reader)
            if (hello.get("versions") != mine or hello.get("world_size") != config.world_size
                    or not 0 < rank < config.nnodes):
                hanging = True  # NCCL init never completes; nothing is logged, as with NCCL
            log("DEBUG", "parallel_state.py:1", f"node {rank} joined from {address[0]}")
        server.close()
        for sock, _ in self.peers.values():
            _send(sock, {"go": True})
        load(self.spec, config, "rank 0")
        for rank, (sock, reader) in self.peers.items():
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            if _read_line(reader).get("loaded") is not True:
                raise TimeoutError(watchdog_timeout_message(rank, timeout_s))
            sock.settimeout(None)
        signal.signal(signal.SIGTERM, previous)

    def step(self) -> None:
        """Run one engine step on every node; raise EngineDead when a node is gone.

        A node that is alive but does not answer (frozen) blocks the step, and with it every
        request, for the collective timeout; a closed connection (dead node) fails at once.
        """
        timeout_s = init_timeout_s(self.config, self.spec)
        with self.lock:
            self.steps += 1
            for rank, (sock, reader) in self.peers.items():
                try:
                    sock.settimeout(timeout_s)
                    _send(sock, {"step": self.steps})
                    _read_line(reader)
                except (socket.timeout, TimeoutError) as exc:  # noqa: UP041 (Python 3.9)
                    message = watchdog_timeout_message(rank * self.config.local_world_size,
                                                       timeout_s)
                    log("ERROR", "ProcessGroupNCCL.cpp:1", message)
                    raise EngineDead(f"RuntimeError: {message} [node {rank}]") from exc
                except (OSError, ValueError) as exc:
                    raise EngineDead(f"RuntimeError: [gloo/transport/tcp/pair.cc:553] {exc} "
                                     f"[node {rank}]") from exc


class HybridMember:
    """A hybrid data-parallel node other than rank 0: joins rank 0 as a headless node does,
    answers its steps on a thread, and serves its own HTTP requests while rank 0 is there."""

    def __init__(self, config: ServeConfig, spec: dict[str, Any]) -> None:
        self.config, self.spec = config, spec
        self.sock: socket.socket | None = None
        self.gone = threading.Event()

    def join(self) -> None:
        """Connect to rank 0 (retrying until the init timeout), say hello, wait for go, load.

        Raises:
            TimeoutError: rank 0 never came, or never said go (a version mismatch).
        """
        config = self.config
        timeout_s = init_timeout_s(config, self.spec)
        deadline = time.monotonic() + timeout_s
        log("INFO", "core.py:1", f"Data parallel node {config.node_rank}: connecting to the "
            f"front end at {config.master_addr}:{config.master_port}")
        while self.sock is None:
            try:
                self.sock = socket.create_connection((config.master_addr, config.master_port),
                                                     timeout=5)
            except OSError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"Did not receive response from front-end process "
                                       f"within {int(timeout_s)} seconds") from None
                time.sleep(1)
        sock = self.sock
        reader = sock.makefile("r")
        _send(sock, {"node_rank": config.node_rank, "versions": versions(self.spec),
                     "world_size": config.world_size, "nnodes": config.nnodes})
        try:
            sock.settimeout(max(1.0, deadline - time.monotonic()))
            _read_line(reader)
            sock.settimeout(None)
        except (OSError, ValueError):
            raise TimeoutError(watchdog_timeout_message(config.node_rank, timeout_s)) from None
        load(self.spec, config, f"node {config.node_rank}")
        _send(sock, {"loaded": True})
        threading.Thread(target=self._answer, args=(reader,), daemon=True).start()

    def _answer(self, reader: Any) -> None:
        assert self.sock is not None
        while True:
            try:
                message = _read_line(reader)
                _send(self.sock, {"ok": message.get("step")})
            except (OSError, ValueError):
                log("ERROR", "core.py:1", "RuntimeError: [gloo/transport/tcp/pair.cc:553] "
                    "Connection closed by peer: data parallel rank 0 is gone")
                self.gone.set()
                return

    def step(self) -> None:
        """One step of this node's engines: fails once rank 0 is gone (the group's all-reduce).

        Raises:
            EngineDead: rank 0's connection closed.
        """
        if self.gone.is_set():
            raise EngineDead("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection "
                             "closed by peer [data parallel rank 0]")


def load(spec: dict[str, Any], config: ServeConfig, who: str) -> None:
    """'Load the weights': check GPU memory, show up in nvidia-smi, then go through vLLM's
    start-up phases in ``load_s`` seconds in all, printing vLLM 0.32's lines at each
    (:func:`.common.startup_phases`)."""
    gpus = visible_gpus(config.local_world_size, spec)
    check_free_memory(spec, gpus, config.gpu_memory_utilization)
    used = int(config.gpu_memory_utilization * int(spec["gpu_memory_mib"]))
    register_compute_app(gpus, used, "VLLM::Worker")
    startup_phases(spec, config.model, config.max_model_len, first_rank=who == "rank 0")


def run_headless(config: ServeConfig, spec: dict[str, Any]) -> int:
    """Run a headless node: a main process supervising one worker process; return exit status.

    The worker ignores SIGTERM and stops only when the main process tells it to, so it outlives
    a ``kill -9`` of the main process (measured on vLLM 0.32.0).
    """
    log("INFO", "serve.py:1", f"Launching vLLM (v{spec['vllm']}) headless multiproc executor, "
        f"with head node address {config.master_addr}:{config.master_port} for "
        "torch.distributed process group.")
    parent_end, child_end = multiprocessing.Pipe()
    worker = multiprocessing.get_context("fork").Process(
        target=_worker_main, args=(config, spec, child_end), name="VllmWorker")
    worker.start()

    def stop(signum: int, frame: Any) -> None:
        log("INFO", "multiproc_executor.py:1", "Shutting down the headless node")
        # measured: a healthy headless node takes 4-6 s to stop (docs/real-vllm.md)
        time.sleep(float(spec.get("stop_s", 0.0)))
        try:
            parent_end.send("stop")
        except OSError:
            pass
        worker.join(10)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.join()
    return 0 if worker.exitcode == 0 else 1


def _worker_main(config: ServeConfig, spec: dict[str, Any], parent: Connection) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os._exit(worker_loop(config, spec, parent))


def worker_loop(config: ServeConfig, spec: dict[str, Any], parent: Connection) -> int:
    """Connect to rank 0, join, load, answer steps; return the exit status."""
    timeout_s = init_timeout_s(config, spec)
    deadline = time.monotonic() + timeout_s
    sock = None
    last_warning = 0.0
    while sock is None:
        try:
            sock = socket.create_connection((config.master_addr, config.master_port), timeout=5)
        except OSError as exc:
            if time.monotonic() >= deadline:
                log("ERROR", "socket.cpp:1", f"The client socket has timed out after "
                    f"{int(timeout_s)}s while trying to connect to ({config.master_addr}, "
                    f"{config.master_port}).")
                return 1
            if time.monotonic() - last_warning > 10:
                log("WARNING", "socket.cpp:1", f"The client socket has failed to connect to "
                    f"[{config.master_addr}]:{config.master_port} ({exc}).")
                last_warning = time.monotonic()
            time.sleep(1)
    reader = sock.makefile("r")
    _send(sock, {"node_rank": config.node_rank, "versions": versions(spec),
                 "world_size": config.world_size, "nnodes": config.nnodes})
    try:
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        _read_line(reader)  # "go": never comes while the versions differ
        sock.settimeout(None)
    except (OSError, ValueError):
        log("ERROR", "ProcessGroupNCCL.cpp:1",
            watchdog_timeout_message(config.node_rank * config.local_world_size, timeout_s))
        return 1
    try:
        load(spec, config, f"node {config.node_rank}")
    except ValueError as exc:
        log("ERROR", "gpu_worker.py:1", f"ValueError: {exc}")
        return 1
    _send(sock, {"loaded": True})
    watched: list[Any] = [sock, parent]
    while True:
        ready, _, _ = select.select(watched, [], [])
        if parent in ready:
            try:
                if parent.recv() == "stop":
                    return 0
            except (EOFError, OSError):
                watched.remove(parent)  # parent killed: keep serving as an orphan
        if sock in ready:
            try:
                message = _read_line(reader)
                _send(sock, {"ok": message.get("step")})
            except (OSError, ValueError):
                log("ERROR", "multiproc_executor.py:1", "RuntimeError: [gloo/transport/tcp/"
                    "pair.cc:553] Connection closed by peer: the head node is gone")
                watched.remove(sock)  # stays up indefinitely, as measured
                if not watched:
                    while True:
                        time.sleep(3600)
