"""JSON that a host, a server or a file sent: parsed without trusting it (docs/security.md,
"Bounded input").

Python's ``json.loads`` raises ``RecursionError`` on input nested deeper than the interpreter's
recursion limit (``[[[[...`` a few thousand deep: a broken or hostile host's probe output, state
record or stack answer), which the callers' ``except ValueError`` does not catch: one host's
bytes ended every host's run with an internal error. :func:`loads` turns that, and text over
:data:`MAX_BYTES`, into ``json.JSONDecodeError`` (a ``ValueError``), so each caller's own
handling of a malformed answer applies: that host fails, with its name, and the others go on.
"""

from __future__ import annotations

import json
from typing import Any

# The most JSON text accepted from one answer: every remote command's output is capped at
# vllm_command_output_limit_mib (64 MiB by default) already; a state record or a probe's
# answer is a few KiB.
MAX_BYTES = 64 << 20


def loads(text: str | bytes, *, max_bytes: int = MAX_BYTES) -> Any:
    """``json.loads(text)`` for untrusted text.

    Args:
        text: the JSON document. max_bytes: the most characters (or bytes) accepted.

    Raises:
        json.JSONDecodeError: malformed, longer than ``max_bytes``, or nested deeper than the
            interpreter's recursion limit allows.
    """
    if len(text) > max_bytes:
        raise json.JSONDecodeError(f"the JSON text has {len(text)} characters, more than "
                                   f"{max_bytes}", "", 0)
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("the JSON text is nested too deeply", "", 0) from None


__all__ = ["MAX_BYTES", "loads"]
