"""A small, hand-made ``vllm serve`` table (format 1, vllm_provision/settings/vllm_cli) and a
fixture that loads it in place of the shipped one.

The releases and options are a subset of real ones (0.10.0 has no ``--nnodes``; 0.11.1 adds
it), plus three made up for the tests: 0.15.0 takes no abbreviations here, and
``--old-option`` became ``--renamed-option`` (with the old spelling as an alias) in 0.15.0.
Release indices: 0 = 0.10.0, 1 = 0.11.1, 2 = 0.12.0, 3 = 0.15.0, 4 = 0.26.0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from vllm_provision.settings import vllm_cli

ALL = 4


def _flag(first: int = 0, last: int = ALL, **props) -> list:
    base = {"aliases": [], "takes_value": True, "kind": "str", "choices": None, "nargs": None,
            "negatable": False}
    return [[first, last, {**base, **props}]]


def _bool(first: int = 0, last: int = ALL, **props) -> list:
    return _flag(first, last, takes_value=False, kind="bool", **props)


TABLE = {
    "format": 1, "made_by": "tests/unit/vllm_table_support.py", "made_at": "2026-12-04",
    "releases": ["0.10.0", "0.11.1", "0.12.0", "0.15.0", "0.26.0"],
    "allow_abbrev": [[0, 2, True], [3, 3, False], [4, 4, True]],
    "flags": {
        "--model": _flag(),
        "--tokenizer": _flag(),
        "--tensor-parallel-size": _flag(aliases=["-tp"], kind="int"),
        "--pipeline-parallel-size": _flag(aliases=["-pp"], kind="int"),
        "--data-parallel-size": _flag(aliases=["-dp"], kind="int"),
        "--data-parallel-address": _flag(aliases=["-dpa"]),
        "--data-parallel-rpc-port": _flag(aliases=["-dpp"], kind="int"),
        "--data-parallel-hybrid-lb": _bool(aliases=["-dph"]),
        "--max-model-len": _flag(kind="int"),
        "--max-num-seqs": _flag(kind="int"),
        "--served-model-name": _flag(nargs="+"),
        "--gpu-memory-utilization": _flag(kind="float"),
        "--host": _flag(),
        "--port": _flag(kind="int"),
        "--api-key": _flag(),
        "--api-server-count": _flag(aliases=["-asc"], kind="int"),
        "--hf-token": _flag(),
        "--hf-overrides": _flag(kind="json"),
        "--hf-config-path": _flag(),
        "--headless": _bool(),
        "--nnodes": _flag(1, ALL, aliases=["-n"], kind="int"),
        "--node-rank": _flag(1, ALL, aliases=["-r"], kind="int"),
        "--master-addr": _flag(1, ALL),
        "--master-port": _flag(1, ALL, kind="int"),
        "--distributed-executor-backend": _flag(
            choices=["ray", "mp", "uni", "external_launcher"]),
        "--enforce-eager": _bool(),
        "--enable-prefix-caching": _bool(negatable=True),
        "--kv-cache-dtype": _flag(choices=["auto", "fp8"]),
        "--all2all-backend": _flag(2, ALL, choices=["naive", "allgather_reducescatter"]),
        "--old-option": _flag(0, 2),
        "--renamed-option": _flag(3, ALL, aliases=["--old-option"]),
        "--swap-space": _flag(0, 2, kind="float"),
        "--max-num-partial-prefills": _flag(3, ALL, kind="int"),
        "--trust-remote-code": _bool(),
    },
    "env_to_flag": {"VLLM_ALL2ALL_BACKEND": {"flag": "--all2all-backend", "since": "0.12.0"}},
}
TEXT = json.dumps(TABLE)


def text_with(release: str) -> str:
    """The small table's JSON with ``release`` added as its newest, holding the newest
    release's options (for tests whose facts run a later vLLM than 0.26.0)."""
    table = json.loads(TEXT)
    last = len(table["releases"]) - 1
    table["releases"].append(release)
    for spans in [*table["flags"].values(), table["allow_abbrev"]]:
        for span in spans:
            if span[1] == last:
                span[1] = last + 1
    return json.dumps(table)


def clear() -> None:
    """Forget every parsed table and surface (the reader's caches)."""
    vllm_cli.table.cache_clear()
    vllm_cli._surface_at.cache_clear()


def use_table(monkeypatch: pytest.MonkeyPatch, text: str = TEXT) -> None:
    """Make ``text`` the shipped table for the rest of the test."""
    monkeypatch.setattr(vllm_cli, "_shipped_text", lambda: text)
    clear()


def no_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the shipped table missing, as in an installation without its data file."""
    def missing() -> str:
        raise FileNotFoundError("serve_flags.json")
    monkeypatch.setattr(vllm_cli, "_shipped_text", missing)
    clear()


@pytest.fixture
def small_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """The hand-made table as the shipped one; the caches are cleared before and after."""
    use_table(monkeypatch)
    yield TABLE
    clear()
