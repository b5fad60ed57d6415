"""Helpers shared by lab test modules (not a test module itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

PROVISION = str(Path(sys.executable).parent / "provision")


def provision(*args: str, state_home: Path | None = None, timeout: float | None = 600,
              approve: bool = True, stdin: int | None = None, cache_home: Path | None = None,
              env: Mapping[str, str | None] | None = None, cwd: Path | str | None = None,
              executable: str | Sequence[str] = PROVISION) -> subprocess.CompletedProcess[str]:
    """Run ``provision ARGS`` as an operator would, with the lab's environment; the one way lab
    tests run the CLI. Never raises on a non-zero exit (``subprocess.TimeoutExpired`` after
    ``timeout`` seconds, None: no limit); returns the finished process with text ``stdout``
    and ``stderr``.

    ``state_home``: the controller's state folder (``XDG_STATE_HOME``, where ``up`` keeps its
    records); without it each call gets its own empty temporary one, removed after the call.
    ``approve=False`` removes ``VLLM_PROVISION_YES`` (which the test session sets), so a run
    that needs approval asks (``stdin``: a terminal's file descriptor) or is refused.
    ``cache_home`` gives it its own ``XDG_CACHE_HOME`` (the stack sync's wheelhouse). ``env``:
    variables added to (or replacing) the session's environment; a None value removes one.
    ``cwd``: its working folder.
    ``executable``: what to run instead of this checkout's ``provision`` console script, as a
    path or an argv prefix (an installed wheel's ``provision``; ``[python, "-m", ...]``)."""
    if state_home is None and env is not None and env.get("XDG_STATE_HOME"):
        state_home = Path(str(env["XDG_STATE_HOME"]))
    if state_home is None:
        with tempfile.TemporaryDirectory(prefix="vp-state-") as temporary:
            return provision(*args, state_home=Path(temporary), timeout=timeout,
                             approve=approve, stdin=stdin, cache_home=cache_home, env=env,
                             cwd=cwd, executable=executable)
    merged = {**os.environ, **(env or {}), "XDG_STATE_HOME": str(state_home)}
    environ = {name: value for name, value in merged.items() if value is not None}
    if cache_home is not None:
        environ["XDG_CACHE_HOME"] = str(cache_home)
    if not approve:
        environ.pop("VLLM_PROVISION_YES", None)
    argv = [executable] if isinstance(executable, str) else list(executable)
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout,
                          env=environ, check=False, stdin=stdin, cwd=cwd)


def complete(base_url: str, model: str, timeout_s: float = 10) -> bool:
    """Send one real completion (4 tokens of "Hello") to ``base_url``; True when it answered
    200 with at least one choice, False on any HTTP, network or decoding failure."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return bool(response.status == 200 and json.loads(response.read())["choices"])
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False


def run_in_pty(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 600,
               columns: int = 160) -> tuple[int, bytes]:
    """Run ``argv`` with stdin, stdout and stderr on a new pseudo-terminal (``columns`` wide),
    as an operator's terminal; return the exit status and every byte it wrote (escape codes
    included). Killed (status -9) after ``timeout`` seconds."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            close_fds=True, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end closed it
                break
            if not data:
                break
            out += data
        else:
            proc.kill()
    finally:
        os.close(master)
    return proc.wait(), bytes(out)


ANSI_ESCAPE = r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]"


def screen_text(raw: bytes) -> str:
    """What a terminal capture says with its escape codes (colours, cursor moves) removed."""
    import re

    return re.sub(ANSI_ESCAPE, "", raw.decode("utf-8", "replace")).replace("\r", "")


def shown_phases(text: str) -> list[str]:
    """The vLLM phase labels (``vllm_provision.phases.PHASES``) that a captured ``up`` or
    ``restart`` showed on its progress rows, in the order they first appear: the live rows
    (``  h1  7 s vllm.service active (running) loading weights``) and the plain ones
    (``[replica lab: waiting until rank 0 serves] h1 7 s ...: loading weights``)."""
    import re

    from vllm_provision.phases import PHASES

    seen: list[str] = []
    for line in text.splitlines():
        if not (re.match(r"^\s+h\d+\s+\d+ s\b", line)
                or re.match(r"^\[replica \S+: waiting until rank 0 serves\] ", line)):
            continue
        for label in PHASES:
            if label in line and label not in seen:
                seen.append(label)
    return seen

