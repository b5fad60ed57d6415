"""Rendering of the units and env files of both backends (roles vllm_mp, ray, vllm_ray)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.settings import variables

ROLES = Path(__file__).resolve().parents[2] / "roles"


def _environment() -> jinja2.Environment:
    # The engine's contract (runner/templating.py): the play's role templates/ folders on the
    # search path, the quoting functions as filters, StrictUndefined, sandboxed: the engine's own.
    dirs = [str(ROLES / role / "templates")
            for role in ("vllm_common", "vllm_mp", "ray", "vllm_ray")]
    from vllm_provision.runner.templating import make_environment

    return make_environment([Path(d) for d in dirs])


def _replica(backend: str = "mp", **engine: Any) -> Replica:
    hosts = [Host(name=f"h{i}", address=f"10.213.6.{10 + i}") for i in (1, 2)]
    nodes = tuple(Node(host=h, rank=i, host_ip=h.address) for i, h in enumerate(hosts))
    args = {"model": "/srv/models/lab-model", "tensor_parallel_size": 4,
            "pipeline_parallel_size": 2} | engine
    return Replica(name="llama", backend=backend, nodes=nodes,  # type: ignore[arg-type]
                   engine=EngineArgs(**args))


def _defaults(*roles: str) -> dict[str, Any]:
    # the table's defaults under the roles', as the engine layers them (runner/engine.py)
    values: dict[str, Any] = variables.defaults()
    for role in ("vllm_common", *roles):
        values.update(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()))
    # Defaults may refer to other variables (the engine renders them lazily, as Ansible does).
    return {key: jinja2.Template(value).render(values)
            if isinstance(value, str) and "{{" in value else value
            for key, value in values.items()}


def render(template: str, replica: Replica, rank: int, **extra: Any) -> str:
    """Render ``roles/<template>`` for node ``rank`` of ``replica`` with the roles' defaults."""
    role = template.split("/")[0]
    roles = {"vllm_mp": ("vllm_mp",), "ray": ("ray",), "vllm_ray": ("ray", "vllm_ray")}[role]
    node = replica.nodes[rank]
    values = _defaults(*roles) | {
        "vllm_venv": "/opt/vllm", "vllm_cluster_interface": "eth0", "vllm_env": {},
        "inventory_hostname": node.name, "replica": replica, "node": node,
        "engine": replica.engine, "ray_num_gpus": 4, "facts": None,
    } | extra
    source = (ROLES / template).read_text()
    return _environment().from_string(source).render(values)


def exec_start(unit: str) -> list[str]:
    """The ExecStart= words of a rendered unit, split as systemd would (continuations joined)."""
    text = unit.replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def env_values(text: str) -> dict[str, str]:
    """Parse a rendered EnvironmentFile (KEY="value" lines, # comments)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = shlex.split(value)[0] if value else ""
    return values


def _engine_words(words: list[str]) -> list[str]:
    start = words.index("serve") + 1
    return words[start:words.index("--nnodes")] if "--nnodes" in words else words[start:]


# --- mp -----------------------------------------------------------------------------------------

def test_mp_rank0_serves_http_with_the_full_multi_node_command() -> None:
    words = exec_start(render("vllm_mp/templates/vllm.service.j2", _replica(), 0))
    assert words[:3] == ["/opt/vllm/bin/vllm", "serve", "/srv/models/lab-model"]
    joined = " ".join(words)
    for part in ("--tensor-parallel-size 4", "--pipeline-parallel-size 2", "--nnodes 2",
                 "--node-rank 0", "--master-addr 10.213.6.11", "--master-port 29501",
                 "--host 0.0.0.0", "--port 8000", "--distributed-executor-backend mp"):
        assert part in joined
    assert "--headless" not in words


def test_mp_followers_are_headless_without_http_options() -> None:
    words = exec_start(render("vllm_mp/templates/vllm.service.j2", _replica(), 1))
    assert "--headless" in words
    assert "--host" not in words and "--port" not in words
    assert words[words.index("--node-rank") + 1] == "1"
    assert words[words.index("--master-addr") + 1] == "10.213.6.11"


def test_mp_engine_arguments_are_identical_on_every_node() -> None:
    replica = _replica(max_model_len=4096, served_model_name="llama-3",
                       extra_args=("--dtype", "bfloat16", "--enforce-eager"))
    per_node = [_engine_words(exec_start(render("vllm_mp/templates/vllm.service.j2", replica, r)))
                for r in (0, 1)]
    assert per_node[0] == per_node[1]
    assert per_node[0] == ["/srv/models/lab-model", "--tensor-parallel-size", "4",
                           "--pipeline-parallel-size", "2", "--served-model-name", "llama-3",
                           "--max-model-len", "4096", "--gpu-memory-utilization", "0.9",
                           "--dtype", "bfloat16", "--enforce-eager"]


def test_optional_engine_arguments_are_left_out_when_unset() -> None:
    words = exec_start(render("vllm_mp/templates/vllm.service.j2", _replica(), 0))
    assert "--max-model-len" not in words and "--served-model-name" not in words


def test_odd_values_are_quoted_so_systemd_reads_them_back_unchanged() -> None:
    odd = 'a "quoted" value with spaces, 100% and $HOME'
    replica = _replica(model="/srv/models/my model", extra_args=("--chat-template", odd))
    unit = render("vllm_mp/templates/vllm.service.j2", replica, 0)
    assert "100%%" in unit and "$$HOME" in unit  # no specifier or variable expansion
    words = exec_start(unit)
    assert words[2] == "/srv/models/my model"
    # shlex does not undo systemd's %% and $$ escapes; systemd does.
    assert words[words.index("--chat-template") + 1].replace("%%", "%").replace("$$", "$") == odd


def test_a_newline_in_an_extra_argument_is_refused() -> None:
    replica = _replica(extra_args=("--x\nExecStartPre=/bin/rm -rf /",))
    with pytest.raises(ValueError, match="newline"):
        render("vllm_mp/templates/vllm.service.j2", replica, 0)


def test_mp_unit_settings_follow_the_measured_behaviour() -> None:
    unit = render("vllm_mp/templates/vllm.service.j2", _replica(), 0)
    unit_section, service = unit.split("[Service]")
    for line in ("Wants=network-online.target", "After=network-online.target",
                 "StartLimitIntervalSec=600", "StartLimitBurst=20"):
        assert line in unit_section.splitlines()
    for line in ("Type=exec", "Restart=always", "RestartSec=5", "TimeoutStopSec=15",
                 "LimitMEMLOCK=infinity", "User=vllm", "WorkingDirectory=/var/lib/vllm",
                 "EnvironmentFile=/etc/vllm-provision/vllm.env", "StandardOutput=journal"):
        assert line in service.splitlines()
    assert unit.startswith("# managed by vllm-provision, role vllm_mp")


def test_env_file_has_the_node_ip_interfaces_and_offline_hub() -> None:
    for rank, ip in ((0, "10.213.6.11"), (1, "10.213.6.12")):
        values = env_values(render("vllm_mp/templates/vllm.env.j2", _replica(), rank))
        assert values["VLLM_HOST_IP"] == ip
        assert values["NCCL_SOCKET_IFNAME"] == values["GLOO_SOCKET_IFNAME"] == "eth0"
        assert values["HF_HUB_OFFLINE"] == "1"
        assert values["VLLM_CACHE_ROOT"] == "/var/lib/vllm/cache"


def test_user_env_is_added_last_and_wins() -> None:
    text = render("vllm_mp/templates/vllm.env.j2", _replica(), 1,
                  vllm_env={"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "0", "ODD": 'x "y" $z'})
    values = env_values(text)
    assert values["NCCL_DEBUG"] == "INFO" and values["HF_HUB_OFFLINE"] == "0"
    assert 'ODD="x \\"y\\" \\$z"' in text


def test_secrets_are_only_in_the_env_file() -> None:
    replica = _replica(api_key="sk-very-secret")
    unit = render("vllm_mp/templates/vllm.service.j2", replica, 0, vllm_hf_token="hf_secret")
    assert "sk-very-secret" not in unit and "hf_secret" not in unit
    assert "--api-key" not in unit
    values = env_values(render("vllm_mp/templates/vllm.env.j2", replica, 0,
                               vllm_hf_token="hf_secret"))
    assert values["VLLM_API_KEY"] == "sk-very-secret"
    assert values["HF_TOKEN"] == "hf_secret"
    follower = env_values(render("vllm_mp/templates/vllm.env.j2", replica, 1))
    assert "VLLM_API_KEY" not in follower  # only rank 0 serves HTTP


# --- ray ----------------------------------------------------------------------------------------

def test_ray_head_and_worker_use_the_venv_ray_and_the_node_ip() -> None:
    replica = _replica("ray")
    head = exec_start(render("ray/templates/ray-head.service.j2", replica, 0))
    worker = exec_start(render("ray/templates/ray-worker.service.j2", replica, 1))
    assert head[:3] == ["/opt/vllm/bin/ray", "start", "--head"]
    assert {"--node-ip-address=10.213.6.11", "--port=6379", "--num-gpus=4", "--block"} <= set(head)
    assert worker[:2] == ["/opt/vllm/bin/ray", "start"]
    assert {"--address=10.213.6.11:6379", "--node-ip-address=10.213.6.12",
            "--block"} <= set(worker)
    assert "--head" not in worker


def test_ray_units_stop_cleanly() -> None:
    for template, rank in (("ray/templates/ray-head.service.j2", 0),
                           ("ray/templates/ray-worker.service.j2", 1)):
        lines = render(template, _replica("ray"), rank).splitlines()
        assert {"KillMode=mixed", "SuccessExitStatus=1", "TimeoutStopSec=20",
                "Restart=always", "EnvironmentFile=/etc/vllm-provision/ray.env"} <= set(lines)


def test_ray_env_matches_vllm_host_ip_and_disables_the_memory_monitor() -> None:
    values = env_values(render("ray/templates/ray.env.j2", _replica("ray"), 1))
    assert values["VLLM_HOST_IP"] == "10.213.6.12"
    assert values["RAY_memory_monitor_refresh_ms"] == "0"


def test_vllm_on_ray_never_gets_nnodes_and_uses_the_ray_backend() -> None:
    replica = _replica("ray", max_model_len=2048)
    words = exec_start(render("vllm_ray/templates/vllm.service.j2", replica, 0))
    assert "--nnodes" not in words and "--node-rank" not in words and "--headless" not in words
    joined = " ".join(words)
    assert "--distributed-executor-backend ray" in joined
    assert "--tensor-parallel-size 4 --pipeline-parallel-size 2 --max-model-len 2048" in joined
    env = env_values(render("vllm_ray/templates/vllm.env.j2", replica, 0))
    assert env["RAY_ADDRESS"] == "10.213.6.11:6379"


def test_engine_arguments_are_the_same_for_both_backends() -> None:
    args = {"max_model_len": 4096, "extra_args": ("--enforce-eager",)}
    mp_words = _engine_words(exec_start(
        render("vllm_mp/templates/vllm.service.j2", _replica(**args), 0)))
    ray_words = exec_start(render("vllm_ray/templates/vllm.service.j2", _replica("ray", **args), 0))
    assert ray_words[2:2 + len(mp_words)] == mp_words


# --- systemd-analyze verify ---------------------------------------------------------------------

UNITS = [
    ("vllm_mp/templates/vllm.service.j2", "mp", 0, "vllm.service"),
    ("vllm_mp/templates/vllm.service.j2", "mp", 1, "vllm.service"),
    ("ray/templates/ray-head.service.j2", "ray", 0, "ray-head.service"),
    ("ray/templates/ray-worker.service.j2", "ray", 1, "ray-worker.service"),
    ("vllm_ray/templates/vllm.service.j2", "ray", 0, "vllm.service"),
]


@pytest.fixture(scope="session")
def verify_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root for ``systemd-analyze verify --root``: systemd's own units and stand-in binaries."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (the lab tests verify on the hosts)")
    root = tmp_path_factory.mktemp("verify-root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "opt/vllm/bin").mkdir(parents=True)
    (root / "bin").mkdir()
    # python3: the Ray vLLM unit's start gate; /bin/sh: its ExecStopPost
    for binary in [root / "opt/vllm/bin" / name for name in ("vllm", "ray", "python3")] + [
            root / "bin/sh"]:
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    return root


@pytest.mark.parametrize(("template", "backend", "rank", "unit_name"), UNITS)
def test_rendered_units_pass_systemd_analyze_verify(
        verify_root: Path, template: str, backend: str, rank: int, unit_name: str) -> None:
    replica = _replica(backend, max_model_len=4096, extra_args=("--chat-template", "a b%"))
    path = verify_root / "etc/systemd/system" / unit_name
    path.write_text(render(template, replica, rank))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={verify_root}",
         f"/etc/systemd/system/{unit_name}"], capture_output=True, text=True, check=False)
    # verify exits 0 on warnings: any output is a failure (systemd/systemd#11651).
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
