"""The one error type the user sees: what went wrong, where, what was expected and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input or a host, in the words a person needs.

    Attributes:
        where: the place: a file and key path (``inventory/lab.yml: all.hosts.h1.ansible_port``),
            a host name, or a command-line option.
        message: what is wrong, one sentence.
        expected: what would be right (``"an integer 1-65535"``); empty when obvious.
        actual: the value found, already masked when it is a secret; empty when absent.
        fix: one line telling the user what to do.
    """

    where: str
    message: str
    expected: str = ""
    actual: str = ""
    fix: str = ""

    def render(self) -> str:
        """Return the problem as one or more plain-text lines (no colour, no markup)."""
        text = f"{self.where}: {self.message}"
        if self.expected:
            text += f" (expected {self.expected}"
            text += f", got {self.actual})" if self.actual else ")"
        elif self.actual:
            text += f" (got {self.actual})"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


@dataclass
class ProvisionError(Exception):
    """Raised for any failure the user must act on.

    Rendered once by ``report``, never as a traceback.

    Attributes:
        problems: one or more problems; at least one.
        exit_code: the process exit code the CLI uses (1 by default).
    """

    problems: list[Problem] = field(default_factory=list)
    exit_code: int = 1

    def __post_init__(self) -> None:
        super().__init__(self.render())

    @classmethod
    def single(cls, where: str, message: str, *, expected: str = "", actual: str = "",
               fix: str = "", exit_code: int = 1) -> ProvisionError:
        """Build an error holding exactly one :class:`Problem`."""
        return cls([Problem(where, message, expected, actual, fix)], exit_code)

    def render(self) -> str:
        """Return every problem, one block each, as plain text."""
        return "\n".join(p.render() for p in self.problems)

    def __str__(self) -> str:
        return self.render()


class InventoryError(ProvisionError):
    """The inventory (or its group_vars/host_vars, or a -e/--limit value) is invalid.

    Raised before any SSH connection is opened.
    """

