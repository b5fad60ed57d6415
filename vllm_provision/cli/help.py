"""Help text shared by the commands: the ``Examples:`` epilog every command's ``--help`` ends
with (a unit test checks each command has one)."""

from __future__ import annotations

# The heading every example block starts with (tests/unit/test_cli_help_completion.py).
EXAMPLES_HEADING = "Examples:"


def examples(*lines: str) -> str:
    """A click epilog listing ``lines`` (command lines, ``# comment`` lines) as written: the
    ``\\b`` marker keeps click from re-wrapping them (click's "Preventing Rewrapping").

    Args:
        lines: one command line each, without the leading indent.
    """
    return "\b\n" + EXAMPLES_HEADING + "\n" + "\n".join(f"  {line}" for line in lines)
