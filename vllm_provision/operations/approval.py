"""Approval before a run that stops a serving replica: Terraform's ``apply`` prompt and
``-auto-approve``, for ``provision up``, ``down`` and ``--take-over``.

The rule (docs/deploy.md, "Approval"):

- ``up`` that would restart or stop a replica that serves, ``down``, and any ``--take-over``
  need approval. Check mode (``--check``) never does: it changes nothing.
- ``--yes`` (or the environment variable :data:`YES_ENV` set to ``1``/``true``, for CI) approves.
- Without ``--yes``, on a terminal (stdin is a TTY), the plan is shown and the run goes on only
  when the operator types ``yes``, as Terraform asks ("Only 'yes' will be accepted to approve").
- Without ``--yes`` and without a terminal, the run exits 1 before changing anything, with the
  plan and what to do: a pipe or a cron job cannot answer, and a silent restart of a serving
  replica is the outage an operator did not ask for.

Whether ``up`` would restart a serving replica comes from a dry run
(``vllm_provision.operations.plan``),
made on the run's own connections while the run holds its hosts' run locks, so no other run of
this tool can change them between the plan shown and the change made.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError

YES_ENV = "VLLM_PROVISION_YES"
YES_HELP = (f"Approve without asking: a restart of a serving replica by up, down, --take-over "
            f"(also: {YES_ENV}=1). Without it, a terminal is asked and a non-terminal run exits 1.")


def env_approves(environ: Mapping[str, str] | None = None) -> bool:
    """True when :data:`YES_ENV` is ``1``, ``true`` or ``yes`` (any case).

    Args:
        environ: the environment (default ``os.environ``).
    """
    value = (environ if environ is not None else os.environ).get(YES_ENV, "")
    return value.strip().lower() in ("1", "true", "yes")


def always_asks(command: str, take_over: bool) -> bool:
    """True when the run needs approval whatever its plan: ``down`` (it stops the replica) and
    ``--take-over`` (it removes another inventory's units)."""
    return command == "down" or take_over


def plan_needs_approval(command: str, plan: Mapping[str, Any], take_over: bool) -> bool:
    """Whether a run with this dry-run plan needs approval (pure).

    Args:
        command: ``up``, ``down`` or ``restart``.
        plan: ``vllm_provision.operations.plan.build_plan``'s result (``replicas``: ``unavailable``
        and
            ``stopped`` per replica).
        take_over: ``--take-over`` was given.

    ``restart`` is asked for by name, so it never needs approval; ``up`` needs it only when a
    replica would be unavailable or stopped.
    """
    if always_asks(command, take_over):
        return True
    if command != "up":
        return False
    return any(item.get("unavailable") or item.get("stopped") for item in plan.get("replicas", ()))


def refusal(command: str, take_over: bool) -> ProvisionError:
    """The error of a run that needs approval and cannot ask (no terminal, no ``--yes``):
    exit 1, nothing changed."""
    what = {"down": "down stops the replica",
            "up": "this up would restart or stop a replica that serves (see the plan)"}.get(
        command, f"{command} needs approval")
    if take_over:
        what = f"{command} --take-over removes what another inventory installed"
    return ProvisionError.single(
        f"provision {command}", f"approval needed: {what}, and stdin is not a terminal to ask; "
        "nothing was changed",
        fix=f"review it with `provision {command} --check --diff`, then run again with --yes "
            f"(or {YES_ENV}=1), or run it on a terminal to be asked")


def ask(command: str, *, prompt: Callable[[str], str] | None = None,
        echo: Callable[[str], None] | None = None) -> bool:
    """Ask on the terminal; True when the answer is exactly ``yes``.

    Args:
        command: the command, for the question.
        prompt: reads one answer (default: :func:`click.prompt` on the terminal); EOF or Ctrl-C
            count as no.
        echo: prints a line (default: stderr, made printable: a unit's state is host text).
    """
    import click

    from vllm_provision.core.text import printable

    say = echo or (lambda line: click.echo(printable(line, newlines=True), err=True))
    read = prompt or (lambda text: click.prompt(text, default="", show_default=False,
                                                err=True))
    say(f"Do you want to perform these actions? provision {command} will do what the plan "
        "above says. Only 'yes' will be accepted to approve.")
    try:
        answer = read("Enter a value")
    except (EOFError, KeyboardInterrupt, click.Abort):
        answer = ""
    if answer.strip() != "yes":
        say(f"{command} cancelled: nothing was changed.")
        return False
    return True


def interactive() -> bool:
    """True when stdin is a terminal that can be asked."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False
