"""A real Prometheus scrapes what ``provision monitor`` writes for the lab's replicas, and
``provision top`` shows them (docs/monitoring.md).

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
  ``vllm.service`` is active on rank 0, labelled with its replica and host;
- the generated rules run: a replica ``ghost`` added to the inventory for ``monitor`` (one node
  at an address nobody answers, ``vllm_alert_down_for_s: 2``, and a front door in
  ``vllm_gateways``) gets its not-serving and node-unreachable alerts, and its front door its
  ``VllmFrontDoorDown``, all firing after their 2 s ``for:``; the serving replica gets none.

``provision top --once`` and ``--json`` (after one completion, so the histograms have an
observation) show the replica serving with numbers: requests, KV cache, TTFT, tokens/s, each
node's units active and GPU memory from the stand-in's nvidia-smi; the JSON validates against
its schema.

Read only: the replicas are left as they were handed out; Prometheus runs under the test's
temporary folder and is stopped at the end. The tests run with mp first, then with Ray (a
module-scoped parameter: one broker switch).

Cost: about 60 s on one lab instance alone (both kinds, the broker's cold deploy of mp and its
switch to Ray included; 61 s measured for the Prometheus half); docs/testing.md, "Per
module".
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lab_support import ReplicaBroker, complete
from vllm_provision_lab import prometheus

from vllm_provision.cli import json_schemas

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

    def wait_all_up(self, jobs: set[str], but: str) -> list[dict[str, Any]]:
        """Wait until every active target of ``jobs`` but those of replica ``but`` has health
        ``up`` (and each job has at least one), then return them."""
        found: list[dict[str, Any]] = []

        def all_up() -> bool:
            nonlocal found
            found = [t for t in self.targets() if t["labels"].get("job") in jobs
                     and t["labels"].get("replica") != but]
            return {t["labels"]["job"] for t in found} == jobs and all(
                t["health"] == "up" for t in found)

        try:
            self._until(all_up, UP_WITHIN_S, "scraping every target")
        except AssertionError:
            raise AssertionError([(t["scrapeUrl"], t["health"], t.get("lastError"))
                                  for t in found]) from None
        return found

    def alerts(self) -> list[tuple[str, str, str]]:
        """``(alertname, replica or host, state)`` of every alert Prometheus holds
        (``/api/v1/alerts``: pending or firing)."""
        data = self.client.get("/api/v1/alerts").json()["data"]["alerts"]
        return sorted((a["labels"]["alertname"],
                       a["labels"].get("replica", a["labels"].get("host", "")), a["state"])
                      for a in data)

    def wait_alerts(self, want: set[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        """Wait until the alerts held are exactly ``want`` (``(alertname, replica or host,
        state)``), then return them."""
        held: list[tuple[str, str, str]] = []

        def present() -> bool:
            nonlocal held
            held = self.alerts()
            return set(held) == want

        try:
            self._until(present, UP_WITHIN_S, "holding the alerts")
        except AssertionError:
            raise AssertionError(held) from None
        return held

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


GHOST, GHOST_HOST = "ghost", "h99"
# The ghost's vllm_alert_down_for_s: its alerts fire within seconds of the first scrape.
DOWN_FOR_S = 2


def with_ghost(inventory: Path, path: Path) -> Path:
    """The lab inventory plus replica ``ghost``: one node at an address of the lab's network
    where no host answers (``.99``), monitored like the lab's replica, so its targets are down
    and its alerts due, beside the serving replica's."""
    data = yaml.safe_load(inventory.read_text())
    replicas = data["all"]["children"]["vllm_replicas"]["children"]
    [lab] = replicas.values()
    address = next(iter(lab["hosts"].values()))["ansible_host"].rsplit(".", 1)[0] + ".99"
    replicas[GHOST] = {"vars": {**lab["vars"], "vllm_backend": "mp",
                                "vllm_pipeline_parallel_size": 1,
                                "vllm_alert_down_for_s": DOWN_FOR_S},
                       "hosts": {GHOST_HOST: {"ansible_host": address, "vllm_node_rank": 0}}}
    # A front door on the ghost's host (never installed: monitor contacts no host), with the
    # same short for:, so its gateway target is down and VllmFrontDoorDown fires.
    data["all"]["children"]["vllm_gateways"] = {"hosts": {GHOST_HOST: {
        "vllm_gateway_wheelhouse": "/nonexistent", "vllm_alert_down_for_s": DOWN_FOR_S}}}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture()
def scraped(tmp_path: Path) -> Iterator[Any]:
    """``start(inventory, replica)``: run ``monitor`` for the inventory and a Prometheus on
    what it wrote; the server is stopped after the test."""
    servers: list[Prometheus] = []

    def start(replica: Any) -> Prometheus:
        out = tmp_path / "prom"
        inventory = with_ghost(Path(replica.inventory), tmp_path / "fleet.yml")
        done = replica.provision("monitor", "-i", str(inventory), "--out", str(out),
                                 "--scrape-interval", SCRAPE, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        server = Prometheus(out / "prometheus.yml", tmp_path / "data")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module", params=["mp", "ray"])
def kind(request: pytest.FixtureRequest) -> str:
    """The lab replica of the tests: a module-scoped parameter, so pytest runs every test with
    mp, then every test with Ray (one broker switch)."""
    return str(request.param)


def test_prometheus_scrapes_every_target_monitor_writes(replicas: ReplicaBroker, scraped: Any,
                                                        kind: str) -> None:
    replica = replicas.serving(kind)
    server = scraped(replica)
    targets = server.wait_all_up({"vllm", "node"}, but=GHOST)
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

    # The ghost replica's targets are down: its not-serving and node-unreachable alerts fire
    # after its 2 s for:, and its front door's; the serving replica has none.
    [gateway] = [t for t in server.targets() if t["labels"]["job"] == "gateway"]
    assert gateway["labels"]["host"] == GHOST_HOST, gateway
    assert gateway["scrapeUrl"].endswith(":29000/metrics"), gateway
    want = {("VllmReplicaNotServing", GHOST, "firing"), ("VllmNodeUnreachable", GHOST, "firing"),
            ("VllmFrontDoorDown", GHOST_HOST, "firing")}
    assert set(server.wait_alerts(want)) == want


def test_top_shows_the_serving_replica_with_numbers(replicas: ReplicaBroker, kind: str) -> None:
    replica = replicas.serving(kind)
    assert complete(replica.base_url, replica.model), "the handed-out replica did not answer"

    once = replica.provision("top", "-i", replica.inventory, "--once", timeout=120)
    assert once.returncode == 0, once.stdout + once.stderr
    assert "serving 1/1" in once.stdout and "not serving" not in once.stdout
    assert "latency (since start) TTFT p50 " in once.stdout
    assert "active (running)" in once.stdout and "GPU memory " in once.stdout
    assert "\x1b" not in once.stdout  # plain: not a terminal, no colour

    shown = replica.provision("top", "-i", replica.inventory, "--json", timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    document = json.loads(shown.stdout)
    json_schemas.validate("top", document)
    [info] = document["replicas"]
    assert info["serving"] and info["health"] == 200 and info["error"] is None
    assert info["requests"]["running"] is not None and info["kv_cache_perc"] is not None
    assert info["latency"]["ttft_s"]["count"] >= 1 and info["latency"]["ttft_s"]["p50"] > 0
    assert info["tokens_per_s"] is not None
    assert info["metric_names"]["kv_cache"] == "vllm:kv_cache_usage_perc"
    assert [n["host"] for n in info["nodes"]] == ["h1", "h2"]
    for node in info["nodes"]:
        assert node["error"] is None and node["gpus"], node
        assert all(g["memory_total_mib"] > 0 for g in node["gpus"])
        assert all(u["active_state"] == "active" for u in node["units"]), node
        assert all(u["restarts_1h"] is not None for u in node["units"]), node
