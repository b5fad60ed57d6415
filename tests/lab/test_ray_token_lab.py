"""Ray token authentication on the lab's Ray replica (Ray 2.60.0; docs/security.md, "Ray token
authentication").

The broker's Ray replica serves with ``vllm_ray_auth: token`` (the default): every node holds
the controller's token in ``/var/lib/vllm/ray_auth_token`` (0600, the service user's), the env
files name it and never hold it, and a completion is answered. A Ray client without the token
(``ray status`` as root, with or without ``RAY_AUTH_MODE=token``) is refused with Ray's
authentication error; with the replica's environment it answers. Then ``restart
--rotate-ray-token`` gives the replica a new token, installs it on both nodes and restarts in
order: the replica serves again and the old token is refused.

One restart of the replica (no deploy of its own), through the broker's exclusive lease; it is
left serving.

Cost: about 67 s on one lab instance alone (63 s and 67 s in two runs), the broker's cold `up`
of the Ray replica from purged included, stand-in tier; docs/testing.md, "Per module".
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from lab_support import ReplicaBroker, complete

pytestmark = pytest.mark.lab

TOKEN_FILE = "/var/lib/vllm/ray_auth_token"
RAY = "/opt/vllm/bin/ray"


def controller_token(replica: Any) -> str:
    """The controller's token of the lab's Ray replica (in the replica's private state)."""
    from vllm_provision.inventory import load_inventory
    from vllm_provision.state import ray_token

    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(replica.state_home)
    try:
        inventory = load_inventory(Path(replica.inventory))
        [name] = [r.name for r in ray_token.token_replicas(inventory)]
        token = ray_token.read_token(inventory.path, name)
    finally:
        if old is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = old
    assert token is not None
    return token


def ray_status(lab: Any, env: str) -> Any:
    """``ray status`` on h1 against the replica's GCS, as root, with ``env`` (``env(1)``
    words) and a bound: a refused client must fail, not wait."""
    address = f"{lab.config.address('h1')}:6379"
    return lab.ssh("h1", f"timeout 60 env -u RAY_AUTH_TOKEN -u RAY_AUTH_TOKEN_PATH "
                         f"-u RAY_AUTH_MODE HOME=/root {env} {RAY} status --address={address}",
                   timeout_s=90)


def test_the_ray_replica_serves_with_token_auth_and_refuses_a_client_without_it(
        replicas: ReplicaBroker, lab: Any, lab_host: Any) -> None:
    with replicas.exclusive("ray", start="serving") as lease:
        replica = lease.replica
        token = controller_token(replica)
        for name in ("h1", "h2"):
            host = lab_host(name)
            held = host.file(TOKEN_FILE)
            assert (held.mode, held.user) == (0o600, "vllm"), name
            assert held.content_string == token, name
            env = host.file("/etc/vllm-provision/ray.env").content_string
            assert 'RAY_AUTH_MODE="token"' in env and f'"{TOKEN_FILE}"' in env, name
            assert token not in env, name
        assert token not in lab_host("h1").file("/etc/vllm-provision/vllm.env").content_string
        assert complete(replica.base_url, replica.model)

        for env in ("", "RAY_AUTH_MODE=token"):
            refused = ray_status(lab, env)
            assert refused.returncode != 0, (env, refused.stdout)
            assert re.search(r"[Aa]uthentication|UNAUTHENTICATED", refused.stdout
                             + refused.stderr), (env, refused.stdout[-2000:],
                                                 refused.stderr[-2000:])
        allowed = ray_status(lab, f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={TOKEN_FILE}")
        assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-2000:]

        run = replica.provision("restart", "-i", replica.inventory, "--rotate-ray-token",
                                "--json", timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        summary = json.loads(run.stdout)
        assert summary["ray_token_rotated"] and summary["completion"].strip()
        assert token not in run.stdout + run.stderr
        new = controller_token(replica)
        assert new != token
        for name in ("h1", "h2"):
            assert lab_host(name).file(TOKEN_FILE).content_string == new, name
        stale = lab.ssh("h1", f"printf %s {token} > /root/old_token && chmod 600 "
                              "/root/old_token", timeout_s=30)
        assert stale.returncode == 0
        old = ray_status(lab, "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/root/old_token")
        lab.ssh("h1", "rm -f /root/old_token", timeout_s=30)
        assert old.returncode != 0, old.stdout[-2000:]
        assert complete(replica.base_url, replica.model)
        lease.leave("serving")
