"""The backend type and its registry: everything that differs between the ways a replica runs (mp,
ray, ...), in one type.

A :class:`Backend` says which systemd units each node runs and in which order they start, the
ports a node listens on, the engine flags that differ per backend, the readiness signal, the
peer watchdog's rules, the backend's own preflight checks and its part of ``provision status``.
Everything else (inventory, runner, checks, templates, status, verify) asks the replica's backend
(:func:`of`) instead of comparing its name.

The built-in backends are :class:`~vllm_provision.backends.mp.MpBackend` and
:class:`~vllm_provision.backends.ray.RayBackend`, each registered where it is defined with
:func:`builtin` (docs/architecture.md, "Extending"). Another one is one class and one role
(docs/architecture.md, "Adding a backend"): register an instance with :func:`register`, or name
it in the ``vllm_provision.backends`` entry-point group of a distribution (Python packaging's
entry points specification); entry points are read once, on the first look-up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.registry import Registry, import_submodules

if TYPE_CHECKING:
    from vllm_provision.checks.finding import Finding
    from vllm_provision.core.errors import Problem
    from vllm_provision.core.models import Node, Replica
    from vllm_provision.facts.model import HostFacts

ENTRY_POINT_GROUP = "vllm_provision.backends"
# The built-in backends: classes that register themselves with @builtin(order=...) in their
# module of this package; the registry imports the package's modules (pkgutil) on the first
# look-up and instantiates them in their declared order, before the entry points' backends.
BUILTINS: Registry[type[Backend]] = Registry("backend")
# The playbook phases a backend contributes plays to (``backend_plays: <phase>``,
# runner/playbook.py): install its units, start them in order, stop them (restart), stop and
# disable them (down).
PHASES = ("install", "start", "stop", "down")
# The peer watchdog's unit (role vllm_watchdog, ``vllm_watchdog_unit_name``), on every node of
# every backend (docs/architecture.md, "Adding a backend": the install play includes the role).
WATCHDOG_UNIT = "vllm-watchdog.service"
# The kinds of :meth:`Backend.journal_units`.
UNIT_KINDS = ("vllm", "ray", "watchdog")


def unit_var(vars_: Mapping[str, Any], name: str, default: str) -> str:
    """A unit name from ``vars_`` (inventory or task variables), else ``default`` (the role
    default of the same variable)."""
    value = vars_.get(name)
    return str(value) if value is not None else default


class Backend:
    """One way of running a replica over its nodes (subclass it; one instance is registered).

    Class attributes:
        name: the ``vllm_backend`` value that selects it (``mp``); the synthetic inventory group
            of its nodes is ``vllm_<name>``.
        role: the role whose ``plays/<phase>.yml`` hold the backend's plays (:data:`PHASES`).
        roles_dir: the folder that holds ``role`` (and any other role its plays name) when it is
            not one of the package's roles (a backend outside this package); None otherwise.
        packages: Python packages the node's venv must hold (``provision check``, host.venv).
        ray_cluster: the nodes form a Ray cluster (Ray's pins, placement and cluster wait apply).
        serves_openai: rank 0 serves vLLM's OpenAI API, so ``up`` waits for it and sends one
            completion, and the peer watchdog probes it.
        title: the name in prose (``provision record``'s decision sentence); default ``name``.
        gpu_reservation: who reserves the replica's GPUs when the backend does it itself (Ray's
            placement group), for the decision record; None when the platform must
            (docs/evidence.md).
    """

    name: ClassVar[str] = ""
    role: ClassVar[str] = ""
    roles_dir: ClassVar[Path | None] = None
    packages: ClassVar[tuple[str, ...]] = ("vllm",)
    ray_cluster: ClassVar[bool] = False
    serves_openai: ClassVar[bool] = True
    title: ClassVar[str] = ""
    gpu_reservation: ClassVar[str | None] = None

    # --- units ------------------------------------------------------------------------------

    def node_units(self, replica: Replica, node: Node, vars_: Mapping[str, Any]) -> list[str]:
        """The units of ours on ``node``, in start order.

        Args:
            replica: the node's replica.
            node: one of its nodes.
            vars_: variables that may rename units (``vllm_unit_name``); absent names take the
                role defaults.
        """
        raise NotImplementedError

    def replica_units(self, replica: Replica, vars_: Mapping[str, Any]) -> dict[str, list[str]]:
        """Host name -> :meth:`node_units`, for every node in rank order."""
        return {node.name: self.node_units(replica, node, vars_) for node in replica.nodes}

    def journal_units(self, replica: Replica, node: Node,
                      vars_: Mapping[str, Any]) -> dict[str, list[str]]:
        """The units of ours on ``node`` by kind, for ``provision logs --unit KIND`` and the
        progress of waits: ``vllm`` (the units whose journal holds vLLM's own lines),
        ``ray`` (Ray's), ``watchdog`` (the peer watchdog, ``vllm_watchdog_unit_name``). A
        kind the backend does not run on the node is absent or empty.

        Default: every unit of :meth:`node_units` is ``vllm``, plus the watchdog."""
        return {"vllm": self.node_units(replica, node, vars_),
                "watchdog": [unit_var(vars_, "vllm_watchdog_unit_name", WATCHDOG_UNIT)]}

    def env_file_variable(self, node: Node) -> str:
        """The variable naming the 0600 environment file that holds ``VLLM_HOST_IP`` on
        ``node`` (the verify suite reads it)."""
        return "vllm_env_file"

    # --- ports and engine flags -------------------------------------------------------------

    def rendezvous(self, replica: Replica) -> tuple[int, str] | None:
        """The port every follower must reach on rank 0 and its name (``(29501, "master
        port")``), or None when the followers reach nothing there (no reachability check)."""
        return None

    def listen_ports(self, replica: Replica, rank: int) -> list[tuple[int, str]]:
        """``(port, label)`` of every port a node of ``rank`` listens on, which must be free
        before the first start (preflight). Default: rank 0 serves the API port and listens on
        :meth:`rendezvous`."""
        if rank != 0:
            return []
        meeting = self.rendezvous(replica)
        return [(replica.engine.api_port, "API port"), *([meeting] if meeting else [])]

    def other_ports(self, agreed: Mapping[str, Any],
                    host_value: Callable[[str], Any]) -> dict[str, Any]:
        """Variables holding ports a node listens on besides the API port, and their values,
        which must differ from ``vllm_api_port`` (checked at inventory load).

        Args:
            agreed: the replica-scope variables every node agrees on.
            host_value: a node's value of a variable (its setting or the default).
        """
        return {}

    def port_ranges(self, agreed: Mapping[str, Any],
                    host_value: Callable[[str], Any]) -> dict[tuple[str, str], tuple[Any, Any]]:
        """Port ranges a node listens in: ``{(low variable, high variable): (low, high)}``;
        no other port may fall inside one, and low <= high (checked at inventory load).
        Arguments as :meth:`other_ports`."""
        return {}

    def peer_ports(self, replica: Replica) -> list[tuple[str, int, int]]:
        """``(what, low, high)`` of every port or range a node of ``replica`` listens on for its
        peers only, besides the watchdog port (``vllm_firewall: nftables`` accepts them from
        the replica's nodes only; docs/security.md). Default: the :meth:`rendezvous` port."""
        meeting = self.rendezvous(replica)
        return [(meeting[1], meeting[0], meeting[0])] if meeting else []

    def extra_args_note(self) -> str:
        """A sentence added when ``vllm_extra_args`` holds an option we render (why it matters
        for this backend), or ``""``."""
        return ""

    def rendered_flags(self, replica: Replica) -> list[str]:
        """The engine flags that differ per backend, as the unit renders them (shown by the
        ``topology.backend`` check)."""
        return []

    def flag_finding(self, flag: str) -> tuple[str, str]:
        """``(expected, actual)`` words of the error for a rendered flag found in
        ``vllm_extra_args``."""
        return "not set by hand", f"{flag} is rendered from the inventory"

    def node_role(self, replica: Replica, node: Node) -> str:
        """The node's role word in ``provision inventory --list`` (``master``, ``ray-worker``);
        default ``rank N``."""
        return f"rank {node.rank}"

    def serve_argv(self, replica: Replica, node: Node, engine_argv: list[str]) -> list[str] | None:
        """The arguments after ``vllm serve`` in ``node``'s vLLM unit, as its role's
        ``templates/vllm.service.j2`` renders them, or None where the node runs no vLLM
        process (a Ray worker) or the backend does not say.

        Args:
            replica: the node's replica.
            node: one of its nodes.
            engine_argv: the engine words every node shares (model, TP, PP, ...), first.
        """
        return None

    # --- watchdog, readiness, checks, status ------------------------------------------------

    def plan(self, replica: Replica, node: Node) -> dict[str, Any]:
        """What the peer watchdog on ``node`` watches (docs/recovery.md), JSON-ready.

        Keys: ``units`` (this node's units, start order), ``rules`` (each ``{unit, peer,
        peer_unit, mutual}``, plus ``master_addr``/``master_port`` where a rule waits for a
        rendezvous), ``probe`` (True: this node probes the API with a completion), ``restarts``
        (what it restarts, for the unit's comment). Unit names come from the node's inventory
        variables or the role defaults.
        """
        units = self.node_units(replica, node, node.host.vars)
        return {"units": units, "rules": [], "probe": False, "restarts": units[-1]}

    def ready_check(self, ctx: Any, replica: Replica) -> Callable[[], Problem | None] | None:
        """An extra check run while waiting for rank 0 to serve (a Problem ends the wait), or
        None. ``ctx`` is the task's :class:`~vllm_provision.modules.context.ModuleContext`."""
        return None

    def check_replica(self, replica: Replica, facts: Mapping[str, HostFacts],
                      settings: Any) -> list[Finding]:
        """The backend's own preflight checks (``settings``: the merged
        :class:`~vllm_provision.checks.options.PreflightSettings`)."""
        return []

    def status_view(self, replica: Replica, states: Sequence[Any], lost: dict[str, str],
                    connections: Mapping[str, Any], vars_: Mapping[str, Any]) -> dict[str, Any]:
        """Extra keys of the replica's ``provision status`` entry (Ray: ``ray``); may add
        nodes found unreachable to ``lost``."""
        return {}

    def placement(self, replica: Replica, connections: Mapping[str, Any],
                  vars_: Mapping[str, Any]) -> dict[str, Any]:
        """Where the replica runs, for ``provision bench`` (docs/evidence.md): ``{"kind":
        "ranks", "ranks": [...]}`` by default, one entry per node with its units' processes,
        their ``CUDA_VISIBLE_DEVICES`` and nvidia-smi's GPU indexes
        (:func:`vllm_provision.backends.placement.unit_placement`).

        Raises:
            UnreachableError: a node's connection failed.
        """
        from vllm_provision.backends.placement import unit_placement

        return {"kind": "ranks", "ranks": unit_placement(replica, connections, vars_)}

    # --- playbooks --------------------------------------------------------------------------

    def plays_file(self, phase: str, role_dir: Path) -> Path | None:
        """The file of this backend's plays for ``phase`` (``role_dir/plays/<phase>.yml``), or
        None when it has none for that phase."""
        path = role_dir / "plays" / f"{phase}.yml"
        return path if path.is_file() else None


_REGISTRY: dict[str, Backend] = {}
_LOADED = False
# Hosts are probed and run in threads: the first lookups may race. The registry is marked
# loaded only once it is full, under this lock (re-entrant: register() calls _load()).
_LOCK = threading.RLock()


def _load() -> dict[str, Backend]:
    global _LOADED
    if _LOADED:
        return _REGISTRY
    with _LOCK:
        if _LOADED:
            return _REGISTRY
        import importlib.metadata  # on first lookup: `provision --help`, `play` need no plug-ins

        # The built-ins are found by name, like plug-ins: this registry sits in the package's
        # lowest room and never imports an implementation, which uses the rooms above it
        # (docs/architecture.md, "Rooms"); importing the package's modules runs their @builtin.
        import_submodules(__package__ or "vllm_provision.backends")
        for entry in BUILTINS:
            _REGISTRY.setdefault(entry.name, entry.obj())
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = entry.load()
                backend = loaded() if isinstance(loaded, type) else loaded
            except Exception as exc:  # a plug-in's import error, reported with its name
                raise ProvisionError.single(
                    f"entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP})",
                    f"the backend cannot be loaded: {type(exc).__name__}: {exc}",
                    fix="fix or uninstall the distribution that declares it") from None
            if not isinstance(backend, Backend):
                raise ProvisionError.single(
                    f"entry point {entry.name} = {entry.value} ({ENTRY_POINT_GROUP})",
                    "it names no Backend", expected="a subclass or instance of "
                    "vllm_provision.backends.Backend", actual=type(backend).__name__)
            _register(backend)
        _LOADED = True
    return _REGISTRY


B = TypeVar("B", bound=type[Backend])


def builtin(*, order: float) -> Callable[[B], B]:
    """Class decorator for a built-in backend (a module of this package): adds the class to
    :data:`BUILTINS` under its ``name``, instantiated on the first look-up, in ``order``
    (mp 10, ray 20). A backend outside the package uses an entry point or :func:`register`.

    Raises:
        ProvisionError: (when decorating) its ``name`` is invalid or another built-in has it.
    """

    def decorate(cls: B) -> B:
        return BUILTINS.add(cls.name, cls, order=order)

    return decorate


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the registry (and return it).

    Raises:
        ProvisionError: its name is empty, not a lower-case word, or taken by another backend.
    """
    _load()
    return _register(backend)


def _register(backend: Backend) -> Backend:
    registry = _REGISTRY
    name = backend.name
    if not name or not name.isidentifier() or name != name.lower():
        raise ProvisionError.single(f"backend {type(backend).__name__}", "invalid backend name",
                                    expected="a lower-case word such as mp", actual=repr(name))
    if name in registry and registry[name] is not backend:
        raise ProvisionError.single(f"backend {name}", "a backend of this name is registered",
                                    fix="give the backend another name")
    registry[name] = backend
    return backend


def unregister(name: str) -> None:
    """Remove the backend ``name`` from the registry (a no-op when absent)."""
    _load().pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered backend name, built-ins first, then in registration order."""
    return tuple(_load())


def find(name: Any) -> Backend | None:
    """The backend called ``name``, or None."""
    return _load().get(name) if isinstance(name, str) else None


def get(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        ProvisionError: no backend has that name (the message lists the registered ones).
    """
    backend = find(name)
    if backend is None:
        raise ProvisionError.single(f"vllm_backend {name!r}", "unknown backend",
                                    expected="one of " + ", ".join(names()),
                                    fix="set vllm_backend to a registered backend")
    return backend


def of(replica: Replica) -> Backend:
    """The backend of ``replica`` (:func:`get` of its ``backend`` name)."""
    return get(replica.backend)


class Names(Sequence[str]):
    """The registered names as a live sequence (``vllm_backend``'s choices in the variables
    table: a backend registered later is accepted too)."""

    def __getitem__(self, index: Any) -> Any:
        return names()[index]

    def __len__(self) -> int:
        return len(names())

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __contains__(self, value: object) -> bool:
        return value in names()

    def __repr__(self) -> str:
        return repr(names())
