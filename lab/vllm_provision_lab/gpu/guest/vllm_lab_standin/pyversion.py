"""Make this venv's interpreter report the lab spec's Python version (lab only).

Imported at interpreter start by ``vllm_lab_python.pth``. When ``/etc/vllm-lab/spec.json``
names ``python`` (e.g. ``3.11.9``) and it differs from the real one, ``sys.version`` (which
``platform.python_version()`` parses) and ``sys.version_info`` (which Ray's version check uses)
are replaced. Any error leaves the interpreter untouched.
"""

from __future__ import annotations

import json
import os
import sys


class _VersionInfo(tuple):
    """A ``sys.version_info`` look-alike: a 5-tuple with named fields."""

    major = property(lambda self: self[0])
    minor = property(lambda self: self[1])
    micro = property(lambda self: self[2])
    releaselevel = property(lambda self: self[3])
    serial = property(lambda self: self[4])


def _apply() -> None:
    try:
        with open(os.environ.get("VLLM_LAB_SPEC", "/etc/vllm-lab/spec.json"),
                  encoding="utf-8") as handle:
            wanted = json.load(handle).get("python")
        if not wanted:
            return
        parts = [int(p) for p in str(wanted).split(".")[:3]]
    except (OSError, ValueError, AttributeError):
        return
    real = ".".join(str(p) for p in sys.version_info[:3])
    if len(parts) != 3 or str(wanted) == real:
        return
    sys.version = str(wanted) + sys.version[len(real):]
    sys.version_info = _VersionInfo((*parts, sys.version_info[3], sys.version_info[4]))  # type: ignore[assignment]


_apply()
