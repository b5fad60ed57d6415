"""The ``vllm serve`` command of each node against the vLLM release installed there.

Preflight reads each node's installed vLLM (``HostFacts.packages["vllm"]``) and checks the
words our unit passes after ``vllm serve`` (:func:`vllm_provision.inventory.view.node_argv`,
both backends) against that release's options (:mod:`vllm_provision.settings.vllm_cli`,
docs/vllm-versions.md), vLLM's own rules between options (:mod:`~vllm_provision.settings.
vllm_cli.rules`) and the known multi-node breakages (:mod:`~vllm_provision.settings.vllm_cli.
breakages`). docs/preflight.md, "vLLM release".

Nothing here raises for a missing or damaged table, an unknown release or a version that is
not one: each is a warning finding naming the host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vllm_provision.checks.context import check
from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.core.models import Node, Replica
from vllm_provision.facts.model import HostFacts
from vllm_provision.inventory.view import node_argv
from vllm_provision.settings import vllm_cli
from vllm_provision.settings.vllm_cli import breakages as known
from vllm_provision.settings.vllm_cli.argv import read_argv, spelled, value_problem
from vllm_provision.settings.vllm_cli.rules import broken_rules, options_of

TABLE_SOURCE = "docs/vllm-versions.md (the vllm serve table, settings/vllm_cli)"
TABLE_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError)
# Every variable our units' environment files set (roles/*/templates/*.env.j2, macros.j2,
# settings/ray_auth.py); tests/unit/test_vllm_serve_check.py keeps the list equal to the
# templates. One that became an option of the installed release is named by vllm_serve.options.
RENDERED_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "HF_HUB_OFFLINE",
                "VLLM_CACHE_ROOT", "TMPDIR", "HOME", "VLLM_API_KEY", "HF_TOKEN", "RAY_ADDRESS",
                "RAY_memory_monitor_refresh_ms", "RAY_USAGE_STATS_ENABLED",
                "RAY_CGRAPH_get_timeout", "RAY_CGRAPH_submit_timeout", "RAY_AUTH_MODE",
                "RAY_AUTH_TOKEN_PATH", "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES")


def installed_release(facts: HostFacts | None) -> str | None:
    """The node's installed vLLM version (``packages["vllm"]``), or None without facts or
    without vLLM (``host.venv`` reports that)."""
    if facts is None:
        return None
    version = facts.packages.get("vllm")
    return str(version) if version else None


def release_surface(version: str, host: str, check_name: str
                    ) -> tuple[vllm_cli.Surface | None, list[Finding]]:
    """The surface of ``version`` and the findings about reading it: a warning when the
    release is not in the table (the nearest older one or the newest stands in), when it is
    older than the table, not a version, or the table cannot be read. Never raises."""
    shown = repr(version)
    try:
        surface, warning = vllm_cli.surface(version)
    except ValueError as error:
        if vllm_cli.parse_release(version) is None:
            text, fix = (f"vLLM {shown} on {host} is not a version the vllm serve table can "
                         "place", "install a released vLLM (`pip show vllm` in the venv shows "
                         "what is there), or pin vllm_version")
        else:
            text, fix = str(error), "install a release the table covers"
        return None, [Finding(check_name, Severity.WARNING, host, "vLLM release",
                              expected="a release of the vllm serve table",
                              actual=text + "; the serve command was not checked", fix=fix,
                              source=TABLE_SOURCE)]
    except TABLE_ERRORS as error:
        return None, [Finding(check_name, Severity.WARNING, host, "vllm serve table",
                              expected="the table of vllm serve options shipped with this tool",
                              actual=f"it cannot be read ({type(error).__name__}: {error}); "
                                     "the serve command was not checked",
                              fix="reinstall vllm-provision (the table is package data)",
                              source=TABLE_SOURCE)]
    findings = []
    if warning:
        findings.append(Finding(check_name, Severity.WARNING, host, "vllm serve table",
                                expected=f"vLLM {shown} in the table", actual=warning,
                                fix="refresh the table (docs/vllm-versions.md) or install a "
                                    "release it has", source=TABLE_SOURCE))
    return surface, findings


def _older_spelling(name: str, surface: vllm_cli.Surface) -> str | None:
    """A spelling of option ``name`` (an alias it has in some release) that ``surface`` has."""
    try:
        spans = vllm_cli.table()["flags"].get(name) or []
    except TABLE_ERRORS:
        return None
    for _first, _last, props in spans:
        for alias in props.get("aliases") or ():
            if alias in surface.flags and surface.flags[alias].name != name:
                return str(alias)
    return None


def _unknown_fix(name: str, surface: vllm_cli.Surface, host: str, from_extra: bool,
                 backend: str) -> str:
    older = _older_spelling(name, surface)
    if older is not None:
        where = "in vllm_extra_args" if from_extra else "(or upgrade vLLM)"
        return f"write {older}, the spelling vLLM {surface.release} has, {where}"
    release_key = vllm_cli.parse_release(surface.release) or ()
    for variable, flag, since in _env_of(name):
        if flag == name and (vllm_cli.parse_release(since) or ()) > release_key:
            return (f"vLLM {surface.release} reads this setting from the environment: set "
                    f"{variable} in vllm_env instead, or upgrade vLLM on {host}")
    first = vllm_cli.first_release(name)
    key = vllm_cli.parse_release(first or "") or ()
    upgrade = (f"upgrade vLLM on {host} to {first} or later (`provision stack sync` with a "
               "lock that pins it, or vllm_version)") if first and key > (
                   vllm_cli.parse_release(surface.release) or ()) else ""
    if from_extra:
        return "remove it from vllm_extra_args" + (f", or {upgrade}" if upgrade else "")
    if upgrade:
        return upgrade + (f"; vllm_backend: {backend} renders it" if backend else "")
    return f"install a vLLM release that has {name}"


def _env_of(name: str) -> list[tuple[str, str, str]]:
    """``(variable, option, since)`` of the table's ``env_to_flag`` entries for option
    ``name``."""
    try:
        entries = vllm_cli.table().get("env_to_flag", {})
        return [(str(var), str(entry.get("flag")), str(entry.get("since", "0")))
                for var, entry in entries.items() if entry.get("flag") == name]
    except TABLE_ERRORS:
        return []


def check_node_options(replica: Replica, node: Node, version: str,
                       surface: vllm_cli.Surface, env_names: Iterable[str]) -> list[Finding]:
    """The ``vllm_serve.options`` findings of one node: an error for each word of its
    ``vllm serve`` line the release does not have, reads as ambiguous, or whose value it
    refuses; a warning for each environment variable we set (``env_names``) that the release
    replaced by an option; one ``ok`` when every option is known."""
    argv = node_argv(replica, node)
    if argv is None:
        return []
    host, release = node.name, surface.release
    extra = {spelled(w.split("=", 1)[0]) for w in replica.engine.extra_args
             if str(w).startswith("-")}
    findings = []
    parsed = read_argv(surface, argv)
    for option in parsed:
        from_extra = spelled(option.word) in extra
        origin = "vllm_extra_args" if from_extra else f"the {replica.backend} unit"
        if isinstance(option.error, vllm_cli.AmbiguousOption):
            findings.append(Finding(
                "vllm_serve.options", Severity.ERROR, host, f"{option.word} ({origin})",
                expected=f"an option of vLLM {release}, written in full",
                actual=str(option.error),
                fix="write the option in full: " + " or ".join(option.error.candidates),
                source=TABLE_SOURCE))
        elif option.error is not None:
            findings.append(Finding(
                "vllm_serve.options", Severity.ERROR, host, f"{option.word} ({origin})",
                expected=f"an option of vLLM {release} (installed: {version!r})",
                actual=str(option.error),
                fix=_unknown_fix(spelled(option.word), surface, host, from_extra,
                                 replica.backend), source=TABLE_SOURCE))
        elif (problem := value_problem(option)) is not None:
            flag = option.flag
            assert flag is not None
            findings.append(Finding(
                "vllm_serve.options", Severity.ERROR, host, f"{flag.name} ({origin})",
                expected=("one of " + ", ".join(repr(c) for c in flag.choices))
                if flag.choices else f"a value vLLM {release} accepts ({flag.kind})",
                actual=f"{problem} (vLLM {release})",
                fix=f"change the value of {flag.name}"
                    + (" in vllm_extra_args" if from_extra else ""), source=TABLE_SOURCE))
    for variable in sorted(set(env_names)):
        flag_name = surface.env_to_flag.get(variable)
        if flag_name is not None:
            findings.append(Finding(
                "vllm_serve.options", Severity.WARNING, host, f"environment {variable}",
                expected=f"the option vLLM {release} reads instead ({flag_name})",
                actual=f"{variable} is set in the unit's environment; vLLM {release} replaced "
                       f"it by {flag_name}",
                fix=f"remove {variable} from vllm_env and add {flag_name} to vllm_extra_args",
                source=TABLE_SOURCE))
    if not findings:
        findings.append(Finding("vllm_serve.options", Severity.OK, host, "vllm serve options",
                                expected=f"options of vLLM {release}",
                                actual=f"{len(parsed)} options, all known to vLLM {release}",
                                source=TABLE_SOURCE))
    return findings


def _env_names(replica: Replica, node: Node, values: Mapping[str, Any]) -> list[str]:
    names = list(RENDERED_ENV)
    for key in ("vllm_env", "ray_env"):
        if isinstance(values.get(key), Mapping):
            names += [str(k) for k in values[key]]
    node_env = node.host.vars.get("vllm_node_env")
    if isinstance(node_env, Mapping):
        names += [str(k) for k in node_env]
    return names


@check("vllm_serve.options", order=12, scope="replica", reads=("replica", "facts", "values"))
def check_serve_options(replica: Replica, facts: Mapping[str, HostFacts],
                        values: Mapping[str, Any] | None = None) -> list[Finding]:
    """``vllm_serve.options`` on every node with facts and vLLM: see
    :func:`check_node_options` (a Ray worker runs no ``vllm serve``: nothing).

    Args:
        replica: the replica.
        facts: facts by host name (``packages["vllm"]``: the installed version).
        values: the replica's settings (``vllm_env``, ``ray_env``); None for none.
    """
    findings: list[Finding] = []
    for node in replica.nodes:
        version = installed_release(facts.get(node.name))
        if version is None or node_argv(replica, node) is None:
            continue
        surface, notes = release_surface(version, node.name, "vllm_serve.options")
        findings += notes
        if surface is not None:
            findings += check_node_options(replica, node, version, surface,
                                           _env_names(replica, node, values or {}))
    return findings


@check("vllm_serve.rules", order=14, scope="replica", reads=("replica", "facts"))
def check_flag_rules(replica: Replica, facts: Mapping[str, HostFacts]) -> list[Finding]:
    """``vllm_serve.rules``: an error, in vLLM's words, for each of vLLM's rules between
    options (:data:`~vllm_provision.settings.vllm_cli.rules.RULES`) that a node's
    ``vllm serve`` line breaks under its installed release; one ``ok`` per node otherwise.
    Nodes whose release the table cannot place are left to ``vllm_serve.options``."""
    findings = []
    for node in replica.nodes:
        version = installed_release(facts.get(node.name))
        argv = node_argv(replica, node)
        if version is None or argv is None:
            continue
        try:
            surface, _warning = vllm_cli.surface(version)
        except TABLE_ERRORS:
            continue
        broken = broken_rules(version, options_of(read_argv(surface, argv)))
        for rule, message in broken:
            findings.append(Finding(
                "vllm_serve.rules", Severity.ERROR, node.name, " with ".join(rule.options),
                expected=f"options vLLM {version!r} accepts together", actual=message,
                fix=rule.fix, source=rule.source))
        if not broken:
            findings.append(Finding("vllm_serve.rules", Severity.OK, node.name,
                                    "options together", expected="vLLM's rules between options",
                                    actual="kept", source="vllm/entrypoints/cli/serve.py, "
                                                          "vllm/config/parallel.py"))
    return findings


def _layout(replica: Replica) -> known.Layout:
    argv = node_argv(replica, replica.master) or []
    options = {spelled(str(w).split("=", 1)[0]) for w in argv if str(w).startswith("--")}
    engine = replica.engine
    return known.Layout(backend=replica.backend, nodes=replica.nnodes,
                        tensor_parallel=engine.tensor_parallel_size,
                        pipeline_parallel=engine.pipeline_parallel_size,
                        gpus_per_node=replica.gpus_per_node,
                        options=frozenset(options))


@check("vllm_serve.breakages", order=16, scope="replica", reads=("replica", "facts"))
def check_breakages(replica: Replica, facts: Mapping[str, HostFacts]) -> list[Finding]:
    """``vllm_serve.breakages``: for each node, each known breakage
    (``settings/vllm_cli/breakages.json``) of its installed vLLM that the replica's layout
    meets: an error for one marked ``refuse``, a warning otherwise, naming the issue and the
    workaround; one ``ok`` for the replica when none applies. A missing or damaged list is a
    warning."""
    layout = _layout(replica)
    findings = []
    checked = False
    hit: dict[tuple[str, str], tuple[known.Breakage, list[str]]] = {}
    for node in replica.nodes:
        version = installed_release(facts.get(node.name))
        if version is None:
            continue
        checked = True
        try:
            matched = known.matching(version, layout)
        except TABLE_ERRORS as error:
            return [Finding("vllm_serve.breakages", Severity.WARNING, "*", "known breakages",
                            expected="the list of known breakages shipped with this tool",
                            actual=f"it cannot be read ({type(error).__name__}: {error})",
                            fix="reinstall vllm-provision (the list is package data)",
                            source="settings/vllm_cli/breakages.json")]
        for entry in matched:
            hit.setdefault((entry.id, version), (entry, []))[1].append(node.name)
    with_facts = [n.name for n in replica.nodes if installed_release(facts.get(n.name))]
    for (_id, version), (entry, hosts) in hit.items():
        unverified = "" if entry.verified else " (not verified: the issue was not read)"
        findings.append(Finding(
            "vllm_serve.breakages", Severity.ERROR if entry.refuse else Severity.WARNING,
            "*" if hosts == with_facts and len(hosts) > 1 else ", ".join(hosts),
            f"known breakage {entry.id}",
            expected=f"for {entry.backend or 'any backend'} over {layout.nodes} nodes, a vLLM "
                     f"release before {entry.first} or from {entry.before} on",
            actual=f"vLLM {version!r} on {', '.join(hosts)} is affected: {entry.title} "
                   f"({entry.issue}){unverified}; symptom: {entry.symptom}",
            fix=entry.workaround, source=entry.issue))
    if checked and not findings:
        findings.append(Finding("vllm_serve.breakages", Severity.OK, "*", "known breakages",
                                expected="no known breakage of the installed vLLM for this "
                                         "layout", actual="none applies",
                                source="settings/vllm_cli/breakages.json"))
    return findings
