"""Known multi-node breakages of vLLM releases, as data (``breakages.json`` beside this file).

Each entry names a public issue, the versions it affects (``from`` inclusive, ``before``
exclusive, in PEP 440 order so that development builds such as ``0.26.1rc1.dev148+g1a2b``
fall in their place), the backend and the replica layout it needs, the workaround, and
whether preflight warns or refuses (docs/preflight.md, ``vllm_serve.breakages``).
:func:`matching` returns the entries that apply to one installed version and one layout.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["Breakage", "Layout", "breakages", "matching", "version_key"]

DATA = "breakages.json"
_VERSION_RE = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc)(\d+))?(?:[-_.]?post(\d+))?"
                         r"(?:[-_.]?dev(\d+))?(?:\+[A-Za-z0-9.]+)?$")
_STAGES = {"a": 0, "b": 1, "rc": 2}


def version_key(version: str) -> tuple[Any, ...] | None:
    """A sort key of a version in PEP 440 order (release, pre-release, post, dev; a local
    part such as ``+cu129`` ignored), or None when ``version`` is not one.

    ``0.26.1rc1.dev78 < 0.26.1rc1.dev148 < 0.26.1rc1 < 0.26.1 < 0.26.1.post1``, and
    ``0.26.1.dev5`` comes before every pre-release of 0.26.1 (PEP 440, "Summary of permitted
    suffixes and relative ordering").
    """
    match = _VERSION_RE.match(str(version).strip().lower())
    if match is None:
        return None
    release = tuple(int(p) for p in match[1].split("."))
    release = release + (0,) * (4 - len(release)) if len(release) < 4 else release
    if match[2] is not None:
        pre: tuple[float, int] = (_STAGES[match[2]], int(match[3]))
    elif match[5] is not None and match[4] is None:
        pre = (-1, 0)
    else:
        pre = (3, 0)
    post = int(match[4]) if match[4] is not None else -1
    dev = int(match[5]) if match[5] is not None else math.inf
    return (release, pre, post, dev)


@dataclass(frozen=True)
class Layout:
    """What a breakage's condition is matched against: one replica as this tool runs it.

    Attributes:
        backend: ``vllm_backend`` (``mp``, ``ray``).
        nodes: the replica's node count.
        tensor_parallel: ``vllm_tensor_parallel_size``.
        pipeline_parallel: ``vllm_pipeline_parallel_size``.
        gpus_per_node: GPU workers per node (world size / nodes).
        options: the long names of every option of the node's ``vllm serve`` line.
    """

    backend: str
    nodes: int
    tensor_parallel: int
    pipeline_parallel: int
    gpus_per_node: int
    options: Collection[str] = ()


@dataclass(frozen=True)
class Breakage:
    """One known breakage (an entry of ``breakages.json``).

    Attributes:
        id: a stable name (``vllm-52907``).
        issue: the public issue's address.
        title: its title, as read.
        affected: what the issue (and, where said, vLLM's sources) show about the versions.
        verified: the issue was found and read; False for an entry kept unread.
        first: the oldest affected version (inclusive).
        before: the first version no longer affected (exclusive).
        backend: the backend it needs, or None for any.
        layout: conditions on the replica (``min_nodes``, ``min_pipeline_parallel``,
            ``tp_spans_nodes``).
        unless_option: an option whose presence is the workaround applied, or None.
        refuse: True to refuse (preflight error), False to warn.
        symptom: what an operator sees.
        workaround: what to do.
    """

    id: str
    issue: str
    title: str
    affected: str
    verified: bool
    first: str
    before: str
    backend: str | None
    layout: dict[str, Any]
    unless_option: str | None
    refuse: bool
    symptom: str
    workaround: str

    def covers(self, version: str) -> bool:
        """True when ``version`` is in ``[first, before)``; False for a version that is not
        one (PEP 440)."""
        key, low, high = version_key(version), version_key(self.first), version_key(self.before)
        return key is not None and low is not None and high is not None and low <= key < high

    def fits(self, layout: Layout) -> bool:
        """True when ``layout`` meets every condition (backend, layout keys, and the
        workaround option absent)."""
        if self.backend is not None and layout.backend != self.backend:
            return False
        if layout.nodes < int(self.layout.get("min_nodes", 1)):
            return False
        if layout.pipeline_parallel < int(self.layout.get("min_pipeline_parallel", 1)):
            return False
        if self.layout.get("tp_spans_nodes") and layout.tensor_parallel <= layout.gpus_per_node:
            return False
        return not (self.unless_option and self.unless_option in layout.options)


def _entry(raw: dict[str, Any]) -> Breakage:
    versions = raw["versions"]
    if raw["action"] not in ("warn", "refuse"):
        raise ValueError(f"{DATA}: {raw['id']!r} has action {raw['action']!r}")
    for bound in (versions["from"], versions["before"]):
        if version_key(bound) is None:
            raise ValueError(f"{DATA}: {raw['id']!r} has a version bound {bound!r}")
    return Breakage(id=str(raw["id"]), issue=str(raw["issue"]), title=str(raw["title"]),
                    affected=str(raw.get("affected", "")), verified=bool(raw["verified"]),
                    first=str(versions["from"]), before=str(versions["before"]),
                    backend=raw.get("backend"), layout=dict(raw.get("layout") or {}),
                    unless_option=raw.get("unless_option"), refuse=raw["action"] == "refuse",
                    symptom=str(raw.get("symptom", "")), workaround=str(raw["workaround"]))


def _shipped_text() -> str:
    """The shipped ``breakages.json`` (tests replace this function)."""
    return resources.files(__package__).joinpath(DATA).read_text(encoding="utf-8")


@lru_cache(maxsize=4)
def breakages(text: str | None = None) -> tuple[Breakage, ...]:
    """Every entry of ``breakages.json`` (``text``: another file's JSON, for tests).

    Raises:
        FileNotFoundError: the file is missing from the installation.
        ValueError: it is not format 1, or an entry has an unknown action or a bound that is
            not a version.
        KeyError: an entry lacks ``id``, ``issue``, ``title``, ``versions``, ``verified``,
            ``action`` or ``workaround``.
    """
    data = json.loads(_shipped_text() if text is None else text)
    if not isinstance(data, dict) or data.get("format") != 1:
        raise ValueError(f"{DATA} is not a breakage list of format 1")
    return tuple(_entry(raw) for raw in data["breakages"])


def matching(version: str, layout: Layout, text: str | None = None) -> list[Breakage]:
    """The breakages that affect ``version`` (a node's installed vLLM) with ``layout``, in file
    order. Raises as :func:`breakages`."""
    return [b for b in breakages(text) if b.covers(version) and b.fits(layout)]
