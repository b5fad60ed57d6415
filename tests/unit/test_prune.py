"""What an earlier up installed that the new plan lacks: the pure diff, its stop order, purge,
records of the earlier version, the preflight's view of leaving units, and the plan's removals."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from test_runner_support import make_inventory

from vllm_provision.checks import network
from vllm_provision.checks.host import check_foreign_gpu_processes
from vllm_provision.checks.run import own_units
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.facts.gather import parse_owner
from vllm_provision.facts.model import GpuProcess, HostFacts, HostOwner, ListeningSocket
from vllm_provision.operations.plan import build_plan, plan_lines
from vllm_provision.state import prune

U = "/etc/systemd/system/"
WATCHDOG = (f"{U}vllm-watchdog.service", "/etc/vllm-provision/watchdog.json")
MP = {"h1": prune.Installed("h1", 0, "mp", ("vllm.service",),
                            (f"{U}vllm.service", "/etc/vllm-provision/vllm.env", *WATCHDOG)),
      "h2": prune.Installed("h2", 1, "mp", ("vllm.service",),
                            (f"{U}vllm.service", "/etc/vllm-provision/vllm.env", *WATCHDOG))}
RAY = {"h1": prune.Installed("h1", 0, "ray", ("ray-head.service", "vllm.service"),
                             (f"{U}ray-head.service", f"{U}vllm.service",
                              "/etc/vllm-provision/ray.env", "/etc/vllm-provision/vllm.env",
                              *WATCHDOG)),
       "h2": prune.Installed("h2", 1, "ray", ("ray-worker.service",),
                             (f"{U}ray-worker.service", "/etc/vllm-provision/ray.env",
                              *WATCHDOG))}


def test_mp_to_ray_stops_the_master_then_the_follower_and_removes_the_follower_s_vllm() -> None:
    removal = prune.diff(MP, RAY)
    assert removal.replaced == "mp -> ray"
    assert removal.waves == ((("h1", "vllm.service"),), (("h2", "vllm.service"),))
    # h1 keeps vllm.service by name (stopped: it runs mp's configuration), removes nothing
    assert removal.hosts["h1"] == prune.HostRemoval("h1", ("vllm.service",), (), ())
    assert removal.hosts["h2"] == prune.HostRemoval(
        "h2", ("vllm.service",), ("vllm.service",),
        (f"{U}vllm.service", "/etc/vllm-provision/vllm.env"))


def test_ray_to_mp_stops_vllm_then_the_workers_then_the_head() -> None:
    removal = prune.diff(RAY, MP)
    assert removal.waves == ((("h1", "vllm.service"),), (("h2", "ray-worker.service"),),
                             (("h1", "ray-head.service"),))
    assert removal.hosts["h1"].units == ("ray-head.service",)
    assert removal.hosts["h1"].files == (f"{U}ray-head.service", "/etc/vllm-provision/ray.env")
    assert removal.hosts["h2"].files == (f"{U}ray-worker.service",
                                         "/etc/vllm-provision/ray.env")


def test_the_same_plan_removes_nothing_and_a_renamed_unit_goes_alone() -> None:
    assert not prune.diff(MP, MP)
    renamed = {h: replace(i, units=("llm.service",),
                          files=tuple(p.replace("vllm.service", "llm.service") for p in i.files))
               for h, i in MP.items()}
    removal = prune.diff(MP, renamed)
    assert removal.replaced == ""
    assert removal.waves == ((("h1", "vllm.service"),), (("h2", "vllm.service"),))
    assert all(item.files == (f"{U}vllm.service",) for item in removal.hosts.values())


def test_a_host_the_run_does_not_target_is_left_alone() -> None:
    removal = prune.diff(MP, {"h1": RAY["h1"]})
    assert set(removal.hosts) == {"h1"}
    assert removal.waves == ((("h1", "vllm.service"),),)


def test_stop_order_puts_units_outside_the_backend_first_and_followers_together() -> None:
    three = [prune.Installed("a", 0, "ray", ("ray-head.service", "vllm.service"),
                             (f"{U}old-watchdog.service",)),
             prune.Installed("b", 1, "ray", ("ray-worker.service",)),
             prune.Installed("c", 2, "ray", ("ray-worker.service",))]
    stop = {"a": ["old-watchdog.service", "ray-head.service", "vllm.service"],
            "b": ["ray-worker.service"], "c": ["ray-worker.service"]}
    assert prune.stop_waves(three, stop) == (
        (("a", "old-watchdog.service"),), (("a", "vllm.service"),),
        (("b", "ray-worker.service"), ("c", "ray-worker.service")),
        (("a", "ray-head.service"),))


def test_purge_takes_every_unit_and_file_the_record_lists() -> None:
    item = prune.purge(RAY["h1"])
    assert item.units == ("ray-head.service", "vllm.service", "vllm-watchdog.service")
    assert set(item.files) == set(RAY["h1"].files)


def test_a_record_of_the_earlier_version_gives_its_units_from_its_unit_files() -> None:
    entry = {"rank": 0, "files": {f"{U}toy-stub.service": "x", f"{U}vllm-watchdog.service": "y"}}
    old = prune.from_record("h1", entry, "toy", ["toy-stub.service"])
    assert old is not None
    assert old.units == ("toy-stub.service",)
    assert old.all_units == ("toy-stub.service", "vllm-watchdog.service")
    assert prune.from_record("h1", {**entry, "units": ["a.service"]}, "toy", []).units == (
        "a.service",)
    assert prune.from_record("h1", None, "mp") is None


def test_parse_owner_reads_backend_rank_and_units_and_none_for_an_old_record() -> None:
    record = {"schema": 1, "inventory": "/i.yml", "replicas": {"lab": {"backend": "ray"}},
              "hosts": {"h1": {"replica": "lab", "rank": 0, "files": {},
                               "units": ["ray-head.service", "vllm.service"]},
                        "h2": {"replica": "lab", "rank": 1, "files": {}}}}
    one = parse_owner("h1", {"record": record}, [])
    two = parse_owner("h2", {"record": record}, [])
    assert one is not None and two is not None
    assert (one.backend, one.rank, one.units) == ("ray", 0, ("ray-head.service", "vllm.service"))
    assert (two.rank, two.units) == (1, None)


def test_on_the_host_only_what_is_there_is_stopped_disabled_and_removed() -> None:
    item = prune.diff(MP, RAY).hosts["h2"]
    script = prune.state_script(["vllm.service"], item.files)
    assert "/etc/vllm-provision/vllm.env" in script
    assert "rm " not in script and "systemctl stop" not in script  # it only reads
    units, files = prune.parse_state("@@unit vllm.service inactive enabled\n"
                                     f"@@file {U}vllm.service\n")
    now = prune.present(item, units, files)
    assert now == prune.HostRemoval("h2", (), ("vllm.service",), (f"{U}vllm.service",))
    assert not prune.present(item, {"vllm.service": ("inactive", "none")}, set())
    words = shlex.split(prune.removal_script(now.units, now.files).replace("&&", ";"))
    assert words[:4] == ["systemctl", "disable", "--now", "--"]
    assert f"{U}vllm.service.prev" in words and words[-1] == "daemon-reload"
    assert prune.removal_script((), ()) == "true"


def _node_facts(owner: HostOwner | None, unit: str) -> HostFacts:
    return HostFacts("h2", owner=owner,
                     gpu_processes=(GpuProcess(pid=7, process_name="python", gpu_uuid="G",
                                               used_memory_mib=10, unit=unit),),
                     listening=(ListeningSocket(address="0.0.0.0", port=6379, pid=7,
                                                process="python", unit=unit),))


def test_preflight_passes_an_earlier_plan_s_unit_only_because_up_stops_it(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    replica = inventory.replicas[0]
    node = replica.nodes[1]
    mine = HostOwner("/i.yml", "llama", "h2", {f"{U}ray-worker.service": "x"}, backend="ray",
                     rank=1, units=("ray-worker.service",))
    planned, leaving = own_units(replica, node, _node_facts(mine, "ray-worker.service"),
                                 "vllm-watchdog.service")
    assert (planned, leaving) == (["vllm.service"], ["ray-worker.service"])
    facts = _node_facts(mine, "ray-worker.service")
    ok = network.check_ports(node, facts, [(6379, "port")], planned, leaving=leaving)[0]
    assert ok.severity.value == "ok" and "stopped and removed before the start" in ok.actual
    gpu = check_foreign_gpu_processes(node, facts, planned, leaving=leaving)[0]
    assert gpu.severity.value == "ok" and "ray-worker.service" in gpu.actual
    # the same unit, but no record of ours lists it: another job's, an error
    planned, leaving = own_units(replica, node, _node_facts(None, "ray-worker.service"),
                                 "vllm-watchdog.service")
    assert leaving == []
    bad = network.check_ports(node, facts, [(6379, "port")], planned, leaving=leaving)[0]
    assert bad.severity.value == "error"
    assert check_foreign_gpu_processes(node, facts, planned)[0].severity.value == "error"


def test_the_plan_lists_the_stop_step_first_and_every_removed_file(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    removal = {"replica": "llama", "replaced": "ray -> mp",
               "waves": [[["h1", "vllm.service"]], [["h2", "ray-worker.service"]]],
               "units": {"h2": ["ray-worker.service"]},
               "files": {"h2": [f"{U}ray-worker.service", "/etc/vllm-provision/ray.env"]}}
    task = "Stop, disable and remove units and files no longer in the plan"
    results = [TaskResult("h1", task, Status.CHANGED, "would stop", data={"removal": removal}),
               TaskResult("h2", task, Status.CHANGED, "would stop"),
               TaskResult("h2", "Install the vLLM unit", Status.CHANGED, "would create")]
    outcome = SimpleNamespace(results=results, handler_results=[], batch_starts=[0])
    plan = build_plan(outcome, inventory, {"h1": ["vllm.service"], "h2": ["vllm.service"]},
                      {"llama": 7.0})
    assert [s["units"] for s in plan["steps"]] == [["vllm.service", "ray-worker.service"]]
    assert plan["steps"][0]["line"].startswith(
        f"{task}: would stop vllm.service on h1, then ray-worker.service on h2: the replica "
        "'llama' stops serving during the stop and the start (about 7.0 s")
    assert [(r["host"], r["unit"]) for r in plan["removals"]] == [
        ("h2", "ray-worker.service"), ("h2", None)]
    assert plan["summary"] == ("3 to change, 2 to remove, 0 restarts, replica 'llama' would be "
                               "unavailable (last start 7.0 s)")
    text = plan_lines(plan)
    assert f"  would remove {U}ray-worker.service on h2 (unit ray-worker.service, not in the " \
           "plan)" in text




def test_the_record_lists_each_host_s_units_and_parse_owner_reads_them_back(
        tmp_path: Path) -> None:
    from vllm_provision import state

    inventory = make_inventory(tmp_path, host_vars={"h2": {"vllm_unit_name": "llm.service"}})
    record = state.build_record(inventory, {}, {"h2": {f"{U}llm.service": "a" * 64}})
    assert [record["hosts"][h]["units"] for h in ("h1", "h2")] == [["vllm.service"],
                                                                   ["llm.service"]]
    owner = parse_owner("h2", {"record": {**record, "host": "h2"}}, [])
    assert owner is not None
    assert (owner.backend, owner.rank, owner.units) == ("mp", 1, ("llm.service",))


def test_a_record_naming_paths_outside_our_folders_or_odd_units_removes_none_of_them() -> None:
    hostile = prune.Installed("h1", 0, "mp", ("vllm.service", "x;rm -rf /.service"),
                              (f"{U}vllm.service", "/etc/passwd", f"{U}../../etc/shadow",
                               "relative.service", "/etc/vllm-provision/vllm.env"))
    kept, refused = prune.trusted(hostile, [U, "/etc/vllm-provision"])
    assert kept.units == ("vllm.service",)
    assert kept.files == (f"{U}vllm.service", "/etc/vllm-provision/vllm.env")
    assert set(refused) == {"x;rm -rf /.service", "/etc/passwd", f"{U}../../etc/shadow",
                            "relative.service"}


def test_the_node_exporter_drop_in_is_in_our_folders_even_when_no_plan_lists_it(tmp_path):
    """`down --purge` plans nothing and monitoring may have been turned off since: the drop-in
    role vllm_monitoring installed is still ours to remove; a file beside it is not."""
    from inventory_support import load_llama

    from vllm_provision.modules.vllm_prune import our_folders

    [replica] = load_llama(tmp_path, "mp").replicas
    drop_in = "/etc/systemd/system/prometheus-node-exporter.service.d/vllm-provision.conf"
    folders = our_folders(replica.master)
    assert "/etc/systemd/system/prometheus-node-exporter.service.d" in folders
    hostile = prune.Installed("h1", 0, "mp", ("vllm.service",),
                              (drop_in, "/etc/systemd/system/ssh.service.d/x.conf"))
    kept, refused = prune.trusted(hostile, folders)
    assert kept.files == (drop_in,) and refused == ("/etc/systemd/system/ssh.service.d/x.conf",)
