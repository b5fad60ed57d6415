"""The runner's parts on their own: the handler queue and the variable resolver.

Hosts are fakes whose commands run locally in a temp folder (``test_runner_support``); the
handlers and the pending-notification records are the real ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from inventory_support import replicas_yaml
from test_runner_support import FakeHost, make_inventory

from vllm_provision.core.models import Inventory
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.inventory.loader import load_inventory
from vllm_provision.modules import UNAFFECTED_KEY, ModuleResult
from vllm_provision.runner.executor import TaskExecutor
from vllm_provision.runner.handlers import HandlerQueue, persist
from vllm_provision.runner.outcome import NullReporter, RunOptions, RunOutcome, RunState
from vllm_provision.runner.playbook import Play, load_playbook
from vllm_provision.runner.prefetch import PrefetchingConnection
from vllm_provision.runner.variables import VariableResolver
from vllm_provision.settings.masking import Masker

PLAYBOOK = """
- hosts: all
  tasks:
    - {name: Write the config, command: "true", notify: Restart the app}
    - {name: Write the unit, command: "true", notify: Restart the app}
  handlers:
    - name: Restart the app
      command: "echo restarted >> {{ root }}/restarts"
"""


class Parts:
    """A run's state, executor and handler queue over fake hosts, with a live pool."""

    def __init__(self, inventory: Inventory, pending: Path, pool: ThreadPoolExecutor) -> None:
        options = RunOptions(pending_dir=str(pending))
        self.fakes = {name: FakeHost(host) for name, host in inventory.hosts.items()}
        self.state = RunState(inventory, options, NullReporter(),
                              Masker.from_inventory(inventory), RunOutcome(), pool=pool)
        self.state.connections.update(
            {name: PrefetchingConnection(fake) for name, fake in self.fakes.items()})
        executor = TaskExecutor(self.state, VariableResolver(inventory), FakeHost)
        self.queue = HandlerQueue(self.state, executor.run_handler)
        self.hosts = list(inventory.hosts.values())


@pytest.fixture()
def play(tmp_path: Path) -> Play:
    path = tmp_path / "play.yml"
    path.write_text(PLAYBOOK)
    return load_playbook(path)[0]


@pytest.fixture()
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as threads:
        yield threads


def changed(host: str, task: str, **data: object) -> TaskResult:
    return TaskResult(host, task, Status.CHANGED, data=dict(data) or None)


def test_handler_notified_by_two_tasks_runs_once_and_only_where_something_changed(
        tmp_path: Path, play: Play, pool: ThreadPoolExecutor) -> None:
    parts = Parts(make_inventory(tmp_path), tmp_path / "pending", pool)
    parts.queue.start_batch(play, parts.hosts)
    first, second = play.tasks
    parts.queue.notify(first, changed("h1", first.name))
    parts.queue.notify(second, changed("h1", second.name))
    parts.queue.notify(first, TaskResult("h2", first.name, Status.OK))
    parts.queue.notify(second, changed("h2", second.name, **{UNAFFECTED_KEY: True}))
    parts.queue.flush(play, parts.hosts)
    assert (tmp_path / "h1" / "restarts").read_text() == "restarted\n"
    assert not (tmp_path / "h2" / "restarts").exists()
    assert [(r.handler, r.scope, r.result.host, r.result.status)
            for r in parts.state.outcome.handler_results] == [
        ("Restart the app", "host", "h1", Status.CHANGED)]


def test_persisted_notification_is_read_back_run_once_then_cleared(
        tmp_path: Path, play: Play, pool: ThreadPoolExecutor) -> None:
    inventory = make_inventory(tmp_path, ("h1",))
    pending = tmp_path / "pending"
    earlier = Parts(inventory, pending, pool)
    persist(play.tasks[0], earlier.state.connections["h1"], str(pending))  # a run cut short

    later = Parts(inventory, pending, pool)
    later.queue.start_batch(play, later.hosts)
    later.queue.flush(play, later.hosts)
    [result] = later.state.outcome.handler_results
    assert result.result.status is Status.CHANGED
    assert result.result.message.startswith("notified by an earlier run (Write the config)")
    assert (tmp_path / "h1" / "restarts").read_text() == "restarted\n"

    again = Parts(inventory, pending, pool)
    again.queue.start_batch(play, again.hosts)
    assert again.queue.notified == {}  # the handler ran: its record was cleared


INVENTORY = replicas_yaml("""\
        llama:
          vars: {vllm_backend: mp, vllm_model: /srv/models/tiny, greeting: group, port: 1}
          hosts:
            h1: {ansible_host: 10.0.0.11, vllm_node_rank: 0, greeting: host, shadow: host}
            h2: {ansible_host: 10.0.0.12, vllm_node_rank: 1}
""")


def test_resolver_chain_group_host_play_registered_extra(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    inventory = load_inventory(path, extra_vars={"port": 9})
    playbook = tmp_path / "play.yml"
    playbook.write_text("""
- hosts: all
  vars: {from_play: play, shadow: play}
  tasks:
    - {name: Look, command: "true", register: seen, run_once: true}
""")
    [play] = load_playbook(playbook)
    resolver = VariableResolver(inventory, check_mode=True)
    h1, h2 = inventory.hosts["h1"], inventory.hosts["h2"]

    def look(host_name: str, expression: str) -> object:
        return resolver.templar_for(play, inventory.hosts[host_name]).evaluate(expression)

    assert look("h1", "greeting") == "host"  # host vars over group vars
    assert look("h2", "greeting") == "group"
    assert look("h1", "port") == 9  # -e over the inventory
    assert look("h2", "from_play") == "play"
    assert look("h1", "shadow") == "play"  # play vars over the inventory
    assert look("h1", "inventory_hostname") == "h1"
    assert look("h2", "node.rank") == 1
    assert look("h1", "check_mode") is True
    assert look("h1", "seen is defined") is False

    task = play.tasks[0]
    resolver.register(task, "h1", ModuleResult(Status.CHANGED, "looked", data={"n": 3}))
    assert look("h1", "seen.changed and seen.n == 3") is True  # the next templar sees it
    assert look("h2", "seen is defined") is False
    resolver.share(task, "h1", [h2])  # run_once: every host sees the value
    assert look("h2", "seen.msg") == "looked"
    assert resolver.templar_for(play, h1).evaluate("groups['llama']") == ["h1", "h2"]
