"""A wait whose first read a batch may carry (docs/engine.md, "Reads of other hosts"):
``wait_for`` from the host takes its first answer from the batch when it holds one, and
otherwise waits live exactly as before. Its batched read is one bounded probe, never the loop:
a batch runs before the plays that start what is waited for, so a read there must not wait.
(``ray_wait_cluster`` is not batched for that reason: its snapshot connects to Ray's GCS,
which before the head starts waits for a connection timeout.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vllm_provision.core.results import Status
from vllm_provision.modules import wait_for
from vllm_provision.transport.base import CommandResult


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
        return CommandResult(0, "", "")


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
