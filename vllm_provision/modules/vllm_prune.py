"""Stop and remove what an earlier ``up`` installed that the plan no longer has (controller).

Runs once per play batch on the controller, over the run's connections. For every replica of
the play it compares each node's state record (what an earlier ``provision up`` installed:
``vllm_provision.state.prune.Installed``) with what this plan installs there, and

- stops, in the old backend's stop order, every unit the plan no longer has, and, when the
  replica's backend changed, the old backend's units the plan keeps under the same name (they run
  the old configuration);
- disables those units, removes their files and the other files the plan no longer installs,
  then reloads systemd.

It runs after preflight and before the install plays of ``provision up``, so the old backend is
down before the new one starts (``vllm_provision.state.prune``). With ``purge: true`` (``provision
down --purge``) it removes everything the record lists, else, on a host without a record, the
units every registered backend would install there and the two folders of ours; see
docs/deploy.md, "What `down --purge` removes". In check mode it reads the hosts and reports what
it would stop and remove (with ``--diff``: one ``--- path`` / ``+++ /dev/null`` per file).

Example task::

    - name: Stop, disable and remove units and files no longer in the plan
      vllm_prune: {}
      run_once: true
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_provision import backends
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Node, Replica
from vllm_provision.core.results import Status
from vllm_provision.facts.gather import parse_owner
from vllm_provision.facts.model import HostOwner
from vllm_provision.modules import ModuleResult, quote
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext
from vllm_provision.modules.systemd import STOPPED_IN_CHECK
from vllm_provision.runner import managed
from vllm_provision.settings import variables
from vllm_provision.state import prune

RUNS_ON = "controller"
ARGUMENT_SPEC = ArgumentSpec("vllm_prune", (
    Argument("purge", "bool", "remove everything an up installed (down --purge), not only what "
             "the plan no longer has", default=False),
))


def role_value(node: Node, name: str) -> str:
    """A role default a node's inventory variables may override (``vllm_unit_dir``)."""
    value = node.host.vars.get(name)
    return str(value if value is not None else variables.role_defaults().get(name, ""))


def owner_of(ctx: ModuleContext, node: Node) -> HostOwner | None:
    """The node's state record, from the facts preflight gathered, else read now."""
    from vllm_provision.state import host_record_path, read_host_record

    facts = ctx.facts.get(node.name)
    if facts is not None and getattr(facts, "owner", None) is not None:
        return facts.owner  # type: ignore[no-any-return]
    try:
        record = read_host_record(ctx.connections[node.name], host_record_path(node.host.vars))
    except ProvisionError:
        return None  # not a record we can read: nothing of it is trusted
    return parse_owner(node.name, {"record": record}, [])


def recorded(replica: Replica, node: Node, owner: HostOwner | None) -> prune.Installed | None:
    """What the record says an earlier ``up`` installed on ``node`` (None: no record). A record
    without ``units`` (an earlier version) takes the order of its backend's units here."""
    if owner is None or not owner.files and owner.units is None:
        return None
    old = backends.find(owner.backend)
    known = old.node_units(replica, node, node.host.vars) if old is not None else []
    entry = {"files": dict(owner.files), "rank": owner.rank if owner.rank is not None
             else node.rank}
    if owner.units is not None:
        entry["units"] = list(owner.units)
    return prune.from_record(node.name, entry, owner.backend, known)


def known_names(replica: Replica, node: Node) -> prune.Installed:
    """Without a record: the units every registered backend would install on ``node`` and the
    watchdog's, in ``vllm_unit_dir`` (the names ``down --purge`` removed before records held
    them)."""
    units: list[str] = []
    for name in backends.names():
        for unit in backends.get(name).node_units(replica, node, node.host.vars):
            if unit not in units:
                units.append(unit)
    unit_dir = role_value(node, "vllm_unit_dir").rstrip("/")
    watchdog = role_value(node, "vllm_watchdog_unit_name")
    files = tuple(f"{unit_dir}/{u}" for u in (*units, watchdog))
    return prune.Installed(node.name, node.rank, "", tuple(units), files)


def planned(ctx: ModuleContext, replicas: list[Replica]) -> dict[str, prune.Installed]:
    """What this plan installs on each node: its backend's units, the install plays' files."""
    from vllm_provision import resources
    from vllm_provision.runner.playbook import load_playbook

    install = managed.install_plays(load_playbook(resources.playbook("up")))
    files = managed.managed_files(ctx.inventory, install)
    return {node.name: prune.Installed(
        node.name, node.rank, replica.backend,
        tuple(replica.backend_type.node_units(replica, node, node.host.vars)),
        tuple(sorted(set((files.get(node.name) or {}).values()))))
        for replica in replicas for node in replica.nodes}


def our_folders(node: Node, planned_files: Sequence[str] = ()) -> list[str]:
    """The folders a recorded file of ours may lie in on ``node``: the unit, config (env files),
    watchdog and service state (the Ray token file) folders and the node exporter's drop-in
    folder (``<vllm_unit_dir>/<vllm_node_exporter_service>.d``, role vllm_monitoring) as the
    node's variables set them and as the roles' defaults do (a record written before the
    operator moved them, or while monitoring was on), and the folders of ``planned_files``
    (what this plan installs there)."""
    names = ("vllm_unit_dir", "vllm_config_dir", "vllm_watchdog_dir", "vllm_state_dir")
    defaults = variables.role_defaults()

    def drop_in(unit_dir: str, service: str) -> str:
        return posixpath.join(unit_dir, f"{service}.d") if unit_dir and service else ""

    return [*(role_value(node, n) for n in names), *(str(defaults.get(n, "")) for n in names),
            drop_in(role_value(node, "vllm_unit_dir"),
                    role_value(node, "vllm_node_exporter_service")),
            drop_in(str(defaults["vllm_unit_dir"]), str(defaults["vllm_node_exporter_service"])),
            *(posixpath.dirname(p) for p in planned_files)]


def _folders(node: Node, new: Mapping[str, prune.Installed]) -> list[str]:
    mine = new.get(node.name)
    return our_folders(node, mine.files if mine else ())


def _folders_script(node: Node, with_record: bool) -> str:
    folders = [role_value(node, "vllm_config_dir"), role_value(node, "vllm_watchdog_dir")]
    words = " ".join(quote(f) for f in folders if f.startswith("/") and f.rstrip("/"))
    # the node exporter's drop-in folder holds the operator's drop-ins too: removed only empty
    drop_in = posixpath.join(role_value(node, "vllm_unit_dir"),
                             role_value(node, "vllm_node_exporter_service") + ".d")
    if_empty = f"rmdir --ignore-fail-on-non-empty -- {quote(drop_in)} 2>/dev/null; " \
        if drop_in.startswith("/") else ""
    if not words:
        return if_empty + "true"
    if with_record:  # only what the record listed went; the folders go when left empty
        return if_empty + f"for d in {words}; do [ -d \"$d\" ] && rmdir " \
               "--ignore-fail-on-non-empty -- \"$d\"; done; true"
    return if_empty + f"rm -rf -- {words}"


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Stop, disable and remove; see the module docstring.

    Returns:
        ModuleResult: ``ok`` when nothing of an earlier plan is left over, ``changed`` (would,
        in check mode) with one result per host that changed, ``failed`` on the hosts where a
        stop or removal failed (the message carries systemctl's error). ``data``: ``removal``
        per replica (``replica``, ``replaced``, ``waves`` as ``[[host, unit], ...]``,
        ``units``/``files`` by host).
    """
    values = ARGUMENT_SPEC.validate(args)
    purge = bool(values["purge"])
    replicas = [r for r in ctx.inventory.replicas
                if any(node.name in ctx.connections for node in r.nodes)]
    if not replicas:
        return ModuleResult(Status.SKIPPED, "no replica among the play's hosts")
    new = {} if purge else planned(ctx, replicas)
    refused: dict[str, tuple[str, ...]] = {}
    host_results: dict[str, ModuleResult] = {}
    summaries: list[dict[str, Any]] = []
    failed = False
    for replica in replicas:
        nodes = [n for n in replica.nodes if n.name in ctx.connections]
        old: dict[str, prune.Installed] = {}
        with_record: set[str] = set()
        for node in nodes:
            found = recorded(replica, node, owner_of(ctx, node))
            if found is not None:
                found, refused[node.name] = prune.trusted(found, _folders(node, new))
                old[node.name] = found
                with_record.add(node.name)
            elif purge:
                old[node.name] = known_names(replica, node)
        if purge:
            removal = prune.Removal({h: prune.purge(i) for h, i in old.items()},
                                    prune.stop_waves(list(old.values()),
                                                     {h: i.all_units for h, i in old.items()}))
        else:
            removal = prune.diff(old, new)
        # narrowed to what is on the hosts now (one read each): a unit already gone is no change
        # a record is read from the host: one that names what is not ours refuses its host
        # whole (nothing there is stopped or removed); the other hosts go on
        now: dict[str, prune.HostRemoval] = {}
        refusals: dict[str, str] = {}
        for host, item in removal.hosts.items():
            result = ctx.connections[host].run(prune.state_script(
                sorted(set(item.stop) | set(item.units)), item.files))
            if not result.ok:
                raise ProvisionError.single(host, "cannot read the units and files to remove",
                                            actual=(result.stderr or result.stdout)[-300:])
            strange = [*refused.get(host, ()), *prune.foreign(result.stdout)]
            if strange and host in with_record:
                refusals[host] = prune.refusal_text(host, strange)
                continue
            units, files = prune.parse_state(result.stdout)
            narrowed = prune.present(item, units, files)
            if narrowed:
                now[host] = narrowed
        for host, text in refusals.items():  # also when the record lists nothing else
            host_results[host] = ModuleResult(Status.FAILED, text)
            failed = True
        waves = tuple(tuple(t for t in wave if t[0] in now and t[1] in now[t[0]].stop)
                      for wave in removal.waves)
        removal = prune.Removal(now, tuple(w for w in waves if w), removal.replaced)
        if ctx.check_mode:
            for host, item in removal.hosts.items():
                ctx.run_state.setdefault(host, {}).setdefault(STOPPED_IN_CHECK, set()).update(
                    item.stop)
        errors = {} if ctx.check_mode else _apply(ctx, replica, removal, purge, with_record)
        failed = failed or bool(errors)
        summary = {"replica": replica.name, "replaced": removal.replaced,
                   "waves": [[list(t) for t in wave] for wave in removal.waves],
                   "units": {h: list(i.units) for h, i in removal.hosts.items()},
                   "files": {h: list(i.files) for h, i in removal.hosts.items()}}
        if removal:
            summaries.append(summary)
        for node in nodes:
            mine_item = removal.hosts.get(node.name)
            if node.name in refusals:
                continue
            if node.name in errors:
                host_results[node.name] = ModuleResult(Status.FAILED, errors[node.name],
                                                       data={"removal": summary})
            elif mine_item:
                mine = prune.lines(removal, check_mode=ctx.check_mode, host=node.name,
                                   purge=purge)
                host_results[node.name] = ModuleResult(
                    Status.CHANGED, "; ".join(mine), diff=prune.removal_diff(mine_item)
                    if ctx.diff_mode else "",
                    data={"removal": summary} if node.name == replica.master.name
                    or replica.master.name not in removal.hosts else None)
            else:
                host_results[node.name] = ModuleResult(
                    Status.OK, "nothing of an earlier plan is left over" if not purge
                    else "nothing of ours is left")
    status = Status.FAILED if failed else (Status.CHANGED if summaries else Status.OK)
    return ModuleResult(status, f"{len(summaries)} replica(s) with units or files to remove",
                        data={"removals": summaries}, host_results=host_results)


def _apply(ctx: ModuleContext, replica: Replica, removal: prune.Removal, purge: bool,
           recorded_hosts: set[str]) -> dict[str, str]:
    """Stop wave by wave, then disable and remove on each host; host -> error text."""
    errors: dict[str, str] = {}
    for wave in removal.waves:
        by_host: dict[str, list[str]] = {}
        for host, unit in wave:
            by_host.setdefault(host, []).append(unit)
        for host, units in by_host.items():
            result = ctx.connections[host].run(prune.stop_script(units))
            if not result.ok:
                errors[host] = (f"cannot stop {', '.join(units)} (the old plan's units): "
                                + (result.stderr or result.stdout).strip()[-300:])
        if errors:  # the rest of the old plan keeps running: nothing half-removed
            return errors
    for node in replica.nodes:
        item = removal.hosts.get(node.name)
        script = prune.removal_script(item.units, item.files) if item else "true"
        if purge:
            script += " && " + _folders_script(node, node.name in recorded_hosts)
        if script == "true" or node.name not in ctx.connections:
            continue
        result = ctx.connections[node.name].run(script)
        if not result.ok:
            errors[node.name] = ("cannot remove the units and files no longer in the plan: "
                                 + (result.stderr or result.stdout).strip()[-300:])
    return errors
