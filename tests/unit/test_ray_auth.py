"""Ray token authentication (docs/security.md, "Ray token authentication"): the variable and its
validation, the controller's token store, what the env files, the watchdog config and our Ray
drivers get, masking, the check of old Ray, and the rotation plan."""

from __future__ import annotations

import json
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from inventory_support import load_llama
from render_support import ROLES, env_values, rendered_files, templar_for
from test_checks_parity_host import clean_facts, make_replica

from vllm_provision.backends.placement import ray_command
from vllm_provision.checks import network
from vllm_provision.checks.finding import Severity
from vllm_provision.core.errors import ProvisionError
from vllm_provision.modules.ray_wait_cluster import snapshot_command
from vllm_provision.operations import deploy
from vllm_provision.runner.engine import Runner
from vllm_provision.settings import layered, ray_auth
from vllm_provision.state import ray_token

SMALL = """\
        small:
          vars: {vllm_backend: mp, vllm_model: /srv/models/tiny}
          hosts:
            h3: {ansible_host: 10.0.0.13, vllm_node_rank: 0}
"""
TOKEN_PATH = "/var/lib/vllm/ray_auth_token"


@pytest.fixture(autouse=True)
def _state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def load(tmp_path: Path, backend: str = "ray", **extra: object):
    """The replica ``llama`` (TP=4 x PP=2 on h1, h2) and the one-node mp replica ``small``."""
    return load_llama(tmp_path, backend, more=SMALL, **extra)


def files(inventory) -> dict[str, str]:
    return dict(rendered_files(inventory))


# --- the variable ---------------------------------------------------------------------------

def test_token_is_the_default_and_a_bad_value_is_refused_at_load(tmp_path):
    [ray, _] = load(tmp_path).replicas
    assert layered(ray.vars)["vllm_ray_auth"] == "token"
    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, vllm_ray_auth="tls")
    text = str(raised.value)
    assert "vllm_ray_auth" in text and "token, none" in text and "inventory.yml" in text


@pytest.mark.parametrize("name", ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"])
def test_ray_auth_names_in_vllm_env_are_refused_with_the_variable_to_set(tmp_path, name):
    with pytest.raises(ProvisionError) as raised:
        load(tmp_path, vllm_env=f"{{{name}: x}}")
    assert name in str(raised.value) and "vllm_ray_auth" in str(raised.value)


# --- what the nodes get ---------------------------------------------------------------------

def test_every_ray_process_gets_the_mode_and_the_token_file_never_the_token(tmp_path):
    rendered = files(load(tmp_path))
    for label in ("h1:ray/ray.env.j2", "h2:ray/ray.env.j2", "h1:vllm_ray/vllm.env.j2"):
        env = env_values(rendered[label])
        assert env["RAY_AUTH_MODE"] == "token", label
        assert env["RAY_AUTH_TOKEN_PATH"] == TOKEN_PATH, label
        assert "RAY_AUTH_TOKEN" not in env, label
    config = json.loads(rendered["h1:vllm_watchdog/watchdog.json.j2"])
    assert config["ray_auth_env"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": TOKEN_PATH}
    assert json.loads(rendered["h3:vllm_watchdog/watchdog.json.j2"])["ray_auth_env"] is None
    assert "RAY_AUTH" not in rendered["h3:vllm_mp/vllm.env.j2"]


def test_none_disables_ray_auth_explicitly_and_names_no_token_file(tmp_path):
    rendered = files(load(tmp_path, vllm_ray_auth="none"))
    for label in ("h1:ray/ray.env.j2", "h2:ray/ray.env.j2", "h1:vllm_ray/vllm.env.j2"):
        env = env_values(rendered[label])
        assert env["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN_PATH" not in env, label


def test_the_token_file_path_follows_vllm_state_dir(tmp_path):
    rendered = files(load(tmp_path, vllm_state_dir="/srv/vllm-state"))
    env = env_values(rendered["h2:ray/ray.env.j2"])
    assert env["RAY_AUTH_TOKEN_PATH"] == "/srv/vllm-state/ray_auth_token"


def test_a_new_token_restarts_the_cluster_in_order_on_up_and_restart_installs_the_same():
    """Role ray installs the token and notifies the Ray handlers (head: the cluster, worker:
    itself, then vLLM); role ray_token (restart.yml) holds the same task without handlers."""
    import yaml

    tasks = yaml.safe_load((ROLES / "ray" / "tasks" / "main.yml").read_text())
    head, worker = (t for t in tasks if t["name"].startswith("Install the replica's Ray token"))
    assert head["notify"] == ["Restart the Ray cluster", "Restart vLLM on the Ray head"]
    assert worker["notify"] == ["Restart this Ray worker", "Restart vLLM on the Ray head"]
    assert tasks.index(head) < min(i for i, t in enumerate(tasks) if "environment" in t["name"])
    [plain] = yaml.safe_load((ROLES / "ray_token" / "tasks" / "main.yml").read_text())
    assert "notify" not in plain
    for task in (head, worker):
        assert task["template"] == plain["template"] and task["no_log"] is plain["no_log"]
        assert task["when"].endswith(plain["when"])
    assert (ROLES / "ray" / "templates" / "ray_auth_token.j2").read_text() == \
        (ROLES / "ray_token" / "templates" / "ray_auth_token.j2").read_text()


def test_the_token_file_holds_the_token_alone_0600_for_the_service_user(tmp_path):
    import yaml

    [task] = yaml.safe_load((ROLES / "ray_token" / "tasks" / "main.yml").read_text())  # = ray's
    args = task["template"]
    assert (args["mode"], args["backup"], task["no_log"]) == ("0600", False, True)
    assert args["owner"] == "{{ vllm_service_user }}"
    assert args["dest"] == "{{ vllm_state_dir }}/ray_auth_token"
    inventory = load(tmp_path)
    templar = templar_for(inventory, inventory.replicas[0], 0).with_vars(
        {"ray_auth_token": "c" * 64})
    source = (ROLES / "ray_token" / "templates" / "ray_auth_token.j2").read_text()
    assert templar.render(source, "ray_auth_token.j2") == "c" * 64


def test_our_ray_drivers_run_with_the_replica_auth_environment(tmp_path):
    replica = load(tmp_path).replicas[0]
    values = layered(replica.vars)
    for command in (snapshot_command(replica, values),
                    ray_command(replica, values, ray_auth.env_words(values))):
        assert f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={TOKEN_PATH}" in command
    off = layered({**replica.vars, "vllm_ray_auth": "none"})
    assert "RAY_AUTH_MODE=disabled" in snapshot_command(replica, off)
    assert "RAY_AUTH_TOKEN_PATH" not in snapshot_command(replica, off)


def test_the_watchdog_keeps_only_ray_auth_names_for_its_gcs_reader():
    sys.path.insert(0, str(ROLES / "vllm_watchdog" / "files"))
    try:
        import vllm_watchdog
    finally:
        sys.path.pop(0)
    assert vllm_watchdog.ray_auth_env(
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/t", "LD_PRELOAD": "/x.so",
         "RAY_AUTH_TOKEN": 5}) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/t"}
    assert vllm_watchdog.ray_auth_env(None) == {}
    nodes = vllm_watchdog.RayNodes("10.0.0.11:6379", env={"RAY_AUTH_MODE": "token"})
    assert nodes.env == {"RAY_AUTH_MODE": "token"}


# --- the controller's tokens ----------------------------------------------------------------

def test_ensure_makes_one_private_token_per_ray_replica_and_keeps_it(tmp_path):
    inventory = load(tmp_path)
    made = ray_token.ensure_tokens(inventory)
    assert list(made) == ["llama"] and ray_auth.TOKEN_RE.fullmatch(made["llama"])
    path = ray_token.token_path(inventory.path, "llama")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert ray_token.ensure_tokens(inventory) == made  # kept, not remade
    assert ray_token.ensure_tokens(load(tmp_path, vllm_ray_auth="none")) == {}


def test_a_token_file_that_is_not_ours_is_refused_with_the_path_and_the_fix(tmp_path):
    inventory = load(tmp_path)
    path = ray_token.token_path(inventory.path, "llama")
    path.parent.mkdir(parents=True)
    path.write_text("$(reboot)\n")
    with pytest.raises(ProvisionError) as raised:
        ray_token.read_tokens(inventory)
    assert str(path) in str(raised.value) and "--rotate-ray-token" in str(raised.value)


def test_rotate_replaces_the_token_and_refuses_a_replica_without_one(tmp_path):
    inventory = load(tmp_path)
    before = ray_token.ensure_tokens(inventory)["llama"]
    after = ray_token.rotate(inventory, ["llama"])["llama"]
    assert after != before and ray_token.read_token(inventory.path, "llama") == after
    with pytest.raises(ProvisionError) as raised:
        ray_token.rotate(inventory, ["small"])
    assert "small" in str(raised.value)


def test_the_run_gives_templates_the_token_and_masks_it_everywhere(tmp_path):
    inventory = load(tmp_path)
    token = ray_token.ensure_tokens(inventory)["llama"]
    runner = Runner(inventory)
    assert runner.variables.ray_tokens == {"llama": token}
    assert runner.masker.text(f"token={token} ok") == "token=******** ok"
    assert token not in json.dumps(runner.masker.data({"out": [token.upper(), token]}))


# --- the check ------------------------------------------------------------------------------

@pytest.mark.parametrize(("ray", "values", "severity"), [
    ("2.60.0", {}, None),
    ("2.52.0", {}, None),
    ("2.51.2", {}, Severity.ERROR),
    ("2.51.2", {"vllm_ray_auth": "none"}, Severity.WARNING),
    ("2.51.2", {"vllm_firewall": "nftables"}, Severity.WARNING),
    (None, {}, None),
])
def test_old_ray_is_refused_only_where_outsiders_reach_its_ports(ray, values, severity):
    replica = make_replica("ray", values)
    facts = clean_facts()["h1"]
    facts = replace(facts, packages={**facts.packages, "ray": ray})
    found = network.check_ray_auth(replica.nodes[0], facts, replica)
    if severity is None:
        assert found == []
        return
    [finding] = found
    assert (finding.check, finding.severity, finding.host) == ("network.ray_auth", severity, "h1")
    assert "CVE-2025-62593" in finding.actual and "Ray 2.51.2" in finding.actual
    assert "2.52" in finding.expected and "vllm_firewall: nftables" in finding.fix


def test_an_mp_replica_has_no_ray_auth_finding():
    replica = make_replica("mp")
    facts = replace(clean_facts()["h1"], packages={"ray": "2.40.0"})
    assert network.check_ray_auth(replica.nodes[0], facts, replica) == []


# --- rotation plan --------------------------------------------------------------------------

def test_rotation_targets_the_ray_replicas_of_the_run_only(tmp_path):
    inventory = load(tmp_path)
    assert deploy.rotation_targets(inventory, ["h1", "h2", "h3"]) == ["llama"]
    assert deploy.rotation_targets(inventory, ["h3"]) == []
    assert deploy.rotation_targets(load(tmp_path, vllm_ray_auth="none"), ["h1"]) == []


def run_hosts(inventory, limit=None):
    """The run's hosts as ``deploy.run`` has them (``runlock.hosts_of_plays``: Host objects)."""
    from vllm_provision import resources
    from vllm_provision.runner.playbook import load_playbook
    from vllm_provision.transport import runlock

    return runlock.hosts_of_plays(inventory, load_playbook(resources.playbook("restart")), limit)


def test_rotate_in_check_mode_writes_nothing_and_says_so(tmp_path):
    inventory = load(tmp_path)
    before = ray_token.ensure_tokens(inventory)
    said: list[str] = []
    request = deploy.Deploy("restart", inventory, connection=None,  # type: ignore[arg-type]
                            check=True, rotate_ray_token=True)
    assert deploy._ray_tokens(request, run_hosts(inventory), said.append) == {}
    assert ray_token.read_tokens(inventory) == before and "llama" in said[0]
    request = replace(request, check=False)
    assert deploy._ray_tokens(request, run_hosts(inventory), said.append) == {
        "ray_token_rotated": ["llama"]}
    assert ray_token.read_tokens(inventory) != before
    with pytest.raises(ProvisionError) as raised:
        deploy._ray_tokens(request, run_hosts(inventory, "h3"), said.append)
    assert "--rotate-ray-token" in str(raised.value)


def test_up_makes_a_missing_token_and_down_does_not(tmp_path):
    inventory = load(tmp_path)
    down = deploy.Deploy("down", inventory, connection=None)  # type: ignore[arg-type]
    deploy._ray_tokens(down, run_hosts(inventory), print)
    assert ray_token.read_tokens(inventory) == {}
    deploy._ray_tokens(replace(down, command="up"), run_hosts(inventory), print)
    assert list(ray_token.read_tokens(inventory)) == ["llama"]


def test_restart_installs_the_token_after_the_hold_and_before_the_stop_in_order():
    from vllm_provision import resources
    from vllm_provision.runner.playbook import load_playbook

    names = [play.name for play in load_playbook(resources.playbook("restart"))]
    token = names.index("Install the Ray token of Ray replicas")
    assert names[token - 1].startswith("Hold the peer watchdogs")
    assert names[token + 1].startswith("Stop")


class _Node:
    """A rank 0 connection that answers ``cat`` of the token file with ``text`` (or raises)."""

    def __init__(self, text: str = "", error: Exception | None = None) -> None:
        self.text, self.error, self.commands = text, error, []

    def run(self, command: str, **_: object):
        from vllm_provision.transport.base import CommandResult

        self.commands.append(command)
        if self.error is not None:
            raise self.error
        return CommandResult(0, self.text, "")


def test_a_second_controller_adopts_the_token_rank_0_holds_instead_of_making_one(tmp_path):
    inventory = load(tmp_path)
    held = "ab" * 32
    node = _Node(held + "\n")
    made = ray_token.ensure_tokens(inventory, connections={"h1": node, "h2": _Node("cd" * 32)})
    assert made == {"llama": held} and ray_token.read_token(inventory.path, "llama") == held
    assert node.commands == [f"cat -- {TOKEN_PATH} 2>/dev/null || true"]
    again = _Node("ef" * 32)
    assert ray_token.ensure_tokens(inventory, connections={"h1": again}) == made
    assert again.commands == []  # the controller has it now: no round trip


@pytest.mark.parametrize("node", [_Node(""), _Node("$(reboot)"), _Node("AB" * 32),
                                  _Node(error=ProvisionError.single("h1", "unreachable"))])
def test_no_usable_token_on_rank_0_makes_a_new_one(tmp_path, node):
    inventory = load(tmp_path)
    made = ray_token.ensure_tokens(inventory, connections={"h1": node})
    assert ray_auth.TOKEN_RE.fullmatch(made["llama"]) and made["llama"] != "ab" * 32
    assert ray_token.read_token(inventory.path, "llama") == made["llama"]


def test_the_adopted_token_is_read_from_rank_0s_vllm_state_dir(tmp_path):
    inventory = load(tmp_path, vllm_state_dir="/srv/vllm-state")
    node = _Node("12" * 32)
    assert ray_token.ensure_tokens(inventory, connections={"h1": node}) == {"llama": "12" * 32}
    assert node.commands == ["cat -- /srv/vllm-state/ray_auth_token 2>/dev/null || true"]
