"""Running commands on the main machine for the lab, with failures turned into LabError."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from vllm_provision_lab.errors import LabError


def require_root(action: str) -> None:
    """Stop with a clear message unless this process runs as root.

    Args:
        action: what the user asked for, for the message (``"lab up"``).

    Raises:
        LabError: not root (the lab makes mounts, network namespaces, bridges and cgroups).
    """
    if os.geteuid() != 0:
        raise LabError.single(
            action, "the lab needs root: it mounts overlays and creates network namespaces, "
            "a bridge and cgroups", expected="uid 0", actual=f"uid {os.geteuid()}",
            fix=f"run it as root, e.g. `sudo provision {action}`")


def run(argv: Sequence[str], *, check: bool = True, timeout_s: float = 120,
        input_text: str | None = None, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (no shell), capture its output as text.

    Args:
        argv: the command and its arguments.
        check: raise when the exit status is not 0.
        timeout_s: wall-clock limit in seconds.
        input_text: text for stdin.
        env: the full environment (None = inherit).

    Raises:
        LabError: the command is missing, timed out, or (with ``check``) failed; the message
            carries the command and the last lines of its stderr.
    """
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              input=input_text, env=env, check=False)
    except FileNotFoundError as exc:
        raise LabError.single(argv[0], "command not found", fix="run `provision lab up "
                              "--install-deps` to install the lab's packages") from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError.single(" ".join(argv), f"did not finish within {timeout_s:.0f} s") from exc
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise LabError.single(" ".join(argv), f"failed with exit status {proc.returncode}",
                              actual=tail)
    return proc
