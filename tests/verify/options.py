"""The verify suite's command-line options, a pytest plugin.

``provision verify`` loads it as a plugin when it runs the packaged suite; the repository's
``tests/conftest.py`` registers the same options for ``pytest tests/verify --inventory INV``.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--inventory INV`` (a deployed replica's inventory) and ``--verify-extra-vars K=V``."""
    group = parser.getgroup("vllm-provision verify suite")
    group.addoption("--inventory", default=None,
                    help="inventory of a deployed replica to verify")
    group.addoption("--verify-extra-vars", action="append", default=[], metavar="K=V|@FILE",
                    help="extra variables for the verify suite's inventory (as provision -e)")
