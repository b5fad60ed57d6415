"""One way to extend (vllm_provision/core/registry.py): a duplicate or invalid name is an error
naming the module and the item, entries come out in their declared order, and every check
module of vllm_provision/checks registers itself (discovered, not listed by hand)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.registry import Registry, import_submodules


def test_a_duplicate_name_names_both_modules_and_the_item() -> None:
    things: Registry[object] = Registry("thing")

    @things.register("net.routes", order=1)
    def first() -> None: ...

    def second() -> None: ...

    second.__module__ = "somewhere.else"
    with pytest.raises(ProvisionError) as caught:
        things.register("net.routes")(second)
    text = str(caught.value)
    assert "thing 'net.routes'" in text and "registered already" in text
    assert "second in somewhere.else" in text and __name__ in text
    assert things.get("net.routes").obj is first  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["", "Net", "net routes", "1net", "net.", ".net", "net-x"])
def test_an_invalid_name_is_refused_naming_the_item(name: str) -> None:
    things: Registry[object] = Registry("thing")

    def item() -> None: ...

    with pytest.raises(ProvisionError) as caught:
        things.register(name)(item)
    assert "invalid thing name" in str(caught.value) and "item in" in str(caught.value)
    assert len(things) == 0


def test_entries_come_in_declared_order_then_by_name_not_registration_order() -> None:
    things: Registry[str] = Registry("thing")
    things.add("c", "third", order=30, module="m")
    things.add("b", "second", order=10, module="m")
    things.add("a", "first", order=10, module="m", scope="node")
    assert things.names() == ["a", "b", "c"]
    assert [e.obj for e in things] == ["first", "second", "third"]
    assert things.get("a").meta == {"scope": "node"}  # type: ignore[union-attr]
    things.remove("a")
    assert "a" not in things and things.names() == ["b", "c"]


def test_the_same_item_again_and_a_reloaded_module_are_no_duplicates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "regpkg_reload"
    package.mkdir()
    (package / "__init__.py").write_text("from vllm_provision.core.registry import Registry\n"
                                         "THINGS = Registry('thing')\n")
    (package / "b_item.py").write_text(textwrap.dedent("""
        from regpkg_reload import THINGS

        @THINGS.register("b", order=1)
        def item(): ...
        """))
    (package / "a_item.py").write_text(textwrap.dedent("""
        from regpkg_reload import THINGS

        @THINGS.register("a", order=2)
        def item(): ...
        """))
    (package / "_private.py").write_text("raise AssertionError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert import_submodules("regpkg_reload") == ["regpkg_reload.a_item",
                                                      "regpkg_reload.b_item"]
        things = sys.modules["regpkg_reload"].THINGS
        assert things.names() == ["b", "a"]  # declared order, not file order
        entry = things.get("a")
        things.add("a", entry.obj, order=2)  # the same object again
        importlib.reload(sys.modules["regpkg_reload.a_item"])
        assert things.get("a").obj is not entry.obj and things.names() == ["b", "a"]
    finally:
        for name in [n for n in sys.modules if n.startswith("regpkg_reload")]:
            del sys.modules[name]


def test_every_check_module_registers_its_checks_and_run_discovers_them_all() -> None:
    import vllm_provision.checks as package
    from vllm_provision.checks import run
    from vllm_provision.checks.context import CHECKS

    modules = {info.name for info in pkgutil.iter_modules(package.__path__)}
    assert set(run.discover()) == {f"vllm_provision.checks.{m}" for m in modules
                                   if m not in run.NOT_CHECKS}
    registered = {e.module.rsplit(".", 1)[1] for e in CHECKS}
    assert registered == modules - set(run.NOT_CHECKS), "a check module registers no check"
    assert all(e.name.split(".")[0] == e.module.rsplit(".", 1)[1] for e in CHECKS)


def test_the_checks_run_in_the_order_preflight_has_always_run_them() -> None:
    from vllm_provision.checks.run import checks_of

    assert [e.name for e in checks_of("replica")] == [
        "topology.topology", "vllm_serve.options", "vllm_serve.rules", "vllm_serve.breakages",
        "placement.backend", "parity.parity", "parity.pins",
        "parity.driver_minimum", "network.host_ip_unique", "network.routes",
        "network.reachability", "fabric.mtu", "fabric.rdma", "fabric.peer_reach", "memory.fit"]
    assert [e.name for e in checks_of("node")] == [
        "network.interface", "network.exposure", "network.ray_auth", "network.hostname",
        "network.ports", "network.watchdog_port", "host.cpu_device", "host.gpus_visible",
        "host.foreign_gpu_processes", "gpu_health.errors", "gpu_health.mig",
        "gpu_health.persistence", "gpu_health.fabric_manager", "pcie_acs.redirect",
        "gpu_health.clock",
        "host.front_door_cpus", "host.venv", "host.shm", "host.remove_ipc",
        "host.model_present", "host.memory", "platform.platform"]
    assert [e.name for e in checks_of("inventory")] == [
        "servers.one_node", "ownership.ownership", "stack.lock"]


def test_a_check_with_an_unknown_scope_is_refused() -> None:
    from vllm_provision.checks.context import check

    with pytest.raises(ProvisionError, match="unknown check scope"):
        check("x.y", order=1, scope="host")


def test_a_check_with_an_unknown_device_is_refused() -> None:
    from vllm_provision.checks.context import check

    with pytest.raises(ProvisionError, match="unknown check only"):
        check("x.y", order=1, scope="node", only="tpu")


def test_a_rule_registered_with_reads_stays_itself_and_gets_its_arguments_from_the_scope(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from vllm_provision.checks import context

    monkeypatch.setattr(context, "CHECKS", Registry("check"))
    calls = []

    @context.check("x.rule", order=1, scope="node", reads=("node", "settings.min_shm_mib"),
                   only="gpu")
    def rule(node: str, shm: int) -> list[str]:
        calls.append((node, shm))
        return [f"{node}:{shm}"]

    assert rule("direct", 1) == ["direct:1"], "the decorated rule is returned unchanged"
    (entry,) = context.CHECKS.entries()
    assert (entry.name, entry.module, entry.meta["scope"]) == ("x.rule", __name__, "node")
    on_gpu = SimpleNamespace(node="h1", settings=SimpleNamespace(min_shm_mib=64), gpu=True)
    assert entry.obj(on_gpu) == ["h1:64"]
    assert entry.obj(SimpleNamespace(node="h2", settings=None, gpu=False)) == [], \
        "a GPU-only check finds nothing on a CPU replica, and reads nothing there"
    assert calls == [("direct", 1), ("h1", 64)]
