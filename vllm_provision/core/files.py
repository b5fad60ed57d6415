"""Atomic writes of the controller's own files (state records, evidence, ``--out`` files)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vllm_provision.core.errors import ProvisionError


def replace_atomically(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder (written, fsynced,
    given ``mode``, then renamed over ``path``): a reader sees the old file or the new one,
    never half of one.

    Raises:
        OSError: the folder does not exist or is not writable (the temporary file is removed).
    """
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_private_json(path: Path, data: Any, *, what: str, indent: int = 2) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (:func:`replace_atomically`), mode 0600 in
    a folder created 0700; return ``path``.

    Args:
        path: the file. data: JSON-serialisable. what: the file's name in the error
            (``the state record``). indent: JSON indentation.

    Raises:
        ProvisionError: the folder or the file cannot be written (naming ``path``).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        replace_atomically(path, json.dumps(data, indent=indent, sort_keys=True) + "\n")
    except OSError as exc:
        raise ProvisionError.single(str(path), f"cannot write {what}: {exc.strerror}",
                                    fix="make the folder writable or set XDG_STATE_HOME") \
            from None
    return path
