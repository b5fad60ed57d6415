"""Helpers shared by lab test modules (not a test module itself)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


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
