"""Notifications persisted on the host until their handler has run (beyond Ansible #4766).

When a task changes a host and notifies a handler, a small file is written on that host under
``/var/lib/vllm-provision/pending/``, in the same shell round trip as the change when the module
supports it. The file is removed only after the handler succeeded. A run that dies in between
(a later task fails, the connection drops) leaves the file, and the next run of a play that
defines that handler runs it and reports it, even though nothing changes on that run.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from vllm_provision.core import hostjson
from vllm_provision.core.paths import STATE_DIR
from vllm_provision.core.quoting import quote

PENDING_DIR = f"{STATE_DIR}/pending"
_SUFFIX = ".pending"


@dataclass(frozen=True)
class PendingNotification:
    """One handler notification waiting on a host.

    Attributes:
        handler: the notified name (a handler name or a ``listen`` topic).
        task: the task that notified it, for the report.
    """

    handler: str
    task: str = ""


def pending_path(handler: str, pending_dir: str = PENDING_DIR) -> str:
    """Return the file that records a pending ``handler``: a readable slug plus a hash."""
    slug = re.sub(r"[^a-z0-9]+", "-", handler.lower()).strip("-")[:40] or "handler"
    digest = hashlib.sha256(handler.encode()).hexdigest()[:12]
    return f"{pending_dir}/{slug}-{digest}{_SUFFIX}"


def persist_script(notifications: Iterable[PendingNotification],
                   pending_dir: str = PENDING_DIR) -> str:
    """Return shell commands that record ``notifications`` (``""`` when there are none).

    Each file holds one JSON line and is written by rename, so a reader never sees half a file.
    """
    commands: list[str] = []
    for item in notifications:
        path = pending_path(item.handler, pending_dir)
        line = json.dumps({"handler": item.handler, "task": item.task})
        tmp = quote(path + ".tmp") + '."$$"'
        commands.append(f"printf '%s\\n' {quote(line)} > {tmp} && mv -f {tmp} {quote(path)}")
    if not commands:
        return ""
    return f"mkdir -p {quote(pending_dir)} && " + " && ".join(commands)


def read_script(pending_dir: str = PENDING_DIR) -> str:
    """Return a shell command printing every pending notification, one JSON line each."""
    folder = quote(pending_dir)
    return (f"if [ -d {folder} ]; then for f in {folder}/*{_SUFFIX}; do "
            f'[ -f "$f" ] && head -n 1 "$f"; done; fi; true')


def parse_pending(stdout: str) -> list[PendingNotification]:
    """Parse :func:`read_script` output; lines that are not our JSON are skipped."""
    found: list[PendingNotification] = []
    for line in stdout.splitlines():
        try:
            data = hostjson.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("handler"), str):
            found.append(PendingNotification(data["handler"], str(data.get("task", ""))))
    return found


def clear_script(handlers: Iterable[str], pending_dir: str = PENDING_DIR) -> str:
    """Return a shell command removing the records of ``handlers`` (after they ran)."""
    paths = " ".join(quote(pending_path(h, pending_dir)) for h in handlers)
    return f"rm -f {paths}" if paths else "true"
