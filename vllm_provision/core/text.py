"""Short text of errors for one-line views (status tables, a backend's view of a lost node)."""

from __future__ import annotations

from vllm_provision.core.errors import ProvisionError


def one_line(error: ProvisionError) -> str:
    """``host: message`` of each problem of ``error``, on one line (``; `` between problems),
    without the fix: the reason a node is unreachable, as ``provision status`` shows it."""
    return "; ".join(f"{p.where}: {' '.join(p.message.split())}" for p in error.problems)
