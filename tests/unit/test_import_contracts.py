"""The package's rooms hold (docs/architecture.md, "Rooms").

The import contracts of ``[tool.importlinter]`` in pyproject.toml (a lower room never imports a
higher one, imports inside functions included; backends never import the command line; the
product never imports the lab), checked by import-linter; and the shape the contracts rely on: at
most three modules at the package root.
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

