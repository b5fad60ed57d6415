#!/usr/bin/python3
"""vllm-watchdog: peer-aware restarts for one node of a multi-node vLLM replica (stdlib only).

Installed as it is by vllm-provision (role vllm_watchdog) as ``vllm-watchdog.service`` on every
node, configured by ``/etc/vllm-provision/watchdog.json`` (``templates/watchdog.json.j2``);
docs/recovery.md has the design. This file is the program (loop, ``systemctl``, ``/proc``, the
``/state`` endpoint, HTTP to peers and the local API, the Ray helpers); the pure rules it
applies live in ``vllm_watchdog_rules.py``, installed beside it and imported from its folder.

Why: a torch.distributed group cannot be rejoined. With vLLM 0.32.0 (docs/measured.md, "vLLM mp:
a node dies"), rank 0 answers ``/health`` 200 after a follower died until its next request
fails, and a headless follower outlives rank 0 forever; Ray workers do not rejoin a restarted
head (ray-project/ray#1345). So each node restarts its unit when a peer unit it depends on
restarted or vanished.

How: every ``poll_s`` seconds the watchdog reads its local units (``systemctl show``: InvocationID,
ActiveState, SubState, ExecMainStartTimestampMonotonic) and each peer's published state
(``GET http://<peer>:<port>/state``, served by the peer's watchdog). Each *rule* says "local unit
U depends on unit V of node P". The watchdog *binds* U's current invocation to V's current
invocation, then restarts U (``systemctl --no-block --job-mode=fail try-restart``) when V's
invocation changes, V is no longer running, or P's watchdog stays unreachable ``grace_s``
seconds. Binding rules (no clocks compared across hosts; ages are durations on each host):

* mutual (mp: every node needs every other node): bind when V is younger than U (started after
  it, within ``slack_s``), or when P already bound V to U's current invocation. A node that
  restarted is younger than its peers, so they bind it and it binds them back: one fault gives
  one restart of each other node, never a ping-pong. A headless node binds rank 0 only once its
  unit holds an established TCP connection to the rendezvous (``master_addr:master_port``, the
  TCPStore that torch.distributed's ``tcp://`` init method opens and keeps for the group's
  life): a headless unit that started after rank 0's group had formed (with a worker of the
  node's previous invocation that was still stopping) is not in that group, and must not be
  restarted when that group fails; its workers join rank 0's next rendezvous instead.
* one-way (Ray: the head's vLLM and each worker depend on the head's ``ray start``): bind when V
  is older than U; when V is younger (it restarted after U started), restart U.

A hold file (``hold_file``, one line: a deadline in seconds since the epoch) written by
``provision up/restart`` makes the watchdog forget its bindings and act on nothing until the
deadline, so planned restarts are not doubled. An operator's ``systemctl stop`` is respected:
only running units are restarted (try-restart), never started.

Completion probe (the node that runs the API server: mp rank 0, the Ray head): the rules above
see only unit changes, and a group that hangs with every unit running (a frozen peer, an NCCL
hang) keeps ``/health`` at 200 (docs/measured.md, "vLLM mp: a node dies": /health says nothing
about peer ranks). So every ``probe_interval_s`` seconds a :class:`Prober` POSTs one real completion
(``max_tokens`` 1) to the local API; ``probe_failures`` consecutive failures (timeout, refused
or reset connection, HTTP 5xx/408/429) restart the local vLLM unit with the same try-restart,
and the peers' rules then restart the rest of the group. It judges only an invocation that
already answered (``/health`` 200 or a completion), so a loading engine is never restarted.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The rules live beside this file (vllm_watchdog_rules.py, installed by the same role). Python
# puts a script's folder first on sys.path, but not under ``-I`` or ``-P``: put it there in any
# case. No bytecode is written beside the installed files (a root-run ExecStartPre would leave a
# __pycache__ folder that `provision down --purge` does not know).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
_WRITE_BYTECODE = sys.dont_write_bytecode
sys.dont_write_bytecode = True
from vllm_watchdog_rules import (  # noqa: E402 (after the sys.path entry above)
    RAY_KV_NAMESPACE,
    RAY_STUCK_MARKER,
    RAY_TRIAL_TRIES,
    RAY_TRIAL_WAIT_S,
    SHOW_PROPERTIES,
    Binding,
    Decision,
    Prober,
    ProbeResult,
    Rule,
    Settings,
    UnitView,
    classify,
    cluster_gaps,
    decide,
    decide_ray_worker,
    describe_probe,
    log,
    node_table,
    parse_show,
    ray_auth_env,
    ray_start_key,
    raylet_node_ids,
    restore_bindings,
    trial_specs,
    unit_view,
)

sys.dont_write_bytecode = _WRITE_BYTECODE


def _proc_address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1F90`` (``/proc/net/tcp``) or its 32-digit IPv6 form (``/proc/net/tcp6``:
    four 32-bit words in host byte order) -> (address, port); IPv4-mapped IPv6 -> IPv4."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1]), int(port, 16)
    v6 = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return (v6.ipv4_mapped or v6), int(port, 16)


def cgroup_socket_inodes(cgroup: str, proc: str = "/proc") -> set[str]:
    """Socket inodes held by every process of the cgroup ``cgroup`` (systemd's ControlGroup,
    ``/system.slice/vllm.service``): a process belongs when a line of ``/proc/PID/cgroup`` ends
    with ``:<cgroup>`` (cgroup v2 ``0::``, v1 ``name=systemd:``). Processes that exit while
    being read are skipped."""
    inodes: set[str] = set()
    for pid in cgroup_pids(cgroup, proc):
        try:
            for fd in os.listdir(f"{proc}/{pid}/fd"):
                link = os.readlink(f"{proc}/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    return inodes


def cgroup_pids(cgroup: str, proc: str = "/proc") -> list[str]:
    """PIDs (as strings) of the processes of the cgroup ``cgroup``: a line of
    ``/proc/PID/cgroup`` ends with ``:<cgroup>`` (cgroup v2 ``0::``, v1 ``name=systemd:``).
    A process that exits while being read is skipped; an empty ``cgroup`` has none."""
    pids: list[str] = []
    if not cgroup:
        return pids
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as handle:
                if any(line.rstrip("\n").split(":", 2)[-1] == cgroup for line in handle):
                    pids.append(pid)
        except OSError:
            continue
    return pids


def connected_to(cgroup: str, host: str, port: int, proc: str = "/proc") -> bool:
    """True when a process of ``cgroup`` holds an ESTABLISHED TCP connection to ``host:port``
    (``/proc/net/tcp`` and ``tcp6``, state 01; proc(5)); ``port`` 0: to any port of ``host``
    (a data-parallel engine's ZMQ sockets to rank 0, on ports rank 0 chose). A ``host`` that is
    not an IP address cannot be compared: True (the caller then keeps the age rules alone)."""
    try:
        wanted = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return True
    if isinstance(wanted, ipaddress.IPv6Address) and wanted.ipv4_mapped:
        wanted = wanted.ipv4_mapped
    inodes = cgroup_socket_inodes(cgroup, proc)
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}", encoding="utf-8") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "01" or fields[9] not in inodes:
                continue
            try:
                address, remote_port = _proc_address(fields[2])
                if address == wanted and port in (0, remote_port):
                    return True
            except ValueError:
                continue
    return False


# --- Ray: what the GCS knows ---------------------------------------------------------------------
#
# Why and when a worker's Ray unit restarts: vllm_watchdog_rules.py (same heading). Here: the
# head reads the GCS node table with Ray's own client in a ``--ray-nodes`` child process and
# publishes it; vLLM's ``ExecStartPre`` on the head waits with ``--wait-ray-cluster``.


def read_ray_nodes(address: str, timeout_s: float) -> list[dict[str, Any]]:
    """The GCS node table of ``address`` (``host:port``) through the venv's Ray (the client
    ``ray status`` and ``ray start`` use; no driver is started).

    Raises:
        ImportError: no ray in this interpreter. Exception: any GCS client error (unreachable,
            timeout).
    """
    from ray._raylet import GcsClient  # noqa: PLC0415 (only on Ray nodes)

    return node_table(GcsClient(address=address).get_all_node_info(timeout=timeout_s))


def read_ray_starts(address: str, ips: list[str], timeout_s: float) -> dict[str, float]:
    """IP -> epoch seconds at which that node's Ray worker unit last started, from the GCS's
    key-value store (:func:`mark_ray_start_main` writes them); an unreadable store or a bad
    value reads as no mark (the gate then waits on the node table alone).

    Raises:
        ImportError: no ray in this interpreter.
    """
    from ray._raylet import GcsClient  # noqa: PLC0415 (only on Ray nodes)

    try:
        found = GcsClient(address=address).internal_kv_multi_get(
            [ray_start_key(ip) for ip in ips], RAY_KV_NAMESPACE, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - the marks only sharpen the gate
        return {}
    starts = {}
    for ip in ips:
        try:
            starts[ip] = float((found or {}).get(ray_start_key(ip), b"").decode())
        except (ValueError, UnicodeDecodeError):
            continue
    return starts


def mark_ray_start_main(address: str, ip: str) -> int:
    """``--mark-ray-start ADDRESS IP`` (a Ray worker unit's ``ExecStartPre``): record in the
    head's GCS key-value store that this node's raylet is starting now (epoch seconds), so
    vLLM's gate on the head does not take the old raylet, still listed alive, for this one.
    Exit 0 always: a head that does not answer yet must not keep the worker from starting (the
    gate then falls back to the node table)."""
    try:
        from ray._raylet import GcsClient  # noqa: PLC0415 (only on Ray nodes)

        GcsClient(address=address).internal_kv_put(
            ray_start_key(ip), f"{time.time():.3f}".encode(), True, RAY_KV_NAMESPACE, timeout=5)
    except Exception as exc:  # noqa: BLE001 - best effort, said in the journal
        log(f"ray: could not record this raylet's start at {address}: "
            f"{type(exc).__name__}: {str(exc)[:200]}")
    return 0


def unit_raylet_node_ids(cgroup: str, proc: str = "/proc") -> set[str]:
    """:func:`raylet_node_ids` of the processes of ``cgroup`` (read from ``/proc/PID/cmdline``,
    which a stopped process still shows)."""
    cmdlines = []
    for pid in cgroup_pids(cgroup, proc):
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as handle:
                cmdlines.append(handle.read().decode("utf-8", "replace").split("\0"))
        except OSError:
            continue
    return raylet_node_ids(cmdlines)


def tcp_reachable(address: str, timeout_s: float) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``timeout_s`` seconds."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


@dataclass
class RayNodes:
    """The head's view of the GCS node table: a ``--ray-nodes`` child process of this script
    (the venv's interpreter, so Ray's own GCS client) prints one JSON line per ``poll_s``; a
    thread keeps the last one. A child that exits is started again on the next :meth:`tick`.
    """

    address: str
    poll_s: float = 2.0
    # Ray's authentication environment of the replica (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH):
    # with token authentication the GCS refuses a client without the token.
    env: dict[str, str] = field(default_factory=dict)
    latest: dict[str, Any] | None = None
    latest_at: float | None = None
    child: subprocess.Popen[str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tick(self) -> None:
        """Start the child when none runs."""
        if self.child is not None and self.child.poll() is None:
            return
        if self.child is not None:
            log(f"ray: the node-table reader exited ({self.child.returncode}); starting it again")
        self.child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--ray-nodes", self.address,
             str(self.poll_s)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **self.env})
        threading.Thread(target=self._read, args=(self.child,), daemon=True).start()

    def _read(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            try:
                data = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.latest, self.latest_at = data, time.monotonic()

    def state(self, mono: float) -> dict[str, Any]:
        """What ``/state`` publishes under ``ray``: ``ok``, ``nodes``, ``error``, ``age_s``
        (seconds since the table was read, on this host)."""
        with self.lock:
            latest, at = self.latest, self.latest_at
        if latest is None or at is None:
            return {"ok": False, "nodes": None, "error": "not read yet", "age_s": None}
        return {**latest, "age_s": round(max(0.0, mono - at), 1)}


def ray_nodes_main(address: str, poll_s: float) -> int:
    """``--ray-nodes ADDRESS POLL_S``: print the GCS node table as one JSON line every
    ``POLL_S`` seconds (``{"ok": true, "nodes": [...]}`` or ``{"ok": false, "error": ...}``)."""
    while True:
        started = time.monotonic()
        try:
            line = {"ok": True, "nodes": read_ray_nodes(address, max(1.0, poll_s)), "error": ""}
        except ImportError as exc:
            print(json.dumps({"ok": False, "nodes": None, "error": f"no ray: {exc}"}), flush=True)
            return 2
        except Exception as exc:  # noqa: BLE001 - any GCS error is "not answered"
            line = {"ok": False, "nodes": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
        print(json.dumps(line), flush=True)
        time.sleep(max(0.2, poll_s - (time.monotonic() - started)))


def wait_ray_cluster_main(address: str, timeout_s: float, gpus_needed: float,
                          expected_ips: list[str]) -> int:
    """``--wait-ray-cluster ADDRESS TIMEOUT_S GPUS IP...`` (vLLM's ``ExecStartPre`` on the
    head): poll the GCS (node table and the workers' start marks) every second until
    :func:`cluster_gaps` is empty (exit 0) or
    ``TIMEOUT_S`` passed (exit 1; systemd's Restart= tries again). Logs what it waits for."""
    started = time.monotonic()
    last_said = ""
    while True:
        try:
            nodes = read_ray_nodes(address, 5.0)
            gaps = cluster_gaps(nodes, expected_ips, gpus_needed,
                                starts=read_ray_starts(address, expected_ips, 5.0),
                                now_s=time.time())
        except ImportError as exc:
            log(f"ray: no ray in {sys.executable}: {exc}")
            return 1
        except Exception as exc:  # noqa: BLE001 - the GCS may be starting
            gaps = [f"the GCS at {address} does not answer ({type(exc).__name__})"]
        waited = time.monotonic() - started
        if not gaps:
            log(f"ray: every node ({', '.join(expected_ips)}) and {gpus_needed:g} GPUs are alive"
                f" in Ray after {waited:.1f} s")
            placed = trial_placement(address, gpus_needed, max(1.0, timeout_s - waited))
            log(f"ray: {placed[1]}")
            return 0 if placed[0] else 1
        said = "; ".join(gaps)
        if said != last_said:
            log(f"ray: waiting before starting vLLM: {said}")
            last_said = said
        if waited >= timeout_s:
            log(f"ray: gave up after {waited:.0f} s: {said}")
            return 1
        time.sleep(1.0)


def _pending_words(ray: Any, group: Any) -> str:
    """What Ray says of a pending group: its state and scheduling state
    (``ray.util.placement_group_table``), and the GPUs free now; for the journal."""
    try:
        row = ray.util.placement_group_table(group)
        stats = row.get("stats") or {}
        return (f"state {row.get('state')}, scheduling {stats.get('scheduling_state')}, "
                f"{float(ray.available_resources().get('GPU', 0.0)):g} GPUs free now")
    except Exception as exc:  # noqa: BLE001 - words for the journal only
        return f"its table unreadable: {type(exc).__name__}"


def trial_placement(address: str, gpus_needed: float, bound_s: float) -> tuple[bool, str]:
    """Place and remove trial placement groups of vLLM's shape (:func:`trial_specs`, bundle 0
    on this head) as a Ray driver of ``address`` until one is placed: a new one each
    :data:`RAY_TRIAL_WAIT_S`, at most :data:`RAY_TRIAL_TRIES` within ``bound_s`` s (rules: why);
    none when fewer GPUs are free than vLLM needs (it waits itself) or no driver connects.

    Returns:
        ``(True, words)`` to start vLLM; ``(False, words)`` when every trial stayed pending,
        having written :data:`RAY_STUCK_MARKER` in the working directory (a new Ray head).
    """
    try:
        import ray  # noqa: PLC0415 (only on Ray nodes)
        from ray.util.placement_group import (  # noqa: PLC0415
            placement_group,
            remove_placement_group,
        )

        ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                 namespace="vllm_provision_gate")
    except Exception as exc:  # noqa: BLE001 - the trial only sharpens the gate
        return True, f"no trial placement ({type(exc).__name__}: {str(exc)[:200]}): starting vLLM"
    started, tries = time.monotonic(), 0
    try:
        free = float(ray.available_resources().get("GPU", 0.0))
        if free < gpus_needed:
            return True, (f"{free:g} GPUs free, vLLM needs {gpus_needed:g}: no trial placement, "
                          "vLLM waits for them itself: starting vLLM")
        specs = trial_specs(gpus_needed, address.rsplit(":", 1)[0])
        while time.monotonic() - started < bound_s and tries < RAY_TRIAL_TRIES:
            tries += 1
            group = placement_group(specs, strategy="PACK")
            ready, _ = ray.wait([group.ready()], timeout=min(
                RAY_TRIAL_WAIT_S, max(1.0, bound_s - (time.monotonic() - started))))
            seen = "" if ready else _pending_words(ray, group)
            remove_placement_group(group)
            took = time.monotonic() - started
            if ready:
                return True, (f"a trial placement group of vLLM's {len(specs)} bundles was placed"
                              f" (try {tries}, {took:.1f} s) and removed: starting vLLM")
            log(f"ray: trial placement group {tries} stayed pending {RAY_TRIAL_WAIT_S:g} s with "
                f"{free:g} GPUs free ({seen}); removed, trying a new one")
        said = f"gave up: {tries} trials of {len(specs)} bundles stayed pending with the GPUs free"
        with open(RAY_STUCK_MARKER, "w", encoding="utf-8") as marker:  # the unit reads it
            marker.write(said + "\n")
        return False, said + ": Ray's books are stuck, the Ray head restarts"
    finally:
        ray.shutdown()


# --- completion probe ---------------------------------------------------------------------------

def probe_completion(url: str, model: str, api_key: str | None, timeout_s: float) -> ProbeResult:
    """POST one real completion (``max_tokens`` 1, temperature 0) to ``url``/v1/completions.

    Args:
        url: the API server, ``http://<node ip>:<port>``.
        model: the served model name (``--served-model-name``, else the model path).
        api_key: sent as ``Authorization: Bearer`` (vLLM ``--api-key`` / ``VLLM_API_KEY``).
        timeout_s: seconds for connecting and for each read (urllib's socket timeout).
    """
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1,
                       "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.loads(response.read())
            if not isinstance(answer, dict) or not answer.get("choices"):
                return classify(None, f"HTTP {response.status} without choices")
            return classify(int(response.status))
    except urllib.error.HTTPError as exc:
        try:  # the server may die while its error body is read (a Ray engine that just died)
            text = exc.read().decode("utf-8", "replace") if exc.fp else ""
        except (OSError, http.client.HTTPException, ValueError):
            text = ""
        return classify(int(exc.code), " ".join(text.split())[:200])
    except (socket.timeout, TimeoutError):  # noqa: UP041 (distinct before Python 3.10)
        return classify(None, f"no answer within {timeout_s:g} s")
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):  # noqa: UP041 (Python 3.8)
            return classify(None, f"no answer within {timeout_s:g} s")
        return classify(None, f"connection failed: {reason}")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return classify(None, f"connection failed: {type(exc).__name__}: {exc}")


def probe_health(url: str, timeout_s: float) -> int | None:
    """``GET url/health``: the HTTP status, None when the server did not answer."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
        return None


def make_prober(config: dict[str, Any] | None, settings: Settings) -> Prober | None:
    """The :class:`Prober` of a config's ``probe`` section (``unit``, ``url``, ``model``,
    ``api_key``), None on a node that runs no API server."""
    if not config:
        return None
    url, model, key = str(config["url"]), str(config["model"]), config.get("api_key") or None
    return Prober(
        unit=str(config["unit"]), settings=settings,
        complete=lambda: probe_completion(url, model, key, settings.probe_timeout_s),
        health=lambda: probe_health(url, min(10.0, settings.probe_timeout_s)))


@dataclass
class Watchdog:
    """The watchdog of one node: its config, bindings and last published state."""

    config: dict[str, Any]
    settings: Settings = field(default_factory=Settings)
    bindings: dict[str, Binding] = field(default_factory=dict)
    suspended: dict[str, Binding] = field(default_factory=dict)  # the bindings a hold set aside
    published_event: threading.Condition = field(default_factory=threading.Condition)
    missing_since: dict[str, float] = field(default_factory=dict)
    restarting: dict[str, tuple[str, float]] = field(default_factory=dict)
    published: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    prober: Prober | None = None
    ray_nodes: RayNodes | None = None
    gcs_unreachable_since: float | None = None

    @property
    def rules(self) -> list[Rule]:
        """The configured rules."""
        return [Rule(**r) for r in self.config["rules"]]

    def read_local(self) -> dict[str, UnitView]:
        """Read the local units with one ``systemctl show``."""
        units = list(self.config["units"])
        result = subprocess.run(
            ["systemctl", "show", "-p", ",".join(SHOW_PROPERTIES), *units],
            capture_output=True, text=True, timeout=20, check=False)
        return parse_show(result.stdout, time.monotonic())

    def control_group(self, unit: str) -> str:
        """The unit's cgroup (``systemctl show -p ControlGroup --value``), "" when unknown."""
        result = subprocess.run(["systemctl", "show", "-p", "ControlGroup", "--value", unit],
                                capture_output=True, text=True, timeout=20, check=False)
        return result.stdout.strip()

    def fetch_peer(self, node: str) -> dict[str, Any] | None:
        """The peer's published state, or None when it does not answer within ``poll_s``."""
        address = self.config["peers"][node]
        try:
            with urllib.request.urlopen(f"http://{address}/state",
                                        timeout=max(0.5, self.settings.poll_s)) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def poll(self) -> None:
        """One round: read, decide every rule, act, publish."""
        now = time.time()
        mono = time.monotonic()
        local = self.read_local()
        node = self.config["node"]
        hold = held_until(self.config["hold_file"], now)
        states: dict[str, dict[str, Any] | None] = {}
        for peer in sorted({r.peer for r in self.rules} - {node}):
            states[peer] = self.fetch_peer(peer)
            if states[peer] is None:
                self.missing_since.setdefault(peer, mono)
            else:
                self.missing_since.pop(peer, None)
        decisions: dict[str, Decision] = {}
        if hold is not None:
            self.suspended.update(self.bindings)
            self.bindings.clear()
            self.restarting.clear()
        else:
            self.bindings.update(restore_bindings(self.suspended, local, states, node))
            self.suspended.clear()
            for rule in self.rules:
                decisions[rule.key] = self.apply(rule, local, states, mono)
        if self.prober is not None:
            self.probe(local, hold is not None, mono)
        ray = self.ray(local, states, hold is not None, mono) if self.config.get("ray") else None
        with self.lock:
            self.published = {
                "node": node, "time": now, "held_until": hold,
                "units": {name: asdict(view) for name, view in local.items()},
                "bindings": [asdict(b) for b in self.bindings.values()],
                "rules": {key: {"action": d.action, "reason": d.reason}
                          for key, d in decisions.items()},
                "whole": hold is None and len(self.bindings) == len(self.rules),
                "probe": self.prober.state(mono) if self.prober is not None else None,
                "ray": ray}
            text = json.dumps(self.published)
        with self.published_event:
            self.published_event.notify_all()
        _write_atomic(self.config["state_file"], text)

    def released(self) -> bool:
        """The last poll saw no hold and every rule bound (``whole``)."""
        with self.lock:
            return self.published.get("held_until") is None and bool(self.published.get("whole"))

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``; wake early when the hold file appears or goes (read every 0.1 s)."""
        end = time.monotonic() + seconds
        with self.lock:
            held = self.published.get("held_until") is not None
        while time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
            if (held_until(self.config["hold_file"], time.time()) is not None) != held:
                return

    def apply(self, rule: Rule, local: dict[str, UnitView],
              states: dict[str, dict[str, Any] | None], mono: float) -> Decision:
        """Decide ``rule`` and act on the decision (bind, forget, restart the local unit)."""
        mine = local.get(rule.unit)
        pending = self.restarting.get(rule.unit)
        if pending and mine and mine.invocation == pending[0] and mono - pending[1] < \
                self.settings.restart_wait_s:
            return Decision("wait", "restart requested, waiting for it")
        self.restarting.pop(rule.unit, None)
        if rule.peer == self.config["node"]:
            peer_view, bound_me, missing = local.get(rule.peer_unit), False, 0.0
        else:
            state = states.get(rule.peer)
            peer_view = unit_view(state, rule.peer_unit) if state else None
            bound_me = bool(state and mine and any(
                b.get("unit") == rule.peer_unit and b.get("peer") == self.config["node"]
                and b.get("peer_unit") == rule.unit and b.get("peer_invocation") == mine.invocation
                and peer_view is not None and b.get("invocation") == peer_view.invocation
                for b in state.get("bindings", [])))
            missing = mono - self.missing_since.get(rule.peer, mono)
        joined = True
        if rule.master_addr and mine is not None and mine.running and \
                self.bindings.get(rule.key) is None:
            joined = connected_to(self.control_group(rule.unit), rule.master_addr,
                                  rule.master_port)
        decision = decide(rule, mine, peer_view, bound_me, self.bindings.get(rule.key), missing,
                          self.settings, joined)
        if decision.binding is not None:
            if self.bindings.get(rule.key) != decision.binding:
                log(f"{rule.key}: bound {decision.binding.invocation[:8]} to "
                    f"{decision.binding.peer_invocation[:8]} ({decision.reason})")
            self.bindings[rule.key] = decision.binding
        else:
            self.bindings.pop(rule.key, None)
        if decision.action == "restart" and mine is not None:
            self.restart(rule.key, rule.unit, mine, decision.reason, mono)
        return decision

    def ray(self, local: dict[str, UnitView], states: dict[str, dict[str, Any] | None],
            held: bool, mono: float) -> dict[str, Any]:
        """The Ray part of a poll (config ``ray``). The head (``observe``): keep the GCS node
        table reader running and return the table. A worker: restart its Ray unit when
        :func:`decide_ray_worker` says so (never while held or while a restart it asked for is
        awaited); return what it saw."""
        conf = self.config["ray"]
        if conf.get("observe"):
            if self.ray_nodes is None:
                self.ray_nodes = RayNodes(str(conf["gcs"]), float(conf.get("poll_s", 2.0)),
                                          env=ray_auth_env(self.config.get("ray_auth_env")))
            self.ray_nodes.tick()
            return self.ray_nodes.state(mono)
        unit = str(conf["unit"])
        if tcp_reachable(str(conf["gcs"]), min(1.0, self.settings.poll_s)):
            self.gcs_unreachable_since = None
        elif self.gcs_unreachable_since is None:
            self.gcs_unreachable_since = mono
        unreachable = 0.0 if self.gcs_unreachable_since is None else \
            mono - self.gcs_unreachable_since
        mine = local.get(unit)
        node_ids = unit_raylet_node_ids(self.control_group(unit)) \
            if mine is not None and mine.running else set()
        head = states.get(str(conf["head"])) or {}
        decision = decide_ray_worker(mine, node_ids, (head.get("ray") or {}).get("nodes"),
                                     unreachable, float(conf["unreachable_s"]))
        pending = self.restarting.get(unit)
        awaited = bool(pending and mine and mine.invocation == pending[0]
                       and mono - pending[1] < self.settings.restart_wait_s)
        if decision.action == "restart" and mine is not None and not held and not awaited:
            self.restart("ray", unit, mine, decision.reason, mono)
        return {"node_ids": sorted(node_ids), "gcs_unreachable_s": round(unreachable, 1),
                "action": "wait" if held or awaited else decision.action,
                "reason": decision.reason}

    def probe(self, local: dict[str, UnitView], held: bool, mono: float) -> None:
        """Run the completion probe's poll; restart its unit when it says so."""
        assert self.prober is not None
        unit = self.prober.unit
        mine = local.get(unit)
        pending = self.restarting.get(unit)
        restarting = bool(pending and mine and mine.invocation == pending[0]
                          and mono - pending[1] < self.settings.restart_wait_s)
        reason = self.prober.tick(mono, local, held, restarting)
        if reason is not None and mine is not None:
            self.restart("probe", unit, mine, reason, mono)

    def restart(self, label: str, unit: str, mine: UnitView, reason: str, mono: float) -> None:
        """``systemctl --no-block --job-mode=fail try-restart`` the local unit, once per
        invocation: try-restart never starts a stopped unit, job-mode fail never replaces a
        queued stop (``provision down``). ``label``: the rule's key, or ``probe``."""
        log(f"{label}: restarting {unit} (invocation {mine.invocation[:8]}): {reason}")
        for key in [k for k, b in self.bindings.items() if b.unit == unit]:
            del self.bindings[key]
        self.restarting[unit] = (mine.invocation, mono)
        result = subprocess.run(["systemctl", "--no-block", "--job-mode=fail", "try-restart",
                                 unit], capture_output=True, text=True, timeout=20,
                                check=False)
        if result.returncode != 0:
            log(f"{label}: systemctl try-restart {unit} failed: "
                f"{(result.stderr or result.stdout).strip()}")

    def state_json(self) -> bytes:
        """The last published state, JSON bytes."""
        with self.lock:
            return json.dumps(self.published).encode()


def held_until(path: str, now_s: float) -> float | None:
    """The hold deadline (seconds since the epoch) when ``path`` holds a future one, else None."""
    try:
        with open(path, encoding="utf-8") as handle:
            deadline = float(handle.read().strip() or 0)
    except (OSError, ValueError):
        return None
    return deadline if deadline > now_s else None


def _write_atomic(path: str, text: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.tmp"
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, path)
    except OSError as exc:
        log(f"cannot write {path}: {exc}")


def serve(watchdog: Watchdog) -> ThreadingHTTPServer:
    """Start the HTTP endpoint (``GET /state``) on ``listen_host:listen_port`` in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path, _, query = self.path.partition("?")
            if path != "/state":
                self.send_error(404)
                return
            # `?wait_released=S` (provision's release task): answer once the watchdog is
            # released and whole again, or after S seconds (at most 10), whichever comes first
            key, _, wait = query.partition("=")
            if key == "wait_released" and wait.replace(".", "", 1).isdigit():
                with watchdog.published_event:
                    watchdog.published_event.wait_for(watchdog.released,
                                                      timeout=min(10.0, float(wait)))
            body = watchdog.state_json()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    server = ThreadingHTTPServer((watchdog.config["listen_host"],
                                  int(watchdog.config["listen_port"])), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> int:
    """``vllm_watchdog.py CONFIG.json``: run until killed; exit 2 on a bad config. Ray helpers
    (the venv's interpreter): ``--ray-nodes ADDRESS POLL_S`` (:func:`ray_nodes_main`),
    ``--wait-ray-cluster ADDRESS TIMEOUT_S GPUS IP...`` (:func:`wait_ray_cluster_main`) and
    ``--mark-ray-start ADDRESS IP`` (:func:`mark_ray_start_main`)."""
    try:
        if len(argv) == 4 and argv[1] == "--ray-nodes":
            return ray_nodes_main(argv[2], float(argv[3]))
        if len(argv) == 4 and argv[1] == "--mark-ray-start":
            return mark_ray_start_main(argv[2], argv[3])
        if len(argv) >= 6 and argv[1] == "--wait-ray-cluster":
            return wait_ray_cluster_main(argv[2], float(argv[3]), float(argv[4]), argv[5:])
    except ValueError as exc:
        print(f"vllm-watchdog: bad arguments {argv[1:]}: {exc}", file=sys.stderr)
        return 2
    if len(argv) != 2:
        print("usage: vllm_watchdog.py /etc/vllm-provision/watchdog.json", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as handle:
            config = json.load(handle)
        settings = Settings(**config.get("settings", {}))
        watchdog = Watchdog(config, settings, prober=make_prober(config.get("probe"), settings))
        _ = watchdog.rules
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"vllm-watchdog: bad config {argv[1]}: {exc}", file=sys.stderr)
        return 2
    serve(watchdog)
    log(f"vllm-watchdog on {config['node']}: {len(watchdog.rules)} rule(s), "
        f"listening on {config['listen_host']}:{config['listen_port']}")
    if watchdog.prober is not None:
        log(f"probe: {describe_probe(watchdog.prober, config['probe'])}")
    while True:
        started = time.monotonic()
        try:
            watchdog.poll()
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"poll failed: {exc}")
        watchdog.pause(max(0.05, settings.poll_s - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
