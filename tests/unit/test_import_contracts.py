"""The package's rooms hold (docs/architecture.md, "Rooms").

The import contracts of ``[tool.importlinter]`` in pyproject.toml (a lower room never imports a
higher one, imports inside functions included; backends never import the command line; the
product never imports the lab), checked by import-linter; and the shape the contracts rely on: at
most three modules at the package root, and no product Python file over :data:`MAX_LINES` lines.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import vllm_provision

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(vllm_provision.__file__).parent


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_at_most_three_modules_lie_at_the_package_root() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 3, loose


# A product module longer than this is split into modules of its room (as transport/connection.py,
# stack/__init__.py and the watchdog were): each module keeps one job a reader can hold in mind.
MAX_LINES = 800


def test_no_product_python_file_is_over_the_line_limit() -> None:
    long = {}
    for folder in ("vllm_provision", "roles"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                long[name] = lines
    assert not long, f"split these into modules of at most {MAX_LINES} lines: {long}"
