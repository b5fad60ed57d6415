"""The front door (group vllm_gateways, docs/front-door.md): its variables checked by kind at
load, the cross checks of ``inventory/gateways.py`` with errors that name file, host, item,
expected and fix, the worker list and the router's command line, and the rendered unit."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventory_support import llama_yaml, write_inventory

from vllm_provision.core.errors import InventoryError
from vllm_provision.core.quoting import systemd_exec_quote
from vllm_provision.inventory import load_inventory
from vllm_provision.inventory.gateways import ROUTER_VERSION, gateway_of

GATEWAYS = """\
    vllm_gateways:
      vars:
        vllm_gateway_wheelhouse: wheels/gateway
{vars}\
      hosts:
        h1: {{}}
"""

SECOND = """\
        qwen:
          vars:
            vllm_backend: mp
            vllm_model: /srv/models/tiny
          hosts:
            h3: {ansible_host: 10.0.0.13, vllm_node_rank: 0}
"""


def _inventory(tmp_path: Path, gateway_vars: str = "", *, more: str = "",
               **replica_vars: object) -> Path:
    gateway = GATEWAYS.format(vars="".join(f"        {line}\n"
                                           for line in gateway_vars.splitlines()))
    text = llama_yaml("mp", more=more, **replica_vars) + gateway
    return write_inventory(tmp_path, text)


def _problems(path: Path) -> str:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return "\n".join(f"{p.where} | {p.message} | {p.expected} | {p.actual} | {p.fix}"
                     for p in caught.value.problems)


def test_defaults_and_workers(tmp_path: Path) -> None:
    inventory = load_inventory(_inventory(tmp_path, more=SECOND))
    gateway = gateway_of(inventory, "h1")
    assert gateway is not None and gateway_of(inventory, "h2") is None
    assert gateway.workers == ("http://10.0.0.11:8000", "http://10.0.0.13:8000")
    assert (gateway.port, gateway.metrics_port, gateway.bind) == (30000, 29000, "0.0.0.0")
    assert gateway.policy == "power_of_two"
    assert (gateway.health_check_interval_s, gateway.health_check_timeout_s,
            gateway.health_failure_threshold, gateway.request_timeout_s) == (2, 5, 2, 3600)
    assert gateway.wheelhouse == str((tmp_path / "wheels" / "gateway").absolute())
    assert gateway.local_url == "http://127.0.0.1:30000"


def test_one_replica_runs_round_robin_unless_power_of_two_is_asked(tmp_path: Path) -> None:
    """vllm-router 0.1.17 exits with "Power-of-two policy requires at least 2 workers" (seen on
    the lab): the default falls back with one replica, an explicit choice is refused."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = gateway_of(load_inventory(_inventory(tmp_path / "one")), "h1")
    two = gateway_of(load_inventory(_inventory(tmp_path / "two", more=SECOND)), "h1")
    assert (one.policy, two.policy) == ("round_robin", "power_of_two")
    problems = _problems(_inventory(tmp_path, "vllm_gateway_policy: power_of_two"))
    assert "needs two replicas" in problems and "at least 2 workers" in problems


def test_argv_is_the_routers_flags(tmp_path: Path) -> None:
    path = _inventory(tmp_path, "vllm_gateway_policy: round_robin\nvllm_gateway_port: 8080\n"
                                "vllm_gateway_request_timeout_s: 7200")
    argv = gateway_of(load_inventory(path), "h1").argv()
    assert argv[0] == "/opt/vllm-router/bin/vllm-router"
    flags = dict(zip(argv[1:-2:2], argv[2:-2:2], strict=True))
    assert flags["--port"] == "8080" and flags["--policy"] == "round_robin"
    assert flags["--request-timeout-secs"] == "7200"
    assert flags["--health-success-threshold"] == "1"
    # the circuit breaker lets a replica that serves again back within seconds (Gateway.argv)
    assert (flags["--cb-failure-threshold"], flags["--cb-success-threshold"],
            flags["--cb-timeout-duration-secs"]) == ("3", "1", "3")
    assert argv[-2:] == ["--worker-urls", "http://10.0.0.11:8000"]


def test_argv_flags_exist_in_the_router_release() -> None:
    """Every flag we write is one vllm-router 0.1.17 declares (router_args.py of its wheel,
    copied below as the launcher's ``--help`` lists them)."""
    declared = {"--host", "--port", "--worker-urls", "--policy", "--prometheus-host",
                "--prometheus-port", "--health-check-interval-secs",
                "--health-check-timeout-secs", "--health-failure-threshold",
                "--health-success-threshold", "--request-timeout-secs",
                "--worker-startup-timeout-secs", "--worker-startup-check-interval",
                "--log-level", "--cb-failure-threshold", "--cb-success-threshold",
                "--cb-timeout-duration-secs"}
    from vllm_provision.inventory.gateways import Gateway

    gateway = Gateway("g", "0.0.0.0", 1, 2, "random", 1, 1, 1, 1, "/v", None, ("http://a:1",))
    assert {w for w in gateway.argv() if w.startswith("--")} == declared
    assert ROUTER_VERSION == "0.1.17"


@pytest.mark.parametrize(("line", "fragment"), [
    ("vllm_gateway_port: 0", "an integer 1-65535"),
    ("vllm_gateway_port: http", "an integer 1-65535"),
    ("vllm_gateway_policy: least_busy", "one of power_of_two, round_robin"),
    ("vllm_gateway_health_check_interval_s: 0", "an integer 1-3600"),
    ("vllm_gateway_request_timeout_s: soon", "an integer 1-604800"),
    ("vllm_gateway_host: gateway.example", "an IP address"),
    ("vllm_gateway_venv: opt/router", "absolute"),
    ("vllm_gateway_venv: \"/opt/a\\nExecStartPre=/bin/sh\"", "control"),
    ("vllm_gateway_polcy: random", "did you mean 'vllm_gateway_policy'"),
])
def test_bad_values_name_file_item_and_expected(tmp_path: Path, line: str,
                                                fragment: str) -> None:
    problems = _problems(_inventory(tmp_path, line))
    assert fragment in problems
    assert "inventory.yml" in problems and "vllm_gateways" in problems
    assert line.split(":")[0] in problems


def test_no_wheelhouse_names_the_host_and_the_fix(tmp_path: Path) -> None:
    text = llama_yaml("mp") + "    vllm_gateways:\n      hosts:\n        h1: {}\n"
    problems = _problems(write_inventory(tmp_path, text))
    assert "gateway host h1 has no vllm_gateway_wheelhouse" in problems
    assert "docs/front-door.md" in problems


def test_gateway_without_replicas_is_refused(tmp_path: Path) -> None:
    text = ("all:\n  children:\n    vllm_gateways:\n      vars: {vllm_gateway_wheelhouse: w}\n"
            "      hosts:\n        g1: {ansible_host: 10.0.0.20}\n")
    assert "no replica to send to" in _problems(write_inventory(tmp_path, text))


def test_api_key_behind_the_gateway_is_refused(tmp_path: Path) -> None:
    problems = _problems(_inventory(tmp_path, vllm_api_key="s3cret-key"))
    assert "sets vllm_api_key" in problems and "--api-key" in problems
    assert "s3cret-key" not in problems


def test_loopback_api_on_another_host_is_refused(tmp_path: Path) -> None:
    text = llama_yaml("mp", vllm_api_host="127.0.0.1") + GATEWAYS.format(vars="").replace(
        "h1: {}", "g1: {ansible_host: 10.0.0.20}")
    problems = _problems(write_inventory(tmp_path, text))
    assert "binds its API to 127.0.0.1, which gateway host g1 cannot reach" in problems


@pytest.mark.parametrize(("line", "fragment"), [
    ("vllm_gateway_port: 8000", "vllm_gateway_port of gateway host h1 is 8000, the API port"),
    ("vllm_gateway_port: 29510", "the watchdog port"),
    ("vllm_gateway_metrics_port: 30000", "are both 30000"),
])
def test_port_clash_on_the_gateway_host(tmp_path: Path, line: str, fragment: str) -> None:
    assert fragment in _problems(_inventory(tmp_path, line))


def test_gateway_on_a_host_of_no_replica_takes_any_port(tmp_path: Path) -> None:
    text = llama_yaml("mp") + GATEWAYS.format(vars="        vllm_gateway_port: 8000\n").replace(
        "h1: {}", "g1: {ansible_host: 10.0.0.20}")
    inventory = load_inventory(write_inventory(tmp_path, text))
    assert gateway_of(inventory, "g1").port == 8000


def test_argv_words_are_quoted_for_systemd(tmp_path: Path) -> None:
    """A value never becomes more than one word of ExecStart: the unit quotes every word."""
    from vllm_provision.inventory.gateways import Gateway

    gateway = Gateway("g", "0.0.0.0", 1, 2, "random", 1, 1, 1, 1, "/opt/r r", None,
                      ("http://a:1",))
    line = systemd_exec_quote(gateway.argv())
    assert line.startswith('"/opt/r r/bin/vllm-router" ')


# --- the unit and the install module ----------------------------------------------------------

ROLE = Path(__file__).resolve().parents[2] / "roles" / "vllm_gateway"


def _render_unit(tmp_path: Path, gateway_vars: str = "", *, more: str = SECOND) -> str:
    import yaml

    from vllm_provision.runner.templating import environment_for

    inventory = load_inventory(_inventory(tmp_path, gateway_vars, more=more))
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    env = environment_for([ROLE / "templates"])
    return env.get_template("vllm-gateway.service.j2").render(
        gateway=gateway_of(inventory, "h1"), inventory_hostname="h1", **defaults)


def test_unit_runs_the_argv_with_every_replica_as_a_worker(tmp_path: Path) -> None:
    import shlex

    text = _render_unit(tmp_path, "vllm_gateway_policy: random")
    assert text.startswith("# managed by vllm-provision")
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_start.removeprefix("ExecStart="))
    assert words[-3:] == ["--worker-urls", "http://10.0.0.11:8000", "http://10.0.0.13:8000"]
    assert words[words.index("--policy") + 1] == "random"
    assert "DynamicUser=yes" in text and "Restart=always" in text


def test_a_new_replica_changes_the_unit(tmp_path: Path) -> None:
    """The worker list is the inventory's: a replica added changes the unit, which notifies
    the restart handler (roles/vllm_gateway/tasks/main.yml)."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _render_unit(tmp_path / "one", "vllm_gateway_policy: random", more="")
    two = _render_unit(tmp_path / "two", "vllm_gateway_policy: random")
    assert "http://10.0.0.13:8000" not in one and "http://10.0.0.13:8000" in two
    assert two.replace(" http://10.0.0.13:8000", "") == one  # the only difference
def _tiny_wheel(folder: Path, version: str = "1.0") -> Path:
    """A pure wheel ``tinyrouter`` (no dependency) pip installs offline in a second."""
    import base64
    import hashlib
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tinyrouter-{version}-py3-none-any.whl"
    info = f"tinyrouter-{version}.dist-info"
    files = {"tinyrouter/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: tinyrouter\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


class _Ctx:
    """The part of ModuleContext the module reads, on a local connection."""

    def __init__(self, tmp_path: Path, *, check_mode: bool = False) -> None:
        from vllm_provision.transport.local import LocalConnection

        self.conn = LocalConnection("h1")
        self.check_mode = check_mode
        self.task_name = "Install the router"
        self.constraints = tmp_path / "constraints.txt"
        self.constraints.write_text("# pins\ntinyrouter==1.0\n")

    def find_file(self, src: str) -> Path:
        return self.constraints

    def on_change_script(self) -> str:
        return ""


def _args(tmp_path: Path, wheelhouse: Path) -> dict[str, object]:
    import sys

    return {"wheelhouse": str(wheelhouse), "requirement": "tinyrouter==1.0",
            "constraints": "constraints.txt", "venv": str(tmp_path / "host" / "router"),
            "python": sys.executable, "import_check": "tinyrouter"}


def test_install_module_builds_links_and_then_changes_nothing(tmp_path: Path) -> None:
    from vllm_provision.core.results import Status
    from vllm_provision.modules import vllm_gateway_venv

    wheelhouse = tmp_path / "wheels"
    _tiny_wheel(wheelhouse)
    (tmp_path / "host").mkdir()
    args = _args(tmp_path, wheelhouse)
    venv = Path(str(args["venv"]))
    planned = vllm_gateway_venv.run(_Ctx(tmp_path, check_mode=True), args)
    assert planned.status is Status.CHANGED and "would send 1 wheels" in planned.message
    assert not venv.exists()
    first = vllm_gateway_venv.run(_Ctx(tmp_path), args)
    assert first.status is Status.CHANGED, first.message
    assert venv.is_symlink() and (venv / "bin" / "python").exists()
    assert (Path(f"{venv}.wheels") / "tinyrouter-1.0-py3-none-any.whl").is_file()
    again = vllm_gateway_venv.run(_Ctx(tmp_path), args)
    assert again.status is Status.OK, again.message
    removed = vllm_gateway_venv.run(_Ctx(tmp_path), {"venv": str(venv), "state": "absent"})
    assert removed.status is Status.CHANGED and not venv.exists()
    assert not Path(f"{venv}.wheels").exists() and not list(venv.parent.iterdir())


def test_install_module_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    from vllm_provision.core.results import Status
    from vllm_provision.modules import vllm_gateway_venv

    wheelhouse = tmp_path / "wheels"
    _tiny_wheel(wheelhouse)
    args = _args(tmp_path, wheelhouse)
    Path(str(args["venv"])).mkdir(parents=True)
    result = vllm_gateway_venv.run(_Ctx(tmp_path), args)
    assert result.status is Status.FAILED and "is not a link" in result.message


def test_install_module_names_an_empty_wheelhouse(tmp_path: Path) -> None:
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.modules import vllm_gateway_venv

    (tmp_path / "empty").mkdir()
    with pytest.raises(ProvisionError, match="holds no wheel") as caught:
        vllm_gateway_venv.run(_Ctx(tmp_path), _args(tmp_path, tmp_path / "empty"))
    assert "docs/front-door.md" in caught.value.render()
    with pytest.raises(ProvisionError, match="cannot read"):
        vllm_gateway_venv.run(_Ctx(tmp_path), _args(tmp_path, tmp_path / "missing"))


def test_a_changed_wheel_is_a_new_build(tmp_path: Path) -> None:
    from vllm_provision.modules.vllm_gateway_venv import build_id

    assert build_id("r==1", "c", {"a.whl": "1"}) != build_id("r==1", "c", {"a.whl": "2"})
    assert build_id("r==1", "c", {"a.whl": "1"}) != build_id("r==1", "d", {"a.whl": "1"})
    assert build_id("r==1", "c", {"a.whl": "1", "b.whl": "2"}) == build_id(
        "r==1", "c", {"b.whl": "2", "a.whl": "1"})
