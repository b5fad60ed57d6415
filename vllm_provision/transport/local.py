"""The local connection: commands on the controller itself, through ``/bin/sh``.

For ``delegate_to: localhost`` tasks and the unit tests; it has the
:class:`~vllm_provision.transport.base.Connection` contract of the SSH connection.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import IO

from vllm_provision.transport.base import (
    CommandResult,
    UnreachableError,
    command_failed,
    sudo_wrap,
)


class LocalConnection:
    """Runs commands on the controller (``delegate_to: localhost``, unit tests), via ``/bin/sh``."""

    def __init__(self, name: str = "localhost", *, become: bool = False,
                 command_timeout_s: float = 30.0) -> None:
        """Create a local connection named ``name``; ``become`` wraps commands in ``sudo -n``."""
        self.name = name
        self.become = become
        self.command_timeout_s = command_timeout_s
        self.calls: list[str] = []

    def run(self, command: str, *, sudo: bool | None = None,
            stdin: str | bytes | IO[bytes] | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        """Same contract as :meth:`~vllm_provision.transport.connection.HostConnection.run`,
        executed locally."""
        self.calls.append(command)
        use_sudo = self.become if sudo is None else sudo
        line = sudo_wrap(command) if use_sudo and os.geteuid() != 0 else command
        data = stdin.encode() if isinstance(stdin, str) else stdin
        if data is not None and not isinstance(data, bytes):
            data = data.read()
        started = time.monotonic()
        try:
            proc = subprocess.run(["/bin/sh", "-c", line], input=data, capture_output=True,
                                  timeout=timeout_s or self.command_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise UnreachableError.single(self.name, "local command timed out") from None
        result = CommandResult(proc.returncode, proc.stdout.decode(errors="replace"),
                               proc.stderr.decode(errors="replace"), time.monotonic() - started)
        if check and not result.ok:
            raise command_failed(self.name, command, result)
        return result


__all__ = ["LocalConnection"]
