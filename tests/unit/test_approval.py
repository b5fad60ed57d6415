"""Approval before a run that stops a serving replica (vllm_provision.operations.approval)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from vllm_provision.cli import cli
from vllm_provision.operations import approval

INVENTORY = Path(__file__).resolve().parents[2] / "inventory" / "lab-mp.yml"


def plan(**flags: bool) -> dict:
    return {"replicas": [{"replica": "llm", "unavailable": flags.get("unavailable", False),
                          "stopped": flags.get("stopped", False), "last_start_s": 7.0}]}


@pytest.mark.parametrize(("command", "flags", "take_over", "needed"), [
    ("up", {}, False, False),                      # a first up, or an edit that restarts nothing
    ("up", {"unavailable": True}, False, True),    # a restart of a serving replica
    ("up", {"stopped": True}, False, True),
    ("up", {}, True, True),                        # --take-over always asks
    ("down", {}, False, True),                     # down always asks
    ("restart", {"unavailable": True}, False, False),  # restart is asked for by name
    ("restart", {}, True, True),
])
def test_which_plans_need_approval(command: str, flags: dict, take_over: bool,
                                   needed: bool) -> None:
    assert approval.plan_needs_approval(command, plan(**flags), take_over) is needed


@pytest.mark.parametrize(("value", "approves"), [
    ("1", True), ("true", True), ("YES", True), ("0", False), ("", False), ("no", False)])
def test_the_environment_variable_approves_only_a_yes(value: str, approves: bool) -> None:
    assert approval.env_approves({approval.YES_ENV: value}) is approves


def test_only_yes_approves_on_a_terminal() -> None:
    lines: list[str] = []
    assert approval.ask("up", prompt=lambda _: "yes", echo=lines.append)
    assert not approval.ask("up", prompt=lambda _: "y", echo=lines.append)
    assert lines[-1] == "up cancelled: nothing was changed."

    def eof(_: str) -> str:
        raise EOFError

    assert not approval.ask("down", prompt=eof, echo=lines.append)


@pytest.mark.parametrize("args", [["down"], ["up", "--take-over"], ["down", "--purge"]])
def test_without_a_terminal_and_without_yes_it_exits_1_before_connecting(
        args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # the lab inventory's hosts are not up here: a connection attempt would fail differently
    monkeypatch.delenv(approval.YES_ENV, raising=False)
    result = CliRunner().invoke(cli, [*args, "-i", str(INVENTORY)])
    assert result.exit_code == 1, result.output
    assert "approval needed" in str(result.exception or result.output)
    assert "--yes" in str(result.exception or result.output)


def test_the_yes_flag_is_on_up_down_and_restart() -> None:
    for command in ("up", "down", "restart"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert "--yes" in result.output, command


class _DryRunner:
    """Stands in for the approval's check-mode Runner: its preflight gathered ``facts``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.facts = {"h1": "facts of h1", "h2": "facts of h2"}

    def run_plays(self, plays: object) -> None:
        return None


@pytest.mark.parametrize(("needed", "handed"), [
    (False, {"h1": "facts of h1", "h2": "facts of h2"}),  # no question: reused seconds later
    (True, {}),  # the operator was asked (minutes may pass): the real run probes again
])
def test_the_dry_run_hands_its_facts_on_only_when_nobody_was_asked(
        needed: bool, handed: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from vllm_provision.operations import deploy

    monkeypatch.setattr(deploy, "guard_ownership", lambda *a, **k: [])
    monkeypatch.setattr(deploy, "Runner", _DryRunner)
    dry_plan = {**plan(unavailable=needed), "steps": [], "summary": "1 to restart"}
    monkeypatch.setattr(deploy, "run_plan", lambda *a, **k: dry_plan)
    monkeypatch.setattr(approval, "interactive", lambda: True)
    monkeypatch.setattr(approval, "ask", lambda name, echo: True)
    request = SimpleNamespace(inventory=None, command="up", limit=None, connection=None,
                              take_over=False)
    go, facts = deploy._approve(request, [], [], [], None, lambda line: None)
    assert go is True
    assert facts == handed
