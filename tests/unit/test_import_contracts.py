"""The package's rooms hold (docs/architecture.md, "Rooms").

The import contracts of ``[tool.importlinter]`` in pyproject.toml (a lower room never imports a
higher one, imports inside functions included; backends never import the command line; the
product never imports the lab), checked by import-linter; no import circle; and the shape the
contracts rely on: at most three modules at the package root, and no product Python file over
:data:`MAX_LINES` lines.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

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


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without
    recursion): each is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(
                        child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_in_the_package() -> None:
    """No module reaches itself through imports, imports inside functions included (grimp reads
    them); imports under ``if TYPE_CHECKING:`` are annotations, never run, and not counted
    (docs/architecture.md, "Rooms")."""
    graph = grimp.build_graph("vllm_provision", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_circle_finder_finds_circles() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("e", "e2"),
                               ("e2", "e")):
        graph.add_import(importer=importer, imported=imported)
    graph.add_module("alone")
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["e", "e2"]]
