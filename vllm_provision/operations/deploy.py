"""The deploy operation: ``provision up``, ``down`` and ``restart`` as one pipeline.

One call of :func:`run` does, in this order (docs/deploy.md; docs/architecture.md, "Rooms"):

1. **lock**: open the run's connections and take the run lock on every host the playbook may
   touch (:func:`vllm_provision.transport.runlock.locked_run`); every later step lends these
   connections;
2. **approval**: a run that may stop a serving replica is dry-run first, its plan shown, and
   asked (:mod:`vllm_provision.operations.approval`);
3. **ownership guard**: hosts another replica (another replica id) deployed are refused, or
   taken over with ``--take-over`` (:mod:`vllm_provision.operations.takeover`);
4. **apply and verify**: the playbook runs once in the engine (preflight, install, start in
   order, readiness, one completion);
5. **state record**: a verified ``up`` records who owns the hosts now
   (:func:`vllm_provision.operations.record.record_after_up`).

The playbook is loaded once, and ``up.yml`` (whose install plays name the managed files the
guard and the record read) at most once more, for ``down`` and ``restart``. The command module
(``vllm_provision.cli.up``) only parses options, prints and exits.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vllm_provision import resources, settings, state
from vllm_provision.checks.options import probe_for, replicas_on
from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Host, Inventory
from vllm_provision.core.results import Status, TaskResult
from vllm_provision.facts import gather
from vllm_provision.modules.vllm_preflight import GATHERED, GATHERED_WITH
from vllm_provision.modules.vllm_wait_ready import replica_units
from vllm_provision.operations import approval, takeover
from vllm_provision.operations.plan import build_plan, plan_lines
from vllm_provision.operations.record import record_after_up
from vllm_provision.output import report
from vllm_provision.runner import managed
from vllm_provision.runner.engine import Runner, RunOptions
from vllm_provision.runner.playbook import load_playbook
from vllm_provision.settings.masking import Masker
from vllm_provision.state import ray_token
from vllm_provision.transport import runlock
from vllm_provision.transport.connection import ConnectionOptions, close_all, open_connections

# The playbooks' ``register`` names of the readiness and verify tasks (playbooks/up.yml,
# restart.yml): stable handles, where task names are prose.
SERVING_REGISTERS = ("vllm_ready", "vllm_verified")
SERVING_KEYS = ("completion", "served_model", "ttft_s", "completion_s", "start_to_serving_s",
                "start_to_serving_reason", "vllm_version", "already_serving", "phase_s",
                "over_budget")
# The ``register`` name of the preflight task (playbooks/up.yml, restart.yml).
PREFLIGHT_REGISTER = "vllm_preflight"
COMMANDS = ("up", "down", "restart")


@dataclass(frozen=True)
class Deploy:
    """What a deploy command asks for, parsed and validated.

    Attributes:
        command: ``up``, ``down`` or ``restart`` (the playbook ``playbooks/<command>.yml``).
        inventory: the loaded inventory (its extra variables already hold
            :func:`run_vars`).
        connection: the run's connection options.
        limit: the ``--limit`` pattern, or None.
        check / diff: ``--check`` (dry run) and ``--diff``.
        take_over: ``--take-over``: take over hosts another replica (another replica id) deployed.
        assume_yes: ``--yes``: approve without asking.
        verbosity: the count of ``-v`` (for the reporter's detail).
        rotate_ray_token: ``restart --rotate-ray-token``: a new Ray token for each targeted
            Ray replica with ``vllm_ray_auth: token`` before the run (not in check mode).
    """

    command: str
    inventory: Inventory
    connection: ConnectionOptions
    limit: str | None = None
    check: bool = False
    diff: bool = False
    take_over: bool = False
    assume_yes: bool = False
    verbosity: int = 0
    rotate_ray_token: bool = False


@dataclass
class DeployOutcome:
    """What a deploy did, for the command to print.

    Attributes:
        summary: the ``--json`` object (``vllm_provision.output.report.summarize`` plus the
            serving keys, ``replicas``, ``plan``, ``take_over``, ``state_record``, ``stats``).
        replicas: one entry per targeted replica (:func:`replica_results`).
        exit_code: 0, 1, or 2 for pending changes in check mode.
        declined: the operator answered no to the approval (nothing was changed; exit 1).
    """

    summary: dict[str, Any] = field(default_factory=dict)
    replicas: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int = 0
    declined: bool = False


def measured_starts(replicas: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Replica name -> the start to serving this run measured (seconds; None: not measured),
    for the state record (:func:`vllm_provision.state.serving_record`), from
    :func:`replica_results`' entries.

    A replica found serving at the readiness wait's first poll (``already_serving``) was not
    started by this run: its ``start_to_serving_s`` is how long its units have been up, not a
    start, and recording it would make the next plan's outage estimate ("about N s, its last
    start to serving", docs/deploy.md) as long as the replica's uptime. It is left out, so the
    record keeps the last real measurement.
    """
    return {entry["name"]: entry["start_to_serving_s"] for entry in replicas
            if "start_to_serving_s" in entry and not entry.get("already_serving")}


def measured_phases(replicas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Replica name -> node -> phase -> seconds of the start this run measured (the readiness
    wait's ``phase_s``), for the same replicas as :func:`measured_starts`."""
    return {entry["name"]: entry.get("phase_s") or {} for entry in replicas
            if "start_to_serving_s" in entry and not entry.get("already_serving")}


def run_vars(skip_checks: Sequence[str], take_over: bool) -> dict[str, Any]:
    """The extra variables a deploy adds to the inventory's before it loads: ``--skip-check``
    (:func:`skip_check_vars`), and with ``--take-over`` the ``ownership`` check skipped too (it
    would still read the old owner's record)."""
    return skip_check_vars((*skip_checks, "ownership") if take_over else tuple(skip_checks))


def skip_check_vars(skip_checks: tuple[str, ...]) -> dict[str, Any]:
    """The extra variables that carry ``--skip-check NAME ...`` to the preflight task:
    ``skip_checks``, which ``modules/vllm_preflight.py`` adds to the task's own list and to the
    inventory's ``preflight_skip_checks`` (so neither replaces the other)."""
    return {"skip_checks": list(skip_checks)} if skip_checks else {}


def rotation_targets(inventory: Inventory, hosts: Iterable[str]) -> list[str]:
    """The replicas ``restart --rotate-ray-token`` gives a new token (pure): those with a node
    among ``hosts`` (the run's, after ``--limit``) that take a Ray token
    (``state.ray_token.token_replicas``)."""
    chosen = set(hosts)
    return [r.name for r in ray_token.token_replicas(inventory)
            if any(node.name in chosen for node in r.nodes)]


def _ray_tokens(deploy: Deploy, hosts: Iterable[Host], warn: Callable[[str], None],
                connections: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Before the run: ``up``/``restart`` make the missing Ray token of each Ray replica with
    ``vllm_ray_auth: token`` (adopting the one its rank 0 holds when it is in ``connections``,
    the run's open connections: ``state.ray_token.ensure_tokens``); ``--rotate-ray-token``
    replaces the targeted ones first (those
    with a node among ``hosts``, the run's: ``runlock.hosts_of_plays``). Returns
    ``{"ray_token_rotated": [replica, ...]}`` when it rotated (names only, never a token).

    Raises:
        ProvisionError: ``--rotate-ray-token`` on a run without such a replica, or a token file
            that cannot be read or written (``state.ray_token``).
    """
    if deploy.command not in ("up", "restart"):
        return {}
    rotated: list[str] = []
    if deploy.rotate_ray_token:
        targets = rotation_targets(deploy.inventory, [host.name for host in hosts])
        if not targets:
            raise ProvisionError.single(
                "--rotate-ray-token", "no Ray replica with token authentication in this run",
                expected="a replica with vllm_backend: ray and vllm_ray_auth: token",
                fix="limit the run (-l) to such a replica, or leave the flag out")
        if deploy.check:
            warn("--check: the Ray token of " + ", ".join(targets) + " would be replaced")
        else:
            ray_token.rotate(deploy.inventory, targets)
            rotated = targets
    if not deploy.check:
        ray_token.ensure_tokens(deploy.inventory, connections=connections)
    return {"ray_token_rotated": rotated} if rotated else {}


@dataclass(frozen=True)
class FirstProbe:
    """The fact probe ``up`` sends in the run lock's first answer (no channel of its own).

    Attributes:
        options: what it gathers (``checks.options.probe_for``).
        sent: host name -> ``(the probe's settings, its command)``
            (``facts.gather.probe_commands``).
    """

    options: gather.ProbeOptions
    sent: Mapping[str, tuple[dict[str, Any], str]]

    @property
    def commands(self) -> dict[str, str]:
        """Host name -> the command, for ``runlock.locked_run``'s ``first_reads``."""
        return {name: command for name, (_config, command) in self.sent.items()}

    def facts(self, inventory: Inventory, outputs: Mapping[str, str]) -> dict[str, Any]:
        """Host name -> ``HostFacts`` of each host whose probe answered with facts (``outputs``:
        the lock's ``firsts``); a host that did not is left out, and preflight probes it
        again (then its error is reported the usual way)."""
        found = {}
        for name, (config, _command) in self.sent.items():
            if name in outputs:
                try:
                    found[name] = gather.parse_probe_result(inventory.hosts[name], config,
                                                            outputs[name], "", 0)
                except ProvisionError:
                    continue
        return found


def first_probe(inventory: Inventory, plays: Sequence[Any], hosts: Sequence[Host]
                ) -> FirstProbe | None:
    """The probe to send with the run lock when ``plays`` run preflight (``up``): on every
    node, among ``hosts``, of the replicas preflight will probe; None otherwise."""
    if not any(task.module == "vllm_preflight" for play in plays for task in play.tasks):
        return None
    names = {host.name for host in hosts}
    replicas = replicas_on(inventory, names)
    if not replicas:
        return None
    options = probe_for(replicas)
    nodes = [node.name for replica in replicas for node in replica.nodes if node.name in names]
    return FirstProbe(options, gather.probe_commands(inventory, nodes, options))


def _seed(runner: Runner, facts: Mapping[str, Any], options: Any = None) -> None:
    """Hand facts this command already gathered under its run lock to ``runner``'s preflight
    (``modules.vllm_preflight.GATHERED``; with the probe options they were gathered with)."""
    for host_name, host_facts in facts.items():
        state = runner.host_state.setdefault(host_name, {})
        state[GATHERED] = host_facts
        if options is not None:
            state[GATHERED_WITH] = options
        else:
            state.pop(GATHERED_WITH, None)


def run(deploy: Deploy, reporter: Any, *, echo: Callable[[str], None],
        warn: Callable[[str], None]) -> DeployOutcome:
    """Run the deploy pipeline (the module docstring's five steps) and return what it did.

    Args:
        deploy: the request.
        reporter: receives each task result as it arrives (``output.report.HumanReporter``).
        echo: prints one human line of the approval and the take-over (the plan, the question).
        warn: prints one warning line (a stale lock taken over, a state record not written).

    Returns:
        The outcome; ``declined`` when the operator said no (nothing was changed).

    Raises:
        ProvisionError: the command is not one of :data:`COMMANDS`, or an invalid playbook
            (nothing was changed).
        RunLockError: another run holds a host's lock (nothing was changed).
        ProvisionError: a host belongs to another replica (replica id) and ``take_over`` is
            false, or the run needs approval and stdin is not a terminal and ``assume_yes`` is
            false (nothing was changed).
    """
    if deploy.command not in COMMANDS:
        raise ProvisionError.single("command", f"no deploy playbook for {deploy.command!r}",
                                    expected=", ".join(COMMANDS))
    inventory, name = deploy.inventory, deploy.command
    plays = load_playbook(resources.playbook(name))
    up_plays = plays if name == "up" else None

    def install() -> Sequence[Any]:
        nonlocal up_plays
        if up_plays is None:
            up_plays = load_playbook(resources.playbook("up"))
        return up_plays

    extra: dict[str, Any] = {}
    measured: dict[str, float | None]
    started_at = datetime.now(UTC)
    approved = (deploy.check or deploy.assume_yes or approval.env_approves()
                or (name == "restart" and not deploy.take_over))
    if not approved and approval.always_asks(name, deploy.take_over) \
            and not approval.interactive():
        raise approval.refusal(name, deploy.take_over)
    hosts = runlock.hosts_of_plays(inventory, plays, deploy.limit)
    probe = first_probe(inventory, plays, hosts)
    with runlock.locked_run(hosts, deploy.connection, name, warn=warn,
                            first_reads=probe.commands if probe else None) as factory:
        probed = probe.facts(inventory, factory.firsts) if probe else {}
        gathered: Mapping[str, Any] = {}
        # the Ray tokens first, so the approval's dry run shows the files they change
        extra.update(_ray_tokens(deploy, hosts, warn, factory.opened))
        if not approved:
            approved, gathered = _approve(deploy, plays, hosts, install(), factory, echo,
                                          probed=probed,
                                          probed_with=probe.options if probe else None)
            if not approved:
                return DeployOutcome(exit_code=1, declined=True)
        # the approval's dry run already read every node's owner under this run lock: without
        # --take-over that guard either refused or found every host ours, and nothing can have
        # changed since, so it is not read again (with --take-over the real removal runs now)
        taken = [] if not approved and not deploy.take_over else guard_ownership(
            name, inventory, hosts, install(), deploy.connection, factory,
            take_over=deploy.take_over, check=deploy.check, echo=echo)
        if taken:
            extra["take_over"] = [take.to_json() for take in taken]
        runner = Runner(inventory, RunOptions(check_mode=deploy.check, diff_mode=deploy.diff,
                                              limit=deploy.limit, connection=deploy.connection),
                        reporter, connection_factory=factory)
        if gathered:
            _seed(runner, gathered)
        elif probed:
            _seed(runner, probed, probe.options if probe else None)
        outcome = runner.run_plays(plays)
        replicas = replica_results(inventory, outcome.results, outcome.hosts)
        # the top-level keys (one replica's, as before there were several): the first replica
        # that served, else the first that got as far as the readiness wait
        first = next((r for r in replicas if "completion" in r),
                     next((r for r in replicas if set(r) & set(SERVING_KEYS)), None))
        if first is not None:
            extra.update({k: first[k] for k in SERVING_KEYS if k in first})
        if name in ("up", "restart"):
            extra["replicas"] = replicas
        measured = measured_starts(replicas)
        # a verified up (a completion answered, or no replica has an API to verify) records
        # who owns the hosts now; without it the previous owner's record would stay
        verified = "completion" in extra or not any(
            r.backend_type.serves_openai for r in inventory.replicas)
        if (name == "up" and not deploy.check and not deploy.limit and verified
                and not any(r.failed for r in outcome.results)):
            extra.update(record_good_up(inventory, runner.facts, install(), deploy.connection,
                                        runner.masker, factory=factory, measured=measured,
                                        phases=measured_phases(replicas),
                                        started_at=started_at, warn=warn))
            kinds = extra.pop("start_kinds", {})
            for entry in replicas:
                if entry["name"] in kinds:
                    entry["start_kind"] = kinds[entry["name"]]
            if first is not None and first["name"] in kinds:
                extra["start_kind"] = kinds[first["name"]]
        if deploy.check:
            extra["plan"] = run_plan(inventory, outcome, starts_again=name == "restart")
    extra["stats"] = report.connection_stats()
    summary = report.summarize(outcome.results, outcome.hosts, check_mode=deploy.check,
                               duration_s=outcome.duration_s, extra=extra)
    return DeployOutcome(summary=summary, replicas=replicas,
                         exit_code=report.exit_code(summary, check_mode=deploy.check))


def serving_summary(results: Iterable[TaskResult]) -> dict[str, Any]:
    """The summary keys (:data:`SERVING_KEYS`) from the results registered as ``vllm_ready``
    or ``vllm_verified``, later results winning; ``{}`` when neither ran.

    Args:
        results: every task result of the run, in order.
    """
    found: dict[str, Any] = {}
    for result in results:
        if result.data and result.register in SERVING_REGISTERS:
            found.update({k: v for k, v in result.data.items() if k in SERVING_KEYS})
    return found


def replica_results(inventory: Inventory, results: Sequence[TaskResult],
                    hosts: Sequence[str]) -> list[dict[str, Any]]:
    """One result per replica the run targeted, for the recap and ``--json`` (``replicas``).

    Each: ``name``, ``backend``, ``hosts`` (its nodes), ``served`` (the completion task on its
    rank 0 succeeded and returned a completion), ``failed`` (a node failed or was unreachable),
    ``failed_findings`` (its preflight error findings, as the ``vllm_preflight`` task reports
    them), ``api_path`` (how the controller reaches its API, preflight's choice; absent when
    preflight did not run), ``failures`` (``host``, ``task``, ``status``, ``message`` of each
    failed result on its nodes) and, when the readiness and completion tasks ran on its rank
    0, their keys (:data:`SERVING_KEYS`: ``completion``, ``start_to_serving_s``, ...).
    Replicas are independent: one replica's failure shows in its own entry only.

    Args:
        inventory: the loaded inventory.
        results: every task result of the run, in order.
        hosts: the hosts any play targeted (a replica with none of them is left out).
    """
    targeted = set(hosts)
    out: list[dict[str, Any]] = []
    for replica in inventory.replicas:
        nodes = [node.name for node in replica.nodes]
        if not targeted & set(nodes):
            continue
        mine = [r for r in results if r.host in nodes]
        failures = [{"host": r.host, "task": r.task, "status": r.status.value,
                     "message": r.message} for r in mine
                    if r.status in (Status.FAILED, Status.UNREACHABLE)]
        findings: list[dict[str, Any]] = []
        api_path = None
        for result in mine:
            if result.register == PREFLIGHT_REGISTER and result.data:
                findings = [f for f in result.data.get("findings", [])
                            if f.get("severity") == "error"]
                api_path = result.data.get("api_path")
                break
        entry: dict[str, Any] = {"name": replica.name, "backend": replica.backend,
                                 "hosts": nodes, "served": False, "failed": bool(failures),
                                 "failed_findings": findings, "failures": failures}
        if api_path:
            entry["api_path"] = api_path
        entry.update(serving_summary(r for r in mine if r.host == replica.master.name))
        entry["served"] = any(
            r.host == replica.master.name and r.register == "vllm_verified"
            and r.status in (Status.OK, Status.CHANGED) and "completion" in (r.data or {})
            for r in mine)
        out.append(entry)
    return out


def run_plan(inventory: Inventory, outcome: Any, *, starts_again: bool = False) -> dict[str, Any]:
    """The plan of a dry run (:func:`vllm_provision.operations.plan.build_plan`): the serving
    units of each node from its variables, the outage estimate from the controller's state
    record (none when it is missing or unreadable).

    Args:
        inventory: the run's inventory.
        outcome: the dry run's ``RunOutcome``.
        starts_again: the playbook starts what it stops (``restart``).
    """
    serving: dict[str, list[str]] = {}
    for replica in inventory.replicas:
        serving.update(replica_units(replica, settings.master_settings(
            replica, inventory.extra_vars)))
    try:
        record = state.read_controller_record(inventory.path)
    except ProvisionError:
        record = None
    return build_plan(outcome, inventory, serving, state.last_start_s(record),
                      starts_again=starts_again)


def _approve(deploy: Deploy, plays: Sequence[Any], hosts: Sequence[Any],
             up_plays: Sequence[Any], factory: Any, echo: Callable[[str], None], *,
             probed: Mapping[str, Any] | None = None, probed_with: Any = None
             ) -> tuple[bool, dict[str, Any]]:
    """Dry-run the playbook on the run's connections (the run locks are held on ``hosts``, the
    hosts of ``plays``), check ownership, show the plan, and ask for approval where it needs
    one (:mod:`vllm_provision.operations.approval`).

    Args:
        probed, probed_with: facts the run lock's first answer already carried, and the probe
            options they were gathered with (:func:`first_probe`): the dry run's preflight
            checks them instead of probing.

    Returns:
        ``(go on, facts)``: ``facts`` (host name -> ``HostFacts``) are what the dry run's
        preflight gathered, handed to the real run's preflight
        (``modules.vllm_preflight.GATHERED``) so that it does not probe every host a second
        time seconds later under the same run lock; empty when the operator was asked (the
        answer may come minutes later: the real run probes again).

    Raises:
        ProvisionError: approval is needed and stdin is not a terminal (nothing was changed).
    """
    inventory, name = deploy.inventory, deploy.command
    guard_ownership(name, inventory, hosts, up_plays, deploy.connection, factory,
                    take_over=deploy.take_over, check=True, echo=echo)
    runner = Runner(inventory, RunOptions(check_mode=True, diff_mode=False, limit=deploy.limit,
                                          connection=deploy.connection),
                    report.HumanReporter(io.StringIO()), connection_factory=factory)
    if probed:
        _seed(runner, probed, probed_with)
    plan = run_plan(inventory, runner.run_plays(plays), starts_again=name == "restart")
    if not approval.plan_needs_approval(name, plan, deploy.take_over):
        return True, dict(runner.facts)
    echo("\n".join(plan_lines(plan)))
    if not approval.interactive():
        raise approval.refusal(name, deploy.take_over)
    return approval.ask(name, echo=echo), {}


def guard_ownership(command: str, inventory: Inventory, hosts: Sequence[Any],
                    up_plays: Sequence[Any], connection: ConnectionOptions, factory: Any, *,
                    take_over: bool, check: bool,
                    echo: Callable[[str], None]) -> list[takeover.TakeOver]:
    """Refuse hosts another replica or inventory deployed, or take them over
    (:func:`vllm_provision.operations.takeover.guard`); before the first play, on the run's
    connections.

    Args:
        command: ``up``, ``down``, ``restart`` (for the message).
        inventory: the run's inventory. hosts: the ``Host`` objects the run targets.
        up_plays: ``up.yml``'s plays (its install plays name the files this inventory manages).
        connection: the run's connection options. factory: the run lock's connection factory.
        take_over: ``--take-over``. check: ``--check`` (remove nothing).
        echo: prints one human line.

    Raises:
        ProvisionError: a host of another owner without ``take_over`` (nothing changed), or a
            removal that failed on a host.
    """
    install = managed.install_plays(up_plays)
    planned = {host: list(files.values())
               for host, files in managed.managed_files(inventory, install).items()}
    connections, _errors = open_connections(list(hosts), connection, factory)
    try:
        return takeover.guard(inventory, [h.name for h in hosts], planned, connections,
                              command=command, take_over=take_over, check_mode=check, echo=echo,
                              records=getattr(factory, "records", None))
    finally:
        close_all(connections)


def record_good_up(inventory: Inventory, facts: Mapping[str, Any], up_plays: Sequence[Any],
                   connection: ConnectionOptions, masker: Masker, *, factory: Any = None,
                   measured: Mapping[str, float | None] | None = None,
                   phases: Mapping[str, Mapping[str, Any]] | None = None,
                   started_at: datetime | None = None,
                   warn: Callable[[str], None]) -> dict[str, Any]:
    """Write the state record of a verified ``up`` (or of an upgrade that verified every
    replica) for ``provision drift`` (:mod:`vllm_provision.state`).

    Args:
        inventory: the run's inventory. facts: host name -> the facts preflight gathered.
        up_plays: ``up.yml``'s plays. connection: the run's connection options.
        masker: masks secrets in the warning. factory: the run lock's connection factory.
        measured, phases, started_at: see
            :func:`vllm_provision.operations.record.record_after_up`.
        warn: prints the warning line when the record could not be written.

    Returns:
        ``{"state_record": controller path, "start_kinds": {replica: "cold" | "warm"}}`` (the
        replicas this ``up`` started), or ``{"state_record_error": text}`` (also given to
        ``warn``: the run itself succeeded).
    """
    try:
        path, serving = record_after_up(inventory, facts, up_plays, connection, factory,
                                        measured=measured, phases=phases,
                                        started_at=started_at)
        kinds = {name: item["last_start"] for name, item in serving.items()
                 if (measured or {}).get(name) is not None and item.get("last_start")}
        return {"state_record": str(path), **({"start_kinds": kinds} if kinds else {})}
    except ProvisionError as exc:
        text = masker.text(exc.render())
        warn(f"the state record for `provision drift` was not written: {text}")
        return {"state_record_error": text}
