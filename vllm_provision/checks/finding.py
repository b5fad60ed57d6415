"""The value every preflight check returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(enum.StrEnum):
    """How bad a finding is.

    ``error`` stops ``provision up``; ``warning`` is shown; ``ok`` passed.
    """

    ERROR = "error"
    WARNING = "warning"
    OK = "ok"


@dataclass(frozen=True)
class Finding:
    """One result of one check on one host (or on the whole replica when ``host`` is ``"*"``).

    Attributes:
        check: the check's stable name, usable with ``--skip-check`` (``"parity.nccl"``).
        severity: :class:`Severity`.
        host: inventory host name, or ``"*"`` for a replica-wide finding.
        item: what was checked, in words (``"NCCL version"``).
        expected: the value wanted (``"2.28.9 (as on h1)"``).
        actual: the value found.
        fix: one line telling the operator what to do; empty for ``ok``.
        source: where the rule comes from (vLLM file/PR, Ray doc, man page).
        replica: the replica whose check found it (``run_checks`` fills it in); empty for a
            host-level finding made outside any replica's checks (facts not gathered), which
            belongs to every replica with a node on that host.
    """

    check: str
    severity: Severity
    host: str
    item: str
    expected: str = ""
    actual: str = ""
    fix: str = ""
    source: str = ""
    replica: str = ""
