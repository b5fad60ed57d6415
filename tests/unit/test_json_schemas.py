"""Every command with --json has a JSON Schema in the package (vllm_provision/schemas/), each is a
valid draft 2020-12 schema, and the outputs that need no lab validate against theirs: the error
object of every command, inventory --list/--host, facts from recorded probes, check's findings
and a playbook run's summary with its plan. The lab-level outputs: tests/lab/
test_init_and_schemas.py."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import click
import jsonschema
import pytest
from test_init_inventory import H1, H2, recorded
from test_plan import SERVING
from test_plan import playbook as playbook  # noqa: F401  (the fixture)
from test_runner import run
from test_runner_support import make_inventory

from vllm_provision.checks.finding import Finding, Severity
from vllm_provision.cli import cli, json_schemas, main
from vllm_provision.cli.check import findings_json
from vllm_provision.operations.plan import build_plan

GOOD = Path(__file__).parent.parent / "data" / "inventories" / "good"


def json_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command (path of words) that has a --json option."""
    ctx = click.Context(group)
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            found += json_commands(command, (*prefix, name))
        elif any("--json" in param.opts for param in command.params
                 if isinstance(param, click.Option)):
            found.append((*prefix, name))
    return found


def test_every_command_with_json_has_a_schema_and_every_schema_a_command() -> None:
    commands = {json_schemas.schema_name(path) for path in json_commands()}
    schemas = set(json_schemas.names()) - {json_schemas.COMMON}
    assert not commands - schemas, (
        f"commands with --json but no schema: {sorted(commands - schemas)}; add "
        "vllm_provision/schemas/<command>.json (see docs/json-output.md)")
    assert not schemas - commands, f"schemas of no --json command: {sorted(schemas - commands)}"
    assert {"up", "down", "restart", "status", "check", "facts", "drift", "play",
            "inventory", "lab-status"} <= commands


@pytest.mark.parametrize("name", json_schemas.names())
def test_each_schema_is_valid_and_accepts_the_error_object(name: str) -> None:
    schema = json_schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"] == f"{json_schemas.ID_BASE}{name}.json"
    if name != json_schemas.COMMON:
        assert schema["anyOf"][0] == {"$ref": "common.json#/$defs/error"}
        assert len(schema["anyOf"]) == 2 and schema["description"]


def test_facts_schema_is_generated_from_the_facts_dataclasses() -> None:
    written = Path(json_schemas.path_of("facts")).read_text()
    assert written == json_schemas.facts_text(), (
        "vllm_provision/schemas/facts.json is stale: run "
        "`python -m vllm_provision.cli.json_schemas --write`")


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
             *args: str) -> tuple[int, str]:
    """Run the console entry point as `provision ARGS`; (exit code, stdout)."""
    monkeypatch.setattr(sys, "argv", ["provision", *args])
    code: object = 0
    try:
        main()
    except SystemExit as exited:
        code = exited.code or 0
    return int(code) if isinstance(code, int) else 1, capsys.readouterr().out


@pytest.mark.parametrize("path", json_commands(), ids=" ".join)
def test_the_error_object_of_every_command_validates(path: tuple[str, ...], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.yml")
    if path == ("lab", "status"):  # no inventory: an instance the lab refuses (or not root)
        monkeypatch.setenv("VLLM_PROVISION_LAB_NET", "not-a-network")
        monkeypatch.setenv("VLLM_PROVISION_LAB_DIR", str(tmp_path / "lab"))
        code, out = run_main(monkeypatch, capsys, *path, "--json")
    else:
        extra = {("play",): [str(tmp_path / "p.yml")], ("inventory",): ["--list"],
                 ("exec",): ["--", "true"], ("fault",): ["--kill", "h2"]}.get(path, [])
        code, out = run_main(monkeypatch, capsys, *path, "-i", missing, "--json", *extra)
    document = json.loads(out)
    assert code == 1 and document["error"] is True
    if path != ("lab", "status"):
        assert missing in document["problems"][0]["where"]
    json_schemas.validate(json_schemas.schema_name(path), document)


@pytest.mark.parametrize("inventory", sorted(p.name for p in GOOD.iterdir()))
def test_inventory_list_and_host_validate(inventory: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(GOOD / inventory if (GOOD / inventory).is_dir() else GOOD)
    source = str(GOOD / inventory)
    code, out = run_main(monkeypatch, capsys, "inventory", "-i", source, "--list", "--json")
    assert code == 0
    listed = json.loads(out)
    json_schemas.validate("inventory", listed)
    host = sorted(listed["_meta"]["hostvars"])[0]
    code, out = run_main(monkeypatch, capsys, "inventory", "-i", source, "--host", host)
    json_schemas.validate("inventory", json.loads(out))


def test_facts_of_the_recorded_lab_probes_validate() -> None:
    document = {"hosts": {"h1": recorded(H1).to_json(), "h2": recorded(H2).to_json()},
                "errors": {"h3": "h3: unreachable"}}
    json_schemas.validate("facts", json.loads(json.dumps(document, default=str)))
    broken = copy.deepcopy(json.loads(json.dumps(document, default=str)))
    broken["hosts"]["h1"]["gpus"][0]["memory_total_mib"] = "80 GiB"
    with pytest.raises(jsonschema.ValidationError, match="80 GiB"):
        json_schemas.validate("facts", broken)


def test_check_findings_validate_and_a_wrong_severity_does_not() -> None:
    findings = [Finding("parity.nccl", Severity.ERROR, "h2", "NCCL", "2.28.9", "2.27.3",
                        fix="install the same NCCL", replica="llama"),
                Finding("host.gpus", Severity.OK, "h1", "GPUs", "4", "4", replica="llama")]
    document = json.loads(json.dumps(findings_json(findings)))
    json_schemas.validate("check", document)
    document["findings"][0]["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError, match="fatal"):
        json_schemas.validate("check", document)


def test_a_run_summary_with_its_plan_validates_and_a_new_key_needs_the_schema(
        tmp_path: Path, playbook: Path) -> None:  # noqa: F811  (the fixture)
    # the playbook of test_plan (PLAY): a template that notifies two restarts
    inventory = make_inventory(tmp_path, extra_vars={"max_len": 1024})
    runner, summary = run(inventory, playbook, check=True)
    plan = build_plan(runner.outcome, inventory, SERVING, {"llama": 7.06})
    document = json.loads(json.dumps({**summary, "plan": plan}, default=str))
    assert plan["steps"]
    for name in ("up", "restart", "down", "play"):
        json_schemas.validate(name, document)
    with pytest.raises(jsonschema.ValidationError, match="unexpected_key"):
        json_schemas.validate("up", {**document, "unexpected_key": 1})
    json_schemas.validate("play", {**document, "a_module_key": 1})  # play's modules may add


def test_an_exec_summary_validates_and_needs_its_exit_codes() -> None:
    from vllm_provision.core.results import Status, TaskResult
    from vllm_provision.output import report

    results = [TaskResult("h1", "exec", Status.CHANGED, "up 3 days",
                          data={"rc": 0, "stdout": "up 3 days", "stderr": ""}),
               TaskResult("h2", "exec", Status.UNREACHABLE, "h2: connection refused",
                          data={"rc": None, "stdout": "", "stderr": ""})]
    summary = report.summarize(results, ["h1", "h2"], check_mode=False, duration_s=0.4,
                               extra={"command": "uptime", "rc": {"h1": 0, "h2": None}})
    document = json.loads(json.dumps(summary, default=str))
    json_schemas.validate("exec", document)
    with pytest.raises(jsonschema.ValidationError, match="rc"):
        json_schemas.validate("exec", {k: v for k, v in document.items() if k != "rc"})
