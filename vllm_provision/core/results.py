"""Values every task and check produces: task results and their status vocabulary."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.StrEnum):
    """Outcome of one task on one host, with Ansible's vocabulary.

    ``ok``: nothing needed changing; ``changed``: the host was changed (or, in check mode,
    would be); ``failed``: the task failed; ``skipped``: a condition was false;
    ``unreachable``: the host could not be reached over SSH (connect or an operation timed out).
    """

    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class TaskResult:
    """What one task did on one host.

    Attributes:
        host: inventory host name.
        task: the task's name, a sentence (``"Install the vLLM unit"``).
        status: one of :class:`Status`.
        message: short human text (why it changed, why it failed); secrets already masked.
        diff: unified diff text when diff mode is on and something changed, else ``""``.
        duration_s: wall time of the task on this host, in seconds.
        data: module-specific values for ``--json`` (e.g. completion text); JSON-serialisable.
        register: the task's ``register`` name, or None: the stable handle a command uses to
            find a result (``provision up`` reads ``vllm_ready`` and ``vllm_verified``), where the
            task's name is prose that may change. Not part of the ``--json`` task entry.
    """

    host: str
    task: str
    status: Status
    message: str = ""
    diff: str = ""
    duration_s: float = 0.0
    data: dict | None = None
    register: str | None = None

    @property
    def changed(self) -> bool:
        """True when the host changed (or would change in check mode)."""
        return self.status is Status.CHANGED

    @property
    def failed(self) -> bool:
        """True when the task failed or the host was unreachable."""
        return self.status in (Status.FAILED, Status.UNREACHABLE)
