"""vLLM's own rules between options, for the combinations this tool renders, per release.

Each :class:`Rule` is one refusal of ``vllm serve`` that no single option's kind or choices
shows: two options together, in the words vLLM prints, with the releases whose source holds
that text. The spans were read from the released sources of every release from 0.10.0 to
0.34.0 (``vllm/entrypoints/cli/serve.py``, ``vllm/config/parallel.py``); a rule with
``last=None`` still holds in the newest release read (``CHECKED_THROUGH``) and is assumed to
hold in newer ones.

:func:`broken_rules` takes the options of one command line as :func:`options_of` gives them
(long name -> value, ``None`` for a flag) and returns the rules it breaks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vllm_provision.settings.vllm_cli import parse_release

__all__ = ["CHECKED_THROUGH", "RULES", "Rule", "broken_rules", "options_of"]

CHECKED_THROUGH = "0.34.0"
SERVE = "vllm/entrypoints/cli/serve.py"
PARALLEL = "vllm/config/parallel.py"


def _int(value: str | None) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _headless_api_servers(minimum: int) -> Callable[[Mapping[str, str | None]],
                                                    dict[str, object] | None]:
    def applies(options: Mapping[str, str | None]) -> dict[str, object] | None:
        if "--headless" not in options or "--api-server-count" not in options:
            return None
        count = _int(options["--api-server-count"])
        return {"n": count} if count is not None and count >= minimum else None
    return applies


def _headless_hybrid(options: Mapping[str, str | None]) -> dict[str, object] | None:
    both = "--headless" in options and "--data-parallel-hybrid-lb" in options
    return {} if both else None


def _nnodes_backend(allowed: tuple[str, ...]) -> Callable[[Mapping[str, str | None]],
                                                         dict[str, object] | None]:
    def applies(options: Mapping[str, str | None]) -> dict[str, object] | None:
        nnodes = _int(options.get("--nnodes"))
        backend = options.get("--distributed-executor-backend")
        if nnodes is None or nnodes <= 1 or backend is None or backend in allowed:
            return None
        return {"nnodes": nnodes, "backend": backend}
    return applies


@dataclass(frozen=True)
class Rule:
    """One of vLLM's refusals of two options together.

    Attributes:
        name: a short stable name (``headless_api_servers``).
        first: the oldest release whose source holds the rule.
        last: the newest one, or None when it still holds in :data:`CHECKED_THROUGH`.
        options: the options involved, as the unit spells them.
        message: vLLM's words, ``{n}``-style fields filled from what :attr:`applies` returns.
        source: the vLLM file (and function) that raises it.
        applies: options (long name -> value) -> the message's fields, or None when the rule
            is kept.
        fix: what to change, in this tool's terms.
    """

    name: str
    first: str
    last: str | None
    options: tuple[str, ...]
    message: str
    source: str
    applies: Callable[[Mapping[str, str | None]], dict[str, object] | None]
    fix: str

    def covers(self, release: str) -> bool:
        """True when ``release`` (a table release or any version) is in the rule's span."""
        key = parse_release(release)
        if key is None:
            return False
        first = parse_release(self.first) or ()
        last = parse_release(self.last) if self.last else None
        return first <= key and (last is None or key <= last)


RULES: tuple[Rule, ...] = (
    Rule("headless_api_servers", "0.15.0", None, ("--headless", "--api-server-count"),
         "--api-server-count={n} cannot be used with --headless (no API servers are started "
         "in headless mode).", f"{SERVE} ServeSubcommand.cmd", _headless_api_servers(1),
         "remove --api-server-count from vllm_extra_args: followers (rank > 0) run headless "
         "and start no API server"),
    Rule("headless_api_servers", "0.10.0", "0.14.1", ("--headless", "--api-server-count"),
         "api_server_count can't be set in headless mode", f"{SERVE} run_headless",
         _headless_api_servers(2),
         "remove --api-server-count from vllm_extra_args: followers (rank > 0) run headless "
         "and start no API server"),
    Rule("headless_hybrid_lb", "0.10.0", None, ("--headless", "--data-parallel-hybrid-lb"),
         "data_parallel_hybrid_lb is not applicable in headless mode",
         f"{SERVE} run_headless", _headless_hybrid,
         "remove --data-parallel-hybrid-lb from vllm_extra_args: followers (rank > 0) run "
         "headless"),
    # vLLM's own spelling ("exectuor") in 0.11.1 and 0.11.2
    Rule("nnodes_backend", "0.11.1", "0.11.2", ("--nnodes", "--distributed-executor-backend"),
         "nnodes > 1 can only be set when distributed exectuor backend is mp.",
         f"{PARALLEL} ParallelConfig.__post_init__", _nnodes_backend(("mp",)),
         "use vllm_backend: mp for a replica of several nodes with this release"),
    Rule("nnodes_backend", "0.12.0", "0.12.0", ("--nnodes", "--distributed-executor-backend"),
         "nnodes > 1 can only be set when distributed executor backend is mp or uni.",
         f"{PARALLEL} ParallelConfig.__post_init__", _nnodes_backend(("mp", "uni")),
         "use vllm_backend: mp for a replica of several nodes with this release"),
    Rule("nnodes_backend", "0.13.0", None, ("--nnodes", "--distributed-executor-backend"),
         "nnodes > 1 can only be set when distributed executor backend is mp, uni or "
         "external_launcher.", f"{PARALLEL} ParallelConfig.__post_init__",
         _nnodes_backend(("mp", "uni", "external_launcher")),
         "use vllm_backend: mp for a replica of several nodes"),
)


def options_of(parsed: list) -> dict[str, str | None]:
    """The options of a command line read by :func:`~.argv.read_argv` that resolved, as long
    name -> value (the last one given wins, as in argparse); unresolved words are left out."""
    return {option.flag.name: option.value for option in parsed if option.flag is not None}


def broken_rules(release: str, options: Mapping[str, str | None]) -> list[tuple[Rule, str]]:
    """The rules of :data:`RULES` that cover ``release`` and that ``options`` break, each with
    its message filled in (vLLM's words)."""
    broken = []
    for rule in RULES:
        if not rule.covers(release):
            continue
        fields = rule.applies(options)
        if fields is not None:
            broken.append((rule, rule.message.format(**fields)))
    return broken
