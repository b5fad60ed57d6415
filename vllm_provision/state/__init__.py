"""The state record of the last good ``provision up``: what ran where, for ``provision drift``.

Written only after ``provision up`` verified a served completion, in two places:

- on every host of the inventory's replicas: ``/var/lib/vllm-provision/state.json`` (root:root,
  0600, written to a temp file in the same folder, fsynced and renamed: rename(2) is atomic);
- on the controller: ``$XDG_STATE_HOME/vllm-provision/<inventory stem>-<12 hex of the sha256 of
  the inventory's absolute path>.json`` (``XDG_STATE_HOME`` defaults to ``~/.local/state``, XDG
  Base Directory spec 0.8), 0600, also written atomically. It stays keyed by the inventory's
  path: it is this controller's cache of one file's last good ``up`` (several replicas in one
  file, the evidence store beside it), not who owns a host; the hosts' copies decide that.

``start_to_serving_s`` is the last MEASURED start to serving of the replica (seconds; an ``up``
that found it already serving keeps the previous value): the outage estimate of the plan
(``vllm_provision.operations.plan``). ``deployed_at`` is when the ``up`` that last (re)started the
replica
began (UTC): ``provision status`` shows failures since then as the current ones. Both are None
when never measured.

A copy equal to the new record but for ``time`` and ``controller`` is not written again
(:func:`save_record`): ``time`` is when the record's content last changed.

Every copy holds the whole record (all hosts), so drift can fall back on any host's copy when
the controller's is missing. The record holds no secret: the API key only as ``api_key_set``,
installed files only as sha256 digests.

Record shape (``schema`` 1)::

    {"schema": 1, "time": "2025-01-01T12:00:00Z", "tool_version": "0.1.0",
     "inventory": "/abs/inventory.yml", "controller": "ops-laptop",
     "replicas": {"llama": {"replica_id": "llama@3f2a9c01d4e5b6a7",
                            "backend": "mp", "nodes": ["h1", "h2"],
                            "engine": {"model": "...", "tensor_parallel_size": 1, ...,
                                       "api_key_set": false},
                            "start_to_serving_s": 7.1,
                            "deployed_at": "2025-01-01T11:58:40Z"}},
     "hosts": {"h1": {"replica": "llama", "rank": 0, "units": ["vllm.service"],
                      "facts": {"python": "3.11.2", "vllm": "0.11.0", "NCCL": "2.28.9", ...,
                                "model content": "<sha256>"},
                      "model_content": {"config.json": "<sha256>",
                                        "model-00001-of-00002.safetensors": "<sha256>", ...},
                      "files": {"/etc/systemd/system/vllm.service": "<sha256>", ...},
                      "started_from": {"vllm.service": {"invocation": "<InvocationID>",
                                                        "files": {"<path>": "<sha256>"}}}}},
     "host": "h1"}

``model content`` is the model folder's content fingerprint
(:attr:`vllm_provision.facts.model.ModelContent.digest`) and ``model_content`` its per-file
hashes, by which ``provision drift`` names the file another revision changed.
``units`` are the host's units of the replica's backend in start order
(``Backend.node_units``) and ``files`` every file the install plays put there (unit files
included): together, what ``provision up`` stops and removes when a later plan no longer has
them, and what ``provision down --purge`` removes (``vllm_provision.state.prune``; a record without
``units`` gives them from the unit files among ``files``).
``host`` (only in a host's own copy) names that host's entry, so a second inventory that calls
the same machine by another name still finds who owns it. ``replica_id`` is the replica's owner
id (``Replica.replica_id``: ``vllm_replica_id``, else derived from the replica's content); it
decides who owns a host (``checks.ownership``). ``inventory`` (the inventory's path:
:func:`inventory_identity`) and ``controller`` (the host name of the controller that wrote the
record) only say where the owner was run from, for messages; a record written before
``replica_id`` existed is matched by its ``inventory`` (``checks.ownership.legacy_match``).
``started_from`` keeps, per unit, the InvocationID systemd gave its running process
(systemd.exec(5), ``$INVOCATION_ID``) and the digests of the installed files when the first
good ``up`` after that start recorded them: what the running process read. It is carried
over unchanged while the InvocationID stays the same, so a later ``up`` can tell that
restoring a hand-edited file gives the running process nothing new (``modules/template.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_provision import __version__
from vllm_provision.core import hostjson
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import EngineArgs, Inventory
from vllm_provision.core.paths import STATE_DIR
from vllm_provision.core.quoting import quote
from vllm_provision.facts.model import HostFacts
from vllm_provision.settings import instance
from vllm_provision.transport.base import Connection, UnreachableError

SCHEMA = 1
HOST_STATE_FILE = f"{STATE_DIR}/state.json"

# Facts that must not change between two good `up`s without the operator knowing (the parity
# items of docs/preflight.md): label -> reader. Labels match `provision facts` rows.
PARITY_FACTS: tuple[tuple[str, Callable[[HostFacts], str | None]], ...] = (
    ("python", lambda f: f.python_micro or None),
    ("vllm", lambda f: f.packages.get("vllm")),
    ("torch", lambda f: f.packages.get("torch")),
    ("torch CUDA build", lambda f: f.torch_cuda),
    ("NCCL", lambda f: f.nccl_version),
    ("ray", lambda f: f.packages.get("ray")),
    ("transformers", lambda f: f.packages.get("transformers")),
    ("driver", lambda f: f.driver_version),
    ("CUDA (driver)", lambda f: f.cuda_driver_version),
    ("GPU model", lambda f: f.gpu_model),
    ("GPU count", lambda f: str(len(f.gpus))),
    ("model manifest", lambda f: model_manifest_digest(f)),
    ("model content", lambda f: f.model_content.digest or None if f.model_content else None),
)
# The fact whose per-file hashes the record keeps beside it (``model_content``), so drift can
# name the file that changed.
MODEL_CONTENT = "model content"


def model_manifest_digest(facts: HostFacts) -> str | None:
    """sha256 (hex) of the model directory's manifest: one ``name<TAB>size<TAB>sha256`` line per
    file, sorted by name; None when the model path was missing. File hashes are included only
    when the probe hashed them, so the digest mostly tracks names and sizes (bytes)."""
    if facts.model_files is None:
        return None
    lines = "".join(f"{m.name}\t{m.size}\t{m.sha256}\n"
                    for m in sorted(facts.model_files, key=lambda m: m.name))
    return hashlib.sha256(lines.encode()).hexdigest()


def parity_facts(facts: HostFacts) -> dict[str, str | None]:
    """The facts of :data:`PARITY_FACTS` as ``label -> value`` (None = not found)."""
    return {label: read(facts) for label, read in PARITY_FACTS}


def engine_record(engine: EngineArgs) -> dict[str, Any]:
    """The replica's engine arguments as JSON, the API key replaced by ``api_key_set`` (bool)."""
    values = asdict(engine)
    values["extra_args"] = list(engine.extra_args)
    values["api_key_set"] = values.pop("api_key") is not None
    return values


def inventory_identity(path: Path | str) -> str:
    """The inventory's path in state records: its absolute path with every symlink resolved
    (``Path.resolve``), so the same file reached through a symlink or a relative path reads
    the same. It names where an owner ran from; ownership itself compares replica ids, and
    this path only for records written before they held one (docs/deploy.md, "Who owns a
    host")."""
    return str(Path(path).resolve())


def controller_name() -> str:
    """This controller's host name (``socket.gethostname()``) for the records it writes: the
    refusal of another inventory's run names it (``""`` when the name cannot be read)."""
    import socket

    try:
        return socket.gethostname()
    except OSError:
        return ""


def build_record(inventory: Inventory, facts: Mapping[str, HostFacts],
                 files: Mapping[str, Mapping[str, str]], *,
                 now: datetime | None = None,
                 serving: Mapping[str, Mapping[str, Any]] | None = None,
                 started: Mapping[str, Mapping[str, Any]] | None = None,
                 controller: str | None = None) -> dict[str, Any]:
    """Build the record (pure but for the controller's name) for every node of every replica.

    Args:
        inventory: the inventory ``up`` ran with (extra vars merged).
        facts: facts by host name, as preflight gathered them.
        files: by host name, installed file path -> sha256 hex digest.
        now: the time of the record (default: now, UTC).
        serving: replica name -> ``{"start_to_serving_s", "deployed_at"}``
            (:func:`serving_record`); absent replicas get None for both.
        started: by host name, unit -> ``{"invocation": id, "files": {path: sha256}}``
            (:func:`started_from`); hosts without one get ``{}``.
        controller: the controller's name to record (default :func:`controller_name`).
    """
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "time": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tool_version": __version__,
        "inventory": inventory_identity(inventory.path),
        "controller": controller_name() if controller is None else controller,
        "replicas": {},
        "hosts": {},
    }
    for replica in inventory.replicas:
        record["replicas"][replica.name] = {
            "replica_id": replica.replica_id,
            "backend": replica.backend,
            "nodes": [node.name for node in replica.nodes],
            "engine": engine_record(replica.engine),
            "start_to_serving_s": None,
            "deployed_at": None,
            **dict((serving or {}).get(replica.name) or {}),
        }
        for node in replica.nodes:
            host_facts = facts.get(node.name)
            record["hosts"][node.name] = {
                "replica": replica.name,
                "rank": node.rank,
                "facts": parity_facts(host_facts) if host_facts else {},
                "model_content": dict(sorted(host_facts.model_content.files.items()))
                if host_facts and host_facts.model_content else {},
                "units": replica.backend_type.node_units(replica, node, node.host.vars),
                "files": dict(sorted(files.get(node.name, {}).items())),
                "started_from": dict((started or {}).get(node.name, {})),
            }
    return record


START_KINDS = ("cold", "warm")


def start_key(replica: Any, facts: Mapping[str, HostFacts]) -> dict[str, Any]:
    """What decides whether a start can reuse vLLM's compile cache (pure): the nodes, the
    backend, the model, the vLLM and torch versions of rank 0, the layout (tensor and
    pipeline parallel size, max model length) and the extra engine arguments (``--dtype``,
    ``--enforce-eager``, ``--kv-cache-dtype`` and the compilation options live there; any
    change counts as a new key). vLLM keys its torch.compile cache under
    ``VLLM_CACHE_ROOT`` by a hash of the model and compilation configs, the parallel layout
    and the versions ("torch.compile integration",
    docs.vllm.ai/en/latest/design/torch_compile.html); a start with the same key on the same
    nodes finds the cache (warm), another one builds it (cold).

    Args:
        replica: a ``Replica`` (its ``nodes``, ``master`` and ``engine``).
        facts: host name -> gathered facts (versions None when not gathered).
    """
    master = facts.get(replica.master.name)
    packages = dict(master.packages) if master is not None else {}
    engine = replica.engine
    return {"nodes": [node.name for node in replica.nodes], "backend": replica.backend,
            "model": engine.model,
            "vllm": packages.get("vllm"), "torch": packages.get("torch"),
            "tensor_parallel_size": engine.tensor_parallel_size,
            "pipeline_parallel_size": engine.pipeline_parallel_size,
            "max_model_len": engine.max_model_len, "extra_args": list(engine.extra_args)}


def serving_record(previous: Mapping[str, Any] | None, replica: str,
                   measured_s: float | None, started_at: datetime, *,
                   replica_id: str | None = None, key: Mapping[str, Any] | None = None,
                   phase_s: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``start_to_serving_s``, ``deployed_at`` and start history of ``replica`` for the
    new record (pure).

    Args:
        previous: the last record (None when there is none).
        replica: the replica's name.
        measured_s: the start to serving this ``up`` measured, in seconds; None when it did not
            start the replica (it was already serving) or could not measure it.
        started_at: when this ``up`` began.
        replica_id: the replica's owner id; a previous entry that holds another one (another
            inventory now at the same path) is not carried over. None: not compared.
        key: :func:`start_key` of this start (None: every start is counted cold).
        phase_s: node -> phase -> seconds of this start (the readiness wait's ``phase_s``).

    A measured value means this ``up`` (re)started the replica: ``start_to_serving_s`` and
    ``deployed_at`` are new, and so is ``starts[kind]``: ``kind`` is ``warm`` when the last
    recorded start had the same ``start_key`` (vLLM's compile cache is there), else ``cold``;
    the other kind's last measurement is kept, so the record holds one of each once both
    happened (docs/deploy.md, "Cold and warm starts"). Otherwise everything is carried over
    from ``previous`` (None when it has no such replica).
    """
    old = ((previous or {}).get("replicas") or {}).get(replica) or {}
    if replica_id is not None and old.get("replica_id") not in (None, replica_id):
        old = {}
    starts = {kind: old["starts"][kind] for kind in START_KINDS
              if isinstance(old.get("starts"), Mapping) and old["starts"].get(kind)}
    if measured_s is None:
        return {"start_to_serving_s": old.get("start_to_serving_s"),
                "deployed_at": old.get("deployed_at"), "start_key": old.get("start_key"),
                "last_start": old.get("last_start"), "starts": starts}
    at = started_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kind = "warm" if key is not None and old.get("start_key") == dict(key) else "cold"
    starts[kind] = {"start_to_serving_s": round(float(measured_s), 3), "at": at,
                    "phase_s": dict(phase_s or {})}
    return {"start_to_serving_s": round(float(measured_s), 3), "deployed_at": at,
            "start_key": dict(key) if key is not None else None, "last_start": kind,
            "starts": starts}


def recorded_starts(record: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Replica name -> ``{"cold": {...}, "warm": {...}}``: the last start of each kind the
    record holds (:func:`serving_record`; ``start_to_serving_s``, ``at``, ``phase_s``), kinds
    never measured left out; a malformed entry reads as none."""
    found: dict[str, dict[str, Any]] = {}
    for name, item in ((record or {}).get("replicas") or {}).items():
        starts = item.get("starts") if isinstance(item, Mapping) else None
        if isinstance(starts, Mapping):
            found[str(name)] = {kind: dict(starts[kind]) for kind in START_KINDS
                                if isinstance(starts.get(kind), Mapping)}
    return found


def describe_starts(starts: Mapping[str, Any]) -> str:
    """One line for :func:`recorded_starts` of a replica: ``cold 95.2 s (2026-12-04T11:39:11Z),
    warm 40.1 s (...)``, or ``none recorded``."""
    parts = [f"{kind} {starts[kind].get('start_to_serving_s')} s ({starts[kind].get('at')})"
             for kind in START_KINDS if kind in starts]
    return ", ".join(parts) or "none recorded"


def last_start_s(record: Mapping[str, Any] | None) -> dict[str, float | None]:
    """Replica name -> its recorded last start to serving (seconds, None when not measured)."""
    found: dict[str, float | None] = {}
    for name, item in ((record or {}).get("replicas") or {}).items():
        value = item.get("start_to_serving_s") if isinstance(item, Mapping) else None
        found[str(name)] = float(value) if isinstance(value, (int, float)) else None
    return found


def started_from(hashes: Mapping[str, str], invocations: Mapping[str, str],
                 previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """One host's ``started_from`` (pure): per running unit, what its process started from.

    Args:
        hashes: installed file path -> sha256 hex now.
        invocations: unit -> its InvocationID now (``""``: not running; left out).
        previous: the host's ``started_from`` in the last record, or None.

    A unit whose InvocationID is the one recorded before keeps its recorded files (its process
    read them when it started, not what is on disk now); a unit started since gets the digests
    of now, taken right after the ``up`` that started it was verified.
    """
    out: dict[str, Any] = {}
    for unit, invocation in sorted(invocations.items()):
        if not invocation:
            continue
        before = (previous or {}).get(unit)
        if isinstance(before, Mapping) and before.get("invocation") == invocation \
                and isinstance(before.get("files"), Mapping):
            out[unit] = {"invocation": invocation, "files": dict(before["files"])}
        else:
            out[unit] = {"invocation": invocation, "files": dict(sorted(hashes.items()))}
    return out


def unit_names(paths: Sequence[str]) -> list[str]:
    """The unit names among installed paths: the file names of ``*.service`` files."""
    return sorted({os.path.basename(p) for p in paths if p.endswith(".service")})


def invocation_script(units: Sequence[str], *, active: bool = False) -> str:
    """Shell printing ``@@unit <unit> <InvocationID or nothing>`` per unit of ``units``
    (``systemctl show -p InvocationID --value``; empty for a unit that is not active); with
    ``active``: ``@@unit <unit> <ActiveState> <InvocationID>``."""
    if not units:
        return "true"
    quoted = " ".join(quote(u) for u in units)
    show = ('a=$(systemctl show -p ActiveState --value -- "$u"); '
            'i=$(systemctl show -p InvocationID --value -- "$u"); ')
    line = 'echo "@@unit $u $a $i"' if active else '[ "$a" = active ] || i=; echo "@@unit $u $i"'
    return f"for u in {quoted}; do {show}{line}; done; true"


def parse_invocations(stdout: str) -> dict[str, str]:
    """:func:`invocation_script` output -> unit -> InvocationID (``""``: not running)."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "@@unit":
            found[parts[1]] = parts[2] if len(parts) > 2 else ""
    return found


# -- the controller's copy ---------------------------------------------------------------------

def controller_state_dir() -> Path:
    """``$XDG_STATE_HOME/vllm-provision`` (``~/.local/state/vllm-provision`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "vllm-provision"


def controller_state_path(inventory_path: Path) -> Path:
    """Where the controller keeps the record of the inventory at ``inventory_path``.

    The name carries the inventory's stem and 12 hex digits of the sha256 of its absolute path,
    so two inventories with the same file name do not share a record.
    """
    absolute = str(Path(inventory_path).resolve())
    tag = hashlib.sha256(absolute.encode()).hexdigest()[:12]
    return controller_state_dir() / f"{Path(inventory_path).stem}-{tag}.json"


def write_controller_record(inventory_path: Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` atomically (temp file, fsync, rename) with mode 0600; return its path.

    Raises:
        ProvisionError: the folder or file cannot be written.
    """
    from vllm_provision.core.files import write_private_json

    return write_private_json(controller_state_path(inventory_path), record,
                              what="the state record")


def read_controller_record(inventory_path: Path) -> dict[str, Any] | None:
    """Return the controller's record of this inventory, or None when there is none.

    Raises:
        ProvisionError: the file exists but is not a record (unreadable, not JSON, wrong schema).
    """
    path = controller_state_path(inventory_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ProvisionError.single(str(path), f"cannot read the state record: {exc.strerror}") \
            from None
    return parse_record(text, str(path))


def parse_record(text: str, where: str) -> dict[str, Any]:
    """Parse a record's JSON text and check its schema.

    Raises:
        ProvisionError: not JSON, not an object, or an unknown ``schema``.
    """
    try:
        record = hostjson.loads(text)
    except json.JSONDecodeError as exc:
        raise ProvisionError.single(where, f"the state record is not JSON: {exc}",
                                    fix="run `provision up` to write a new one") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA \
            or not isinstance(record.get("hosts"), dict):
        raise ProvisionError.single(where, "not a state record this version can read",
                                    expected=f"a JSON object with schema {SCHEMA} and hosts",
                                    actual=str(record.get("schema") if isinstance(record, dict)
                                               else type(record).__name__),
                                    fix="run `provision up` to write a new one")
    return record


# -- the hosts' copies -------------------------------------------------------------------------

def hash_files_script(paths: Sequence[str]) -> str:
    """Shell printing ``<sha256> <path>`` for each existing path of ``paths`` (one round trip)."""
    if not paths:
        return "true"
    quoted = " ".join(quote(p) for p in paths)
    return f"for p in {quoted}; do [ -f \"$p\" ] && sha256sum \"$p\"; done; true"


def parse_hashes(stdout: str) -> dict[str, str]:
    """``sha256sum`` output -> path -> digest (pure)."""
    hashes: dict[str, str] = {}
    for line in stdout.splitlines():
        digest, _, path = line.strip().partition(" ")
        path = path.lstrip(" *")
        if len(digest) == 64 and path:
            hashes[path] = digest
    return hashes


def host_record_path(host_vars: Mapping[str, Any]) -> str:
    """The host's copy of the record: ``state.json`` in its ``provision_state_dir``
    (:func:`vllm_provision.settings.instance.state_dir`; :data:`HOST_STATE_FILE` unless the
    host's replica shares the server, docs/inventory.md "Shared servers").

    Args:
        host_vars: the host's merged variables (``Host.vars``).
    """
    return instance.record_file(host_vars)


def write_host_record_script(path: str = HOST_STATE_FILE) -> str:
    """Shell that writes stdin to ``path`` atomically, root-only (folder 0755, file 0600)."""
    folder = quote(os.path.dirname(path))
    target = quote(path)
    return (f"umask 077 && mkdir -p {folder} && tmp=$(mktemp {folder}/.state.XXXXXX) && "
            f"cat > \"$tmp\" && sync \"$tmp\" && chmod 0600 \"$tmp\" && "
            f"mv -f \"$tmp\" {target}")


def write_host_record(conn: Connection, record: Mapping[str, Any],
                      path: str = HOST_STATE_FILE) -> None:
    """Write the record on one host (one round trip, as root through the host's ``become``).

    Raises:
        UnreachableError: the connection failed.
        ProvisionError: the write failed on the host.
    """
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    result = conn.run(write_host_record_script(path), stdin=text)
    if not result.ok:
        raise ProvisionError.single(getattr(conn, "name", "host"),
                                    f"cannot write {path}",
                                    actual=(result.stderr or result.stdout).strip()[-300:])


def read_host_record(conn: Connection, path: str = HOST_STATE_FILE) -> dict[str, Any] | None:
    """Read one host's copy of the record; None when it has none.

    Raises:
        UnreachableError: the connection failed.
        ProvisionError: the file is not a record.
    """
    result = conn.run(f"cat {quote(path)} 2>/dev/null || echo __ABSENT__")
    text = result.stdout.strip()
    if not text or text == "__ABSENT__":
        return None
    return parse_record(text, f"{getattr(conn, 'name', 'host')}:{path}")


# Keys a rewrite of an otherwise equal record would only refresh: when the record was written
# and from which controller. A record equal but for these is not written again.
VOLATILE_KEYS = ("time", "controller")


def same_record(old: Any, new: Mapping[str, Any]) -> bool:
    """Whether ``old`` (a parsed record, a record's JSON text, or None) holds what ``new`` holds
    but for :data:`VOLATILE_KEYS`: the comparison is of their JSON forms, so a tuple and a list
    of the same items are equal. An unreadable ``old`` is never the same."""
    if isinstance(old, str):
        try:
            old = hostjson.loads(old)
        except json.JSONDecodeError:
            return False
    if not isinstance(old, dict):
        return False

    def kept(record: Mapping[str, Any]) -> Any:
        return json.loads(json.dumps({k: v for k, v in record.items() if k not in VOLATILE_KEYS},
                                     sort_keys=True, default=str))

    return bool(kept(old) == kept(new))


def save_record(inventory: Inventory, record: Mapping[str, Any],
                connections: Mapping[str, Connection], *,
                found: Mapping[str, Any] | None = None,
                previous: Mapping[str, Any] | None = None,
                ) -> tuple[Path, dict[str, ProvisionError]]:
    """Write the record on every connected host, then on the controller; a copy that already
    holds the same record (:func:`same_record`: equal but for when and from where it was
    written) is left as it is, so an ``up`` that changed nothing writes no record (as Terraform
    leaves its state alone after an apply with no changes). The record's ``time`` is thus when
    its content last changed.

    Args:
        inventory: the inventory ``up`` ran with (its path keys the controller's copy).
        record: the record (:func:`build_record`).
        connections: host name -> its connection.
        found: host name -> that host's copy as the run read it under its run lock (text, or
            None when it had none; ``LendingFactory.records``); a host absent is written.
        previous: the controller's copy before this run (None: written).

    Returns:
        ``(controller path, errors by host)``: hosts whose copy could not be written.

    Raises:
        ProvisionError: the controller's copy could not be written.
    """
    errors: dict[str, ProvisionError] = {}
    for name, conn in connections.items():
        mine = {**record, "host": name}
        if found is not None and same_record(found.get(name), mine):
            continue
        try:
            write_host_record(conn, mine, host_record_path(inventory.hosts[name].vars))
        except (UnreachableError, ProvisionError) as exc:
            errors[name] = exc
    if previous is not None and same_record(previous, record):
        return controller_state_path(inventory.path), errors
    return write_controller_record(inventory.path, record), errors
