"""Test doubles for the engine (no tests here): hosts whose commands run locally in a temp dir,
a stand-in systemctl, and the file and error helpers several test modules share."""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import EngineArgs, Group, Host, Inventory, Node, Replica
from vllm_provision.transport.base import CommandResult, UnreachableError
from vllm_provision.transport.local import LocalConnection


class FakeHost:
    """A connection whose commands run locally (``/bin/sh``); counts round trips.

    ``fail_after`` makes the N-th and later commands raise UnreachableError (a cut network).
    """

    def __init__(self, host: Host, *, unreachable: bool = False,
                 fail_after: int | None = None) -> None:
        self.name = host.name
        self.host = host
        self.unreachable = unreachable
        self.fail_after = fail_after
        self.local = LocalConnection(host.name)
        self.commands: list[str] = []
        self.opened = False

    def open(self) -> None:
        if self.unreachable:
            raise UnreachableError.single(self.name, "connection refused (fake)")
        self.opened = True

    def close(self) -> None:
        self.opened = False

    def run(self, command: str, *, sudo: bool | None = None, stdin: str | bytes | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        if self.fail_after is not None and len(self.commands) >= self.fail_after:
            raise UnreachableError.single(self.name, "operation timed out (fake cut)")
        self.commands.append(command)
        return self.local.run(command, stdin=stdin, timeout_s=timeout_s, check=check)


class LocalChannel:
    """The subset of a paramiko channel the run lock uses (vllm_provision/transport/runlock.py:
    ``recv_ready``, ``recv``, ``sendall``, ``shutdown_write``, ``close``, ``status_event``),
    over the pipes of a local ``bash -c <command>`` (the holder script the lock starts).

    ``drop()`` is a controller that died (the holder's stdin ends without ``release``);
    ``end()`` a holder process that ended (killed: it gave up, or the host rebooted).
    """

    def __init__(self, command: str) -> None:
        self.process = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)
        self.status_event = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        self.process.wait()
        self.status_event.set()

    def settimeout(self, timeout: float) -> None:
        pass

    def recv_ready(self) -> bool:
        assert self.process.stdout is not None
        return bool(select.select([self.process.stdout], [], [], 0)[0])

    def recv(self, size: int) -> bytes:
        assert self.process.stdout is not None
        return os.read(self.process.stdout.fileno(), size)

    def sendall(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def shutdown_write(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()

    def close(self) -> None:
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:  # the holder is gone (a paramiko channel closes quietly)
                pass
        self.process.wait(10)

    def drop(self) -> None:
        """The connection dies: the holder's stdin ends without ``release``."""
        self.close()

    def end(self) -> None:
        """The holder process ends without ``release`` (it gave up, or the host rebooted)."""
        self.process.kill()
        assert self.status_event.wait(10)


class RecordHost:
    """A connection that answers the ownership record read (``cat <record>``: ``record`` as
    JSON) and the unit probe (``@@unit vllm.service <active> inv-1``: the unit's ActiveState and
    its invocation id, as vllm_provision/operations/takeover.py reads them), and records every
    command it is given in ``commands``."""

    def __init__(self, record: dict[str, Any], active: str = "active") -> None:
        self.record = record
        self.active = active
        self.commands: list[str] = []

    def run(self, command: str, **_: Any) -> CommandResult:
        self.commands.append(command)
        if command.startswith("cat "):
            return CommandResult(0, json.dumps(self.record), "")
        if "@@unit" in command:
            return CommandResult(0, f"@@unit vllm.service {self.active} inv-1\n", "")
        return CommandResult(0, "", "")


def make_inventory(tmp_path: Path, names: tuple[str, ...] = ("h1", "h2"), *,
                   host_vars: dict[str, dict[str, Any]] | None = None,
                   group_vars: dict[str, Any] | None = None,
                   extra_vars: dict[str, Any] | None = None) -> Inventory:
    """An inventory with one mp replica ``llama`` whose nodes are ``names`` (rank = position).

    Every host's vars get ``root: <tmp_path>/<host>`` so "remote" files stay in the temp folder.
    """
    host_vars = host_vars or {}
    hosts: dict[str, Host] = {}
    for rank, name in enumerate(names):
        (tmp_path / name).mkdir(exist_ok=True)
        merged = {**(group_vars or {}), "vllm_node_rank": rank, "root": str(tmp_path / name),
                  **host_vars.get(name, {}), **(extra_vars or {})}
        hosts[name] = Host(name=name, address=f"10.0.0.{11 + rank}",
                           groups=("all", "vllm_replicas", "llama"), vars=merged)
    nodes = tuple(Node(hosts[n], rank, hosts[n].address) for rank, n in enumerate(names))
    replica = Replica("llama", "mp", nodes, EngineArgs(model="/srv/models/tiny"))
    groups = {
        "all": Group("all", children=("vllm_replicas",)),
        "vllm_replicas": Group("vllm_replicas", children=("llama",)),
        "llama": Group("llama", hosts=names, vars=group_vars or {}),
        "vllm_master": Group("vllm_master", hosts=names[:1]),
        "vllm_followers": Group("vllm_followers", hosts=names[1:]),
    }
    return Inventory(tmp_path / "inventory.yml", hosts, groups, (replica,), extra_vars or {})


# stands in for systemctl: `show` reports a running, enabled unit whose ActiveState is
# $FAKE_ACTIVE (active when unset); anything else is appended to $FAKE_SYSTEMCTL_LOG
FAKE_SYSTEMCTL = """#!/bin/sh
if [ "$1" = show ]; then
  printf 'LoadState=loaded\\nActiveState=%s\\nSubState=running\\n' "${FAKE_ACTIVE:-active}"
  printf 'UnitFileState=enabled\\nNeedDaemonReload=no\\nExecMainStartTimestamp=\\n'
  exit 0
fi
echo "$*" >> "$FAKE_SYSTEMCTL_LOG"
"""


def install_fake_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put :data:`FAKE_SYSTEMCTL` first on ``PATH`` (as ``<tmp_path>/bin/systemctl``), logging
    the commands it is given to ``<tmp_path>/systemctl.log`` (absent until the first)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMCTL_LOG", str(tmp_path / "systemctl.log"))


def write_file(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, creating its folders; return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def rendered_error(error: type[ProvisionError], call: Callable[..., object], *args: Any) -> str:
    """The rendered text of the ``error`` that ``call(*args)`` raises (fails if it raises none)."""
    with pytest.raises(error) as caught:
        call(*args)
    return caught.value.render()
