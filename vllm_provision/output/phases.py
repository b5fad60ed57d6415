"""Where a starting vLLM is, read from its own log lines, and the journal read that feeds it.

vLLM announces each start-up phase in its log (the lines and their sources in vLLM 0.32.0, read
from the installed package; older texts kept where they differ, marked so):

=============================  ==================================================================
phase                          vLLM's line (file)
=============================  ==================================================================
waiting for a Ray placement    ``Waiting for creating a placement group of specs for %d seconds``
group                          (ray_utils.py, ``_wait_until_pg_ready``: repeated with
                               a doubling interval while Ray cannot place the bundles)
loading weights                ``Starting to load model %s...`` (v1/worker/gpu_model_runner.py,
                               cpu_model_runner.py); ``Loading safetensors checkpoint shards:
                               50% Completed | 1/2 [...]`` (model_executor/model_loader/
                               weight_utils.py: a tqdm bar whose ``_BAR_FORMAT`` ends in a line
                               break, so each step is a journal line; rank 0 only)
weights loaded                 ``Loading weights took %.2f seconds`` (default_loader.py),
                               ``Model loading took %s GiB memory and %.6f seconds``
                               (gpu_model_runner.py)
profiling memory               ``Memory profiling takes %.2f seconds`` (utils/mem_utils.py; logged
                               at DEBUG by 0.32's gpu_worker.py, at INFO by older releases)
sizing the KV cache            ``Available KV cache memory: %s GiB`` (v1/worker/gpu_worker.py),
                               ``GPU KV cache size: %s tokens`` (v1/core/kv_cache_utils.py; ``CPU``
                               on the CPU build), ``Auto set ... GiB for KV cache`` (cpu_worker.py),
                               ``# GPU blocks: %d, # CPU blocks: %d`` (the V0 engine's
                               executor_base.py, before V1)
compiling / warming up         ``Warming up model for the compilation...`` (cpu_model_runner.py),
                               ``torch.compile takes %.2f s in total`` (compilation/)
capturing CUDA graphs          ``Capturing CUDA graphs (decode, FULL): 40%|...`` (tqdm desc in
                               gpu_model_runner.py; rank 0), ``Graph capturing finished in %.0f
                               secs, took %.2f GiB``
engine ready                   ``init engine (profile, create kv cache, warmup model) took %.2f s``
                               (v1/engine/core.py)
API server up                  ``Starting vLLM server on %s`` (entrypoints/launchers/api_server/
                               entry.py; ``Starting vLLM API server`` before 0.32), uvicorn's
                               ``Application startup complete.`` (uvicorn/lifespan/on.py)
=============================  ==================================================================

Lines may carry vLLM's process prefix (``(EngineCore pid=164) INFO 12-01 10:00:00 [file.py:1]``),
so the rules search anywhere in the line. The lab's stand-in prints the same lines at the same
phases (docs/lab-standin.md).

The journal is read incrementally (:class:`JournalTail`): each poll of a wait appends one short
``journalctl`` to the command it already sends (no extra round trip), asking only for the
current invocation's lines (``_SYSTEMD_INVOCATION_ID``, systemd.journal-fields(7)) after the
cursor of the last line seen (``--after-cursor``, ``--show-cursor``: journalctl(1)).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

# (phase label, pattern), in the order of a start; the first that matches a line wins; later
# phases win over earlier ones by order of appearance in the journal, not by this table (the
# order of PHASES says which of two nodes is further behind: output/stall.py).
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("waiting for a Ray placement group", re.compile(
        r"Waiting for creating a placement group of specs")),
    ("loading weights", re.compile(
        r"Loading safetensors checkpoint shards(?: \(eager\))?:\s*(?P<pct>\d+)% Completed"
        r" \| (?P<n>\d+)/(?P<total>\d+)")),
    ("loading weights", re.compile(r"Starting to load model ")),
    ("weights loaded", re.compile(r"Loading weights took |Model loading took ")),
    ("profiling memory", re.compile(r"Memory profiling takes ")),
    ("sizing the KV cache", re.compile(
        r"Available KV cache memory: |[A-Z]+(?: \+ host)? KV cache size: |GiB for KV cache "
        r"on node|# GPU blocks: ")),
    ("compiling", re.compile(r"Warming up model for the compilation|torch\.compile takes ")),
    ("capturing CUDA graphs", re.compile(
        r"Capturing CUDA graphs(?P<desc> \([^)]*\))?(?::\s*(?P<pct>\d+)%)?"
        r"|Graph capturing finished")),
    ("engine ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("API server up", re.compile(
        r"Starting vLLM (?:API )?server|Application startup complete")),
)
PHASES = tuple(dict.fromkeys(label for label, _ in _RULES))
_MARK = "== vllm-provision journal "
_CURSOR = "-- cursor: "
TAIL_LINES = 400


def phase_of(line: str) -> str | None:
    """The phase ``line`` announces, with its progress where vLLM prints one
    (``loading weights 50% (1/2 shards)``), or None for any other line."""
    for label, pattern in _RULES:
        found = pattern.search(line)
        if found is None:
            continue
        groups = found.groupdict()
        if label == "loading weights" and groups.get("pct"):
            return f"{label} {groups['pct']}% ({groups['n']}/{groups['total']} shards)"
        if label == "capturing CUDA graphs" and groups.get("pct"):
            return f"{label} {groups['pct']}%"
        return label
    return None


def label_of(phase: str) -> str:
    """The label of a phase text (``loading weights 50% (1/2 shards)`` -> ``loading
    weights``)."""
    return next((label for label in PHASES if phase.startswith(label)), phase)


@dataclass
class _UnitTail:
    invocation: str = ""
    cursor: str = ""
    phase: str = ""


@dataclass
class JournalTail:
    """The journal read of one wait: per ``(host, unit)``, the invocation and cursor seen last
    and the phase its lines reached."""

    units: dict[tuple[str, str], _UnitTail] = field(default_factory=dict)

    def command(self, host: str, units: Sequence[str]) -> str:
        """Shell appended to a poll of ``host``: for each unit, a marker line naming it and its
        invocation, then its new journal lines (``-o cat``) and the last cursor.

        Every word from the host (invocation, cursor) and every unit name is one quoted word.
        """
        parts = []
        for unit in units:
            seen = self.units.get((host, unit), _UnitTail())
            quoted = shlex.quote(unit)
            read = ("journalctl -q --no-pager -o cat --show-cursor "
                    "_SYSTEMD_INVOCATION_ID=\"$inv\"")
            after = (f"if [ \"$inv\" = {shlex.quote(seen.invocation)} ]; then {read} "
                     f"--after-cursor={shlex.quote(seen.cursor)}; else {read}; fi"
                     if seen.invocation and seen.cursor else read)
            parts.append(
                f"inv=$(systemctl show -p InvocationID --value -- {quoted} 2>/dev/null); "
                f"echo {shlex.quote(_MARK + unit)} \"$inv\"; "
                f"if [ -n \"$inv\" ]; then {{ {after}; }} 2>/dev/null | tail -n {TAIL_LINES}; fi")
        return "; ".join(parts)

    def feed(self, host: str, text: str) -> None:
        """Read the output of :meth:`command` for ``host``: move each unit's cursor and phase.

        A new invocation (the unit restarted) starts its phase afresh."""
        unit: str | None = None
        for line in text.splitlines():
            if line.startswith(_MARK):
                name, _, invocation = line[len(_MARK):].partition(" ")
                unit = name
                seen = self.units.setdefault((host, unit), _UnitTail())
                if invocation.strip() != seen.invocation:
                    self.units[(host, unit)] = _UnitTail(invocation=invocation.strip())
                continue
            if unit is None:
                continue
            seen = self.units[(host, unit)]
            if line.startswith(_CURSOR):
                seen.cursor = line[len(_CURSOR):].strip()
                continue
            found = phase_of(line)
            if found is not None:
                seen.phase = found

    def phase(self, host: str, units: Sequence[str] | None = None) -> str:
        """The phase of ``host`` (the last unit of ``units``, or of every unit read there, that
        has one), ``""`` when its lines announced none yet."""
        for (name, unit), seen in reversed(list(self.units.items())):
            if name == host and (units is None or unit in units) and seen.phase:
                return seen.phase
        return ""


def split_output(text: str) -> tuple[str, str]:
    """``(what came before the journal part, the journal part)`` of a poll's output."""
    head, mark, rest = text.partition(_MARK)
    return head, (mark + rest if mark else "")


# systemd's own lines about a unit (src/core/service.c, unit.c), as journalctl -u shows them:
# "<unit>: Main process exited, code=exited, status=1/FAILURE", "<unit>: Failed with result
# 'exit-code'.", "<unit>: Scheduled restart job, restart counter is at 1.", "Starting <unit or
# description>...", "Started <unit or description>." (the description on systemd before 249).
_SYSTEMD = re.compile(r"\ssystemd\[1\]: (?P<message>.*)$")
_FAILED = re.compile(r": (Main process exited, |Failed with result |Scheduled restart job)")
_FAILURE_TAIL = re.compile(r": (Main process exited, |Failed with result |Scheduled restart job|"
                           r"Consumed |Deactivated successfully)")


def first_failure(text: str, lines: int) -> tuple[str, bool]:
    """The journal lines of a unit's FIRST failure since it was last started by hand.

    systemd restarts a failed unit (``Restart=``, systemd.service(5)); by the time a wait reads
    the journal the unit may have failed several times, and the last failure's lines (often a
    shorter, secondary error: a port still in use, a peer gone) hide the first one's cause. The
    last start by hand is the last ``Starting``/``Started`` line of systemd that no ``Scheduled
    restart job`` line announced (an automatic restart); the first failure after it ends at
    systemd's first ``Main process exited``/``Failed with result``/``Scheduled restart job`` line
    and the lines of that failure right after it (``Consumed``, ``Deactivated successfully``).

    Args:
        text: ``journalctl -u UNIT -o short-iso`` output (oldest first), every process's lines.
        lines: how many lines to return at most (the last ones up to the failure's end).

    Returns:
        ``(the lines, True)`` when a failure was found after the last start by hand, else
        ``(the last lines of text, False)``.
    """
    rows = text.rstrip("\n").splitlines()
    start = 0
    auto_restart = False
    previous = ""
    for index, row in enumerate(rows):
        found = _SYSTEMD.search(row)
        if found is None:
            continue
        message = found.group("message")
        if "Scheduled restart job" in message:
            auto_restart = True
        elif message.startswith("Starting ") and not auto_restart:
            start = index
        elif message.startswith("Started "):
            if not auto_restart and not previous.startswith("Starting "):
                start = index
            auto_restart = False
        previous = message
    end = None
    for index in range(start, len(rows)):
        found = _SYSTEMD.search(rows[index])
        if found is not None and _FAILED.search(found.group("message")):
            end = index
            break
    if end is None:
        return "\n".join(rows[-lines:]), False
    while end + 1 < len(rows):
        found = _SYSTEMD.search(rows[end + 1])
        if found is None or not _FAILURE_TAIL.search(found.group("message")):
            break
        end += 1
    return "\n".join(rows[max(start, end + 1 - lines):end + 1]), True

