"""A real Prometheus scrapes what ``provision monitor`` writes for the lab's replicas
(docs/monitoring.md).

The broker hands out each lab replica serving (mp, then Ray; both lab inventories ask for
``vllm_monitoring: node_exporter``, so role vllm_monitoring has started Debian's node exporter
on both nodes, with its systemd collector). ``provision monitor --scrape-interval 1s`` writes
the targets and ``prometheus.yml``; the controller runs Debian's Prometheus 2.42 (unpacked at
set-up, ``vllm_provision_lab.prometheus``) on it, and the test asks Prometheus' HTTP API, as an
operator's Grafana would:

- every target of the ``vllm`` and ``node`` jobs is ``up`` (vLLM's ``/metrics`` on rank 0, both
  node exporters) within a bound of a few scrape intervals; a Ray replica's ``ray`` job has its
  two nodes, labelled (the lab's Ray has no metrics agent: it needs ``ray[default]``);
- ``vllm:num_requests_running`` is scraped with the labels replica, backend, role ``api``,
  node_rank ``0`` and host ``h1``; the node exporter's ``node_systemd_unit_state`` says
  ``vllm.service`` is active on rank 0, labelled with its replica and host.

Read only: the replicas are left as they were handed out; Prometheus runs under the test's
temporary folder and is stopped at the end.

Cost: about 10 s per replica the broker already holds serving (Prometheus' start and a few
1 s scrapes); a replica it does not hold is deployed by the broker first (the Ray case after
an mp holder costs that switch); docs/testing.md, "Per module".
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lab_support import ReplicaBroker

from vllm_provision_lab import prometheus

pytestmark = pytest.mark.lab

SCRAPE = "1s"
# Prometheus' first scrape of a target comes within one interval of its discovery; a few
# intervals cover a loaded CI machine.
UP_WITHIN_S = 30.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Prometheus:
    """One Prometheus server on the controller's loopback, reading ``config``."""

    def __init__(self, config: Path, data: Path) -> None:
        binaries = prometheus.binaries()
        assert binaries is not None, ("no Prometheus on the controller: scripts/setup.sh "
                                      "unpacks Debian's (python -m vllm_provision_lab.prometheus)")
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = data.parent / "prometheus.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [str(binaries / "prometheus"), f"--config.file={config}",
                 f"--storage.tsdb.path={data}", f"--web.listen-address={self.url[7:]}"],
                stdout=log, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=5.0)
        self._until(lambda: self.client.get("/-/ready").status_code == 200, 30.0, "ready")

    def _until(self, done: Any, bound_s: float, what: str) -> None:
        deadline = time.monotonic() + bound_s
        while True:
            try:
                if done():
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, f"Prometheus exited: {self.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"Prometheus not {what} within {bound_s} s"
            time.sleep(0.25)

    def targets(self) -> list[dict[str, Any]]:
        """The active targets (Prometheus HTTP API, ``/api/v1/targets``)."""
        return list(self.client.get("/api/v1/targets").json()["data"]["activeTargets"])

    def wait_all_up(self, jobs: set[str]) -> list[dict[str, Any]]:
        """Wait until every active target of ``jobs`` has health ``up`` (and each job has at
        least one), then return them."""
        found: list[dict[str, Any]] = []

        def all_up() -> bool:
            nonlocal found
            found = [t for t in self.targets() if t["labels"].get("job") in jobs]
            return {t["labels"]["job"] for t in found} == jobs and all(
                t["health"] == "up" for t in found)

        try:
            self._until(all_up, UP_WITHIN_S, "scraping every target")
        except AssertionError:
            raise AssertionError([(t["scrapeUrl"], t["health"], t.get("lastError"))
                                  for t in found]) from None
        return found

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (``/api/v1/query``)."""
        answer = self.client.get("/api/v1/query", params={"query": expr}).json()
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture()
def scraped(tmp_path: Path) -> Iterator[Any]:
    """``start(inventory, replica)``: run ``monitor`` for the inventory and a Prometheus on
    what it wrote; the server is stopped after the test."""
    servers: list[Prometheus] = []

    def start(replica: Any) -> Prometheus:
        out = tmp_path / "prom"
        done = replica.provision("monitor", "-i", replica.inventory, "--out", str(out),
                                 "--scrape-interval", SCRAPE, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        server = Prometheus(out / "prometheus.yml", tmp_path / "data")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("kind", ["mp", "ray"])
def test_prometheus_scrapes_every_target_monitor_writes(replicas: ReplicaBroker, scraped: Any,
                                                        kind: str) -> None:
    replica = replicas.serving(kind)
    server = scraped(replica)
    targets = server.wait_all_up({"vllm", "node"})
    assert sorted((t["labels"]["job"], t["labels"]["host"], t["labels"]["role"])
                  for t in targets) == [("node", "h1", "head"), ("node", "h2", "worker"),
                                        ("vllm", "h1", "api")]
    # Ray's metrics agent serves only with ray[default] (its dashboard agent's reporter needs
    # opencensus and prometheus_client), which neither vLLM's requirements nor the lab's Ray
    # have: the targets are written and labelled; whether they are up is the cluster's
    # (docs/monitoring.md, "Targets")
    ray = sorted((t["labels"]["host"], t["labels"]["role"], t["labels"]["replica"])
                 for t in server.targets() if t["labels"]["job"] == "ray")
    assert ray == ([("h1", "head", "lab"), ("h2", "worker", "lab")] if kind == "ray" else [])

    [running] = server.query('vllm:num_requests_running{job="vllm"}')
    labels = running["metric"]
    assert (labels["replica"], labels["backend"], labels["role"], labels["node_rank"],
            labels["host"]) == ("lab", kind, "api", "0", "h1"), labels
    assert float(running["value"][1]) >= 0

    states = server.query('node_systemd_unit_state{job="node",name="vllm.service",'
                          'state="active"}')
    assert {(s["metric"]["host"], s["metric"]["replica"], s["value"][1]) for s in states} >= {
        ("h1", "lab", "1")}, states
    restarts = server.query('node_systemd_service_restart_total{name="vllm.service"}')
    assert {s["metric"]["host"] for s in restarts} >= {"h1"}, restarts
