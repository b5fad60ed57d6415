"""The ownership guard of ``provision up``, ``restart`` and ``down``, and ``--take-over``.

Before a run changes any host, each targeted node's state record is read (one round trip per
host, on the run's own connections) and its replica id compared with the run's replica's
(``checks.ownership``). A node of another replica stops the run before anything changed, naming
both owners, unless ``--take-over`` was given. Taking over removes, from each
such node, what the old owner installed that this inventory's ``up`` does not install (its
units, stopped and disabled first, its env files, its watchdog), then lets the run go on; the
next good ``up`` writes the new owner's record (docs/deploy.md, "Who owns a host").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_provision.checks.ownership import (
    Conflict,
    conflict,
    recorded_owner,
    same_owner,
    take_over_fix,
)
from vllm_provision.core.errors import Problem, ProvisionError
from vllm_provision.core.models import Inventory
from vllm_provision.core.quoting import quote
from vllm_provision.facts.gather import parse_owner
from vllm_provision.facts.model import HostOwner


@dataclass(frozen=True)
class TakeOver:
    """What taking over one host does.

    Attributes:
        conflict: the host, its old owner and the run's replica, its id and inventory.
        remove: files the old owner installed that the new plan does not, sorted.
        units: the units among them (stopped and disabled before their files go).
    """

    conflict: Conflict
    remove: tuple[str, ...]
    units: tuple[str, ...]

    def lines(self, check_mode: bool) -> list[str]:
        """The human lines: who owned the host, and each unit and file removed."""
        item = self.conflict
        verb = "would remove" if check_mode else "removed"
        head = (f"take-over: {item.host}: from {recorded_owner(item.owner)} to "
                f"{item.run_owner()}")
        if not self.remove:
            return [head + " (nothing of the old replica is outside the new plan)"]
        return [head] + [f"  {verb} unit {u} (stopped and disabled)" for u in self.units] + [
            f"  {verb} {path}" for path in self.remove]

    def to_json(self) -> dict[str, Any]:
        """``host``, ``from_replica``, ``from_replica_id`` (``""``: an older record),
        ``from_inventory``, ``from_controller`` (``""``: unknown), ``removed_units``,
        ``removed``."""
        return {"host": self.conflict.host, "from_replica": self.conflict.owner.replica,
                "from_replica_id": self.conflict.owner.replica_id,
                "from_inventory": self.conflict.owner.inventory,
                "from_controller": self.conflict.owner.controller,
                "removed_units": list(self.units), "removed": list(self.remove)}


def plan_take_over(item: Conflict, planned: Sequence[str]) -> TakeOver:
    """The :class:`TakeOver` of one conflict (pure).

    Args:
        item: the conflict. planned: the paths this inventory's ``up`` installs on the host.
    """
    remove = tuple(sorted(set(item.owner.files) - set(planned)))
    units = tuple(sorted({path.rsplit("/", 1)[-1] for path in remove
                          if path.endswith(".service")}))
    return TakeOver(item, remove, units)


def removal_script(take: TakeOver) -> str:
    """Shell that stops and disables the old units, removes the files and reloads systemd
    (paths and names are single quoted words; ``true`` when there is nothing to remove)."""
    if not take.remove:
        return "true"
    steps = []
    if take.units:
        units = " ".join(quote(u) for u in take.units)
        steps.append(f"systemctl disable --now -- {units} || true")
    # the template module's backups (<dest>.prev) go with their files
    steps.append("rm -f -- " + " ".join(f"{quote(p)} {quote(p + '.prev')}" for p in take.remove))
    if take.units:
        steps.append("systemctl daemon-reload")
    return " && ".join(steps)


def unit_states(conn: Any, units: Sequence[str]) -> dict[str, dict[str, str]]:
    """unit -> ``{"active": ActiveState, "invocation": InvocationID}`` now, one round trip
    (the shape of the facts probe's ``state.invocations``)."""
    from vllm_provision.state import invocation_script

    result = conn.run(invocation_script(units, active=True))
    found: dict[str, dict[str, str]] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "@@unit":
            found[parts[1]] = {"active": parts[2],
                               "invocation": parts[3] if len(parts) > 3 else ""}
    return found


def vet(inventory: Inventory, take: TakeOver, planned: Sequence[str], conn: Any
        ) -> Problem | None:
    """The problem when the old owner's record names, on ``take``'s host, a unit or file that
    no ``up`` of ours installs, else None (one read on ``conn``).

    The record is the host's word, not ours: a file must be absolute, normal and lie directly
    in a folder we write (``vllm_prune.our_folders``), a unit name must be a unit name, and a
    unit's file and every listed unit file must begin with our marker line (the roles' unit
    templates; ``state.prune.MARKER``). Otherwise ``--take-over`` would run ``systemctl
    disable --now`` and ``rm -f`` as root on whatever an edited record lists.
    """
    from vllm_provision.modules.vllm_prune import our_folders
    from vllm_provision.state import prune

    host = take.conflict.host
    node = next((n for r in inventory.replicas for n in r.nodes if n.name == host), None)
    if node is None or not take.remove:
        return None
    listed = prune.Installed(host, node.rank, "", take.units, take.remove)
    _, strange = prune.trusted(listed, our_folders(node, planned))
    result = conn.run(prune.state_script(take.units, take.remove))
    if not result.ok:
        return Problem(host, "cannot read the old owner's units and files before taking over",
                       actual=(result.stderr or result.stdout).strip()[-300:])
    entries = [*strange, *prune.foreign(result.stdout)]
    if not entries:
        return None
    return Problem(host, "`--take-over` refused: " + prune.refusal_text(host, entries),
                   expected="units and files of ours in the old owner's record",
                   actual=", ".join(entries)[:300])


def refusal(conflicts: Sequence[Conflict], command: str) -> ProvisionError:
    """The error of a run that meets hosts of another owner without ``--take-over``."""
    return ProvisionError([Problem(
        item.host, f"`provision {command}` refused: {item.describe()}; nothing was changed",
        expected=f"replica id {item.replica_id}, or no owner",
        actual=f"replica id {item.owner.replica_id or 'none (an older record, another path)'}",
        fix=take_over_fix(item)) for item in conflicts])


def guard(inventory: Inventory, hosts: Sequence[str], plays_files: Mapping[str, Sequence[str]],
          connections: Mapping[str, Any], *, command: str, take_over: bool,
          check_mode: bool, echo: Callable[[str], None],
          records: Mapping[str, str | None] | None = None) -> list[TakeOver]:
    """Read the targeted nodes' records; refuse, or take the hosts over.

    Args:
        inventory: the run's inventory. hosts: the host names the run targets.
        plays_files: host -> paths this inventory's ``up`` installs there
            (``managed.managed_files`` of the install plays).
        connections: open connections by host name (hosts missing here are skipped: the run
            reports them unreachable).
        command: ``up``, ``restart`` or ``down`` (for the message).
        take_over: ``--take-over`` was given. check_mode: ``--check`` (remove nothing).
        echo: prints one human line.
        records: host name -> its record's text as the run lock read it under the lock
            (``LendingFactory.records``; None: no record); a host absent here is read now.

    Returns:
        One :class:`TakeOver` per host taken over (empty when every host is ours).

    Raises:
        ProvisionError: a host of another owner without ``take_over`` (nothing changed), or a
            removal that failed on a host.
    """
    from vllm_provision.state import (
        host_record_path,
        inventory_identity,
        parse_record,
        read_host_record,
    )

    identity = inventory_identity(inventory.path)
    known = records or {}
    wanted = set(hosts)
    conflicts: list[Conflict] = []
    for replica in inventory.replicas:
        for node in replica.nodes:
            if node.name not in wanted or node.name not in connections:
                continue
            conn = connections[node.name]
            path = host_record_path(node.host.vars)
            try:
                if node.name in known:  # read by the run lock, under it
                    text = known[node.name]
                    record = None if text is None else parse_record(text, f"{node.name}:{path}")
                else:
                    record = read_host_record(conn, path)
            except ProvisionError:
                record = None  # not a record we can read: nobody's (drift reports it)
            owner: HostOwner | None = parse_owner(node.name, {"record": record}, [])
            if owner is not None and owner.started and not same_owner(replica, owner, identity):
                owner = parse_owner(node.name, {"record": record, "invocations": unit_states(
                    conn, sorted(owner.started))}, [])
            found = conflict(replica, node.name, owner, identity)
            if found is not None:
                conflicts.append(found)
    if not conflicts:
        return []
    if not take_over:
        raise refusal(conflicts, command)
    plans = [plan_take_over(item, plays_files.get(item.host, ())) for item in conflicts]
    refused = [p for take in plans if (p := vet(inventory, take, plays_files.get(
        take.conflict.host, ()), connections[take.conflict.host])) is not None]
    if refused:  # checked on every host before anything is removed on any
        raise ProvisionError(refused)
    problems: list[Problem] = []
    for take in plans:
        for line in take.lines(check_mode):
            echo(line)
        if check_mode or not take.remove:
            continue
        result = connections[take.conflict.host].run(removal_script(take))
        if not result.ok:
            problems.append(Problem(take.conflict.host, "taking the host over failed",
                                    actual=(result.stderr or result.stdout).strip()[-300:]))
    if problems:
        raise ProvisionError(problems)
    return plans
