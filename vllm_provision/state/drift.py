"""Drift: what changed since the last good ``provision up`` (pure: no I/O).

Two kinds of change, as Terraform's ``plan -refresh-only`` vs ``plan`` tell them apart
(https://developer.hashicorp.com/terraform/cli/commands/plan#planning-modes):

- ``facts``: a parity fact of a node (vLLM, torch, NCCL, driver, GPUs, model manifest, model
  content, ...) differs from the record (:mod:`vllm_provision.state`);
- ``config``: what ``provision up`` would change now: a file or unit the install plays would
  rewrite in check mode (hand edits on the host, inventory or ``-e`` edits), a node added to or
  removed from a replica, an engine argument changed in the inventory.

Exit codes follow ``terraform plan -detailed-exitcode`` (hashicorp/terraform#1355): 0 no drift,
1 error (a host unreachable, no record), 2 drift found.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from vllm_provision.core.models import Inventory
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.facts.model import HostFacts, first_different_file
from vllm_provision.state import MODEL_CONTENT, engine_record, parity_facts

Kind = Literal["facts", "config"]
EXIT_NO_DRIFT = 0
EXIT_ERROR = 1
EXIT_DRIFT = 2
# Facts shown shortened (digests): first 12 hex digits, as git shows commits.
_DIGEST_ITEMS = ("model manifest", MODEL_CONTENT)


@dataclass(frozen=True)
class Change:
    """One difference between the record and now.

    Attributes:
        host: inventory host name, or ``"*"`` for a replica-wide item (an engine argument).
        item: what differs: a fact label (``"NCCL"``), a file path, ``"node"``, or
            ``"engine <argument> (<replica>)"``.
        recorded: the value in the record (None: absent then).
        current: the value now (None: absent now); for files, ``"would change: <why>"``.
        kind: ``facts`` or ``config``.
    """

    host: str
    item: str
    recorded: str | None
    current: str | None
    kind: Kind

    def to_json(self) -> dict[str, Any]:
        """Return the change as a JSON object (keys: host, item, recorded, current, kind)."""
        return asdict(self)

    def line(self) -> str:
        """One plan line: ``~ h2  NCCL  2.28.9 -> 2.27.3`` (``+``/``-`` for added/removed)."""
        if self.recorded is None and self.current is not None:
            return f"+ {self.host}  {self.item}  {self.current}"
        if self.current is None:
            return f"- {self.host}  {self.item}  {self.recorded}"
        if self.current.startswith("would change"):
            return f"~ {self.host}  {self.item}  ({self.current})"
        return f"~ {self.host}  {self.item}  {self.recorded} -> {self.current}"


def _show(label: str, value: str | None) -> str | None:
    if value is not None and label in _DIGEST_ITEMS:
        return value[:12]
    return value


def compare_facts(record: Mapping[str, Any], facts: Mapping[str, HostFacts]) -> list[Change]:
    """Parity facts that differ from the record, for every host in both.

    Args:
        record: a state record (``state.build_record``).
        facts: current facts by host name (hosts not probed are not compared).
    """
    changes: list[Change] = []
    recorded_hosts: Mapping[str, Any] = record.get("hosts") or {}
    for name, host_facts in facts.items():
        entry = recorded_hosts.get(name) or {}
        then = entry.get("facts")
        if not then:
            continue
        now = parity_facts(host_facts)
        for label, value in now.items():
            if label in then and then[label] != value:
                item = label
                if label == MODEL_CONTENT:
                    item = _content_item(entry.get("model_content"), host_facts)
                changes.append(Change(name, item, _show(label, then[label]),
                                      _show(label, value), "facts"))
    return changes


def _content_item(recorded: Any, facts: HostFacts) -> str:
    """``model content (<first file that differs>)``, or the bare label when the record holds
    no per-file hashes (written before they were kept)."""
    if not isinstance(recorded, Mapping) or not recorded:
        return MODEL_CONTENT
    files = {str(k): str(v) for k, v in recorded.items()}
    name = first_different_file(files, facts.model_content.files if facts.model_content else {})
    return f"{MODEL_CONTENT} ({name})" if name else MODEL_CONTENT


def compare_lock(locks: Mapping[str, Any], inventory: Inventory,
                 facts: Mapping[str, HostFacts]) -> list[Change]:
    """Locked packages a node's venv no longer runs (docs/stack.md: the lock is the expected
    state), as ``facts`` changes: recorded = the locked version, current = the installed one.

    Args:
        locks: parsed locks (``vllm_provision.stack.lock.Lock``) by replica name.
        inventory: the inventory (to find each host's replica).
        facts: current facts by host name; their ``packages`` hold the lock's packages.
    """
    from vllm_provision.stack.lock import compare

    changes: list[Change] = []
    for name, host_facts in facts.items():
        replica = inventory.replica_of(name)
        if replica is None or replica.name not in locks:
            continue
        for d in compare(locks[replica.name], name, host_facts.packages):
            changes.append(Change(name, f"{d.package} (stack lock)", d.expected, d.actual,
                                  "facts"))
    return changes


def compare_layout(record: Mapping[str, Any], inventory: Inventory,
                   hosts: Iterable[str] | None = None) -> list[Change]:
    """Nodes added, removed or moved, the replica id and engine arguments changed, since the
    record.

    Args:
        record: a state record.
        inventory: the inventory now (with ``-e`` values merged).
        hosts: restrict to these host names (``--limit``); None = all.
    """
    wanted = set(hosts) if hosts is not None else None
    changes: list[Change] = []
    then_hosts: Mapping[str, Any] = record.get("hosts") or {}
    now_hosts = {node.name: (replica.name, node.rank)
                 for replica in inventory.replicas for node in replica.nodes}
    for name in sorted(set(then_hosts) | set(now_hosts)):
        if wanted is not None and name not in wanted:
            continue
        then = then_hosts.get(name)
        before = f"{then['replica']} rank {then['rank']}" if then else None
        now = now_hosts.get(name)
        after = f"{now[0]} rank {now[1]}" if now else None
        if before != after:
            changes.append(Change(name, "node", before, after, "config"))
    then_replicas: Mapping[str, Any] = record.get("replicas") or {}
    for replica in inventory.replicas:
        if wanted is not None and not any(n.name in wanted for n in replica.nodes):
            continue
        then = then_replicas.get(replica.name)
        if not then:
            continue
        if then.get("replica_id") and then["replica_id"] != replica.replica_id:
            # another owner id: the next `up` is refused as another owner (docs/deploy.md,
            # "Who owns a host"); a record written before ids holds none
            changes.append(Change("*", f"replica id ({replica.name})", str(then["replica_id"]),
                                  replica.replica_id, "config"))
        if then.get("backend") != replica.backend:
            changes.append(Change("*", f"backend ({replica.name})", str(then.get("backend")),
                                  replica.backend, "config"))
        recorded_engine: Mapping[str, Any] = then.get("engine") or {}
        for key, value in engine_record(replica.engine).items():
            if key in recorded_engine and recorded_engine[key] != value:
                changes.append(Change("*", f"engine {key} ({replica.name})",
                                      _text(recorded_engine[key]), _text(value), "config"))
    return changes


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value) or "[]"
    return str(value)


def config_changes(results: Sequence[TaskResult], record: Mapping[str, Any],
                   files: Mapping[str, Mapping[str, str]],
                   ignore_tasks: Iterable[str] = ()) -> list[Change]:
    """What the install plays would change, from their check-mode results.

    Args:
        results: task results of a check-mode run of the install plays.
        record: the state record (for the recorded sha256 of each file).
        files: by host, task name -> file path (``managed.managed_files``): names the file of a
            ``no_log`` task, whose result carries no data.
        ignore_tasks: task names whose change only follows another (``daemon-reload``).
    """
    skip = set(ignore_tasks)
    changes: list[Change] = []
    recorded_hosts: Mapping[str, Any] = record.get("hosts") or {}
    for result in results:
        if result.status is not Status.CHANGED or result.task in skip:
            continue
        path = (files.get(result.host) or {}).get(result.task) \
            or (result.data or {}).get("dest")
        item = str(path) if path else result.task
        recorded_files: Mapping[str, str] = (recorded_hosts.get(result.host) or {}).get(
            "files") or {}
        recorded = recorded_files.get(item)
        why = result.message.removeprefix("would change: ").strip()
        hidden = not why or why.startswith("(output hidden")
        current = "would change" if hidden else f"would change: {why}"
        changes.append(Change(result.host, item,
                              f"sha256 {recorded[:12]}" if recorded else "-", current, "config"))
    return changes


def failed_results(results: Sequence[TaskResult]) -> list[TaskResult]:
    """Results that make drift unable to tell: a task failed or a host was unreachable."""
    return [r for r in results if r.status in (Status.FAILED, Status.UNREACHABLE)]


def exit_code(changes: Sequence[Change], errors: Mapping[str, Any]) -> int:
    """1 when any host could not be checked, else 2 when anything drifted, else 0."""
    if errors:
        return EXIT_ERROR
    return EXIT_DRIFT if changes else EXIT_NO_DRIFT


def summary_line(changes: Sequence[Change], hosts: Sequence[str], record_time: str) -> str:
    """The plan's last line, like Terraform's ``Plan: ...`` line."""
    if not changes:
        return (f"No drift: {', '.join(hosts) or 'no host'} match the last good "
                f"`provision up` ({record_time}).")
    by_kind = {kind: sum(1 for c in changes if c.kind == kind) for kind in ("facts", "config")}
    drifted = sorted({c.host for c in changes} - {"*"})
    if any(c.host == "*" for c in changes):
        drifted.insert(0, "the replica")
    return (f"Drift: {len(changes)} change(s) on {', '.join(drifted)} since the last good "
            f"`provision up` ({record_time}): {by_kind['facts']} in facts, "
            f"{by_kind['config']} in configuration.")
