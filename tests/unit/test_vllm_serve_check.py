"""Preflight's vllm_serve checks (checks/vllm_serve.py) on hand-made replicas and facts, with
the small vllm serve table of vllm_table_support: options against the installed release,
vLLM's rules between options, known breakages; never a crash for a missing table, an unknown
release or a version that is not one."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from vllm_table_support import clear, no_table

from vllm_provision.checks import vllm_serve
from vllm_provision.checks.finding import Severity
from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.facts.model import HostFacts
from vllm_provision.settings.ray_auth import auth_env
from vllm_provision.settings.vllm_cli import breakages as known
from vllm_provision.settings.vllm_cli.rules import RULES, broken_rules

ROOT = Path(__file__).resolve().parents[2]


def make_replica(backend: str = "mp", extra: tuple[str, ...] = (), tp: int = 4, pp: int = 2,
                 nodes: int = 2) -> Replica:
    members = tuple(Node(Host(f"h{i + 1}", f"10.0.0.{11 + i}"), i, f"10.0.0.{11 + i}")
                    for i in range(nodes))
    return Replica("llama", backend, members,  # type: ignore[arg-type]
                   EngineArgs(model="/srv/models/m", tensor_parallel_size=tp,
                              pipeline_parallel_size=pp, extra_args=extra))


def facts_with(version: str | None, nodes: int = 2) -> dict[str, HostFacts]:
    return {f"h{i + 1}": HostFacts(host=f"h{i + 1}", packages={"vllm": version})
            for i in range(nodes)}


def first_option_error(extra: tuple[str, ...], release: str):
    """The first error ``vllm_serve.options`` finds with ``extra`` in vllm_extra_args, with
    ``release`` installed on both nodes."""
    replica = make_replica(extra=extra)
    [error, *_] = by(vllm_serve.check_serve_options(replica, facts_with(release)),
                     Severity.ERROR)
    return error


def by(findings, severity):
    return [f for f in findings if f.severity is severity]


def test_a_clean_mp_replica_passes_on_a_release_that_has_every_option(small_table):
    findings = vllm_serve.check_serve_options(make_replica(), facts_with("0.12.0"))
    assert [f.severity for f in findings] == [Severity.OK, Severity.OK]
    assert [f.actual for f in findings] == ["10 options, all known to vLLM 0.12.0",
                                            "9 options, all known to vLLM 0.12.0"]
    rules = vllm_serve.check_flag_rules(make_replica(), facts_with("0.12.0"))
    assert {f.severity for f in rules} == {Severity.OK}


def test_a_rendered_option_the_release_lacks_is_an_error_with_the_release_and_an_upgrade(
        small_table):
    findings = vllm_serve.check_serve_options(make_replica(), facts_with("0.10.0"))
    errors = by(findings, Severity.ERROR)
    assert {f.item for f in errors if f.host == "h1"} == {
        "--nnodes (the mp unit)", "--node-rank (the mp unit)", "--master-addr (the mp unit)",
        "--master-port (the mp unit)"}
    nnodes = next(f for f in errors if f.item == "--nnodes (the mp unit)" and f.host == "h1")
    assert nnodes.actual == "unrecognized arguments: --nnodes (vLLM 0.10.0 has no such option)"
    assert nnodes.expected == "an option of vLLM 0.10.0 (installed: '0.10.0')"
    assert nnodes.fix.startswith("upgrade vLLM on h1 to 0.11.1 or later")


def test_an_extra_option_of_a_later_release_says_remove_or_upgrade(small_table):
    error = first_option_error(("--max-num-partial-prefills", "2"), "0.12.0")
    assert error.item == "--max-num-partial-prefills (vllm_extra_args)"
    assert error.fix == ("remove it from vllm_extra_args, or upgrade vLLM on h1 to 0.15.0 or "
                         "later (`provision stack sync` with a lock that pins it, or "
                         "vllm_version)")


def test_an_option_that_was_an_environment_variable_names_the_variable(small_table):
    error = first_option_error(("--all2all-backend", "naive"), "0.11.1")
    assert error.fix == ("vLLM 0.11.1 reads this setting from the environment: set "
                         "VLLM_ALL2ALL_BACKEND in vllm_env instead, or upgrade vLLM on h1")


def test_an_option_renamed_later_suggests_the_spelling_the_release_has(small_table):
    error = first_option_error(("--renamed-option", "x"), "0.12.0")
    assert error.fix == ("write --old-option, the spelling vLLM 0.12.0 has, in "
                         "vllm_extra_args")


def test_a_value_outside_the_choices_is_an_error_naming_them(small_table):
    error = first_option_error(("--kv-cache-dtype=fp4",), "0.26.0")
    assert error.actual == ("argument --kv-cache-dtype: invalid choice: 'fp4' (choose from "
                            "'auto', 'fp8') (vLLM 0.26.0)")
    assert error.expected == "one of 'auto', 'fp8'"


@pytest.mark.parametrize(("version", "words"), [
    ("0.13.5", "not in the vllm serve table: checking against 0.12.0"),
    ("0.40.0", "newer than the newest release in the vllm serve table (0.26.0)"),
    ("nightly", "vLLM 'nightly' on h1 is not a version"),
    ("0.9.2", "older than the oldest release this tool knows (0.10.0)"),
])
def test_a_release_the_table_cannot_place_is_a_warning_not_a_crash(small_table, version,
                                                                   words):
    findings = vllm_serve.check_serve_options(make_replica(), facts_with(version))
    warning = by(findings, Severity.WARNING)[0]
    assert words in warning.actual and warning.host == "h1"
    assert vllm_serve.check_flag_rules(make_replica(), facts_with(version)) is not None
    assert vllm_serve.check_breakages(make_replica(), facts_with(version)) is not None


def test_a_missing_table_is_one_warning_per_node(monkeypatch):
    no_table(monkeypatch)
    findings = vllm_serve.check_serve_options(make_replica(), facts_with("0.12.0"))
    assert [(f.severity, f.host) for f in findings] == [(Severity.WARNING, "h1"),
                                                       (Severity.WARNING, "h2")]
    assert "cannot be read" in findings[0].actual
    assert vllm_serve.check_flag_rules(make_replica(), facts_with("0.12.0")) == []
    clear()


def test_nodes_without_facts_or_vllm_and_ray_workers_are_skipped(small_table):
    assert vllm_serve.check_serve_options(make_replica(), {}) == []
    assert vllm_serve.check_serve_options(make_replica(), facts_with(None)) == []
    findings = vllm_serve.check_serve_options(make_replica("ray"), facts_with("0.12.0"))
    assert [f.host for f in findings] == ["h1"]  # the worker runs no vllm serve


def test_an_environment_variable_that_became_an_option_is_named(small_table):
    findings = vllm_serve.check_serve_options(
        make_replica(), facts_with("0.12.0"), {"vllm_env": {"VLLM_ALL2ALL_BACKEND": "naive"}})
    [warning, *_] = by(findings, Severity.WARNING)
    assert warning.item == "environment VLLM_ALL2ALL_BACKEND"
    assert warning.fix == ("remove VLLM_ALL2ALL_BACKEND from vllm_env and add --all2all-backend "
                           "to vllm_extra_args")
    older = vllm_serve.check_serve_options(
        make_replica(), facts_with("0.11.1"), {"vllm_env": {"VLLM_ALL2ALL_BACKEND": "naive"}})
    assert not by(older, Severity.WARNING)


def test_no_variable_we_render_became_an_option_in_the_shipped_table():
    """Renamed settings: were one of our environment variables an option in some release, the
    unit would have to render the option there instead; none is (the table's env_to_flag)."""
    path = ROOT / "vllm_provision/settings/vllm_cli/serve_flags.json"
    tables = [json.loads(path.read_text())] if path.exists() else []
    from vllm_table_support import TABLE
    for table in [TABLE, *tables]:
        assert set(vllm_serve.RENDERED_ENV) & set(table["env_to_flag"]) == set()


def test_the_rendered_environment_list_is_every_variable_the_templates_set():
    texts = [p.read_text() for p in ROOT.glob("roles/*/templates/*.env.j2")]
    texts.append((ROOT / "roles/vllm_common/templates/macros.j2").read_text())
    names = {n for t in texts for n in re.findall(r'"([A-Z][A-Z0-9]*(?:_[A-Za-z0-9]+)*)"', t)}
    names |= set(auth_env({"vllm_ray_auth": "token", "vllm_state_dir": "/x"}))
    names |= set(auth_env({"vllm_ray_auth": "off", "vllm_state_dir": "/x"}))
    assert names == set(vllm_serve.RENDERED_ENV)


# -- vLLM's rules between options --------------------------------------------------------------

@pytest.mark.parametrize(("version", "count", "message"), [
    ("0.26.0", "1", "--api-server-count=1 cannot be used with --headless (no API servers are "
                    "started in headless mode)."),
    ("0.15.0", "2", "--api-server-count=2 cannot be used with --headless (no API servers are "
                    "started in headless mode)."),
    ("0.12.0", "2", "api_server_count can't be set in headless mode"),
    ("0.12.0", "1", None),
])
def test_api_servers_on_a_headless_follower_are_refused_in_vllm_s_words(small_table, version,
                                                                        count, message):
    replica = make_replica(extra=("--api-server-count", count))
    findings = vllm_serve.check_flag_rules(replica, facts_with(version))
    errors = by(findings, Severity.ERROR)
    if message is None:
        assert errors == []
        return
    [error] = errors
    assert (error.host, error.actual) == ("h2", message)
    assert error.source.startswith("vllm/entrypoints/cli/serve.py")
    assert "remove --api-server-count from vllm_extra_args" in error.fix


def test_hybrid_load_balancing_on_a_headless_follower_is_refused(small_table):
    replica = make_replica(extra=("--data-parallel-hybrid-lb",))
    [error] = by(vllm_serve.check_flag_rules(replica, facts_with("0.26.0")), Severity.ERROR)
    assert (error.host, error.actual) == (
        "h2", "data_parallel_hybrid_lb is not applicable in headless mode")


@pytest.mark.parametrize(("release", "text"), [
    ("0.10.0", None),
    ("0.11.1", "nnodes > 1 can only be set when distributed exectuor backend is mp."),
    ("0.12.0", "nnodes > 1 can only be set when distributed executor backend is mp or uni."),
    ("0.34.0", "nnodes > 1 can only be set when distributed executor backend is mp, uni or "
               "external_launcher."),
])
def test_nnodes_with_ray_is_refused_in_each_release_s_words(release, text):
    broken = broken_rules(release, {"--nnodes": "2", "--distributed-executor-backend": "ray"})
    assert [message for _rule, message in broken] == ([text] if text else [])
    assert broken_rules(release, {"--nnodes": "2", "--distributed-executor-backend": "mp"}) == []


def test_every_rule_names_a_vllm_source_file_and_a_release_span():
    for rule in RULES:
        assert rule.source.startswith("vllm/") and rule.covers(rule.first)


# -- known breakages ---------------------------------------------------------------------------

def test_the_breakage_list_is_well_formed_public_and_verified():
    data = json.loads((ROOT / "vllm_provision/settings/vllm_cli/breakages.json").read_text())
    entries = known.breakages()
    assert [e.id for e in entries] == [raw["id"] for raw in data["breakages"]]
    for entry in entries:
        assert entry.issue.startswith("https://github.com/") and entry.workaround
        assert known.version_key(entry.first) < known.version_key(entry.before)
    assert {e.id: e.refuse for e in entries} == {
        "vllm-52907": True, "vllm-30044": False, "vllm-28997": False, "gpustack-6019": False}


def test_the_gloo_deadlock_of_the_0_26_1_dev_builds_is_refused(small_table):
    replica = make_replica("ray", tp=8, pp=1)
    [error] = by(vllm_serve.check_breakages(replica, facts_with("0.26.1rc1.dev148+g1a2b3c")),
                 Severity.ERROR)
    assert (error.item, error.host) == ("known breakage vllm-52907", "*")  # one for both nodes
    assert error.actual.startswith("vLLM '0.26.1rc1.dev148+g1a2b3c' on h1, h2 is affected: ")
    assert "https://github.com/vllm-project/vllm/issues/52907" in error.actual
    assert "install a released vLLM" in error.fix
    assert by(vllm_serve.check_breakages(replica, facts_with("0.26.1rc1.dev78")),
              Severity.ERROR) == []
    # tensor parallel inside a node: the deadlock's layout is not met
    inside = make_replica("ray", tp=4, pp=2)
    assert by(vllm_serve.check_breakages(inside, facts_with("0.26.1rc1.dev148")),
              Severity.ERROR) == []


def test_cuda_graph_capture_on_0_12_0_with_ray_pp_warns_unless_enforce_eager(small_table):
    facts = facts_with("0.12.0")
    facts["h2"] = HostFacts(host="h2", packages={"vllm": "0.13.0"})
    [warning] = by(vllm_serve.check_breakages(make_replica("ray"), facts), Severity.WARNING)
    assert warning.host == "h1"  # h2 runs another release
    assert warning.item == "known breakage vllm-30044" and "--enforce-eager" in warning.fix
    eager = make_replica("ray", extra=("--enforce-eager",))
    assert [f.severity for f in vllm_serve.check_breakages(eager, facts_with("0.12.0"))] == [
        Severity.OK]


@pytest.mark.parametrize(("backend", "version", "entry"), [
    ("ray", "0.11.1", "vllm-28997"), ("mp", "0.25.1", "gpustack-6019"),
    ("mp", "0.26.0+cu130", "gpustack-6019"),
])
def test_the_other_known_breakages_warn_for_their_backend_and_releases(backend, version, entry):
    findings = vllm_serve.check_breakages(make_replica(backend), facts_with(version))
    assert {f.item for f in by(findings, Severity.WARNING)} == {f"known breakage {entry}"}
    other = "mp" if backend == "ray" else "ray"
    assert not by(vllm_serve.check_breakages(make_replica(other), facts_with(version)),
                  Severity.WARNING)
    single = make_replica(backend, tp=4, pp=1, nodes=1)
    assert not by(vllm_serve.check_breakages(single, facts_with(version, 1)), Severity.WARNING)


def test_an_unverified_entry_says_so(monkeypatch):
    text = json.dumps({"format": 1, "breakages": [{
        "id": "x-1", "issue": "https://github.com/o/r/issues/1", "title": "t", "verified": False,
        "versions": {"from": "0.12.0", "before": "0.13.0"}, "backend": None, "layout": {},
        "action": "warn", "workaround": "w"}]})
    monkeypatch.setattr(known, "_shipped_text", lambda: text)
    known.breakages.cache_clear()
    findings = vllm_serve.check_breakages(make_replica(), facts_with("0.12.0"))
    assert "(not verified: the issue was not read)" in findings[0].actual
    known.breakages.cache_clear()


def test_a_damaged_breakage_list_is_a_warning(monkeypatch):
    monkeypatch.setattr(known, "_shipped_text", lambda: "{not json")
    known.breakages.cache_clear()
    [warning] = vllm_serve.check_breakages(make_replica(), facts_with("0.12.0"))
    assert warning.severity is Severity.WARNING and "cannot be read" in warning.actual
    known.breakages.cache_clear()


def test_the_check_runs_from_preflight_with_the_replica_s_settings(small_table):
    from vllm_provision.checks.run import check_replica, settings_for

    replica = make_replica(extra=("--api-server-count", "2"))
    facts = {name: replace(f) for name, f in facts_with("0.26.0").items()}
    findings = check_replica(replica, facts, settings_for(replica))
    names = {f.check for f in findings if f.severity is Severity.ERROR}
    assert "vllm_serve.rules" in names
