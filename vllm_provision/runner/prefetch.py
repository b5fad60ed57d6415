"""Batch the read-only commands of a play into one round trip per host (docs/runner-contract.md).

At the start of a play batch the runner asks each task's module for the exact read command its
``run`` would send first (``read_command(ctx, args)``), runs all of them on the host in ONE shell
script (each command in its own subshell, its exit code captured separately) and keeps the
answers in a per-host cache keyed by the exact command string. A module asking for the same
command then gets the stored answer without a round trip.

Safe by construction: the cache of a host is dropped as soon as any command that is not a cache
hit runs on it (a write can change what a later read would see), when a task on it reports
``changed`` or ``failed``, and when its entries are older than ``max_age_s``. So a changing run
behaves as without batching; only a no-change run gets the speed-up.

A command that is not a read may lead the batch (``ahead``: a module's ``lead_command``, the
first thing its task sends): it runs once, at the head, and its answer is kept apart from the
reads' cache: handed out once, to the first identical request, whatever its age and whatever
else ran meanwhile, so it never runs twice.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

from vllm_provision.connection import CommandResult, command_failed

log = logging.getLogger(__name__)

# Answers older than this are not used (a unit's state may move on by itself), in seconds.
MAX_AGE_S = 10.0


def batch_script(commands: Sequence[str], nonce: str) -> str:
    """Return ONE shell line running ``commands`` in order, each in a subshell with stdin from
    /dev/null; their stdout and stderr are framed by marker lines holding ``nonce`` and the
    index, and the exit code follows each command's stdout. No newline is used, so the script
    survives ``sudo_wrap`` (which refuses control characters).
    """
    parts = []
    for index, command in enumerate(commands):
        mark = f"@@{nonce} {index}"
        parts.append(
            f"printf '%s\\n' '{mark} BEGIN'; printf '%s\\n' '{mark} BEGIN' >&2; "
            f"( {command} ) </dev/null; "
            f"printf '\\n{mark} END %s\\n' \"$?\"; printf '\\n%s\\n' '{mark} END' >&2")
    return "; ".join(parts)


def split_batch(stdout: str, stderr: str, count: int, nonce: str) -> list[CommandResult] | None:
    """Split the output of :func:`batch_script` back into one :class:`CommandResult` per
    command; None when it is not complete (the caller then reads live)."""
    results: list[CommandResult] = []
    for index in range(count):
        mark = f"@@{nonce} {index}"
        out = _between(stdout, f"{mark} BEGIN\n", f"\n{mark} END ")
        err = _between(stderr, f"{mark} BEGIN\n", f"\n{mark} END\n")
        if out is None or err is None:
            return None
        text, rest = out
        code_text = rest.split("\n", 1)[0].strip()
        if not code_text.isdigit():
            return None
        results.append(CommandResult(int(code_text), text, err[0]))
    return results


def _between(text: str, start: str, end: str) -> tuple[str, str] | None:
    begin = text.find(start)
    if begin < 0:
        return None
    begin += len(start)
    stop = text.find(end, begin)
    if stop < 0:
        return None
    return text[begin:stop], text[stop + len(end):]


class PrefetchingConnection:
    """Wraps a host's connection; answers prefetched read commands from a cache.

    Args:
        inner: the host's connection (``HostConnection`` or a test double) with ``run(...)``.
        max_age_s: answers older than this many seconds are not used.

    Every attribute other than ``run``/``with_become``/``prefetch``/``drop`` is the inner
    connection's (``name``, ``host``, ``open``, ``close``, ``options``...).
    """

    def __init__(self, inner: Any, max_age_s: float = MAX_AGE_S) -> None:
        self._inner = inner
        self._max_age_s = max_age_s
        self._cache: dict[str, CommandResult] = {}
        self._stored_at = 0.0
        self._ahead: dict[str, CommandResult] = {}  # commands run once ahead: answered once
        self._lock = threading.Lock()
        self.ran_live = False  # a command other than a cached read ran since the last prefetch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def inner(self) -> Any:
        """The wrapped connection."""
        return self._inner

    def drop(self) -> None:
        """Forget every prefetched answer (after a write, a change or a failure)."""
        with self._lock:
            self._cache.clear()

    def prefetch(self, commands: Sequence[str], ahead: Sequence[str] = ()) -> int:
        """Run ``commands`` (read-only, but for those in ``ahead``) in one round trip and store
        their answers.

        Args:
            commands: exact command strings as modules will ask for them; duplicates are run once.
            ahead: those of ``commands`` that are not reads (each a module's ``lead_command``):
                their answers are handed out once, never expired, never dropped; when the
                batch's output cannot be split, each gets a failed answer saying so rather
                than running a second time.

        Returns:
            how many answers were stored (0 when the batch output could not be split).

        Raises:
            UnreachableError: the connection failed (the caller reports it as usual).
        """
        unique = list(dict.fromkeys(commands))
        once = set(ahead)
        self.drop()
        self.ran_live = False
        with self._lock:
            self._ahead.clear()
        if not unique:
            return 0
        if len(unique) == 1:  # nothing to batch: send it as it is
            results: list[CommandResult] | None = [self._inner.run(unique[0])]
        else:
            nonce = secrets.token_hex(8)
            log.debug("%s: batching %d commands in one round trip", self.name, len(unique))
            batch = self._inner.run(batch_script(unique, nonce))
            results = split_batch(batch.stdout, batch.stderr, len(unique), nonce)
        if results is None:
            log.debug("%s: batched read incomplete; reading live", self.name)
            lost = CommandResult(1, "", "the batched output of this command could not be read "
                                        "back (it ran once; it is not run again)")
            with self._lock:
                self._ahead = {command: lost for command in unique if command in once}
            return 0
        with self._lock:
            answers = dict(zip(unique, results, strict=True))
            self._ahead = {c: r for c, r in answers.items() if c in once}
            self._cache = {c: r for c, r in answers.items() if c not in once}
            self._stored_at = time.monotonic()
        return len(results)

    def run(self, command: str, *, sudo: bool | None = None, stdin: str | bytes | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        """Answer ``command`` from the cache when it was prefetched (same command, default
        ``sudo``, no stdin, fresh); otherwise drop the cache and run it live on the host.

        Raises:
            UnreachableError: the connection failed. ProvisionError: ``check`` and exit != 0.
        """
        hit = None
        with self._lock:
            if sudo is None and stdin is None and command in self._ahead:
                hit = self._ahead.pop(command)  # ran once, at the head of the batch
            elif sudo is None and stdin is None and command in self._cache:
                if time.monotonic() - self._stored_at <= self._max_age_s:
                    hit = self._cache[command]  # valid until a live command runs
                else:
                    self._cache.clear()
            else:
                self._cache.clear()
            if hit is None:
                self.ran_live = True
        if hit is None:
            return self._inner.run(command, sudo=sudo, stdin=stdin, timeout_s=timeout_s,
                                   check=check)
        log.debug("%s: rc=%s (prefetched): %s", self.name, hit.exit_code, command)
        if check and not hit.ok:
            raise command_failed(self.name, command, hit)
        return hit

    def with_become(self, become: bool | None) -> Any:
        """Return this connection when ``become`` is the host's default; else a view whose
        commands run live with ``sudo=become`` (never answered from the cache)."""
        if become is None or become == getattr(self._inner, "become", None):
            return self
        return _ExplicitSudo(self, become)


class _ExplicitSudo:
    """A :class:`PrefetchingConnection` seen with another default for ``sudo``."""

    def __init__(self, outer: PrefetchingConnection, become: bool) -> None:
        self._outer = outer
        self.become = become

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outer, name)

    def run(self, command: str, *, sudo: bool | None = None, stdin: str | bytes | None = None,
            timeout_s: float | None = None, check: bool = False) -> CommandResult:
        return self._outer.run(command, sudo=self.become if sudo is None else sudo,
                               stdin=stdin, timeout_s=timeout_s, check=check)
