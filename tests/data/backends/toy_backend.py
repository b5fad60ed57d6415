"""A toy third backend, built outside the package to prove the extension point
(docs/architecture.md, "Adding a backend"): one class here and one role, ``toy_stub/``, beside
it. Every node runs one unit, a stub HTTP server (``python3 -m http.server``); nothing else in
vllm_provision knows about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_provision.backends import Backend, unit_var
from vllm_provision.core.models import Node, Replica

# The stub's port (roles toy_stub/defaults/main.yml says the same).
PORT = 18080


class ToyBackend(Backend):
    """One stub server per node, no rendezvous, no OpenAI API, no dependency between nodes."""

    name = "toy"
    role = "toy_stub"
    roles_dir = Path(__file__).resolve().parent
    serves_openai = False

    def node_units(self, replica: Replica, node: Node, vars_: Mapping[str, Any]) -> list[str]:
        """Every node runs ``toy_unit_name``."""
        return [unit_var(vars_, "toy_unit_name", "toy-stub.service")]

    def listen_ports(self, replica: Replica, rank: int) -> list[tuple[int, str]]:
        """Every node's stub listens on :data:`PORT`."""
        return [(PORT, "stub port")]

    def rendered_flags(self, replica: Replica) -> list[str]:
        """No engine runs, so no flags."""
        return ["(toy stub)"]
