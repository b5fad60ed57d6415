"""A foreign process holding GPUs (the shared-pool case): ``python3 -m vllm_lab_standin.occupy``.

Usage: ``occupy GPU_INDEXES [MIB]`` (e.g. ``0,1 120000``); registers itself so the stand-in
nvidia-smi lists it under --query-compute-apps and counts its memory, then sleeps until killed.
"""

from __future__ import annotations

import signal
import sys
import time

from .common import register_compute_app


def main(argv: list[str]) -> int:
    """Register as using the GPUs in ``argv[0]`` with ``argv[1]`` MiB each; sleep forever."""
    gpus = [int(g) for g in argv[0].split(",") if g.strip()]
    mib = int(argv[1]) if len(argv) > 1 else 120000
    path = register_compute_app(gpus, mib, "python3")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    finally:
        if path is not None:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
