"""Bench and fault results in the controller's state folder, next to the ``up`` record.

``$XDG_STATE_HOME/vllm-provision/<inventory stem>-<12 hex>.evidence.json`` (the same name as
the state record of :func:`vllm_provision.state.controller_state_path`, another suffix), 0600,
written atomically (temp file, fsync, rename). Shape: ``{"schema": 1, "bench": <last bench
result>, "faults": {"<host>:<unit>": <last fault result on that target>}, "fabric": <last
provision fabric result>}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_provision.core.errors import ProvisionError

SCHEMA = 1


def evidence_path(inventory_path: Path) -> Path:
    """Where the evidence of the inventory at ``inventory_path`` is kept."""
    from vllm_provision.state import controller_state_path

    return controller_state_path(inventory_path).with_suffix(".evidence.json")


def read(inventory_path: Path) -> dict[str, Any]:
    """The stored evidence (``{"schema", "bench", "faults", "fabric"}``; empty ones when
    none).

    Raises:
        ProvisionError: the file exists but is unreadable or not this schema.
    """
    path = evidence_path(inventory_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"schema": SCHEMA, "bench": None, "faults": {}, "fabric": None}
    except (OSError, ValueError) as exc:
        raise ProvisionError.single(str(path), f"cannot read the stored evidence: {exc}",
                                    fix="remove the file and run `provision bench` again") \
            from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProvisionError.single(str(path), "not an evidence file this version can read",
                                    expected=f"a JSON object with schema {SCHEMA}",
                                    fix="remove the file and run the experiments again")
    data.setdefault("bench", None)
    data.setdefault("faults", {})
    data.setdefault("fabric", None)
    return data


def update(inventory_path: Path, *, bench: dict[str, Any] | None = None,
           fault: tuple[str, dict[str, Any]] | None = None,
           fabric: dict[str, Any] | None = None) -> Path:
    """Store a new bench result, one fault result (``(target, result)``) and/or a fabric
    result, keeping the rest; return the file's path.

    Raises:
        ProvisionError: the folder or file cannot be written, or the old file is unreadable.
    """
    data = read(inventory_path)
    if bench is not None:
        data["bench"] = bench
    if fault is not None:
        data["faults"][fault[0]] = fault[1]
    if fabric is not None:
        data["fabric"] = fabric
    from vllm_provision.core.files import write_private_json

    return write_private_json(evidence_path(inventory_path), data, what="the evidence",
                              indent=1)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to a file the user named (``--out``), atomically.

    Raises:
        ProvisionError: it cannot be written.
    """
    write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`vllm_provision.core.files.replace_atomically`).

    Raises:
        ProvisionError: the folder does not exist or is not writable.
    """
    from vllm_provision.core.files import replace_atomically

    try:
        replace_atomically(path, text)
    except OSError as exc:
        raise ProvisionError.single(str(path), f"cannot write: {exc.strerror}",
                                    fix="name a file in a writable folder") from None
