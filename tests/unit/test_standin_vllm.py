"""The stand-in vLLM: vLLM's rejections, and an mp pair on localhost that serves only when whole
(a dead follower fails the next request; a frozen one hangs it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from vllm_provision_lab.gpu.install import GUEST_PACKAGE
from vllm_provision_lab.gpu.spec import effective_spec, write_overrides


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def host(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Start stand-in processes for lab host names; each host has its own spec and registry."""
    procs: list[subprocess.Popen[str]] = []
    (tmp_path / "model").mkdir()

    def start(name: str, *args: str, visible: str | None = None,
              **values: object) -> subprocess.Popen[str]:
        """``visible``: the process's CUDA_VISIBLE_DEVICES (None: unset, whatever the
        controller's own environment says)."""
        write_overrides(tmp_path, {name: {"load_s": 0.2, "ttft_s": 0.05, "token_s": 0.1,
                                          "init_timeout_s": 4, **values}})
        spec_file = tmp_path / f"{name}.json"
        spec_file.write_text(json.dumps(effective_spec(tmp_path, name)))
        env = dict(os.environ, VLLM_LAB_SPEC=str(spec_file),
                   VLLM_LAB_APPS_DIR=str(tmp_path / f"apps-{name}"),
                   PYTHONPATH=str(GUEST_PACKAGE.parent))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        proc = subprocess.Popen([sys.executable, "-m", "vllm_lab_standin", *args], env=env,
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # also the orphaned headless worker
        proc.wait()


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _complete(port: int, body: dict[str, object], headers: dict[str, str],
              timeout_s: float = 10) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_for(condition, timeout_s: float = 10) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(("args", "message"), [
    (["-tp", "4", "-pp", "2"], "World size (8) is larger than the number of available GPUs (4)"),
    (["-tp", "4", "-pp", "2", "--nnodes", "2", "--distributed-executor-backend", "ray"],
     "nnodes > 1 can only be set when distributed executor backend is mp, uni or"),
    (["--headless", "--api-server-count", "1"], "--api-server-count=1 cannot be used with "
     "--headless"),
    (["--tokenizer", "/srv/models/no-such-tokenizer"],
     "Incorrect path_or_model_id: '/srv/models/no-such-tokenizer'"),
    # vLLM's EngineArgs.create_engine_config (vllm/engine/arg_utils.py) and serve.py
    (["-dp", "4", "--data-parallel-hybrid-lb"],
     "data_parallel_size_local must be set to use data_parallel_hybrid_lb."),
    (["-dp", "4", "-dpl", "2", "--data-parallel-hybrid-lb", "--headless"],
     "data_parallel_hybrid_lb is not applicable in headless mode"),
    (["-tp", "4", "-dp", "4", "-dpl", "2", "--headless"],
     "local_world_size (8) must be less than or equal to the number of visible devices (4)"),
])
def test_vllm_rejects_what_vllm_rejects(host, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    proc = host("h1", "serve", "model", *args)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and message in err


@pytest.mark.parametrize(("visible", "message"), [
    ("2,3", "World size (4) is larger than the number of available GPUs (2)"),
    # CUDA hides an index the host lacks and every one after it
    ("1,7,2,3", "World size (4) is larger than the number of available GPUs (1)"),
])
def test_vllm_counts_the_gpus_cuda_visible_devices_shows(host, visible: str,  # type: ignore[no-untyped-def]
                                                         message: str) -> None:
    proc = host("h1", "serve", "model", "-tp", "4", visible=visible)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and message in err


def test_version_prints_the_spec_version_and_says_stand_in(host) -> None:  # type: ignore[no-untyped-def]
    proc = host("h1", "--version", vllm="0.33.1")
    out, err = proc.communicate(timeout=20)
    assert out.strip() == "0.33.1" and "lab stand-in" in err


def test_a_client_that_resets_its_connection_leaves_no_traceback(host) -> None:  # type: ignore[no-untyped-def]
    """uvicorn drops such a connection quietly; a traceback in the journal would read as a
    failure of the engine to whoever looks there after a fault."""
    port = _free_port()
    proc = host("h1", "serve", "model", "-tp", "1", "--port", str(port))
    assert _wait_for(lambda: _get(port, "/health") == 200)
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert _get(port, "/health") == 200
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err, err[-3000:]


def test_mp_pair_serves_only_after_both_joined_then_dies_like_vllm(host) -> None:  # type: ignore[no-untyped-def]
    port, master = _free_port(), _free_port()
    common = ["serve", "model", "-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master), "--served-model-name", "tiny"]
    rank0 = host("h1", *common, "--node-rank", "0", "--port", str(port), "--api-key", "k")
    time.sleep(1.0)
    assert _get(port, "/health") == 0  # no HTTP port while waiting for peers
    rank1 = host("h2", *common, "--node-rank", "1", "--headless")
    assert _wait_for(lambda: _get(port, "/health") == 200)
    assert _get(port, "/v1/models") == 401  # --api-key protects /v1 only
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", headers={"Authorization": "Bearer k",
                                                             "Content-Type": "application/json"},
        data=json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 4,
                         "stream": True}).encode())
    start = time.monotonic()
    with urllib.request.urlopen(request, timeout=10) as response:
        arrivals = [time.monotonic() - start for line in response if line.startswith(b"data: {")]
    assert len(arrivals) == 4
    # token_s = 0.1 s: the server cannot send the 4th token before 0.3 s, and a client that
    # waits for the CPU only sees tokens later (two may then arrive together: under the full
    # suite's load a 0.08 s bound on every gap failed), so: the last one late enough, and the
    # tokens streamed, not sent in one burst
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert arrivals[-1] >= 3 * 0.1 * 0.8, arrivals
    assert max(gaps) >= 0.08, arrivals
    rank1.kill()  # the headless main process; its worker lives on as an orphan (measured)
    rank1.wait()
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    auth = {"Authorization": "Bearer k"}
    assert _complete(port, body, auth)[0] == 200
    os.killpg(rank1.pid, signal.SIGKILL)  # now the worker too (systemd's final SIGKILL)
    time.sleep(0.3)
    assert _get(port, "/health") == 200  # nothing notices without traffic
    assert _complete(port, body, auth)[0] == 500
    assert rank0.wait(timeout=10) == 0  # exits with status 0: Restart=on-failure won't fire


@pytest.mark.parametrize("hybrid", [False, True])
def test_data_parallel_nodes_meet_on_the_rpc_port_and_fail_together(host, hybrid: bool) -> None:  # type: ignore[no-untyped-def]
    """Internal layout: rank 0 serves only once the headless node's engines joined on the RPC
    port, and a dead member fails rank 0's next request (the group's lockstep). Hybrid: the
    other node serves its own API too, and fails its next request once rank 0 is gone."""
    port, port1, rpc = _free_port(), _free_port(), _free_port()
    common = ["serve", "model", "-tp", "2", "-dp", "4", "-dpl", "2", "--data-parallel-address",
              "127.0.0.1", "--data-parallel-rpc-port", str(rpc), "--served-model-name", "tiny"]
    if hybrid:
        common.append("--data-parallel-hybrid-lb")
    rank0 = host("h1", *common, "--data-parallel-start-rank", "0", "--port", str(port))
    time.sleep(1.0)
    assert _get(port, "/health") == 0  # no HTTP port while waiting for the other engines
    other = (["--port", str(port1)] if hybrid else ["--headless"])
    rank1 = host("h2", *common, "--data-parallel-start-rank", "2", *other)
    assert _wait_for(lambda: _get(port, "/health") == 200)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    assert _complete(port, body, {})[0] == 200
    if hybrid:
        assert _wait_for(lambda: _get(port1, "/health") == 200)
        assert _complete(port1, body, {})[0] == 200
        os.killpg(rank0.pid, signal.SIGKILL)
        rank0.wait()
        assert _wait_for(lambda: _complete(port1, body, {})[0] == 500)
        assert rank1.wait(timeout=10) == 0
    else:
        os.killpg(rank1.pid, signal.SIGKILL)
        rank1.wait()
        time.sleep(0.3)
        assert _complete(port, body, {})[0] == 500
        assert rank0.wait(timeout=10) == 0


def test_nccl_mismatch_never_serves(host) -> None:  # type: ignore[no-untyped-def]
    port, master = _free_port(), _free_port()
    common = ["serve", "model", "-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master)]
    rank0 = host("h1", *common, "--node-rank", "0", "--port", str(port), init_timeout_s=2)
    rank1 = host("h2", *common, "--node-rank", "1", "--headless", nccl="2.27.3",
                 init_timeout_s=2)
    assert not _wait_for(lambda: _get(port, "/health") == 200, timeout_s=1.5)
    _, err0 = rank0.communicate(timeout=20)
    rank1.communicate(timeout=20)
    assert rank0.returncode == 1 and "Watchdog caught collective operation timeout" in err0
    assert rank1.returncode == 1


def test_mp_frozen_follower_hangs_requests_with_health_200_until_the_collective_timeout(
        host) -> None:  # type: ignore[no-untyped-def]
    """SIGSTOP of the headless node (``systemctl kill -s STOP``): every step needs it, so a
    completion gets no answer while /health stays 200; thawed, the group serves again; frozen
    past the collective timeout (init_timeout_s here 3 s), the engine dies like with a dead peer."""
    port, master = _free_port(), _free_port()
    common = ["serve", "model", "-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master), "--served-model-name", "tiny"]
    rank0 = host("h1", *common, "--node-rank", "0", "--port", str(port), init_timeout_s=3)
    rank1 = host("h2", *common, "--node-rank", "1", "--headless", init_timeout_s=3)
    assert _wait_for(lambda: _get(port, "/health") == 200)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
    assert _complete(port, body, {})[0] == 200
    os.killpg(rank1.pid, signal.SIGSTOP)  # main process and worker
    with pytest.raises(TimeoutError):
        _complete(port, body, {}, timeout_s=1.0)
    assert _get(port, "/health") == 200  # /health says nothing about the peer
    os.killpg(rank1.pid, signal.SIGCONT)
    assert _complete(port, body, {})[0] == 200  # frozen is not dead: the group goes on
    os.killpg(rank1.pid, signal.SIGSTOP)
    started = time.monotonic()
    assert _complete(port, body, {})[0] == 500
    assert 2.5 <= time.monotonic() - started < 8
    assert rank0.wait(timeout=10) == 0
    os.killpg(rank1.pid, signal.SIGCONT)
    assert "Watchdog caught collective operation timeout" in rank0.communicate()[1]
