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

from vllm_provision.cli.help import examples
from vllm_provision.cli.options import shared_options


def pytest_args(inventory: Path, extra_vars: tuple[str, ...], pytest_extra: tuple[str, ...],
                suite: Path) -> list[str]:
    """The pytest command line (without the program) that ``provision verify`` runs.

    Args:
        inventory: the deployed replica's inventory file.
        extra_vars: ``-e`` values for the suite's inventory (``--verify-extra-vars``), each
            ``K=V``, a ``{...}`` mapping or ``@file.yml``
            (:func:`vllm_provision.cli.options.parse_extra_vars`).
        pytest_extra: arguments passed to pytest unchanged.
        suite: the verify suite's folder (:func:`vllm_provision.resources.folder`).
    """
    args = ["-c", os.devnull, "--rootdir", str(suite), "--confcutdir", str(suite),
            "-p", "no:cacheprovider", "-p", "vllm_provision.resources.verify.options",
            str(suite), "--inventory", str(inventory)]
    for item in extra_vars:
        args += ["--verify-extra-vars", item]
    return args + list(pytest_extra)


# The shared options that mean something to a pytest run over SSH: the inventory, its extra
# variables and pytest's verbosity. (The suite opens its own connections with unknown host keys
# refused; --timeout, --host-key-policy and -f do not apply to it.)
VERIFY_OPTIONS = ("inventory", "extra_vars", "verbose")


@click.command("verify", context_settings={"ignore_unknown_options": False}, epilog=examples(
    'provision verify -i inventory.yml',
    'provision verify -i inventory.yml -- -k watchdog -x'))
@shared_options(VERIFY_OPTIONS)
@click.argument("pytest_extra", nargs=-1, type=click.UNPROCESSED)
def command(inventory: Path, extra_vars: tuple[str, ...], verbose: int,
            pytest_extra: tuple[str, ...]) -> None:
    """Check a deployed replica with the packaged verify suite (pytest-testinfra over SSH).

    -e takes what the other commands take (K=V, a {...} mapping, @file.yml); -v is passed to
    pytest. Arguments after `--` are passed to pytest.
    """
    from vllm_provision import resources
    from vllm_provision.cli.options import parse_extra_vars
    from vllm_provision.core.errors import ProvisionError

    parse_extra_vars(extra_vars)  # refuse a bad -e here, with the same message as elsewhere
    missing = [name for name in ("pytest", "testinfra") if importlib.util.find_spec(name) is None]
    if missing:
        raise ProvisionError.single(
            "provision verify", "the verify suite needs pytest and pytest-testinfra",
            actual=f"not installed: {', '.join(missing)}",
            fix="install the test extra: pip install 'vllm-provision[test]' "
                "(pipx: pipx install 'vllm_provision-*.whl[test]')") from None
    import pytest

    suite = resources.folder("verify")
    verbosity = ("-" + "v" * verbose,) if verbose else ()
    sys.exit(int(pytest.main(pytest_args(inventory, extra_vars, verbosity + pytest_extra,
                                         suite))))
