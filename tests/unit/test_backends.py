"""The Backend layer: the registry, what mp and Ray declare, and a toy third backend registered
from outside the package (tests/data/backends) taking part in inventory, playbooks and the
watchdog's templates without any change to vllm_provision."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from vllm_provision import backends
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.inventory import load_inventory
from vllm_provision.runner.playbook import load_playbook
from vllm_provision.runner.templating import Templar, make_environment
from vllm_provision.settings import variables

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "backends"))
from render_support import ROLES  # noqa: E402
from toy_backend import ToyBackend  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def toy() -> Iterator[backends.Backend]:
    backend = backends.register(ToyBackend())
    yield backend
    backends.unregister("toy")


def _replica(backend: str, nodes: int = 2) -> Replica:
    hosts = [Host(name=f"h{i}", address=f"10.0.0.{10 + i}") for i in range(1, nodes + 1)]
    return Replica(name="r", backend=backend,
                   nodes=tuple(Node(host=h, rank=i, host_ip=h.address)
                               for i, h in enumerate(hosts)),
                   engine=EngineArgs(model="/srv/m", master_port=29511))


def test_builtin_backends_are_registered_and_an_unknown_name_is_a_located_error() -> None:
    assert backends.names()[:2] == ("mp", "ray")
    assert backends.get("ray").ray_cluster and not backends.get("mp").ray_cluster
    with pytest.raises(ProvisionError) as caught:
        backends.get("slurm")
    assert "one of mp, ray" in str(caught.value.problems[0].expected)


def test_units_and_ports_come_from_the_backend() -> None:
    mp, ray = _replica("mp"), _replica("ray")
    assert mp.backend_type.replica_units(mp, {}) == {"h1": ["vllm.service"],
                                                    "h2": ["vllm.service"]}
    assert ray.backend_type.replica_units(ray, {"vllm_unit_name": "v.service"}) == {
        "h1": ["ray-head.service", "v.service"], "h2": ["ray-worker.service"]}
    assert mp.backend_type.rendezvous(mp) == (29511, "master port")
    assert ray.backend_type.rendezvous(ray) == (6379, "Ray GCS port")
    assert ray.backend_type.listen_ports(ray, 1) == []
    head = ray.backend_type.listen_ports(ray, 0)
    # the dashboard is off unless ray_include_dashboard (docs/security.md)
    assert (10001, "Ray client server") in head and (8265, "Ray dashboard") not in head


def test_a_registered_backend_is_accepted_by_the_inventory_and_gets_its_group(
        toy: backends.Backend, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  children:\n    vllm_replicas:\n      children:\n        r:\n"
        "          vars: {vllm_backend: toy, vllm_model: /srv/m}\n"
        "          hosts:\n"
        "            h1: {ansible_host: 10.0.0.11, vllm_node_rank: 0}\n"
        "            h2: {ansible_host: 10.0.0.12, vllm_node_rank: 1}\n")
    loaded = load_inventory(inventory)
    assert loaded.replicas[0].backend_type is toy
    assert loaded.hosts_in_group("vllm_toy") == ["h1", "h2"]
    assert loaded.hosts_in_group("vllm_mp") == []
    backends.unregister("toy")
    with pytest.raises(ProvisionError, match="vllm_backend"):
        load_inventory(inventory)


def test_each_backend_brings_its_plays_to_the_playbooks(toy: backends.Backend) -> None:
    plays = load_playbook(REPO / "playbooks" / "up.yml")
    install = [(p.hosts, p.name) for p in plays if p.name.startswith("Install")]
    assert install == [("vllm_mp", "Install the vLLM units of mp replicas"),
                       ("vllm_ray", "Install the Ray and vLLM units of Ray replicas"),
                       ("vllm_toy", "Install the stub units of toy replicas")]
    toy_roles = next(p for p in plays if p.hosts == "vllm_toy").template_dirs
    assert toy_roles[1] == Path(ToyBackend.roles_dir or "") / "toy_stub" / "templates"
    down = [p.hosts for p in load_playbook(REPO / "playbooks" / "down.yml")]
    assert "vllm_toy" in down and "vllm_mp:&vllm_master" in down


def test_a_backend_play_on_another_pattern_is_refused(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "vllm_mp"
    (role / "plays").mkdir(parents=True)
    (role / "plays" / "start.yml").write_text("- hosts: all\n  tasks: []\n")
    playbook = tmp_path / "playbooks" / "p.yml"
    playbook.parent.mkdir()
    playbook.write_text("- name: start\n  backend_plays: start\n")
    with pytest.raises(ProvisionError) as caught:
        load_playbook(playbook)
    assert caught.value.problems[0].where.endswith("start.yml: play[0].hosts")


def test_the_watchdog_renders_the_backend_plan(toy: backends.Backend) -> None:
    replica = _replica("toy")
    values = dict(variables.defaults())
    for role in ("vllm_common", "vllm_watchdog"):
        values.update(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()))
    templar = Templar(make_environment(), values, "h1",
                      {"replica": replica, "node": replica.nodes[0]})
    text = (ROLES / "vllm_watchdog" / "templates" / "watchdog.json.j2").read_text()
    config = json.loads(templar.render(text, "watchdog.json.j2"))
    assert config["units"] == ["toy-stub.service"]
    assert config["rules"] == [] and config["probe"] is None


def test_the_first_lookups_from_many_threads_all_see_the_built_in_backends(monkeypatch):
    # hosts are probed in threads; the registry once answered "unknown backend 'mp'" to a
    # thread that looked it up while another was still filling it
    import threading

    import vllm_provision.backends.base as registry

    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_LOADED", False)
    seen: list[tuple[str, ...]] = []
    barrier = threading.Barrier(8)

    def look() -> None:
        barrier.wait()
        seen.append(registry.names())

    threads = [threading.Thread(target=look) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and all(names[:2] == ("mp", "ray") for names in seen), seen
