"""``provision fabric``: measure the link between every pair of a replica's nodes.

For each pair (lower rank ``a``, higher rank ``b``), over the cluster network (each node's
``vllm_host_ip``), with only what the nodes have (their ``python3`` and ``ip``):

1. ``b`` listens on ``--port`` for one connection, bounded by ``timeout`` (coreutils) so
   nothing stays running; ``a`` connects (retrying while ``b`` starts).
2. Round-trip time: :data:`RTT_ROUNDS` one-byte ping-pongs; minimum and median, in ms.
3. TCP throughput: ``a`` sends 1 MiB writes for ``--seconds``; ``b`` counts what it received
   from the first byte to the end of the stream and reports it, so the figure is the
   receiver's (what crossed the link), in Gb/s of payload.
4. Each end reads the link it sends on: the interface holding its address (or
   ``vllm_cluster_interface``), its ``/sys/class/net/<if>/speed`` (Mb/s) and MTU.
5. Verdict: below ``min_ratio`` (default 0.5) of the slower end's rated speed is a warning
   that names the likely causes in order (:func:`causes`); an unknown rate (a virtual link
   without a speed) gives the figures without a verdict.

One TCP stream from Python does not fill a 100 Gb/s link (about 10 to 40 Gb/s on one core,
depending on the CPU): the verdict is a floor that catches a link running at a fraction of its
rate (a wrong MTU, a 1 Gb/s port, a shaped or congested path), not a replacement for
nccl-tests. That is the collective's part (:func:`collective`): after the pairs, every node at
once runs ``torch.distributed`` all-reduce and all-gather with the replica's own interpreter (NCCL
on a node with a CUDA GPU, gloo without), and reports bus bandwidth as nccl-tests does; a node
without torch skips it with the reason.

The result (JSON-ready): ``kind`` (``fabric``), ``time``, ``conditions`` (replica, backend, hosts,
port, seconds, min_ratio), ``pairs`` (one per pair: ``a``, ``b``, ``rtt_ms`` {min, median},
``gbps``, ``bytes``, ``seconds``, ``links`` {host: {interface, speed_mbps, mtu}},
``rated_gbps``, ``ratio``, ``verdict`` (``ok``, ``slow``, ``unrated`` or ``failed``),
``problem`` (why it failed), ``causes``), ``collective`` (:func:`collective`). docs/evidence.md,
"provision fabric".
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from vllm_provision.core.quoting import python_loader, quote

RTT_ROUNDS = 20
DEFAULT_MIN_RATIO = 0.5
DEFAULT_PORT = 29499
DEFAULT_SECONDS = 3.0
CONNECT_WAIT_S = 10.0  # how long the sender retries while the receiver starts

# The script both ends run (``python3 -c SCRIPT ROLE ADDRESS PORT SECONDS INTERFACE PEER``): one
# JSON line on stdout. The receiver binds its own address, accepts one connection from PEER only
# (another source is closed), echoes RTT_ROUNDS bytes, counts the stream, and sends its count.
SCRIPT = r'''
import json, socket, statistics, subprocess, sys, time
role, ip, port, seconds, iface, peer, rounds, wait_s = sys.argv[1:9]
port, seconds, rounds, wait_s = int(port), float(seconds), int(rounds), float(wait_s)
def link():
    name = iface or None
    if not name:
        try:
            out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True,
                                 timeout=5).stdout
            for entry in json.loads(out or "[]"):
                if any(a.get("local") == ip for a in entry.get("addr_info", [])):
                    name = entry.get("ifname")
        except (OSError, ValueError, subprocess.SubprocessError):
            name = None
    found = {"interface": name, "speed_mbps": None, "mtu": None}
    for key, leaf in (("speed_mbps", "speed"), ("mtu", "mtu")):
        try:
            value = int(open(f"/sys/class/net/{name}/{leaf}").read().strip())
            found[key] = value if value > 0 else None
        except (OSError, ValueError, TypeError):
            pass
    return found
def exact(sock, n):
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("the peer closed the connection")
        data += part
    return data
result = {"role": role, "link": link()}
try:
    if role == "receive":
        server = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((ip, port))
        server.listen(1)
        server.settimeout(wait_s + 5)
        while True:
            conn, source = server.accept()
            if source[0] == peer:
                break
            conn.close()
        conn.settimeout(seconds + 30)
        for _ in range(rounds):
            conn.sendall(exact(conn, 1))
        received, first, last = 0, None, None
        while True:
            part = conn.recv(1 << 20)
            if not part:
                break
            now = time.monotonic()
            first = first or now
            last = now
            received += len(part)
        took = (last - first) if first is not None and last is not None else 0.0
        conn.sendall(json.dumps({"bytes": received, "seconds": took}).encode())
        conn.close()
        result.update(bytes=received, seconds=took)
    else:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                conn = socket.create_connection((peer, port), timeout=min(5.0, wait_s),
                                                source_address=(ip, 0))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(seconds + 30)
        rtts = []
        for _ in range(rounds):
            started = time.perf_counter()
            conn.sendall(b"x")
            exact(conn, 1)
            rtts.append((time.perf_counter() - started) * 1000.0)
        chunk = b"\0" * (1 << 20)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(chunk)
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while True:
            part = conn.recv(4096)
            if not part:
                break
            reply += part
        conn.close()
        result.update(rtt_ms=rtts, receiver=json.loads(reply.decode() or "{}"))
except Exception as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(result))
'''


def probe_command(role: str, address: str, port: int, seconds: float, interface: str | None,
                  peer: str, bound_s: float) -> str:
    """The shell command one end runs: :data:`SCRIPT` under ``timeout`` (coreutils: the
    process is killed after ``bound_s`` seconds, whatever happens), every value one quoted
    word (an argument with a newline is refused by :func:`~vllm_provision.core.quoting.quote`:
    values are data)."""
    args = [role, address, str(port), f"{seconds:g}", interface or "", peer, str(RTT_ROUNDS),
            f"{CONNECT_WAIT_S:g}"]
    # one line, as modules/http.py sends its script
    return (f"timeout {int(bound_s)} python3 -c {quote(python_loader(SCRIPT))} "
            + " ".join(quote(a) for a in args))


def parse_line(stdout: str) -> dict[str, Any]:
    """The last JSON object line of one end's output, or ``{"error": ...}``."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {"error": "no result (the probe was killed at its bound, or python3 is missing)"}


def causes(links: Mapping[str, Mapping[str, Any]], tensor_parallel_size: int,
           pipeline_parallel_size: int, nodes: int) -> list[str]:
    """The likely causes of a slow link, most likely first: what the two ends' links show
    (MTU mismatch or a small MTU) before what only the operator can check (NCCL's NIC, PCIe
    ACS, peer memory), then the layout (TP across nodes puts every layer's all-reduce on
    this link: with fewer pipeline stages than nodes, a TP group spans nodes). NCCL User
    Guide, "Troubleshooting" (its "PCI Access Control Services (ACS)" section) and
    "Environment Variables" (NCCL_SOCKET_IFNAME, NCCL_IB_HCA)."""
    found = []
    mtus = {h: link.get("mtu") for h, link in links.items()}
    if len({m for m in mtus.values() if m}) > 1:
        found.append("the MTUs differ (" + ", ".join(f"{h} {m}" for h, m in mtus.items())
                     + "): set the same MTU end to end")
    elif any(m and m < 9000 for m in mtus.values()):
        found.append(f"a small MTU ({max(m for m in mtus.values() if m)}): jumbo frames (9000) "
                     "on every port and switch of the cluster network")
    found += ["the NIC NCCL picked: set vllm_cluster_interface (NCCL_SOCKET_IFNAME) and, with "
              "RDMA, NCCL_IB_HCA to the fast ports; NCCL_DEBUG=INFO shows which it uses",
              "PCIe ACS enabled on the GPUs' and NICs' switches (peer-to-peer traffic detours "
              "through the root complex): disable ACS or set IOMMU passthrough",
              "GPUDirect RDMA peer memory not loaded (nvidia_peermem): load the module"]
    if tensor_parallel_size > 1 and nodes > pipeline_parallel_size:
        found.append("tensor parallelism spanning nodes sends every layer's all-reduce over "
                     "this link: keep TP within a node and use pipeline parallelism across")
    return found


def judge(pair: dict[str, Any], min_ratio: float, engine: Any, nodes: int,
          rated_gbps: float | None = None) -> dict[str, Any]:
    """Add ``rated_gbps``, ``ratio``, ``verdict`` and ``causes`` to a measured ``pair`` (pure).
    The rate is the slower end's ``speed_mbps``; a pair without a figure is ``failed``; one
    without a rate ``unrated``; below ``min_ratio`` of the rate ``slow``, else ``ok``.
    ``engine``: the replica's engine arguments (its tensor and pipeline parallel sizes).
    ``rated_gbps``: the operator's rate of the link (``--rated-gbps``), which wins over what
    the NICs report (a virtual NIC or a bond may report none, or its members' sum)."""
    speeds = [link.get("speed_mbps") for link in pair["links"].values()]
    rated = min(speeds) / 1000.0 if speeds and all(speeds) else None
    if rated_gbps is not None:
        rated = float(rated_gbps)
    pair["rated_gbps"] = rated
    pair["ratio"] = None
    pair["causes"] = []
    if pair.get("gbps") is None:
        pair["verdict"] = "failed"
    elif rated is None:
        pair["verdict"] = "unrated"
    else:
        pair["ratio"] = round(pair["gbps"] / rated, 3)
        slow = pair["ratio"] < min_ratio
        pair["verdict"] = "slow" if slow else "ok"
        if slow:
            pair["causes"] = causes(pair["links"], engine.tensor_parallel_size,
                                    engine.pipeline_parallel_size, nodes)
    return pair


def measure_pair(conns: Mapping[str, Any], a: Any, b: Any, *, port: int, seconds: float,
                 interfaces: Mapping[str, str | None]) -> dict[str, Any]:
    """One pair's figures: the receiver on ``b`` in a thread, the sender on ``a``, both through
    the run's SSH connections (``conns``: node name -> connection). Never raises for what the
    hosts answer: a failure is the pair's ``problem``."""
    bound_s = seconds + CONNECT_WAIT_S + 40
    answers: dict[str, str] = {}

    def receive() -> None:
        try:
            answers["b"] = conns[b.name].run(probe_command(
                "receive", b.host_ip, port, seconds, interfaces.get(b.name), a.host_ip,
                bound_s), timeout_s=bound_s + 15).stdout
        except Exception as exc:  # noqa: BLE001 - the pair's problem, in words
            answers["b"] = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]})

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    time.sleep(0.3)  # the sender retries anyway; this spares most retries
    try:
        sent = conns[a.name].run(probe_command(
            "send", a.host_ip, port, seconds, interfaces.get(a.name), b.host_ip, bound_s),
            timeout_s=bound_s + 15).stdout
    except Exception as exc:  # noqa: BLE001 - the pair's problem, in words
        sent = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]})
    thread.join(timeout=bound_s + 20)
    sender, receiver = parse_line(sent), parse_line(answers.get("b", ""))
    pair: dict[str, Any] = {"a": a.name, "b": b.name,
                            "links": {a.name: sender.get("link") or {},
                                      b.name: receiver.get("link") or {}},
                            "rtt_ms": None, "gbps": None, "bytes": None, "seconds": None,
                            "problem": None}
    problem = sender.get("error") or receiver.get("error")
    if problem:
        where = a.name if sender.get("error") else b.name
        pair["problem"] = f"{where}: {problem}"
        return pair
    rtts = [float(x) for x in sender.get("rtt_ms") or []]
    if rtts:
        pair["rtt_ms"] = {"min": round(min(rtts), 3), "median": round(statistics.median(rtts), 3)}
    got = sender.get("receiver") or {}
    took = float(got.get("seconds") or 0.0)
    pair["bytes"], pair["seconds"] = int(got.get("bytes") or 0), round(took, 3)
    if took > 0:
        pair["gbps"] = round(pair["bytes"] * 8 / took / 1e9, 3)
    return pair


# The collective every node runs at once (``python -c SCRIPT RANK WORLD MASTER PORT IP IFACE
# SIZES ITERS TIMEOUT_S``) with the replica's own interpreter: torch.distributed over NCCL when
# the node has a CUDA GPU (GPU 0: one process per node measures the link between nodes), gloo
# otherwise; all-reduce and all-gather of float32 tensors of each size; one JSON line.
COLLECTIVE_SCRIPT = r'''
import datetime, json, os, subprocess, sys, time
rank, world, master, port, ip, iface, sizes, iters, timeout_s = sys.argv[1:10]
rank, world, port, iters, timeout_s = int(rank), int(world), int(port), int(iters), float(timeout_s)
out = {"rank": rank}
try:
    import torch
    import torch.distributed as dist
except Exception as exc:
    out["skipped"] = f"no torch in {sys.executable}: {type(exc).__name__}: {exc}"[:300]
    print(json.dumps(out))
    sys.exit(0)
try:
    if not iface:
        found = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True,
                               timeout=5).stdout
        for entry in json.loads(found or "[]"):
            if any(a.get("local") == ip for a in entry.get("addr_info", [])):
                iface = entry.get("ifname")
    if iface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    out.update(backend=backend, torch=torch.__version__, sizes=[])
    for size in [int(x) for x in sizes.split(",")]:
        row = {"bytes": size}
        for name in ("all_reduce", "all_gather"):
            count = max(1, size // 4 // (world if name == "all_gather" else 1))
            data = torch.ones(count, dtype=torch.float32, device=device)
            gathered = [torch.empty_like(data) for _ in range(world)]
            def once():
                if name == "all_reduce":
                    dist.all_reduce(data)
                else:
                    dist.all_gather(gathered, data)
            once()
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            started = time.perf_counter()
            for _ in range(iters):
                once()
            if cuda:
                torch.cuda.synchronize()
            took = (time.perf_counter() - started) / iters
            moved = count * 4 * (world if name == "all_gather" else 1)
            algbw = moved / took / 1e9
            factor = 2 * (world - 1) / world if name == "all_reduce" else (world - 1) / world
            row[name] = {"time_ms": round(took * 1000, 3), "algbw_gbytes": round(algbw, 3),
                         "busbw_gbytes": round(algbw * factor, 3)}
        out["sizes"].append(row)
    dist.destroy_process_group()
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(out))
'''
COLLECTIVE_SIZES = (1 << 20, 16 << 20, 64 << 20)  # bytes per rank's tensor (all-reduce)
COLLECTIVE_ITERS = 5


def collective(replica: Any, conns: Mapping[str, Any], interfaces: Mapping[str, str | None],
               pythons: Mapping[str, str], *, port: int, bound_s: float = 120.0
               ) -> dict[str, Any]:
    """All-reduce and all-gather across every node of ``replica`` at once, one process per
    node with the replica's own interpreter (``pythons``: node name -> its path), rank 0's
    node the rendezvous (``tcp://<its address>:port``); bus bandwidth as nccl-tests reports it
    (all-reduce: algbw x 2(n-1)/n; all-gather: algbw x (n-1)/n; nccl-tests
    doc/PERFORMANCE.md). A node without torch skips it with the reason (the TCP test still
    ran); every process is under ``timeout`` and torch's own init timeout.

    Returns:
        ``{"run": bool, "reason", "backend", "torch", "world_size", "sizes": [{"bytes",
        "all_reduce": {"time_ms", "algbw_gbytes", "busbw_gbytes"}, "all_gather": {...}}]}``.
    """
    nodes = sorted(replica.nodes, key=lambda n: n.rank)
    master = nodes[0].host_ip
    answers: dict[str, dict[str, Any]] = {}
    init_s = max(10.0, bound_s - 30)

    def one(index: int, node: Any) -> None:
        args = [str(index), str(len(nodes)), master, str(port), node.host_ip,
                interfaces.get(node.name) or "", ",".join(str(s) for s in COLLECTIVE_SIZES),
                str(COLLECTIVE_ITERS), f"{init_s:g}"]
        command = (f"timeout {int(bound_s)} {quote(pythons[node.name])} -c "
                   f"{quote(python_loader(COLLECTIVE_SCRIPT))} " + " ".join(quote(a) for a in args))
        try:
            answers[node.name] = parse_line(conns[node.name].run(
                command, timeout_s=bound_s + 15).stdout)
        except Exception as exc:  # noqa: BLE001 - the node's problem, in words
            answers[node.name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}

    threads = [threading.Thread(target=one, args=(i, n), daemon=True)
               for i, n in enumerate(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=bound_s + 30)
    # in rank order, whichever node answered first
    ordered = {n.name: answers.get(n.name) or {"error": "no answer"} for n in nodes}
    skipped = {n: a["skipped"] for n, a in ordered.items() if a.get("skipped")}
    if skipped:
        return {"run": False, "reason": "; ".join(f"{n}: {why}" for n, why in skipped.items())}
    failed = {n: a.get("error") for n, a in ordered.items() if a.get("error") or "sizes" not in a}
    if failed:
        return {"run": False, "reason": "; ".join(f"{n}: {why or 'no result'}"
                                                  for n, why in failed.items())}
    first = answers[nodes[0].name]
    return {"run": True, "reason": None, "backend": first.get("backend"),
            "torch": first.get("torch"), "world_size": len(nodes), "sizes": first["sizes"]}


def run(replica: Any, conns: Mapping[str, Any], interfaces: Mapping[str, str | None], *,
        port: int = DEFAULT_PORT, seconds: float = DEFAULT_SECONDS,
        min_ratio: float = DEFAULT_MIN_RATIO, rated_gbps: float | None = None,
        pythons: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Measure every pair of ``replica``'s nodes, one pair at a time (two pairs at once would
    share the links they measure); return the result (module doc).

    Args:
        replica: the replica (its ``nodes``, ``engine``). conns: node name -> connection.
        interfaces: node name -> ``vllm_cluster_interface`` (None: the one holding its
            address). port: the receiver's TCP port. seconds: of streaming per pair.
        min_ratio: of the rated speed, below which a pair is ``slow``.
        rated_gbps: the link's rate as the operator knows it (None: what the NICs report).
        pythons: node name -> the replica's interpreter, for :func:`collective` (after the
            pairs, on the same port); None: the collective is not run.
    """
    nodes: Sequence[Any] = sorted(replica.nodes, key=lambda n: n.rank)
    pairs = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            pair = measure_pair(conns, a, b, port=port, seconds=seconds,
                                interfaces=interfaces)
            pairs.append(judge(pair, min_ratio, replica.engine, len(nodes), rated_gbps))
    return {"kind": "fabric", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "conditions": {"replica": replica.name, "backend": replica.backend,
                           "hosts": [{"host": n.name, "address": n.host_ip, "rank": n.rank}
                                     for n in nodes],
                           "port": port, "seconds": seconds, "min_ratio": min_ratio,
                           "rated_gbps": rated_gbps},
            "pairs": pairs,
            "collective": collective(replica, conns, interfaces, pythons, port=port)
            if pythons else {"run": False, "reason": "not asked for"}}


def describe(pair: Mapping[str, Any]) -> str:
    """One human line for a pair."""
    head = f"{pair['a']} to {pair['b']}: "
    if pair["verdict"] == "failed":
        return head + f"not measured: {pair['problem']}"
    rtt = pair["rtt_ms"] or {}
    rate = (f" of {pair['rated_gbps']:g} Gb/s rated ({pair['ratio']:.0%})"
            if pair["rated_gbps"] else " (link rate unknown)")
    return (head + f"{pair['gbps']:g} Gb/s{rate}, RTT min {rtt.get('min')} ms median "
            f"{rtt.get('median')} ms: {pair['verdict']}")


def describe_collective(item: Mapping[str, Any]) -> str:
    """One human line (or a few) for :func:`collective`'s result."""
    if not item.get("run"):
        return f"collective: not run: {item.get('reason')}"
    lines = [f"collective: torch {item.get('torch')} {item.get('backend')} across "
             f"{item.get('world_size')} nodes (bus bandwidth, GB/s, as nccl-tests)"]
    for row in item.get("sizes") or []:
        reduce, gather = row.get("all_reduce") or {}, row.get("all_gather") or {}
        lines.append(f"  {row['bytes'] / (1 << 20):g} MiB: all-reduce "
                     f"{reduce.get('busbw_gbytes')} ({reduce.get('time_ms')} ms), all-gather "
                     f"{gather.get('busbw_gbytes')} ({gather.get('time_ms')} ms)")
    return "\n".join(lines)
