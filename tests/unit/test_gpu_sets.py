"""GPU sets per node (``vllm_gpus``, docs/inventory.md "GPU sets"): what the loader refuses and
in which words, what the env files render with and without it, and that every check that looks
at GPUs reads only the chosen ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from inventory_support import replicas_yaml, write_inventory
from test_checks_health import gpus as health_gpus
from test_checks_parity_host import POLICY, clean_facts, make_replica
from test_gpu_pool import ctx_for
from test_memory_fit import facts_for, replica_of
from test_templates import _replica, env_values, exec_start, render

from vllm_provision.checks import gpu_health, host, memory, parity, topology
from vllm_provision.checks.context import device_counts, gpu_view
from vllm_provision.checks.finding import Severity
from vllm_provision.checks.run import check_replica, settings_for
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Inventory, Node, Replica
from vllm_provision.core.results import Status
from vllm_provision.facts import gpu_pool
from vllm_provision.facts.model import Gpu, GpuProcess, HostFacts, XidEvent
from vllm_provision.inventory import load_inventory
from vllm_provision.modules import vllm_gang_start


def gpu_inventory(tmp_path: Path, *, h1: str = "[2, 3]", h2: str = "[2, 3]",
                  backend: str = "mp", tp: int = 2, pp: int = 2, group: str = "",
                  host_more: str = "", name: str = "inventory.yml") -> Path:
    """A replica ``llama`` of h1 (rank 0) and h2, TP x PP over both, each host's ``vllm_gpus``
    as YAML text (``""``: unset); ``group``: more group vars, one ``key: value`` per line;
    ``host_more``: more flow-mapping entries of h1 (``", ray_num_gpus: 4"``)."""
    def host(name: str, rank: int, gpus: str, more: str = "") -> str:
        value = f", vllm_gpus: {gpus}" if gpus else ""
        return (f"            {name}: {{ansible_host: 10.0.0.{11 + rank}, "
                f"vllm_node_rank: {rank}{value}{more}}}\n")

    extra = "".join(f"            {line.strip()}\n" for line in group.splitlines() if line.strip())
    text = replicas_yaml(
        "        llama:\n          vars:\n"
        f"            vllm_backend: {backend}\n"
        "            vllm_model: /srv/models/tiny\n"
        f"            vllm_tensor_parallel_size: {tp}\n"
        f"            vllm_pipeline_parallel_size: {pp}\n"
        + extra + "          hosts:\n" + host("h1", 0, h1, host_more) + host("h2", 1, h2),
        all_vars="{ansible_user: root}")
    return write_inventory(tmp_path, text, name)


def load(tmp_path: Path, **kwargs: object) -> Inventory:
    return load_inventory(gpu_inventory(tmp_path, **kwargs))  # type: ignore[arg-type]


def refusal(tmp_path: Path, **kwargs: object) -> list:
    """The problems of loading :func:`gpu_inventory` (which must be refused)."""
    with pytest.raises(ProvisionError) as caught:
        load(tmp_path, **kwargs)
    return caught.value.problems


# -- the loader -----------------------------------------------------------------------------

def test_unset_nodes_have_no_gpu_set_and_use_the_first_gpus(tmp_path: Path) -> None:
    [replica] = load(tmp_path, h1="", h2="", tp=4, pp=2).replicas
    assert [node.gpus for node in replica.nodes] == [None, None]
    assert replica.node_gpus(replica.master) == (0, 1, 2, 3)


def test_a_gpu_set_per_host_or_per_group_reaches_each_node_in_its_order(tmp_path: Path) -> None:
    [replica] = load(tmp_path, h1="[3, 1]", h2="", group="vllm_gpus: [4, 5, 6]").replicas
    assert [node.gpus for node in replica.nodes] == [(3, 1), (4, 5, 6)]
    assert replica.node_gpus(replica.nodes[1]) == (4, 5, 6)  # more than needed: all listed


@pytest.mark.parametrize(("value", "expected"), [
    ("[2, 2]", "distinct GPU indexes (listed more than once: 2)"),
    ("[-1, 3]", "GPU indexes >= 0, nvidia-smi's index column (bad item -1)"),
    ("[]", "at least one GPU index, such as [2, 3] (remove vllm_gpus to use GPUs 0..N-1)"),
])
def test_a_value_that_is_no_set_of_gpu_indexes_is_refused_naming_file_host_and_item(
        tmp_path: Path, value: str, expected: str) -> None:
    [problem] = refusal(tmp_path, h2=value)
    assert problem.where.startswith(f"{tmp_path / 'inventory.yml'}:")
    assert problem.where.endswith("llama.hosts.h2.vllm_gpus")
    assert problem.message == "vllm_gpus has an invalid value"
    assert problem.expected == expected
    assert problem.fix == "write e.g. vllm_gpus: [2, 3]"


@pytest.mark.parametrize("value", ["'2,3'", "[true, 3]", "['2', '3']", "[2.0, 3]", "2"])
def test_anything_but_a_list_of_integers_is_the_wrong_type(tmp_path: Path, value: str) -> None:
    [problem] = refusal(tmp_path, h1=value)
    assert problem.where.endswith("llama.hosts.h1.vllm_gpus")
    assert (problem.message, problem.expected) == ("vllm_gpus has the wrong type",
                                                  "a list of integers")
    assert problem.fix == "write a list of integers (no quotes), e.g. vllm_gpus: [2, 3]"


def test_extra_vars_give_a_list_of_integers(tmp_path: Path) -> None:
    inventory = load_inventory(gpu_inventory(tmp_path, h1="", h2=""),
                               extra_vars={"vllm_gpus": "[6, 7]"})
    assert [n.gpus for n in inventory.replicas[0].nodes] == [(6, 7), (6, 7)]
    with pytest.raises(ProvisionError, match="vllm_gpus has the wrong type"):
        load_inventory(gpu_inventory(tmp_path, h1="", h2=""), extra_vars={"vllm_gpus": "6,7"})


def test_fewer_gpus_than_the_node_runs_names_replica_node_count_and_variable(
        tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, tp=4, pp=2, h1="[0, 1, 2, 3]", h2="[2, 3]")
    assert problem.where.endswith("llama.hosts.h2.vllm_gpus")
    assert problem.message == ("vllm_gpus of h2 lists 2 GPUs, but replica 'llama' needs 4 on "
                               "each node (TP x PP 8 over 2 nodes)")
    assert (problem.expected, problem.actual) == ("at least 4 GPU indexes in vllm_gpus", "[2, 3]")
    assert problem.fix == "list 4 of h2's GPUs in vllm_gpus, or lower the replica's TP x PP"


def test_data_parallel_needs_every_local_engine_in_the_set(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, tp=2, pp=1, h1="[0, 1, 2]", h2="[0, 1, 2, 3]",
                        group="vllm_data_parallel_size: 4\nvllm_data_parallel_size_local: 2")
    assert problem.message == ("vllm_gpus of h1 lists 3 GPUs, but replica 'llama' needs 4 on "
                               "each node (2 data-parallel engines x TP x PP 2)")
    assert problem.fix.endswith("or lower the replica's TP x PP or "
                                "vllm_data_parallel_size_local")


def test_a_gpu_set_on_a_cpu_replica_is_refused(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, h2="", group="vllm_device: cpu")
    assert problem.message == ("vllm_gpus is set on h1, but replica 'llama' runs on CPUs "
                               "(vllm_device: cpu)")


def test_ray_num_gpus_above_the_set_is_refused_in_rays_words(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, backend="ray", host_more=", ray_num_gpus: 4")
    assert problem.where.endswith("llama.hosts.h1.ray_num_gpus")
    assert problem.message == ("ray_num_gpus 4 of h1 is more than the 2 GPUs of its vllm_gpus "
                               "[2, 3]; Ray would not start: Attempting to start raylet with 4 "
                               "GPU, but CUDA_VISIBLE_DEVICES contains ['2', '3'].")
    # as many or fewer is Ray's own business (it uses that many of the visible GPUs)
    load(tmp_path, backend="ray", host_more=", ray_num_gpus: 2")


def test_cuda_visible_devices_in_an_env_mapping_is_refused_once(tmp_path: Path) -> None:
    [problem] = refusal(tmp_path, group="vllm_env: {CUDA_VISIBLE_DEVICES: '0,1'}")
    assert problem.where.endswith("llama.vars.vllm_env.CUDA_VISIBLE_DEVICES")
    assert problem.message == ("vllm_env sets CUDA_VISIBLE_DEVICES, which follows from "
                               "vllm_gpus ([2, 3]) on host h1")
    # without vllm_gpus the operator's own CUDA_VISIBLE_DEVICES stays as before
    load(tmp_path, h1="", h2="", group="vllm_env: {CUDA_VISIBLE_DEVICES: '0,1'}")
    [order] = refusal(tmp_path, host_more=", vllm_node_env: {CUDA_DEVICE_ORDER: FASTEST_FIRST}")
    assert order.where.endswith("llama.hosts.h1.vllm_node_env.CUDA_DEVICE_ORDER")
    assert order.fix == "remove CUDA_DEVICE_ORDER from vllm_node_env and list the GPUs in vllm_gpus"


# -- what the nodes get ---------------------------------------------------------------------

def gpu_replica(backend: str = "mp", gpus: tuple[int, ...] | None = (2, 3)) -> Replica:
    """The templates' two-node replica (TP=4 x PP=2: 4 GPUs per node) with ``gpus`` on both."""
    replica = _replica(backend)
    return replace(replica, nodes=tuple(replace(n, gpus=gpus) for n in replica.nodes))


ENV_FILES = [("mp", "vllm_mp/templates/vllm.env.j2", 1), ("ray", "ray/templates/ray.env.j2", 1),
             ("ray", "ray/templates/ray.env.j2", 0), ("ray", "vllm_ray/templates/vllm.env.j2", 0)]


@pytest.mark.parametrize(("backend", "template", "rank"), ENV_FILES)
def test_a_gpu_set_is_rendered_into_every_env_file_of_the_node(backend: str, template: str,
                                                              rank: int) -> None:
    values = env_values(render(template, gpu_replica(backend, (6, 2, 3, 5)), rank))
    assert values["CUDA_VISIBLE_DEVICES"] == "6,2,3,5"  # the list's order: CUDA's numbering
    assert values["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # so the numbers are nvidia-smi's


@pytest.mark.parametrize(("backend", "template", "rank"), ENV_FILES)
def test_without_a_gpu_set_no_env_file_names_gpus(backend: str, template: str,
                                                  rank: int) -> None:
    text = render(template, gpu_replica(backend, None), rank)
    assert "CUDA_VISIBLE_DEVICES" not in text and "CUDA_DEVICE_ORDER" not in text


def test_rays_gpus_are_the_sets_unless_ray_num_gpus_says_fewer() -> None:
    replica = gpu_replica("ray", (2, 3, 5))
    facts = SimpleNamespace(gpus=[0, 1, 2, 3, 4, 5, 6, 7])

    def num_gpus(unit: str, rank: int, **extra: object) -> list[str]:
        words = exec_start(render(f"ray/templates/{unit}", replica, rank, **extra))
        return [w for w in words if w.startswith("--num-gpus")]

    assert num_gpus("ray-worker.service.j2", 1, ray_num_gpus=None, facts=facts) == [
        "--num-gpus=3"]
    assert num_gpus("ray-head.service.j2", 0, ray_num_gpus=None, facts=facts) == [
        "--num-gpus=3"]
    assert num_gpus("ray-worker.service.j2", 1, ray_num_gpus=2) == ["--num-gpus=2"]
    unset = replace(replica, nodes=tuple(replace(n, gpus=None) for n in replica.nodes))
    words = exec_start(render("ray/templates/ray-worker.service.j2", unset, 1,
                              ray_num_gpus=None, facts=facts))
    assert "--num-gpus=8" in words  # as before: the GPUs facts found


def test_ray_waits_for_the_sets_gpus_not_the_hosts() -> None:
    from vllm_provision.modules.ray_wait_cluster import expected_gpus

    replica = gpu_replica("ray", (2, 3, 5))
    ctx = SimpleNamespace(facts={n.name: SimpleNamespace(gpus=[0] * 8) for n in replica.nodes},
                          vars={})
    assert set(expected_gpus(ctx, replica, None).values()) == {3.0}  # type: ignore[arg-type]


# -- the checks read the chosen GPUs only ---------------------------------------------------

def check_replica_with(backend: str = "mp", h1: tuple[int, ...] | None = (2, 3),
                       h2: tuple[int, ...] | None = (2, 3), tp: int = 2, pp: int = 2
                       ) -> Replica:
    """The checks' two-node replica ``llama`` (h1 rank 0, h2), TP x PP, each node's set."""
    base = make_replica(backend)
    base = replace(base, engine=replace(base.engine, tensor_parallel_size=tp,
                                        pipeline_parallel_size=pp))
    sets = {"h1": h1, "h2": h2}
    return replace(base, nodes=tuple(replace(n, gpus=sets[n.name]) for n in base.nodes))


def node_of(replica: Replica, name: str = "h1") -> Node:
    return next(n for n in replica.nodes if n.name == name)


def test_an_index_the_host_lacks_is_a_preflight_error_naming_host_index_and_its_gpus() -> None:
    replica = check_replica_with(h1=(2, 7, 5))
    [finding] = host.check_gpus_visible(node_of(replica), clean_facts()["h1"])
    assert (finding.check, finding.severity, finding.host) == ("host.gpus", Severity.ERROR, "h1")
    assert finding.item == "GPUs of vllm_gpus"
    assert finding.actual == "h1 has no GPU 7, 5; it has GPU 0, 1, 2, 3"
    assert finding.fix == ("set vllm_gpus of h1 to GPUs it has (nvidia-smi "
                           "--query-gpu=index,uuid,name --format=csv)")
    assert "CUDA_VISIBLE_DEVICES" in finding.source
    [ok] = host.check_gpus_visible(node_of(replica, "h2"), clean_facts()["h2"])
    assert ok.severity is Severity.OK and ok.actual.endswith("; vllm_gpus: GPU 2, 3")
    # unset: as before
    [plain] = host.check_gpus_visible(node_of(check_replica_with(h1=None)), clean_facts()["h1"])
    assert "vllm_gpus" not in plain.actual


def test_topology_counts_the_gpus_of_the_set_the_host_has() -> None:
    replica = check_replica_with(h1=(2, 7), h2=(0, 1, 2))
    counts = device_counts(clean_facts(), "cuda", replica)
    assert counts == {"h1": 1, "h2": 3}
    findings = {f.host: f for f in topology.check_gpus_per_node(replica, counts)}
    assert findings["h1"].severity is Severity.ERROR
    assert findings["h1"].item == "GPUs of vllm_gpus on the node"
    assert findings["h1"].fix == ("list 2 GPUs that h1 has in its vllm_gpus (host.gpus names "
                                  "the missing ones)")
    assert findings["h2"].severity is Severity.OK
    assert device_counts(clean_facts(), "cuda") == {"h1": 4, "h2": 4}  # no replica: every GPU


def with_processes(facts: HostFacts, *on: tuple[int, str]) -> HostFacts:
    """``facts`` with one foreign or own process per ``(gpu index, unit)``."""
    return replace(facts, gpu_processes=tuple(
        GpuProcess(100 + i, "python3", 1000, f"GPU-{facts.host}-{index}", unit)
        for i, (index, unit) in enumerate(on)))


def test_another_jobs_process_on_a_gpu_outside_the_set_is_not_this_replicas() -> None:
    replica = check_replica_with()
    facts = with_processes(clean_facts()["h1"], (0, "train.service"), (1, "train.service"),
                           (2, "vllm.service"))
    [finding] = host.check_foreign_gpu_processes(node_of(replica), facts, ("vllm.service",))
    assert finding.severity is Severity.OK
    assert finding.actual == "1 ours; 2 on GPUs outside vllm_gpus, not this replica's"
    held = with_processes(clean_facts()["h1"], (0, "train.service"), (3, "train.service"))
    [error] = host.check_foreign_gpu_processes(node_of(replica), held, ("vllm.service",))
    assert error.severity is Severity.ERROR
    assert error.expected == "no process outside vllm.service on GPU 2, 3"
    assert error.actual == ("pid 101 python3 on GPU 3 (1000 MiB) in unit train.service; 1 on "
                            "GPUs outside vllm_gpus, not this replica's")
    # unset: a process on any GPU of the node counts, as before
    [before] = host.check_foreign_gpu_processes(node_of(check_replica_with(h1=None)),
                                                with_processes(facts), ("vllm.service",))
    assert before.severity is Severity.OK
    [unset] = host.check_foreign_gpu_processes(node_of(check_replica_with(h1=None)), facts,
                                               ("vllm.service",))
    assert unset.severity is Severity.ERROR and "GPU 0" in unset.actual


def health_facts(**faults: dict[int, object]) -> HostFacts:
    return replace(clean_facts()["h1"], gpus=health_gpus(**faults))


def test_gpu_faults_outside_the_set_are_at_most_a_note() -> None:
    replica = check_replica_with(h1=(2, 3))
    used = replica.node_gpus(node_of(replica))
    facts = replace(health_facts(ecc_uncorrected={1: 2}, mig_mode={0: True},
                                 persistence_mode={0: False}),
                    xid_events=(XidEvent("0000:18:00", 79, "NVRM: Xid (PCI:0000:18:00): 79"),))
    [errors] = gpu_health.check_gpu_errors(node_of(replica), facts, used)
    assert errors.severity is Severity.OK
    assert errors.actual == ("none on GPU 2, 3 (not this replica's, outside vllm_gpus: GPU 0: "
                             "Xid 79 in the last 24 h; GPU 1: 2 uncorrectable ECC errors)")
    assert gpu_health.check_mig(node_of(replica), facts, used)[0].severity is Severity.OK
    assert gpu_health.check_persistence(node_of(replica), facts, used)[0].severity is Severity.OK
    inside = health_facts(ecc_uncorrected={3: 2}, mig_mode={2: True},
                          persistence_mode={3: False})
    assert [f.item for f in gpu_health.check_gpu_errors(node_of(replica), inside, used)] == [
        "GPU 3 (00000000:5D:00.0)"]
    assert gpu_health.check_mig(node_of(replica), inside, used)[0].actual == "Enabled on GPU 2"
    assert gpu_health.check_persistence(node_of(replica), inside, used)[0].actual == \
        "Disabled on GPU 3"
    # unset: the first N, with no note about the others (as before)
    plain = check_replica_with(h1=None)
    assert plain.node_gpus(node_of(plain)) == (0, 1)
    faults = gpu_health.check_gpu_errors(node_of(plain), facts, plain.node_gpus(node_of(plain)))
    assert [(f.item, f.severity) for f in faults] == [
        ("GPU 0 (00000000:18:00.0)", Severity.ERROR), ("GPU 1 (00000000:2A:00.0)", Severity.ERROR)]
    clean = check_replica_with(h1=None)
    [quiet] = gpu_health.check_gpu_errors(node_of(clean), health_facts(ecc_uncorrected={3: 2}),
                                          clean.node_gpus(node_of(clean)))
    assert quiet.actual == "none"  # GPU 3 is not used, and not named


def test_memory_fit_reads_the_total_memory_of_the_sets_gpus() -> None:
    """Hosts with two large GPUs (0, 1) and two small ones (2, 3): the estimate's GPU total is
    the chosen GPUs' smallest, never another GPU of the host."""
    facts = facts_for("tinyllama-1.1b-chat-v1.0", gpus=4, mib=81920)
    for name in facts:
        facts[name] = replace(facts[name], gpus=tuple(
            replace(g, memory_total_mib=24576) if g.index >= 2 else g
            for g in facts[name].gpus))
    plain = replica_of("tinyllama-1.1b-chat-v1.0", tp=2, pp=2)
    chosen = replace(plain, nodes=tuple(replace(n, gpus=(3, 2)) for n in plain.nodes))
    high = replace(plain, nodes=tuple(replace(n, gpus=(1, 0)) for n in plain.nodes))
    assert {s.gpu_total for s in memory.estimate(plain, facts, 2048).stages} == {80 * 1024 ** 3}
    assert {s.gpu_total for s in memory.estimate(chosen, facts, 2048).stages} == {
        24 * 1024 ** 3}
    assert {s.gpu_total for s in memory.estimate(high, facts, 2048).stages} == {80 * 1024 ** 3}


def test_parity_compares_the_gpus_each_node_gives_the_replica() -> None:
    facts = clean_facts()
    facts["h2"] = replace(facts["h2"], gpus=facts["h2"].gpus + tuple(
        Gpu(i, "NVIDIA H100 80GB HBM3", 81559, f"GPU-h2-{i}") for i in range(4, 8)))
    unset = check_replica_with(h1=None, h2=None)
    checks = {f.check for f in parity.check_parity(unset, gpu_view(unset, facts), POLICY)
              if f.severity is Severity.ERROR}
    assert checks == {"parity.gpu_count", "parity.gpu_model"}  # the hosts differ: as before
    chosen = check_replica_with(h1=(2, 3), h2=(2, 3))
    assert [f for f in parity.check_parity(chosen, gpu_view(chosen, facts), POLICY)
            if f.severity is Severity.ERROR] == []
    elsewhere = check_replica_with(h1=(2, 3), h2=(6, 7))  # the H100s of h2
    [model] = [f for f in parity.check_parity(elsewhere, gpu_view(elsewhere, facts), POLICY)
               if f.severity is Severity.ERROR]
    assert (model.check, model.host) == ("parity.gpu_model", "h2")


def test_ray_places_on_the_gpus_its_start_declares() -> None:
    replica = check_replica_with("ray", h1=(2, 3), h2=(2, 3), tp=2, pp=2)
    settings = settings_for(replica)
    facts = clean_facts()
    findings = replica.backend_type.check_replica(replica, facts, settings)
    assert [(f.check, f.severity) for f in findings] == [("placement", Severity.OK)]
    too_big = check_replica_with("ray", h1=(2, 3), h2=(2, 3), tp=4, pp=2)  # 8 GPUs wanted
    [error] = [f for f in too_big.backend_type.check_replica(too_big, facts, settings)
               if f.severity is Severity.ERROR]
    assert "the cluster has 4 GPUs on 2 nodes (2, 2)" in error.actual


def test_a_replica_on_its_sets_passes_every_check_and_a_missing_index_fails_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_table_support import clear, text_with, use_table

    use_table(monkeypatch, text_with("0.33.0"))
    try:
        replica = check_replica_with(h1=(2, 3), h2=(3, 1))
        findings = check_replica(replica, clean_facts(), settings_for(replica))
        assert [f for f in findings if f.severity is not Severity.OK] == []
        broken = check_replica_with(h1=(2, 3), h2=(3, 4))
        findings = check_replica(broken, clean_facts(), settings_for(broken))
        # the missing GPU, and what it leads to (as a GPU lost from a host without a set)
        assert sorted((f.check, f.host) for f in findings if f.severity is Severity.ERROR) == [
            ("host.gpus", "h2"), ("parity.gpu_count", "h2"), ("topology.gpus", "h2")]
    finally:
        clear()


def test_the_shared_pools_gang_start_waits_only_for_the_sets_gpus() -> None:
    ours = gpu_pool.Holder("h1", 2, 10, "python", 70000, "vllm.service")
    below = gpu_pool.Holder("h1", 0, 11, "python3", 120000, "train.service")
    inside = gpu_pool.Holder("h1", 3, 12, "python3", 100, "batch.service")
    unknown = gpu_pool.Holder("h1", -1, 13, "python3", None, "")
    assert gpu_pool.foreign_holders([ours, below, inside, unknown], (2, 3),
                                    ("vllm.service",)) == [inside, unknown]
    # h2's GPU 0 stays held by another job: a replica on GPUs 2, 3 starts at once ...
    ctx, log = ctx_for([False], [True])
    ctx.replica = replace(ctx.replica, nodes=tuple(replace(n, gpus=(2, 3))
                                                   for n in ctx.replica.nodes))
    result = vllm_gang_start.run(ctx, {"timeout_s": 0, "poll_s": 0.05})  # type: ignore[arg-type]
    assert result.status is Status.CHANGED
    assert [e for e in log if e.startswith("start")] == ["start h2", "start h1"]
    # ... while without a set it is held back by that GPU (one of its first four)
    ctx, log = ctx_for([False], [True])
    with pytest.raises(ProvisionError, match="h2 GPU 0: pid 75"):
        vllm_gang_start.run(ctx, {"timeout_s": 0, "poll_s": 0.05})  # type: ignore[arg-type]


def test_top_shows_a_nodes_set_only() -> None:
    from test_top import node_output

    from vllm_provision.operations import top

    reading = top.parse_node("h1", node_output(gpu="0, 100, 81559\n1, 200, 81559\n"
                                                   "2, 61440, 81559\n3, 61000, 81559\n"))
    chosen = top.node_view("h1", 0, ["vllm.service"], reading, None, gpus=(3, 2))
    assert [g["index"] for g in chosen["gpus"]] == [2, 3]
    every = top.node_view("h1", 0, ["vllm.service"], reading, None)
    assert [g["index"] for g in every["gpus"]] == [0, 1, 2, 3]  # unset: as before
