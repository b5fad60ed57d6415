"""Waits whose first read a batch may carry (docs/engine.md, "Reads of other hosts"):
``wait_for`` from the host and ``ray_wait_cluster`` on the head take their first answer from
the batch when it holds one, and otherwise wait live exactly as before; their later reads
are always live."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from inventory_support import load_llama

from vllm_provision.core.results import Status
from vllm_provision.modules import ray_wait_cluster, wait_for
from vllm_provision.transport.base import CommandResult

SNAPSHOT = "RAY-SNAPSHOT " + json.dumps({
    "nodes": [{"ip": "10.0.0.11", "alive": True, "resources": {"GPU": 4.0}},
              {"ip": "10.0.0.12", "alive": True, "resources": {"GPU": 4.0}}],
    "total": {"GPU": 8.0}, "available": {"GPU": 8.0}, "placement_groups": []}) + "\n"


class Batched:
    """A connection whose batch holds ``held`` (command -> answer); records what it sends."""

    def __init__(self, held: dict[str, CommandResult]) -> None:
        self.held, self.sent = held, []

    def holds(self, commands: list[str]) -> bool:
        return all(c in self.held for c in commands)

    def run(self, command: str, *, stdin: str | None = None, **_: Any) -> CommandResult:
        if stdin is None and command in self.held:
            return self.held[command]
        self.sent.append((command, stdin))
        return CommandResult(0, SNAPSHOT, "")


def _wait_ctx(conn: Any) -> Any:
    return SimpleNamespace(conn=conn, check_mode=False, host=SimpleNamespace(address="10.0.0.11"))


def test_wait_for_takes_an_open_port_from_the_batch_and_waits_live_otherwise() -> None:
    args = {"port": 6379, "host": "10.0.0.11", "timeout": 120}
    probe = wait_for.read_command(_wait_ctx(None), args)
    assert probe is not None and "10.0.0.11" in probe and "/dev/tcp" in probe
    assert "while" not in probe  # one probe, never the loop: a batch must not wait
    held = Batched({probe: CommandResult(0, "", "")})
    assert wait_for.run(_wait_ctx(held), args).status is Status.OK and held.sent == []
    closed = Batched({probe: CommandResult(1, "", "")})
    wait_for.run(_wait_ctx(closed), args)
    assert len(closed.sent) == 1 and "while :" in closed.sent[0][0]  # the live wait
    assert wait_for.read_command(_wait_ctx(None), {**args, "from": "controller"}) is None
    assert wait_for.read_command(_wait_ctx(None), {**args, "delay": 2}) is None
    assert wait_for.read_command(_wait_ctx(None), {"port": "x"}) is None


def test_the_inline_snapshot_is_the_same_script_as_one_word(tmp_path: Path) -> None:
    inventory = load_llama(tmp_path, "ray")
    [replica] = inventory.replicas
    vars_ = dict(replica.master.host.vars)
    plain = shlex.split(ray_wait_cluster.snapshot_command(replica, vars_))
    inline = shlex.split(ray_wait_cluster.inline_snapshot_command(replica, vars_))
    at = plain.index("-")
    assert inline[:at] == plain[:at] and inline[at] == "-c" and inline[at + 2:] == plain[at + 1:]
    code = inline[at + 1]
    encoded = code.split("'")[1]
    assert base64.b64decode(encoded).decode() == ray_wait_cluster.SNAPSHOT_SCRIPT
    assert all(ch.isprintable() for word in inline for ch in word)


def test_the_cluster_wait_reads_its_first_snapshot_from_the_batch_and_then_live(
        tmp_path: Path) -> None:
    inventory = load_llama(tmp_path, "ray")
    [replica] = inventory.replicas
    vars_ = dict(replica.master.host.vars)
    inline = ray_wait_cluster.inline_snapshot_command(replica, vars_)
    head = Batched({inline: CommandResult(0, SNAPSHOT, "")})
    ctx = SimpleNamespace(replica=replica, connections={"h1": head}, conn=head, vars=vars_,
                          check_mode=False, host=replica.master.host)
    assert ray_wait_cluster.read_command(ctx, {}) == inline
    snapshot, _ = ray_wait_cluster.read_snapshot(ctx, replica, first=True)
    assert snapshot is not None and snapshot.alive_ips == ["10.0.0.11", "10.0.0.12"]
    assert head.sent == []
    ray_wait_cluster.read_snapshot(ctx, replica)  # a later poll: live, the script on stdin
    assert len(head.sent) == 1 and head.sent[0][1] == ray_wait_cluster.SNAPSHOT_SCRIPT
    worker = SimpleNamespace(**{**vars(ctx), "host": replica.nodes[1].host})
    assert ray_wait_cluster.read_command(worker, {}) is None
    unbatched = Batched({})
    ctx.connections = {"h1": unbatched}
    ray_wait_cluster.read_snapshot(ctx, replica, first=True)
    assert len(unbatched.sent) == 1 and unbatched.sent[0][1] is not None
