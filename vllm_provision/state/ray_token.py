"""The controller's Ray authentication tokens: one per Ray replica of an inventory.

Kept beside the state record of the inventory (``vllm_provision.state.controller_state_path``):
``$XDG_STATE_HOME/vllm-provision/<inventory stem>-<12 hex>.ray-tokens/<replica>.token``, the
folder 0700 and each file 0600, written atomically (temp file, fsync, rename). A token is
``secrets.token_hex(32)`` (256 bits, 64 hex digits): Ray accepts any non-empty string (Ray's docs,
"Ray token authentication", https://docs.ray.io/en/latest/ray-security/token-auth.html).

``provision up`` and ``restart`` make the token of each Ray replica with ``vllm_ray_auth: token``
when there is none (:func:`ensure_tokens`; a token rank 0 already holds is adopted first, so a
second controller with the same inventory installs the same token and restarts nothing), the
ray role installs it on every node of the replica (``roles/ray/tasks/main.yml``; ``restart``:
role ray_token), ``restart --rotate-ray-token`` replaces it (:func:`rotate`). Dry runs
(``--check``, ``drift``) only read it (:func:`read_token`). The run's masker is given every
token (``runner.engine``), so no value of it is ever printed (docs/security.md).
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.files import replace_atomically
from vllm_provision.core.models import Inventory, Replica
from vllm_provision.settings import master_settings, replica_settings
from vllm_provision.settings.ray_auth import TOKEN_RE, auth_on, token_file


def tokens_dir(inventory_path: Path) -> Path:
    """The folder of the inventory's tokens: its state record's path with ``.ray-tokens`` in
    place of ``.json`` (``<stem>-<12 hex>.ray-tokens``)."""
    from vllm_provision.state import controller_state_path

    return controller_state_path(inventory_path).with_suffix(".ray-tokens")


def token_path(inventory_path: Path, replica_name: str) -> Path:
    """The token file of replica ``replica_name`` (a group name, checked at load: no ``/``)."""
    return tokens_dir(inventory_path) / f"{replica_name}.token"


def read_token(inventory_path: Path, replica_name: str) -> str | None:
    """The stored token of the replica, or None when there is none.

    Raises:
        ProvisionError: the file cannot be read, or holds something that is not a token this
            tool made (64 lower-case hex digits), naming the file and what to do.
    """
    path = token_path(inventory_path, replica_name)
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError.single(str(path), f"cannot read the Ray token: {exc}",
                                    fix="remove the file and run `provision restart "
                                        "--rotate-ray-token`") from None
    if not TOKEN_RE.fullmatch(text):
        raise ProvisionError.single(str(path), "not a Ray token of this tool",
                                    expected="64 lower-case hex digits",
                                    fix="remove the file and run `provision restart "
                                        "--rotate-ray-token`")
    return text


def write_token(inventory_path: Path, replica_name: str, token: str) -> Path:
    """Store ``token`` for the replica (folder 0700, file 0600, atomic); return the path.

    Raises:
        ProvisionError: the folder or file cannot be written, or ``token`` is not 64 hex digits.
    """
    if not TOKEN_RE.fullmatch(token):
        raise ProvisionError.single(replica_name, "a Ray token must be 64 lower-case hex digits")
    path = token_path(inventory_path, replica_name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        replace_atomically(path, token + "\n", mode=0o600)
    except OSError as exc:
        raise ProvisionError.single(str(path), f"cannot write the Ray token: {exc.strerror}",
                                    fix="make the folder writable or set XDG_STATE_HOME") \
            from None
    return path


def new_token() -> str:
    """A fresh token: ``secrets.token_hex(32)``."""
    return secrets.token_hex(32)


def token_replicas(inventory: Inventory) -> list[Replica]:
    """The replicas whose Ray takes a token: a backend with a Ray cluster and
    ``vllm_ray_auth: token`` (the replica's settings, defaults applied)."""
    return [r for r in inventory.replicas if r.backend_type.ray_cluster
            and auth_on(replica_settings(r, inventory.extra_vars))]


def read_tokens(inventory: Inventory) -> dict[str, str]:
    """Replica name -> stored token, for :func:`token_replicas` that have one (dry runs).

    Raises:
        ProvisionError: as :func:`read_token`.
    """
    found = {}
    for replica in token_replicas(inventory):
        token = read_token(inventory.path, replica.name)
        if token is not None:
            found[replica.name] = token
    return found


def node_token(replica: Replica, conn: Any, extra_vars: Mapping[str, Any] | None = None,
               ) -> str | None:
    """The token ``replica``'s rank 0 holds (the file role ray installed:
    ``settings.ray_auth.token_file`` of rank 0's settings), read as root over ``conn`` (its
    open connection) in one round trip; None when the file is absent, unreadable, not a token
    this tool made (64 lower-case hex digits), or the host cannot be reached (the caller then
    makes a new token, as on a first ``up``)."""
    path = token_file(master_settings(replica, extra_vars))
    try:
        result = conn.run(f"cat -- {shlex.quote(path)} 2>/dev/null || true", timeout_s=30)
    except ProvisionError:  # UnreachableError included
        return None
    text = str(result.stdout or "").strip()
    return text if TOKEN_RE.fullmatch(text) else None


def ensure_tokens(inventory: Inventory, replicas: list[str] | None = None, *,
                  connections: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Make the missing token of each :func:`token_replicas` (only those named in
    ``replicas`` when given); return replica name -> token for all of them.

    A replica with no token on this controller whose rank 0 is in ``connections`` (host name
    -> open connection, the run's) keeps the token rank 0 already holds (:func:`node_token`):
    a second controller (a bastion, a teammate's laptop) with the same inventory then installs
    the same file and the cluster does not restart. Only a replica with no token anywhere gets
    a new one (``secrets.token_hex(32)``).

    Raises:
        ProvisionError: as :func:`read_token` and :func:`write_token`.
    """
    found = {}
    for replica in token_replicas(inventory):
        if replicas is not None and replica.name not in replicas:
            continue
        token = read_token(inventory.path, replica.name)
        if token is None:
            conn = (connections or {}).get(replica.master.name)
            token = (node_token(replica, conn, inventory.extra_vars) if conn is not None
                     else None) or new_token()
            write_token(inventory.path, replica.name, token)
        found[replica.name] = token
    return found


def rotate(inventory: Inventory, replicas: list[str]) -> dict[str, str]:
    """Replace the token of each named replica of :func:`token_replicas` with a new one;
    return replica name -> new token. The old one stays valid on the nodes until the ray role
    installs the new file and the Ray cluster restarts (``restart`` does both, in order).

    Raises:
        ProvisionError: a named replica takes no token (not Ray, or ``vllm_ray_auth: none``),
            or as :func:`write_token`.
    """
    eligible = {r.name for r in token_replicas(inventory)}
    wrong = [name for name in replicas if name not in eligible]
    if wrong:
        raise ProvisionError.single(
            ", ".join(wrong), "--rotate-ray-token: no Ray token to rotate",
            expected="replicas with vllm_backend: ray and vllm_ray_auth: token",
            fix="limit the run (-l) to Ray replicas with token authentication")
    made = {}
    for name in replicas:
        made[name] = new_token()
        write_token(inventory.path, name, made[name])
    return made
