"""Helpers shared by lab test modules (not a test module itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

PROVISION = str(Path(sys.executable).parent / "provision")


def provision(*args: str, state_home: Path, timeout: float = 600, approve: bool = True,
              stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``provision ARGS`` with the lab's environment and its own controller state folder
    (``XDG_STATE_HOME``); never raises on a non-zero exit.

    ``approve=False`` removes ``VLLM_PROVISION_YES`` (which the test session sets), so a run
    that needs approval asks (``stdin``: a terminal's file descriptor) or is refused."""
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    if not approve:
        env.pop("VLLM_PROVISION_YES", None)
    return subprocess.run([PROVISION, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, check=False, stdin=stdin)


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
