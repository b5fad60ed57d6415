"""What an earlier ``provision up`` installed that the new plan no longer has (pure).

Terraform's rule for resources removed from the configuration: they are part of the plan, as
removals. ``provision up`` compares what the host's state record says an earlier ``up`` installed
(:class:`Installed`: the backend's units in start order, every installed file) with what this
plan installs, and before the new backend's units start it

- stops every unit of the old plan that the new plan no longer has, and, when the replica's
  backend changed, also the old backend's units the new plan keeps under the same name (they run
  the old backend's configuration: "must be replaced", destroy before create); in the old
  backend's stop order (:func:`stop_waves`);
- disables the units it no longer has, removes their files and every other file the new plan
  no longer installs (with the template module's ``.prev`` backups), then reloads systemd.

``provision down --purge`` removes everything the record lists (:func:`purge`). Records written
before the record held ``units`` give their units from the unit files among ``files``; a host
without a record falls back to the unit names every registered backend would install there
(docs/deploy.md, "What `down --purge` removes").
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_provision.core.paths import UNIT_MARKER
from vllm_provision.core.quoting import quote


@dataclass(frozen=True)
class Installed:
    """What one host holds of one plan, from its state record or from the new plan.

    Attributes:
        host: the host's name. rank: its node rank (0 serves the API).
        backend: the replica's backend name (``mp``).
        units: the backend's units on the host, in start order (``Backend.node_units``).
        files: every installed path (unit files, env files, the watchdog's files).
    """

    host: str
    rank: int
    backend: str
    units: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    @property
    def all_units(self) -> tuple[str, ...]:
        """The backend's units, then any other unit whose file is installed (the watchdog)."""
        return (*self.units, *(u for u in unit_names(self.files) if u not in self.units))


def unit_names(paths: Iterable[str]) -> list[str]:
    """The unit names among installed paths: the file names of ``*.service`` files, sorted."""
    return sorted({posixpath.basename(p) for p in paths if p.endswith(".service")})


@dataclass(frozen=True)
class HostRemoval:
    """What leaves one host.

    Attributes:
        host: the host. stop: units stopped before the new units start (removed or replaced).
        units: units disabled and removed (not in the new plan). files: paths removed, sorted
            (unit files included).
    """

    host: str
    stop: tuple[str, ...] = ()
    units: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.stop or self.units or self.files)


@dataclass(frozen=True)
class Removal:
    """What leaves the hosts of one replica, and in which order the units stop.

    Attributes:
        hosts: host -> :class:`HostRemoval` (hosts with nothing to remove are left out).
        waves: ``(host, unit)`` groups in stop order; the units of one wave stop together.
        replaced: the backend changed (``old -> new``), or ``""``.
    """

    hosts: Mapping[str, HostRemoval] = field(default_factory=dict)
    waves: tuple[tuple[tuple[str, str], ...], ...] = ()
    replaced: str = ""

    def __bool__(self) -> bool:
        return bool(self.hosts)


def stop_waves(old: Sequence[Installed], stop: Mapping[str, Sequence[str]],
               ) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The order the units of ``stop`` go down, from the old plan (pure).

    The rule is ``provision down``'s (playbooks/down.yml and each backend's ``plays/down.yml``):
    first units outside the backend's own (a renamed watchdog: it watches the others), then rank
    0's last unit (the one that serves: no request reaches a group that is coming apart, and no
    rank 0 waits on followers that are gone), then every follower's units (reverse start order,
    the followers together), then rank 0's other units in reverse start order (the rendezvous
    the followers joined: Ray's head). mp: the master, then the headless followers; Ray: vLLM,
    the workers, the head.

    Args:
        old: what the earlier plan installed, one per host.
        stop: host -> the units to stop there (others of the host are left running).
    """
    waves: list[list[tuple[str, str]]] = []

    def add(items: list[tuple[str, str]]) -> None:
        if items:
            waves.append(items)

    wanted = {host: set(units) for host, units in stop.items()}
    by_rank = sorted(old, key=lambda item: (item.rank, item.host))
    add([(i.host, u) for i in by_rank for u in i.all_units
         if u not in i.units and u in wanted.get(i.host, ())])
    heads = [i for i in by_rank if i.rank == 0]
    followers = [i for i in by_rank if i.rank != 0]
    add([(i.host, i.units[-1]) for i in heads
         if i.units and i.units[-1] in wanted.get(i.host, ())])
    depth = max((len(i.units) for i in followers), default=0)
    for position in range(depth):
        add([(i.host, i.units[-1 - position]) for i in followers
             if position < len(i.units) and i.units[-1 - position] in wanted.get(i.host, ())])
    for position in range(2, 1 + max((len(i.units) for i in heads), default=0)):
        add([(i.host, i.units[-position]) for i in heads
             if position <= len(i.units) and i.units[-position] in wanted.get(i.host, ())])
    return tuple(tuple(wave) for wave in waves)


def diff(old: Mapping[str, Installed], new: Mapping[str, Installed]) -> Removal:
    """What of ``old`` the new plan no longer has, and the stop order (pure).

    Args:
        old: host -> what its state record says an earlier ``up`` installed (hosts without a
            record are left out).
        new: host -> what this plan installs there (a host of ``old`` missing here is left
            alone: the run does not target it).

    Returns:
        The :class:`Removal`: on each host, the old units the new plan lacks (stopped, disabled,
        removed) and, when the backend changed, the old backend's units it keeps (stopped
        only); the old files it no longer installs.
    """
    hosts: dict[str, HostRemoval] = {}
    stops: dict[str, list[str]] = {}
    changed = sorted({f"{o.backend} -> {new[h].backend}" for h, o in old.items()
                      if h in new and o.backend and o.backend != new[h].backend})
    for host, before in old.items():
        if host not in new:
            continue
        after = new[host]
        keep_units = set(after.all_units)
        gone = tuple(u for u in before.all_units if u not in keep_units)
        replaced = tuple(u for u in before.units if u in keep_units
                         and before.backend and before.backend != after.backend)
        files = tuple(sorted(set(before.files) - set(after.files)))
        stop = tuple(u for u in before.all_units if u in gone or u in replaced)
        item = HostRemoval(host, stop, gone, files)
        if item:
            hosts[host] = item
            stops[host] = list(stop)
    waves = stop_waves([old[h] for h in hosts], stops)
    return Removal(hosts, waves, ", ".join(changed))


def purge(installed: Installed) -> HostRemoval:
    """Everything of ``installed`` (``provision down --purge``): every unit stopped, disabled
    and removed, every file removed (pure)."""
    units = installed.all_units
    return HostRemoval(installed.host, units, units, tuple(sorted(set(installed.files))))


def from_record(host: str, entry: Mapping[str, Any] | None, backend: str,
                known_units: Sequence[str] = ()) -> Installed | None:
    """The :class:`Installed` of one host's record entry (pure), or None without an entry.

    Args:
        host: the host. entry: its ``hosts[<host>]`` entry of the record.
        backend: the record's backend of the host's replica (``""`` when unknown).
        known_units: the units in start order to assume when the entry has no ``units`` (a
            record of an earlier version): those of them whose file the entry lists keep this
            order; the other unit files it lists follow.
    """
    if not isinstance(entry, Mapping):
        return None
    files = tuple(str(p) for p in (entry.get("files") or {}))
    recorded = entry.get("units")
    if isinstance(recorded, list):
        units = tuple(str(u) for u in recorded)
    else:
        present = set(unit_names(files))
        units = tuple(u for u in known_units if u in present)
    rank = entry.get("rank")
    return Installed(host, int(rank) if isinstance(rank, int) else 0, backend, units, files)


# systemd.unit(5): unit names are [A-Za-z0-9:_.\-@] plus a type suffix.
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|timer|mount|path|slice)$")


def trusted(installed: Installed, folders: Iterable[str]) -> tuple[Installed, tuple[str, ...]]:
    """``installed`` without what no ``up`` of ours could have installed (pure): a record is
    read from the host, so a path is removed only when it is absolute and normal (no ``..``, no
    ``//``) and lies directly in one of ``folders`` (the unit folder, the env-file and watchdog
    folders, the folders of the plan's files), and a unit only when its name is a unit name.

    Returns:
        ``(what may be removed, the refused paths and names)``.
    """
    where = {f.rstrip("/") for f in folders if f.startswith("/") and f.rstrip("/")}
    keep: list[str] = []
    refused: list[str] = []
    for path in installed.files:
        ok = (path.startswith("/") and posixpath.normpath(path) == path
              and posixpath.dirname(path) in where)
        (keep if ok else refused).append(path)
    units: list[str] = []
    for unit in installed.units:
        (units if _UNIT_RE.match(unit) else refused).append(unit)
    return replace(installed, units=tuple(units), files=tuple(keep)), tuple(refused)


# -- on a host ---------------------------------------------------------------------------------

# The line every unit file this product installs carries in its first 3 lines (core/paths.py).
MARKER = UNIT_MARKER
# The unit types a record may name (systemd.unit(5)); a listed file with one of these suffixes
# is a unit file and must carry MARKER.
UNIT_SUFFIXES = (".service", ".socket", ".target", ".timer", ".mount", ".path", ".slice")
# Shell: m=ours|foreign|none for the file "$f" (ours: MARKER in its first 3 lines).
_MARK = ('if [ -z "$f" ] || [ ! -f "$f" ]; then m=none; '
         f"elif head -n 3 -- \"$f\" | grep -qF -- {quote(MARKER)}; then m=ours; "
         "else m=foreign; fi")


def state_script(units: Sequence[str], files: Sequence[str]) -> str:
    """Shell printing ``@@unit <unit> <ActiveState> <UnitFileState>`` per unit and ``@@file
    <path>`` per existing path (read-only, one round trip); and ``@@foreign <unit or path>``
    for each unit whose unit file (systemd's ``FragmentPath``) and each listed unit file that
    does not carry :data:`MARKER`: not ours, whatever a record says (:func:`foreign`)."""
    parts = []
    if units:
        parts.append(f"for u in {' '.join(quote(u) for u in units)}; do "
                     'a=$(systemctl show -p ActiveState --value -- "$u"); '
                     'e=$(systemctl show -p UnitFileState --value -- "$u"); '
                     'f=$(systemctl show -p FragmentPath --value -- "$u"); '
                     f'{_MARK}; [ "$m" = foreign ] && echo "@@foreign $u"; '
                     'echo "@@unit $u ${a:-unknown} ${e:-none}"; done')
    if files:
        parts.append(f"for p in {' '.join(quote(p) for p in files)}; do "
                     '[ -e "$p" ] || continue; echo "@@file $p"; '
                     f'case "$p" in {"|".join("*" + x for x in UNIT_SUFFIXES)}) '
                     f'f=$p; {_MARK}; [ "$m" = foreign ] && echo "@@foreign $p";; esac; done')
    return "; ".join(parts + ["true"])


def foreign(stdout: str) -> list[str]:
    """The units and unit files that :func:`state_script` found without our :data:`MARKER`,
    in the order printed: a record that names them was not written by an ``up`` of ours (or
    was edited), so nothing it lists on that host may be stopped or removed."""
    return [line[len("@@foreign "):] for line in stdout.splitlines()
            if line.startswith("@@foreign ")]


def refusal_text(host: str, entries: Sequence[str]) -> str:
    """The message for a host whose record names what is not ours (``entries``: units and
    paths, as :func:`trusted` and :func:`foreign` give them)."""
    shown = ", ".join(repr(e)[:120] for e in entries[:8])
    more = f" and {len(entries) - 8} more" if len(entries) > 8 else ""
    return (f"the state record on {host} names {shown}{more}, which no `up` of ours installs "
            "(a unit or file outside the folders we write, or a unit file without the line "
            f"{MARKER!r}); nothing on {host} was stopped or removed. Check who edited "
            "/var/lib/vllm-provision/state.json there, fix or remove it, and run again")


def parse_state(stdout: str) -> tuple[dict[str, tuple[str, str]], set[str]]:
    """:func:`state_script` output -> ``(unit -> (ActiveState, UnitFileState), existing
    paths)``."""
    units: dict[str, tuple[str, str]] = {}
    files: set[str] = set()
    for line in stdout.splitlines():
        parts = line.split(" ")
        if len(parts) >= 4 and parts[0] == "@@unit":
            units[parts[1]] = (parts[2], parts[3])
        elif len(parts) >= 2 and parts[0] == "@@file":
            files.add(line[len("@@file "):])
    return units, files


ACTIVE = frozenset({"active", "activating", "deactivating", "reloading"})


def present(item: HostRemoval, units: Mapping[str, tuple[str, str]],
            files: set[str]) -> HostRemoval:
    """``item`` narrowed to what is there now (pure): running units to stop, units with a unit
    file to disable, existing files to remove."""
    stop = tuple(u for u in item.stop if units.get(u, ("", ""))[0] in ACTIVE)
    gone = tuple(u for u in item.units
                 if units.get(u, ("", ""))[1] not in ("", "none", "not-found"))
    return HostRemoval(item.host, stop, gone, tuple(p for p in item.files if p in files))


def stop_script(units: Sequence[str]) -> str:
    """``systemctl stop`` of ``units`` (one call; they stop together)."""
    return "systemctl stop -- " + " ".join(quote(u) for u in units)


def removal_script(units: Sequence[str], files: Sequence[str]) -> str:
    """Shell that disables ``units`` (stopping any still running), removes ``files`` and their
    ``.prev`` backups (each ``rm`` is one unlink(2): a file is there or gone, never half), then
    reloads systemd; ``true`` when there is nothing to do. ``units`` are those with a unit file
    (:func:`present`): ``disable`` of a unit without one fails."""
    steps = []
    if units:
        steps.append("systemctl disable --now -- " + " ".join(quote(u) for u in units))
    if files:
        steps.append("rm -f -- " + " ".join(f"{quote(p)} {quote(p + '.prev')}" for p in files))
    if units or any(p.endswith(".service") for p in files):
        steps.append("systemctl daemon-reload")
    return " && ".join(steps) or "true"


def lines(removal: Removal, *, check_mode: bool, host: str | None = None,
          purge: bool = False) -> list[str]:
    """Human lines: the backend change, the stop order, then each unit and file removed (on
    ``host`` only, when given; ``purge``: everything goes, not only what left the plan)."""
    verb = "would " if check_mode else ""
    why = "" if purge else " (not in the plan)"
    out = []
    if removal.replaced:
        out.append(f"backend {removal.replaced}: the old backend's units are replaced")
    if removal.waves:
        out.append(f"{verb}stop " + ", then ".join(
            " and ".join(f"{unit} on {name}" for name, unit in wave) for wave in removal.waves))
    for name, item in removal.hosts.items():
        if host is None or name == host:
            out += [f"{verb}remove unit {u} on {name}{why}" for u in item.units]
            out += [f"{verb}remove {p} on {name}" for p in item.files]
    return out


def removal_diff(item: HostRemoval) -> str:
    """A unified-diff header per removed path (``--- path`` / ``+++ /dev/null``); contents are
    left out (an env file holds the API key)."""
    return "".join(f"--- {p}\n+++ /dev/null (removed: not in the plan)\n" for p in item.files)
