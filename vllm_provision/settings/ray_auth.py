"""Ray token authentication: which environment every Ray process of a replica gets.

Ray >= 2.52 authenticates every RPC and HTTP entry point (GCS, raylets, dashboard, job API) with
one shared token when ``RAY_AUTH_MODE=token`` is in the environment of every Ray process (the
mode is read from the environment only, never from ``_system_config``); the token comes from
``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names (an unreadable or empty file is
fatal, no fall back), else ``~/.ray/auth_token`` (Ray's docs, "Ray token authentication",
https://docs.ray.io/en/latest/ray-security/token-auth.html; ray
python/ray/_private/authentication/authentication_token_setup.py). Ray below 2.52 knows none of
these names and ignores them.

This product never puts the token in an environment file, a unit file or a command line: the
environment names a file (:func:`token_file`), which the ray role installs mode 0600 owned by
the service user the Ray units run as (they read it themselves; ``root`` reads it for the Ray
drivers we start as that user). One rule here, used by the Ray env file, vLLM's env file on the
head (its ``ray.init`` is a Ray driver), the watchdog's GCS reader, the cluster wait's snapshot
and the placement reader (docs/security.md, "Ray token authentication").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# The values of vllm_ray_auth (settings/variables.py).
MODES = ("token", "none")
# The first Ray release with token authentication (Ray's docs, "Ray token authentication").
MIN_RAY = (2, 52)
# The hole of Ray below 2.52 that token authentication closes (the job API runs code for anyone
# who reaches the dashboard's port).
CVE = "CVE-2025-62593"
# The token file's name in vllm_state_dir (the service user's home: a folder it owns, 0750).
TOKEN_FILE_NAME = "ray_auth_token"
# secrets.token_hex(32): 64 lower-case hex digits (256 bits).
TOKEN_RE = re.compile(r"[0-9a-f]{64}")


def auth_on(values: Mapping[str, Any]) -> bool:
    """True when ``values`` (resolved settings, ``settings.layered``) ask for token
    authentication (``vllm_ray_auth: token``, the default; an absent value is the default)."""
    return str(values.get("vllm_ray_auth", "token")) == "token"


def token_file(values: Mapping[str, Any]) -> str:
    """The token file's path on a node: ``<vllm_state_dir>/ray_auth_token``.

    Args:
        values: resolved settings holding ``vllm_state_dir`` (an absolute folder, checked by
            kind at load: ``owned_dir``).

    Raises:
        KeyError: ``vllm_state_dir`` is not in ``values`` (not resolved).
    """
    return f"{str(values['vllm_state_dir']).rstrip('/')}/{TOKEN_FILE_NAME}"


def auth_env(values: Mapping[str, Any]) -> dict[str, str]:
    """The environment every Ray process of the replica gets: ``RAY_AUTH_MODE=token`` and
    ``RAY_AUTH_TOKEN_PATH`` (:func:`token_file`) with ``vllm_ray_auth: token``, else
    ``RAY_AUTH_MODE=disabled`` (Ray respects an explicit mode: no token file found in the service
    user's home turns it on behind the operator's back, authentication_token_setup.py).

    Raises:
        KeyError: as :func:`token_file`.
    """
    if auth_on(values):
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_file(values)}
    return {"RAY_AUTH_MODE": "disabled"}


def env_words(values: Mapping[str, Any]) -> list[str]:
    """:func:`auth_env` as ``NAME=value`` words for ``env(1)`` (each one argv word; the caller
    quotes them with ``core.quoting.shell_join``)."""
    return [f"{name}={value}" for name, value in auth_env(values).items()]


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"2.51.2"`` -> ``(2, 51, 2)``; None for an unknown or unparsable version (a host's
    text: leading digits of each dotted part only)."""
    if not text:
        return None
    parts: list[int] = []
    for piece in str(text).strip().split(".")[:3]:
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts) if len(parts) >= 2 else None


def supports_token(version: str | None) -> bool | None:
    """True when Ray ``version`` has token authentication (>= 2.52), False below, None when
    the version is unknown."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    return parsed[:2] >= MIN_RAY
