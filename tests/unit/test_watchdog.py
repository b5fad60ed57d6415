"""The peer watchdog's program (role vllm_watchdog): its I/O, its loop, its rendered config/unit.

The program (``files/vllm_watchdog.py``) imports its rules (``files/vllm_watchdog_rules.py``,
tested on their own in tests/unit/test_watchdog_rules.py) from its own folder. Here: what it reads
from ``/proc`` and the hold file, a watchdog poll driven with a fake clock, fake HTTP answers and a
fake ``systemctl``, the probe's HTTP request over real sockets, the role that installs both files,
and the rendered config and unit.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jinja2
import pytest
import yaml
from test_watchdog_rules import OK, TIMEOUT, FakeApi, load_file, prober, rules

from vllm_provision.core.models import EngineArgs, Host, Node, Replica

ROLE = Path(__file__).resolve().parents[2] / "roles" / "vllm_watchdog"
SCRIPT = ROLE / "files" / "vllm_watchdog.py"
RULES = ROLE / "files" / "vllm_watchdog_rules.py"


wd = load_file("vllm_watchdog_script", SCRIPT)


def test_the_program_uses_the_rules_module_it_imports_from_its_folder() -> None:
    assert wd.decide is rules.decide and wd.Settings is rules.Settings
    assert wd.Prober is rules.Prober and wd.log is rules.log


@pytest.mark.parametrize("flags", [[], ["-I"]])
def test_the_installed_pair_runs_from_its_folder_even_isolated(tmp_path: Path,
                                                               flags: list[str]) -> None:
    # As on a host: both files in one folder, started from elsewhere (``-I``: the script's
    # folder is not on sys.path by itself). A bad config exits 2 after the import succeeded.
    folder = tmp_path / "usr-local-lib"
    folder.mkdir()
    for source in (SCRIPT, RULES):
        shutil.copy(source, folder / source.name)
    (tmp_path / "bad.json").write_text("{}")
    result = subprocess.run([sys.executable, *flags, str(folder / SCRIPT.name),
                             str(tmp_path / "bad.json")], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert "bad config" in result.stderr and "Traceback" not in result.stderr
    assert not (folder / "__pycache__").exists()  # nothing beside the installed files


# --- /proc ----------------------------------------------------------------------------------------

def _fake_proc(root: Path, members: dict[int, tuple[str, list[str]]], tcp: list[str],
               tcp6: list[str]) -> Path:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt" \
             "   uid  timeout inode"
    for pid, (cgroup, inodes) in members.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(cgroup)
        for fd, inode in enumerate(inodes):
            (root / str(pid) / "fd" / str(fd)).symlink_to(f"socket:[{inode}]")
    (root / "net").mkdir()
    (root / "net" / "tcp").write_text("\n".join([header, *tcp]) + "\n")
    (root / "net" / "tcp6").write_text("\n".join([header, *tcp6]) + "\n")
    return root


def _line(local: str, remote: str, state: str, inode: str) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0  0 {inode}"


def test_connected_to_reads_the_cgroups_established_sockets(tmp_path: Path) -> None:
    unit = "/system.slice/vllm.service"
    # 10.213.6.11:29501 is 0B06D50A:733D in /proc/net/tcp (little-endian words, hex port)
    proc = _fake_proc(tmp_path, {
        100: (f"0::{unit}\n", ["11"]),                          # cgroup v2 member
        101: (f"12:cpu:/x\n1:name=systemd:{unit}\n", ["12"]),  # cgroup v1 member
        200: ("0::/system.slice/other.service\n", ["13"]),
    }, tcp=[_line("0C06D50A:9C40", "0B06D50A:733D", "06", "11"),   # TIME_WAIT: not joined
            _line("0C06D50A:9C41", "0B06D50A:733D", "01", "13")],  # other unit's socket
        tcp6=[])
    assert not wd.connected_to(unit, "10.213.6.11", 29501, str(proc))
    with (proc / "net" / "tcp6").open("a") as handle:  # IPv4-mapped, established, pid 101
        handle.write(_line("0000000000000000FFFF00000C06D50A:9C42",
                           "0000000000000000FFFF00000B06D50A:733D", "01", "12") + "\n")
    assert wd.connected_to(unit, "10.213.6.11", 29501, str(proc))
    assert not wd.connected_to(unit, "10.213.6.11", 29502, str(proc))
    assert not wd.connected_to("/system.slice/none.service", "10.213.6.11", 29501, str(proc))
    assert wd.connected_to(unit, "rank0.example", 29501, str(proc))  # a name: not judged
    # port 0 (data parallel): any established connection to the address joins
    assert wd.connected_to(unit, "10.213.6.11", 0, str(proc))
    assert not wd.connected_to(unit, "10.213.6.12", 0, str(proc))



# --- a watchdog poll and the probe's request -----------------------------------------------------

class FakeSystemctl:
    """``systemctl show`` of one running vllm.service, and every other call recorded."""

    def __init__(self, invocation: str = "a") -> None:
        self.invocation = invocation
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> Any:
        if argv[:2] == ["systemctl", "show"]:
            out = (f"Id=vllm.service\nInvocationID={self.invocation}\nActiveState=active\n"
                   "SubState=running\nMainPID=42\nExecMainStartTimestampMonotonic=1000000\n")
            return types.SimpleNamespace(returncode=0, stdout=out, stderr="")
        self.calls.append(argv)
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")


def test_watchdog_try_restarts_the_unit_the_probe_gave_up_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    systemctl, clock = FakeSystemctl(), [100.0]
    monkeypatch.setattr(wd.subprocess, "run", systemctl)
    monkeypatch.setattr(wd.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(wd.time, "time", lambda: 1.7e9 + clock[0])
    api = FakeApi()
    api.answers = [OK] + [TIMEOUT] * 3
    settings = wd.Settings(probe_interval_s=30.0, probe_timeout_s=60.0, probe_failures=3)
    config = {"node": "h1", "units": ["vllm.service"], "rules": [], "peers": {},
              "hold_file": str(tmp_path / "hold"), "state_file": str(tmp_path / "state.json")}
    watchdog = wd.Watchdog(config, settings, prober=prober(api, settings))
    for _ in range(200):
        watchdog.poll()
        clock[0] += 1.0
    assert systemctl.calls == [["systemctl", "--no-block", "--job-mode=fail", "try-restart",
                                "vllm.service"]]
    published = json.loads((tmp_path / "state.json").read_text())["probe"]
    assert published["restarts"] == 1 and published["last_result"] == "failure"
    systemctl.invocation = "b"  # systemd restarted it; the new invocation is judged afresh
    api.answers = [OK]
    watchdog.poll()
    assert watchdog.prober.armed == "b" and watchdog.prober.last.outcome == "ok"


class ScriptedApi(http.server.BaseHTTPRequestHandler):
    """A local HTTP server answering POST /v1/completions by the path's scripted behaviour."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        behaviour = self.server.behaviour  # type: ignore[attr-defined]
        if behaviour == "hang":
            time.sleep(1.0)
            return
        if behaviour == "reset":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if behaviour == "500-dies":  # the 500's body is cut short: the engine process died
            self.send_response(500)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"error": "EngineCore')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status, body = {"ok": (200, {"choices": [{"text": " the"}]}),
                        "500": (500, {"error": "EngineCore encountered an issue"}),
                        "401": (401, {"error": "Unauthorized"})}[behaviour]
        if behaviour == "ok" and self.headers.get("Authorization") != "Bearer sk-lab":
            status, body = 401, {"error": "Unauthorized"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return


@pytest.mark.parametrize(("behaviour", "outcome", "detail"), [
    ("ok", "ok", "HTTP 200"), ("500", "failure", "HTTP 500"), ("401", "ignored", "HTTP 401"),
    ("500-dies", "failure", "HTTP 500"),
    ("hang", "failure", "no answer within 0.3 s"), ("reset", "failure", "connection failed"),
    ("refused", "failure", "connection failed")])
def test_probe_completion_over_real_sockets(behaviour: str, outcome: str, detail: str) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedApi)
    server.behaviour = behaviour  # type: ignore[attr-defined]
    server.daemon_threads = True
    port = server.server_address[1]
    if behaviour == "refused":
        server.server_close()
    else:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = wd.probe_completion(f"http://127.0.0.1:{port}", "tiny", "sk-lab", 0.3)
    finally:
        if behaviour != "refused":
            server.shutdown()
            server.server_close()
    assert result.outcome == outcome and detail in result.detail, result



# --- hold -----------------------------------------------------------------------------------------

def test_hold_file_counts_only_until_its_deadline(tmp_path: Path) -> None:
    hold = tmp_path / "watchdog.hold"
    assert wd.held_until(str(hold), 1000.0) is None
    hold.write_text("1500\n")
    assert wd.held_until(str(hold), 1000.0) == 1500.0
    assert wd.held_until(str(hold), 2000.0) is None
    hold.write_text("garbage")
    assert wd.held_until(str(hold), 1000.0) is None


def _idle_watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A watchdog of one unit and no rules (whole whenever it is not held), listening on a free
    loopback port."""
    monkeypatch.setattr(wd.subprocess, "run", FakeSystemctl())
    config = {"node": "h1", "units": ["vllm.service"], "rules": [], "peers": {},
              "hold_file": str(tmp_path / "hold"), "state_file": str(tmp_path / "state.json"),
              "listen_host": "127.0.0.1", "listen_port": 0}
    return wd.Watchdog(config, wd.Settings())


def test_pause_wakes_when_the_hold_file_appears_and_when_it_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watchdog = _idle_watchdog(tmp_path, monkeypatch)
    watchdog.poll()
    hold = tmp_path / "hold"
    hold.write_text(f"{time.time() + 600}\n")  # a run took the hold: the next read sees it
    start = time.monotonic()
    watchdog.pause(30.0)
    assert time.monotonic() - start < 15.0
    watchdog.poll()
    assert watchdog.published["held_until"] is not None and not watchdog.released()
    hold.unlink()  # the run released it
    start = time.monotonic()
    watchdog.pause(30.0)
    assert time.monotonic() - start < 15.0


def test_pause_sleeps_its_whole_time_while_nothing_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watchdog = _idle_watchdog(tmp_path, monkeypatch)
    watchdog.poll()
    start = time.monotonic()
    watchdog.pause(0.3)
    assert time.monotonic() - start >= 0.3


def _get_state(port: int, query: str, into: list[dict[str, Any]]) -> None:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/state{query}", timeout=30) as answer:
        into.append(json.loads(answer.read()))


def test_state_wait_released_answers_once_the_watchdog_is_whole_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watchdog = _idle_watchdog(tmp_path, monkeypatch)
    hold = tmp_path / "hold"
    hold.write_text(f"{time.time() + 600}\n")
    watchdog.poll()
    server = wd.serve(watchdog)
    try:
        answers: list[dict[str, Any]] = []
        waiter = threading.Thread(target=_get_state,
                                  args=(server.server_address[1], "?wait_released=9", answers))
        waiter.start()
        time.sleep(0.2)
        assert answers == []  # still held: the request waits
        hold.unlink()
        watchdog.poll()  # the next round sees the release and wakes the waiting request
        waiter.join(timeout=8)
        assert answers and answers[0]["held_until"] is None and answers[0]["whole"] is True
        held: list[dict[str, Any]] = []
        hold.write_text(f"{time.time() + 600}\n")
        watchdog.poll()
        _get_state(server.server_address[1], "?wait_released=0.2", held)  # gives up: held
        assert held[0]["held_until"] is not None
        plain: list[dict[str, Any]] = []
        _get_state(server.server_address[1], "", plain)  # no wait asked: answers at once
        assert plain[0]["node"] == "h1"
    finally:
        server.shutdown()
        server.server_close()


# --- rendered files -----------------------------------------------------------------------------

def _replica(backend: str, nodes: int = 3) -> Replica:
    hosts = [Host(name=f"h{i}", address=f"10.213.6.{10 + i}") for i in range(1, nodes + 1)]
    return Replica(name="llama", backend=backend,  # type: ignore[arg-type]
                   nodes=tuple(Node(host=h, rank=i, host_ip=h.address)
                               for i, h in enumerate(hosts)),
                   engine=EngineArgs(model="/srv/models/m", tensor_parallel_size=2,
                                     pipeline_parallel_size=nodes))


def render(name: str, replica: Replica, rank: int) -> str:
    roles = ["vllm_common", *(["vllm_mp"] if replica.backend == "mp" else ["ray", "vllm_ray"]),
             "vllm_watchdog"]
    from vllm_provision.settings import variables

    values: dict[str, Any] = variables.defaults()  # the table's, under the roles' (the engine's)
    for role in roles:
        values.update(yaml.safe_load((ROLE.parent / role / "defaults" / "main.yml").read_text()))
    values |= {"vllm_venv": "/opt/vllm", "replica": replica, "node": replica.nodes[rank]}
    for _ in range(3):  # defaults refer to other variables
        values = {k: jinja2.Template(v).render(values) if isinstance(v, str) and "{{" in v else v
                  for k, v in values.items()}
    from vllm_provision.runner.templating import make_environment

    env = make_environment()
    return env.from_string((ROLE / "templates" / name).read_text()).render(values)


def test_mp_config_makes_every_node_depend_on_every_other_node_both_ways() -> None:
    replica = _replica("mp")
    configs = [json.loads(render("watchdog.json.j2", replica, r)) for r in range(3)]
    for rank, config in enumerate(configs):
        assert config["units"] == ["vllm.service"]
        assert {r["peer"] for r in config["rules"]} == {f"h{i}" for i in (1, 2, 3)} - {
            f"h{rank + 1}"}
        assert all(r["mutual"] for r in config["rules"])
        assert config["listen_host"] == replica.nodes[rank].host_ip
        assert set(config["peers"]) == {r["peer"] for r in config["rules"]}
    assert configs[0]["peers"]["h2"] == "10.213.6.12:29510"
    # only a headless node's rule for rank 0 names the rendezvous it must have joined
    for rank, config in enumerate(configs):
        for rule in config["rules"]:
            wanted = (replica.master_addr, replica.engine.master_port) if rule["peer"] == "h1" \
                else (None, None)
            assert (rule.get("master_addr"), rule.get("master_port")) == wanted, (rank, rule)


def test_ray_config_makes_vllm_and_workers_depend_on_the_head_one_way() -> None:
    replica = _replica("ray", nodes=2)
    head = json.loads(render("watchdog.json.j2", replica, 0))
    worker = json.loads(render("watchdog.json.j2", replica, 1))
    assert head["rules"] == [{"unit": "vllm.service", "peer": "h1",
                              "peer_unit": "ray-head.service", "mutual": False}]
    # A worker tolerates a silent head as long as Ray does: the GCS health-check bound with
    # Ray's defaults, 5 x (10 s + 3 s) (src/ray/common/ray_config_def.h).
    assert worker["rules"] == [{"unit": "ray-worker.service", "peer": "h1",
                                "peer_unit": "ray-head.service", "mutual": False,
                                "grace_s": 65.0}]
    assert head["units"] == ["ray-head.service", "vllm.service"]
    gcs = f"{replica.master.host_ip}:6379"
    assert head["ray"] == {"gcs": gcs, "observe": True, "poll_s": 2.0}
    assert worker["ray"] == {"gcs": gcs, "observe": False, "head": "h1",
                             "unit": "ray-worker.service", "unreachable_s": 65.0}


def test_watchdog_unit_is_enabled_ordered_after_its_units_and_never_gives_up() -> None:
    unit = render("vllm-watchdog.service.j2", _replica("ray", nodes=2), 0)
    assert "Before=ray-head.service vllm.service" in unit  # stop after them: peers see it at once
    assert "StartLimitIntervalSec=0" in unit and "Restart=always" in unit
    assert "WantedBy=multi-user.target" in unit
    assert "ExecStart=/opt/vllm/bin/python3 /usr/local/lib/vllm-provision/vllm_watchdog.py " \
           "/etc/vllm-provision/watchdog.json" in unit


def test_the_installed_script_is_the_file_itself() -> None:
    # The role copies files/vllm_watchdog.py as it is (the copy module never renders it): a
    # plain Python program, no Jinja markers, and what a node needs comes from its JSON config.
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    install = next(t for t in tasks if t["name"] == "Install the watchdog script")
    assert install["copy"]["src"] == "vllm_watchdog.py" and "template" not in install
    source = SCRIPT.read_text()
    assert source.splitlines()[0] == "#!/usr/bin/python3"
    assert "def main(" in source and "from vllm_watchdog_rules import" in source
    assert not any(marker in source for marker in ("{%", "{{", "{#"))
    assert len(source.splitlines()) <= 800
    compile(source, "vllm_watchdog.py", "exec")


def test_the_rules_are_installed_beside_the_script_before_it() -> None:
    # The script imports vllm_watchdog_rules from its own folder: the role copies the rules
    # first, into vllm_watchdog_script's folder (no variable of its own), readable by vLLM's
    # service user (the Ray head's ExecStartPre runs the script), and a new version of either
    # file restarts the watchdog.
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    names = [t["name"] for t in tasks]
    rules_task = next(t for t in tasks if t.get("copy", {}).get("src") == RULES.name)
    script_task = next(t for t in tasks if t["name"] == "Install the watchdog script")
    assert names.index(rules_task["name"]) < names.index(script_task["name"])
    assert rules_task["copy"]["dest"] == \
        "{{ vllm_watchdog_script | dirname }}/vllm_watchdog_rules.py"
    assert rules_task["copy"]["mode"] == "0644" and rules_task["copy"]["owner"] == "root"
    assert rules_task["notify"] == script_task["notify"] == "Restart the watchdog"
    from vllm_provision.runner.templating import make_environment

    dest = make_environment().from_string(rules_task["copy"]["dest"]).render(
        vllm_watchdog_script="/opt/wd/vllm_watchdog.py")
    assert dest == "/opt/wd/vllm_watchdog_rules.py"


def test_rank0_config_carries_the_probe_and_its_settings() -> None:
    replica = _replica("mp", nodes=2)
    rank0 = json.loads(render("watchdog.json.j2", replica, 0))
    assert rank0["probe"] == {"unit": "vllm.service", "url": "http://10.213.6.11:8000",
                              "model": "/srv/models/m", "api_key": None}
    assert rank0["settings"]["probe_interval_s"] == 30.0
    assert rank0["settings"]["probe_timeout_s"] == 60.0
    assert rank0["settings"]["probe_failures"] == 3
    assert json.loads(render("watchdog.json.j2", replica, 1))["probe"] is None  # headless
    ray_head = json.loads(render("watchdog.json.j2", _replica("ray", nodes=2), 0))
    assert ray_head["probe"]["unit"] == "vllm.service"


def test_probe_uses_the_served_name_the_key_and_a_specific_api_address() -> None:
    replica = _replica("mp", nodes=2)
    engine = dataclasses.replace(replica.engine, served_model_name="llama", api_key="sk-lab-key",
                                 api_host="fd00::11", api_port=8080)
    probe = json.loads(render("watchdog.json.j2", dataclasses.replace(replica, engine=engine),
                              0))["probe"]
    assert probe == {"unit": "vllm.service", "url": "http://[fd00::11]:8080", "model": "llama",
                     "api_key": "sk-lab-key"}


def test_the_config_that_may_hold_the_api_key_is_root_only() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    (task,) = [t for t in tasks if t.get("template", {}).get("src") == "watchdog.json.j2"]
    assert task["template"]["mode"] == "0600" and task["template"]["owner"] == "root"
    assert task["notify"] == "Restart the watchdog"  # new probe values restart no vLLM unit


class _FakeRay:
    """Ray's driver API as the gate's trial uses it: ``placed`` says, per trial, whether the
    group gets placed; records what was created, removed and whether the driver shut down."""

    def __init__(self, free_gpus: float, placed: list[bool]) -> None:
        self.free, self.placed, self.groups, self.removed = free_gpus, list(placed), [], []
        self.shut, self.now = False, 0.0
        util = types.ModuleType("ray.util")
        pg = types.ModuleType("ray.util.placement_group")
        pg.placement_group = self.placement_group  # type: ignore[attr-defined]
        pg.remove_placement_group = self.removed.append  # type: ignore[attr-defined]
        util.placement_group = pg  # type: ignore[attr-defined]
        self.modules = {"ray": self, "ray.util": util, "ray.util.placement_group": pg}

    def init(self, **kwargs: Any) -> None:
        self.init_kwargs = kwargs

    def available_resources(self) -> dict[str, float]:
        return {"GPU": self.free, "CPU": 4.0}

    def placement_group(self, specs: list[dict[str, float]], strategy: str) -> Any:
        group = SimpleNamespace(specs=specs, strategy=strategy, placed=self.placed.pop(0))
        group.ready = lambda: group
        self.groups.append(group)
        return group

    def wait(self, refs: list[Any], timeout: float) -> tuple[list[Any], list[Any]]:
        """A placed group is ready at once; a pending one takes the whole timeout."""
        if refs[0].placed:
            return [refs[0]], []
        self.now += timeout
        return [], refs

    def shutdown(self) -> None:
        self.shut = True


@pytest.mark.parametrize(("free", "placed", "ok", "tries"), [
    (8.0, [True], True, 1),
    (8.0, [False, True], True, 2),     # a pending trial is removed and made again
    (4.0, [], True, 0),                # GPUs held elsewhere: vLLM waits for them itself
    (8.0, [False] * 3, False, 3),      # every trial pending within the bound: the gate fails
    (8.0, [False] * 5, False, 3),      # at most RAY_TRIAL_TRIES: then a new Ray head
])
def test_the_gate_places_a_trial_group_of_vllms_shape_before_starting_vllm(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, free: float, placed: list[bool],
        ok: bool, tries: int) -> None:
    fake = _FakeRay(free, placed)
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(wd.time, "monotonic", lambda: fake.now)
    monkeypatch.chdir(tmp_path)  # the gate runs in vLLM's state folder
    result, words = wd.trial_placement("10.0.0.1:6379", 8.0, bound_s=100.0)
    assert result is ok and len(fake.groups) == tries and fake.removed == fake.groups
    marker = tmp_path / wd.RAY_STUCK_MARKER
    assert marker.exists() is (not ok), "the marker asks vLLM's unit for a new Ray head"
    assert ok or (marker.read_text().startswith("gave up: 3 trials") and "head" in words)
    assert fake.shut and fake.init_kwargs["address"] == "10.0.0.1:6379"
    for group in fake.groups:  # vLLM's bundles: 8 x {"GPU": 1}, bundle 0 on the head
        assert group.strategy == "PACK" and len(group.specs) == 8
        assert group.specs[0] == {"GPU": 1.0, "node:10.0.0.1": 0.001}
        assert all(spec == {"GPU": 1.0} for spec in group.specs[1:])
    assert ("starting vLLM" in words) is ok


def test_a_trial_that_cannot_connect_never_keeps_vllm_from_starting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay(8.0, [])

    def refuse(**kwargs: Any) -> None:
        raise ConnectionError("no GCS")
    fake.init = refuse  # type: ignore[method-assign]
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    assert wd.trial_placement("10.0.0.1:6379", 8.0, 40.0) == (
        True, "no trial placement (ConnectionError: no GCS): starting vLLM")


@pytest.mark.parametrize("bad", [0, 2.5, -1])
def test_trial_specs_need_a_whole_number_of_gpus(bad: float) -> None:
    with pytest.raises(ValueError, match="whole number"):
        rules.trial_specs(bad, "10.0.0.1")
