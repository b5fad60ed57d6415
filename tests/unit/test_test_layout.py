"""The test tree itself: pytest imports test modules by basename (rootdir-relative, no
packages), so two test files with the same name in different folders break collection of the
whole suite ("import file mismatch")."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_unique_basename() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"


def test_every_lab_module_states_its_cost_for_the_scheduler() -> None:
    """tests/conftest.py orders the modules by the ``Cost: about N s`` line of their
    docstrings (docs/testing.md, "Module order"): a lab module without one would be started
    last, among the unit modules."""
    import ast
    import re

    missing = []
    for path in sorted((TESTS / "lab").glob("test_*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if not re.search(r"^Cost: about \d+ s\b", doc, re.MULTILINE):
            missing.append(path.name)
    assert not missing, f"say what these cost in their docstrings: {missing}"
