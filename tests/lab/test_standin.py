"""The simulated GPU stack on a running lab: nvidia-smi, metadata, lab set, mp and Ray stand-ins.

Cost: about 190 s on the stand-in tier (3 lab workers on 2 cores); docs/testing.md, "Per module".
"""

from __future__ import annotations

import base64
import json
import time

import pytest
from lab_support import provision

pytestmark = pytest.mark.lab

VENV_PY = "/opt/vllm/bin/python"
MODEL = "/srv/models/lab-model"
RAY_FLAGS = ("--num-gpus=4 --num-cpus=1 --memory=1000000000 --object-store-memory=200000000 "
             "--disable-usage-stats --block")
RAY_UNIT = ("-p KillMode=mixed -p SuccessExitStatus=1 -p TimeoutStopSec=20 "
            "-E RAY_USAGE_STATS_ENABLED=0")


def _ssh(lab, host: str, command: str, timeout_s: float = 60) -> str:  # type: ignore[no-untyped-def]
    result = lab.ssh(host, command, timeout_s=timeout_s)
    assert result.returncode == 0, f"{host}: {command}: {result.stderr}"
    return str(result.stdout)


def _address(lab, name: str) -> str:  # type: ignore[no-untyped-def]
    return next(h.address for h in lab.hosts if h.name == name)


def _curl(lab, host: str, url: str, data: dict | None = None, max_time: int = 10) -> str:  # type: ignore[no-untyped-def]
    body = f"-H 'Content-Type: application/json' -d '{json.dumps(data)}'" if data else ""
    result = lab.ssh(host, f"curl -s -o /dev/stdout -w '\\n%{{http_code}}' --max-time "
                           f"{max_time} {body} {url}", timeout_s=max_time + 10)
    return str(result.stdout)


def _stop(lab, host: str, *units: str) -> None:  # type: ignore[no-untyped-def]
    for unit in units:
        lab.ssh(host, f"systemctl kill -s KILL {unit}; systemctl stop {unit}; "
                      f"systemctl reset-failed {unit}", timeout_s=60)


def _wait_http(lab, host: str, url: str, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _curl(lab, host, url, max_time=3).endswith("200"):
            return True
        time.sleep(1)
    return False


def test_nvidia_smi_lists_four_gpus_on_each_host(lab) -> None:  # type: ignore[no-untyped-def]
    for host in ("h1", "h2"):
        out = _ssh(lab, host, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
        assert out.splitlines() == ["NVIDIA H200, 580.95.05"] * 4


def test_real_ray_imports_and_versions_follow_lab_set(lab) -> None:  # type: ignore[no-untyped-def]
    _ssh(lab, "h1", f"{VENV_PY} -c 'import ray'")
    code = f"{VENV_PY} -c \"import importlib.metadata as m; print(m.version('vllm'))\""
    try:
        assert provision("lab", "set", "h2", "vllm=0.33.1").returncode == 0
        assert _ssh(lab, "h2", code).strip() == "0.33.1"
        assert _ssh(lab, "h1", code).strip() == "0.33.0"
    finally:
        provision("lab", "set", "h2", "vllm=default")
    assert _ssh(lab, "h2", code).strip() == "0.33.0"


def _start_mp(lab, h1_extra: str = "") -> tuple[str, str]:  # type: ignore[no-untyped-def]
    ip1 = _address(lab, "h1")
    common = (f"{MODEL} -tp 4 -pp 2 --nnodes 2 --master-addr {ip1} --master-port 29501 "
              "--served-model-name lab")
    _ssh(lab, "h1", f"systemd-run -q --unit=standin-mp -p TimeoutStopSec=5 -E VLLM_HOST_IP={ip1} "
                    f"/opt/vllm/bin/vllm serve {common} --node-rank 0 --port 8000 {h1_extra}")
    return ip1, common


def test_mp_serves_only_after_both_nodes_joined(lab) -> None:  # type: ignore[no-untyped-def]
    _, common = _start_mp(lab)
    try:
        time.sleep(3)
        assert _curl(lab, "h1", "http://127.0.0.1:8000/health", max_time=2).endswith("000")
        _ssh(lab, "h2", f"systemd-run -q --unit=standin-mp -p TimeoutStopSec=5 "
                        f"/opt/vllm/bin/vllm serve {common} --node-rank 1 --headless")
        assert _wait_http(lab, "h1", "http://127.0.0.1:8000/health", 60)
        answer = _curl(lab, "h1", "http://127.0.0.1:8000/v1/completions",
                       {"model": "lab", "prompt": "hello", "max_tokens": 4})
        assert answer.endswith("200") and '"text_completion"' in answer
    finally:
        _stop(lab, "h1", "standin-mp")
        _stop(lab, "h2", "standin-mp")


def test_mp_with_an_nccl_mismatch_never_serves(lab) -> None:  # type: ignore[no-untyped-def]
    assert provision("lab", "set", "h2", "nccl=2.27.3", "init_timeout_s=15").returncode == 0
    provision("lab", "set", "h1", "init_timeout_s=15")
    try:
        _, common = _start_mp(lab)
        _ssh(lab, "h2", f"systemd-run -q --unit=standin-mp /opt/vllm/bin/vllm serve {common} "
                        "--node-rank 1 --headless")
        assert not _wait_http(lab, "h1", "http://127.0.0.1:8000/health", 12)
        time.sleep(8)
        state = lab.ssh("h1", "systemctl is-active standin-mp", timeout_s=30).stdout.strip()
        assert state in ("failed", "inactive")  # the watchdog timeout ended it
    finally:
        _stop(lab, "h1", "standin-mp")
        _stop(lab, "h2", "standin-mp")
        provision("lab", "set", "h2", "nccl=default", "init_timeout_s=default")
        provision("lab", "set", "h1", "init_timeout_s=default")


def test_ray_with_nnodes_2_is_rejected_with_vllms_message(lab) -> None:  # type: ignore[no-untyped-def]
    result = lab.ssh("h1", f"/opt/vllm/bin/vllm serve {MODEL} -tp 4 -pp 2 --nnodes 2 "
                           "--distributed-executor-backend ray", timeout_s=60)
    assert result.returncode == 1
    assert "nnodes > 1 can only be set when distributed executor backend is mp" in result.stderr


@pytest.fixture
def ray_cluster(lab):  # type: ignore[no-untyped-def]
    ip1, ip2 = _address(lab, "h1"), _address(lab, "h2")
    _ssh(lab, "h1", f"systemd-run -q --unit=standin-ray-head {RAY_UNIT} /opt/vllm/bin/ray start "
                    f"--head --node-ip-address={ip1} --port=6379 {RAY_FLAGS}")
    _ssh(lab, "h2", f"systemd-run -q --unit=standin-ray-worker {RAY_UNIT} /opt/vllm/bin/ray "
                    f"start --address={ip1}:6379 --node-ip-address={ip2} {RAY_FLAGS}")
    count = (f"{VENV_PY} -c \"import ray; ray.init(address='auto', logging_level='ERROR'); "
             "print(sum(n['Alive'] for n in ray.nodes()))\"")
    deadline = time.monotonic() + 90
    while lab.ssh("h1", count, timeout_s=60).stdout.strip() != "2":
        assert time.monotonic() < deadline, "the Ray cluster did not come up"
        time.sleep(2)
    yield ip1, ip2
    _stop(lab, "h2", "standin-ray-worker")
    _stop(lab, "h1", "standin-ray-head")


def test_ray_places_world_size_8_as_4_bundles_per_node_and_serves(lab, ray_cluster) -> None:  # type: ignore[no-untyped-def]
    ip1, ip2 = ray_cluster
    try:
        _ssh(lab, "h1", f"systemd-run -q --unit=standin-ray-vllm -E VLLM_HOST_IP={ip1} "
                        f"/opt/vllm/bin/vllm serve {MODEL} -tp 4 -pp 2 "
                        "--distributed-executor-backend ray --served-model-name lab")
        assert _wait_http(lab, "h1", "http://127.0.0.1:8000/health", 120)
        log = _ssh(lab, "h1", "journalctl -u standin-ray-vllm --no-pager")
        assert f"'{ip1}': 4" in log and f"'{ip2}': 4" in log
        for host in ("h1", "h2"):
            apps = _ssh(lab, host, "nvidia-smi --query-compute-apps=pid --format=csv,noheader")
            assert len(apps.splitlines()) == 4
        answer = _curl(lab, "h1", "http://127.0.0.1:8000/v1/completions",
                       {"model": "lab", "prompt": "hi", "max_tokens": 2})
        assert answer.endswith("200")
    finally:
        _stop(lab, "h1", "standin-ray-vllm")


def test_ray_with_an_unknown_vllm_host_ip_stays_pending_until_timeout(lab, ray_cluster) -> None:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    result = lab.ssh("h1", f"VLLM_HOST_IP=10.255.255.1 VLLM_LAB_PG_TIMEOUT_S=12 "
                           f"/opt/vllm/bin/vllm serve {MODEL} -tp 4 -pp 2 "
                           "--distributed-executor-backend ray", timeout_s=120)
    assert result.returncode == 1 and time.monotonic() - start >= 12
    assert "Waiting for creating a placement group of specs" in result.stderr
    assert "Cannot provide a placement group" in result.stderr


def test_streaming_returns_tokens_at_the_configured_pace(lab) -> None:  # type: ignore[no-untyped-def]
    provision("lab", "set", "h1", "token_s=0.2", "load_s=1")
    try:
        _ssh(lab, "h1", f"systemd-run -q --unit=standin-one /opt/vllm/bin/vllm serve {MODEL} "
                        "--served-model-name lab --port 8001")
        assert _wait_http(lab, "h1", "http://127.0.0.1:8001/health", 60)
        body = json.dumps({"model": "lab", "prompt": "hi", "max_tokens": 6, "stream": True})
        script = ("import json, time, urllib.request as u\n"
                  "r = u.Request('http://127.0.0.1:8001/v1/completions', "
                  f"data={body!r}.encode(), headers={{'Content-Type': 'application/json'}})\n"
                  "t = time.monotonic()\n"
                  "print(json.dumps([time.monotonic() - t for line in u.urlopen(r) "
                  "if line.startswith(b'data: {')]))\n")
        encoded = base64.b64encode(script.encode()).decode()
        times = json.loads(_ssh(lab, "h1", f"echo {encoded} | base64 -d | python3"))
        assert len(times) == 6
        assert times[-1] - times[0] >= 5 * 0.2 * 0.9
    finally:
        _stop(lab, "h1", "standin-one")
        provision("lab", "set", "h1", "token_s=default", "load_s=default")
