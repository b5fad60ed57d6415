"""``provision verify -i INVENTORY``: run the packaged verify suite against a deployed replica.

The suite (``tests/verify`` in the repository, ``vllm_provision.resources.verify`` in the wheel)
checks every node the way an operator does, with pytest-testinfra over SSH: units enabled and
running, files and their modes, sockets, rank 0's health, models and one completion, the peer
watchdog. pytest and testinfra are in the ``test`` extra (``pip install 'vllm-provision[test]'``).

pytest runs with the suite's folder as its root and no configuration file (``-c`` the null
device), so a ``pytest.ini``, ``pyproject.toml`` or ``conftest.py`` of the current directory
does not change it; no cache folder is written. Arguments after ``--`` go to pytest as they are
(``-- -k watchdog -x``). Exit codes are pytest's: 0 every check passed, 1 a check failed,
2-4 usage or collection errors, 5 nothing collected.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import click


def pytest_args(inventory: Path, extra_vars: tuple[str, ...], pytest_extra: tuple[str, ...],
                suite: Path) -> list[str]:
    """The pytest command line (without the program) that ``provision verify`` runs.

    Args:
        inventory: the deployed replica's inventory file.
        extra_vars: ``K=V`` strings for the suite's inventory (``--verify-extra-vars``).
        pytest_extra: arguments passed to pytest unchanged.
        suite: the verify suite's folder (:func:`vllm_provision.resources.folder`).
    """
    args = ["-c", os.devnull, "--rootdir", str(suite), "--confcutdir", str(suite),
            "-p", "no:cacheprovider", "-p", "vllm_provision.resources.verify.options",
            str(suite), "--inventory", str(inventory)]
    for item in extra_vars:
        args += ["--verify-extra-vars", item]
    return args + list(pytest_extra)


@click.command("verify", context_settings={"ignore_unknown_options": False})
@click.option("-i", "--inventory", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Inventory of the deployed replica.")
@click.option("-e", "--extra-vars", "extra_vars", multiple=True, metavar="K=V",
              help="Extra variable for the inventory (K=V); repeatable.")
@click.argument("pytest_extra", nargs=-1, type=click.UNPROCESSED)
def command(inventory: Path, extra_vars: tuple[str, ...], pytest_extra: tuple[str, ...]) -> None:
    """Check a deployed replica with the packaged verify suite (pytest-testinfra over SSH).

    Arguments after `--` are passed to pytest.
    """
    from vllm_provision import resources
    from vllm_provision.errors import ProvisionError

    for item in extra_vars:
        if "=" not in item:
            raise ProvisionError.single(f"-e {item}", "invalid extra variable",
                                        expected="K=V", actual=item)
    missing = [name for name in ("pytest", "testinfra") if importlib.util.find_spec(name) is None]
    if missing:
        raise ProvisionError.single(
            "provision verify", "the verify suite needs pytest and pytest-testinfra",
            actual=f"not installed: {', '.join(missing)}",
            fix="install the test extra: pip install 'vllm-provision[test]' "
                "(pipx: pipx install 'vllm_provision-*.whl[test]')") from None
    import pytest

    suite = resources.folder("verify")
    sys.exit(int(pytest.main(pytest_args(inventory, extra_vars, pytest_extra, suite))))
