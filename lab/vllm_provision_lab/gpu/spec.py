"""The lab spec: what GPUs, driver and library versions each simulated host pretends to have.

The spec is YAML (``provision lab up --spec FILE`` copies it to ``<state dir>/spec.yml``). Top-level
keys are the values for every host; ``hosts: {h2: {nccl: 2.27.3}}`` overrides them per host.
Values changed on a running lab with ``provision lab set`` are kept in
``<state dir>/gpu-overrides.json`` so a host rebooted by the lab keeps them.

Example::

    nccl: 2.28.9
    load_s: 3
    hosts:
      h2: {nccl: 2.27.3, gpus: 2}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vllm_provision.core.errors import Problem
from vllm_provision_lab.errors import LabError

SPEC_FILE = "spec.yml"
OVERRIDES_FILE = "gpu-overrides.json"
GUEST_SPEC_PATH = "/etc/vllm-lab/spec.json"


@dataclass(frozen=True)
class Key:
    """One settable value of a host's simulated GPU stack.

    Attributes:
        name: the key as written in the spec and in ``lab set HOST name=value``.
        kind: ``str``, ``int`` or ``float`` (seconds for ``*_s`` keys, MiB for ``*_mib``).
        default: the value when neither the spec nor ``lab set`` gives one; ``None`` means
            "derived" (``torch_cuda`` from ``cuda``) or "the guest's own" (``python``).
        doc: what it means, one line.
        choices: the values a ``str`` key takes (empty: any text).
    """

    name: str
    kind: type
    default: str | int | float | None
    doc: str
    choices: tuple[str, ...] = ()


# The phases the stand-in can stall in (key ``stall``; common.startup_phases), in start order.
STALL_PHASES = ("none", "init", "load", "kv_cache", "graphs")

# Defaults: the reference scenario of docs/measured.md (2 x 4 H200, CUDA 13 wheels).
KEYS: dict[str, Key] = {k.name: k for k in [
    Key("gpus", int, 4, "number of GPUs nvidia-smi lists"),
    Key("gpu_name", str, "NVIDIA H200", "GPU product name"),
    Key("gpu_memory_mib", int, 143771, "memory.total per GPU, MiB (H200 141 GB)"),
    Key("driver", str, "580.95.05", "NVIDIA driver version"),
    Key("cuda", str, "13.0", "CUDA version the driver supports (nvidia-smi header)"),
    Key("nccl", str, "2.28.9", "version of the nvidia-nccl-cuXX distribution in the venv"),
    Key("torch", str, "2.14.0", "torch release, without the local build tag"),
    Key("torch_cuda", str, None, "torch build tag, e.g. cu130 (default: from cuda)"),
    Key("vllm", str, "0.33.0", "vllm distribution version"),
    Key("transformers", str, "5.19.0", "transformers distribution version"),
    Key("ray", str, None, "ray version the venv reports (default: the base's real Ray, "
        "2.60.0 on bookworm and trixie, 2.51.2 on bullseye)"),
    Key("python", str, None, "Python version the venv reports (default: the guest's)"),
    Key("ecc_gpus", str, "none", "GPU indexes (comma separated) with 2 uncorrectable ECC "
        "errors in ecc.errors.uncorrected.aggregate.total, or none"),
    Key("mig_gpus", str, "none", "GPU indexes (comma separated) with mig.mode.current "
        "Enabled, or none"),
    Key("persistence_off_gpus", str, "none", "GPU indexes (comma separated) with "
        "persistence_mode Disabled, or none"),
    Key("load_s", float, 5.0, "stand-in vLLM: seconds to 'load weights' before serving"),
    Key("ttft_s", float, 0.05, "stand-in vLLM: seconds to the first token"),
    Key("token_s", float, 0.02, "stand-in vLLM: seconds between tokens"),
    Key("stop_s", float, 4.0, "stand-in vLLM: seconds a healthy headless node takes to stop "
        "on SIGTERM (vLLM 0.32.0 CPU in the lab: 4.0-5.7 s, docs/real-vllm.md)"),
    Key("init_timeout_s", float, 600.0,
        "stand-in vLLM: torch.distributed/NCCL init timeout, seconds (PyTorch default 600)"),
    Key("pg_timeout_s", float, 1800.0,
        "stand-in vLLM: placement group wait, seconds (vLLM PG_WAIT_TIMEOUT 1800)"),
    Key("stage_s", float, 0.0,
        "stand-in vLLM (ray): seconds one step takes on each Ray worker (a pipeline stage's "
        "forward); longer than RAY_CGRAPH_get_timeout fails as Ray's compiled graph does"),
    Key("stall", str, "none", "stand-in vLLM: the start-up phase it stops in and sits in for "
        "ever, after printing vLLM's lines up to there: init (before loading: joining the "
        "group), load (loading weights), kv_cache (the KV cache sized), graphs (capturing CUDA "
        "graphs), or none", choices=STALL_PHASES),
]}


def host_count(state_dir: Path) -> int:
    """Return how many hosts the lab spec asks for (``host_count``, default 2).

    Raises:
        LabError: the spec file is not valid YAML or ``host_count`` is not a positive integer.
    """
    raw = _read_spec_file(state_dir)
    count = raw.get("host_count", 2)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise LabError.single(f"{state_dir / SPEC_FILE}: host_count", "invalid host count",
                              expected="a positive integer", actual=repr(count),
                              fix="write e.g. host_count: 2")
    return count


def effective_spec(state_dir: Path, host_name: str) -> dict[str, Any]:
    """Return the full spec of one host: defaults < spec top level < spec ``hosts.<host>`` <
    values set with ``lab set``.

    Args:
        state_dir: the lab's state directory (may hold ``spec.yml`` and ``gpu-overrides.json``).
        host_name: the lab host, e.g. ``h2``.

    Returns:
        ``{key: value}`` for every key of :data:`KEYS` plus ``host`` (the host name);
        ``torch_cuda`` is filled in from ``cuda`` when not given.

    Raises:
        LabError: a file is unreadable, a key is unknown or a value has the wrong type.
    """
    spec = spec_defaults(state_dir, host_name)
    overrides = read_overrides(state_dir).get(host_name, {})
    spec.update(validate_values(overrides, f"{state_dir / OVERRIDES_FILE}: {host_name}"))
    return finish(spec, host_name)


def spec_defaults(state_dir: Path, host_name: str) -> dict[str, Any]:
    """Return a host's values from the built-in defaults and ``spec.yml`` only (no ``lab set``).

    These are what ``lab set HOST key=default`` goes back to.
    """
    raw = _read_spec_file(state_dir)
    where = str(state_dir / SPEC_FILE)
    per_host = raw.get("hosts") or {}
    if not isinstance(per_host, Mapping):
        raise LabError.single(f"{where}: hosts", "hosts must be a mapping",
                              expected="hosts: {h2: {nccl: 2.27.3}}", actual=repr(per_host))
    top = {k: v for k, v in raw.items() if k not in ("hosts", "host_count")}
    spec: dict[str, Any] = {name: key.default for name, key in KEYS.items()}
    spec.update(validate_values(top, where))
    host_values = per_host.get(host_name) or {}
    spec.update(validate_values(host_values, f"{where}: hosts.{host_name}"))
    return spec


def finish(spec: dict[str, Any], host_name: str) -> dict[str, Any]:
    """Fill in derived values (``torch_cuda`` from ``cuda``, the release's ``vllm serve``
    options from ``vllm``: :func:`serve_surface`) and the host name; return ``spec``."""
    if not spec.get("torch_cuda"):
        spec["torch_cuda"] = "cu" + str(spec["cuda"]).replace(".", "")
    spec["host"] = host_name
    spec.update(serve_surface(str(spec["vllm"])))
    return spec


def serve_surface(version: str) -> dict[str, Any]:
    """The ``vllm serve`` options of vLLM ``version`` for the stand-in's parser, from the
    product's table of releases (:mod:`vllm_provision.settings.vllm_cli`, docs/vllm-versions.md):
    ``{"serve_release": the table's release, "serve_allow_abbrev": bool, "serve_options": [...]}``
    (each option ``{"name", "aliases", "takes_value", "kind", "choices", "nargs",
    "negatable"}``), so ``lab set h1 vllm=0.11.0`` makes the stand-in accept and refuse what
    0.11.0 does. A release between two of the table's uses the nearest older one, a newer one
    the newest; an older or unreadable one, or a table missing from the installation, gives
    ``{}`` (the stand-in keeps its own short list of options).
    """
    from vllm_provision.settings import vllm_cli

    try:
        surface, _warning = vllm_cli.surface(version)
    except (ValueError, OSError):
        return {}
    seen: dict[str, Any] = {}
    for flag in surface.flags.values():
        seen.setdefault(flag.name, {
            "name": flag.name, "aliases": list(flag.aliases), "takes_value": flag.takes_value,
            "kind": flag.kind, "choices": None if flag.choices is None else list(flag.choices),
            "nargs": flag.nargs, "negatable": flag.negatable})
    return {"serve_release": surface.release, "serve_allow_abbrev": surface.allow_abbrev,
            "serve_options": [seen[name] for name in sorted(seen)]}


def validate_values(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check keys and coerce values to their kind.

    Args:
        values: ``{key: value}`` as read from YAML/JSON or parsed from ``key=value``.
        where: the place to name in an error (file and key path).

    Raises:
        LabError: unknown key, or a value that is not of the key's kind (listing all problems).
    """
    if not isinstance(values, Mapping):
        raise LabError.single(where, "expected a mapping of spec keys", actual=repr(values))
    problems: list[Problem] = []
    result: dict[str, Any] = {}
    for name, value in values.items():
        key = KEYS.get(str(name))
        if key is None:
            problems.append(Problem(f"{where}.{name}", "unknown lab spec key",
                                    expected="one of " + ", ".join(KEYS), actual=str(name)))
            continue
        try:
            result[key.name] = _coerce(key, value)
        except ValueError:
            problems.append(Problem(f"{where}.{name}", f"{key.doc}: wrong type",
                                    expected=f"a {key.kind.__name__}", actual=repr(value)))
            continue
        if key.choices and result[key.name] not in key.choices:
            problems.append(Problem(f"{where}.{name}", f"unknown value of {key.name}",
                                    expected="one of " + ", ".join(key.choices),
                                    actual=repr(value),
                                    fix=f"e.g. provision lab set h2 {key.name}={key.choices[-1]}"
                                        f" (back: {key.name}=default)"))
    if problems:
        raise LabError(problems)
    return result


def parse_assignments(assignments: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split ``key=value`` command-line words into values to set and keys to reset.

    Args:
        assignments: e.g. ``["vllm=0.33.1", "nccl=default"]``.

    Returns:
        (``{key: value-as-text}``, ``[keys given as "default"]``); types are checked by
        :func:`validate_values`.

    Raises:
        LabError: a word without ``=`` or with an empty key.
    """
    values: dict[str, str] = {}
    resets: list[str] = []
    for word in assignments:
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise LabError.single(word, "not a key=value assignment", expected="key=value",
                                  actual=word, fix="e.g. provision lab set h2 vllm=0.33.1")
        if value == "default":
            resets.append(name)
        else:
            values[name] = value
    return values, resets


def read_overrides(state_dir: Path) -> dict[str, dict[str, Any]]:
    """Return ``{host: {key: value}}`` set with ``lab set`` (empty when none)."""
    path = state_dir / OVERRIDES_FILE
    data = _read_state_file(path, json.loads, json.JSONDecodeError, "lab overrides",
                            f"delete {path} to go back to the spec")
    return data if isinstance(data, dict) else {}


def write_overrides(state_dir: Path, overrides: Mapping[str, Mapping[str, Any]]) -> None:
    """Store ``{host: {key: value}}`` (hosts with no value are dropped)."""
    path = state_dir / OVERRIDES_FILE
    kept = {host: dict(values) for host, values in overrides.items() if values}
    path.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def clear_overrides(state_dir: Path) -> None:
    """Forget every ``lab set`` value (call on a fresh ``lab up``)."""
    (state_dir / OVERRIDES_FILE).unlink(missing_ok=True)


def _read_state_file(path: Path, parse: Callable[[str], Any], error: type[Exception], what: str,
                     fix: str) -> Any:
    """``parse`` of the text of ``path`` (UTF-8), or None when there is no such file.

    Raises:
        LabError: naming ``path``, ``what`` it holds and the ``fix``, when it cannot be read
            (OSError) or ``parse`` raises ``error``.
    """
    if not path.exists():
        return None
    try:
        return parse(path.read_text(encoding="utf-8"))
    except (OSError, error) as exc:
        raise LabError.single(str(path), f"cannot read {what}: {exc}", fix=fix) from exc


def _read_spec_file(state_dir: Path) -> dict[str, Any]:
    path = state_dir / SPEC_FILE
    raw = _read_state_file(path, yaml.safe_load, yaml.YAMLError, "the lab spec",
                           "fix the YAML or run lab up without --spec")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise LabError.single(str(path), "the lab spec must be a mapping",
                              actual=type(raw).__name__)
    return raw


def _coerce(key: Key, value: Any) -> str | int | float | None:
    if value is None:
        return key.default
    if isinstance(value, bool):
        raise ValueError(value)
    if key.kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        number = int(value)
        if number < 0:
            raise ValueError(value)
        return number
    if key.kind is float:
        number_f = float(value)
        if number_f < 0:
            raise ValueError(value)
        return number_f
    text = str(value).strip()
    if not text:
        raise ValueError(value)
    return text
