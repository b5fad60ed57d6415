"""Playbooks -> plays -> hosts -> tasks; handlers (persisted); check and diff modes.

Public names: :class:`Runner`, :class:`RunOptions`, :class:`RunOutcome`, :class:`TaskContext`,
:func:`load_playbook`. See docs/runner-contract.md and docs/engine.md.
"""

from vllm_provision.runner.context import TaskContext
from vllm_provision.runner.engine import Reporter, Runner, RunOptions, RunOutcome
from vllm_provision.runner.playbook import Play, Task, load_playbook

__all__ = ["Play", "Reporter", "RunOptions", "RunOutcome", "Runner", "Task", "TaskContext",
           "load_playbook"]
