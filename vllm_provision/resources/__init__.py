"""Where the playbooks, roles and verify suite live: found with :mod:`importlib.resources`.

In the repository they are the top-level folders ``playbooks/``, ``roles/`` and
``tests/verify/``; ``pyproject.toml`` maps them into the wheel as the packages
``vllm_provision.resources.playbooks``, ``.roles`` and ``.verify`` (setuptools ``package-dir``),
so a wheel install, an sdist install and an editable install (``pip install -e``) all find them
the same way. Playbooks and roles stay siblings in every layout: a playbook's roles are searched
in ``<playbook folder>/../roles`` (:func:`vllm_provision.runner.playbook.roles_search_path`).

A missing resource is an incomplete installation: every function here raises
:class:`~vllm_provision.core.errors.ProvisionError` naming what is missing and where it looked;
nothing
falls back to an empty default.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from vllm_provision.core.errors import ProvisionError

PACKAGE = "vllm_provision.resources"
# kind -> (package holding it, what it is, its folder in the repository)
KINDS: dict[str, tuple[str, str, str]] = {
    "playbooks": (f"{PACKAGE}.playbooks", "the playbooks", "playbooks/"),
    "roles": (f"{PACKAGE}.roles", "the roles", "roles/"),
    "verify": (f"{PACKAGE}.verify", "the verify suite", "tests/verify/"),
}
FIX = ("reinstall vllm-provision from a complete wheel or sdist (`pip install --force-reinstall "
       "vllm_provision-*.whl`), or from a checkout with `pip install -e .`")


def _missing(what: str, where: str, actual: str) -> ProvisionError:
    return ProvisionError.single(where, f"the installation of vllm-provision is incomplete: "
                                        f"{what} is missing", expected=f"{what} in the package",
                                 actual=actual, fix=FIX)


def folder(kind: str) -> Path:
    """The folder holding one kind of resource, as a real path on disk.

    Args:
        kind: ``playbooks``, ``roles`` or ``verify`` (the verify suite).

    Raises:
        ProvisionError: the package is not installed, or is not a folder on disk (a zipped
            install), naming the package and the repository folder it comes from.
        KeyError: an unknown ``kind`` (a bug of the caller).
    """
    package, what, repo_folder = KINDS[kind]
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError as exc:
        raise _missing(what, package, f"no package {package} ({exc}); it is built from "
                                      f"{repo_folder} of the repository") from None
    if not isinstance(root, Path) or not root.is_dir():
        raise _missing(what, package, f"{root!r} is not a folder on disk")
    return root


def playbook(name: str) -> Path:
    """The path of the packaged playbook ``<name>.yml`` (``up``, ``down``, ``restart``).

    Raises:
        ProvisionError: the file is not in the installed package.
    """
    path = folder("playbooks") / f"{name}.yml"
    if not path.is_file():
        raise _missing(f"the playbook {name}.yml", str(path), "no such file")
    return path


def role_defaults_files() -> list[Path]:
    """Every ``roles/<role>/defaults/main.yml`` of the packaged roles, sorted by role name.

    Raises:
        ProvisionError: the roles folder is missing or holds no role defaults.
    """
    roles = folder("roles")
    found = sorted(roles.glob("*/defaults/main.yml"))
    if not found:
        raise _missing("the role defaults (roles/*/defaults/main.yml)", str(roles),
                       "no role defaults in the folder")
    return found


def role_file(role: str, *parts: str) -> Path:
    """The path of one file of a packaged role, e.g. ``role_file("preflight", "defaults",
    "main.yml")``.

    Raises:
        ProvisionError: the file is not in the installed package.
    """
    path = folder("roles").joinpath(role, *parts)
    if not path.is_file():
        raise _missing(f"roles/{role}/{'/'.join(parts)}", str(path), "no such file")
    return path


def describe() -> dict[str, str]:
    """Where each kind of resource comes from (kind -> folder, or the error's message), for
    ``provision --version``; never raises."""
    where: dict[str, str] = {}
    for kind in KINDS:
        try:
            where[kind] = str(folder(kind))
        except ProvisionError as exc:
            where[kind] = f"MISSING ({exc.problems[0].message})"
    return where
