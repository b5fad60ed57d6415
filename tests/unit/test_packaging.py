"""The built sdist and wheel hold every playbook, role, template, the watchdog program and the
verify suite; a missing resource is an error naming it, never empty defaults."""

from __future__ import annotations

import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from setuptools import find_namespace_packages

from vllm_provision import resources, variables
from vllm_provision.errors import ProvisionError

REPO = Path(__file__).resolve().parents[2]
# repository folder -> where the wheel holds it
MAPPED = {"playbooks": "vllm_provision/resources/playbooks",
          "roles": "vllm_provision/resources/roles",
          "tests/verify": "vllm_provision/resources/verify"}


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def test_the_wheel_holds_every_playbook_role_template_watchdog_and_verify_file(
        built_dists: dict[str, Any]) -> None:
    names = set(zipfile.ZipFile(built_dists["wheel"]).namelist())
    expected = {f"{inside}/{rel}" for folder, inside in MAPPED.items()
                for rel in _files_under(REPO / folder)}
    assert len(expected) > 30
    assert expected - names == set()
    for must in ("vllm_provision/resources/playbooks/up.yml",
                 "vllm_provision/resources/roles/vllm_mp/templates/vllm.service.j2",
                 "vllm_provision/resources/roles/vllm_watchdog/files/vllm_watchdog.py",
                 "vllm_provision/resources/roles/preflight/defaults/main.yml",
                 "vllm_provision/resources/roles/preflight/tasks/main.yml",
                 "vllm_provision/resources/roles/vllm_mp/meta/main.yml",
                 "vllm_provision/resources/playbooks/start.yml",
                 "vllm_provision/resources/verify/test_replica.py",
                 "vllm_provision/resources/verify/options.py"):
        assert must in names
    code = {f"vllm_provision/{rel}" for rel in _files_under(REPO / "vllm_provision")}
    assert code - names == set()
    print(f"sdist + wheel built in {built_dists['build_s']:.1f} s")


def test_the_sdist_holds_the_playbooks_roles_and_verify_suite(
        built_dists: dict[str, Any]) -> None:
    with tarfile.open(built_dists["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    expected = {f"{folder}/{rel}" for folder in MAPPED for rel in _files_under(REPO / folder)}
    assert expected - names == set()


def test_pyproject_lists_every_python_package_of_the_tree() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set(find_namespace_packages(where=str(REPO), include=["vllm_provision*"]))
    mapped = {f"vllm_provision.resources.{name}" for name in ("playbooks", "roles", "verify")}
    assert listed == found | mapped
    assert {config["package-dir"][p] for p in mapped} == set(MAPPED)


def test_resources_are_found_in_the_installed_package() -> None:
    assert resources.playbook("up").name == "up.yml"
    assert (resources.folder("roles") / "vllm_watchdog" / "files" / "vllm_watchdog.py"
            ).is_file()
    assert (resources.folder("verify") / "test_replica.py").is_file()
    assert resources.folder("playbooks").parent == resources.folder("roles").parent


def test_a_missing_resource_is_an_error_naming_it_not_empty_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(resources.KINDS, "roles",
                        ("vllm_provision.resources.absent", "the roles", "roles/"))
    variables.role_defaults.cache_clear()
    try:
        with pytest.raises(ProvisionError) as caught:
            variables.role_defaults()
        text = caught.value.render()
        assert "incomplete" in text and "the roles is missing" in text
        assert "vllm_provision.resources.absent" in text and "reinstall" in text
        with pytest.raises(ProvisionError, match="the roles is missing"):
            resources.role_file("preflight", "defaults", "main.yml")
        assert resources.describe()["roles"].startswith("MISSING")
    finally:
        variables.role_defaults.cache_clear()


def test_a_missing_playbook_is_named() -> None:
    with pytest.raises(ProvisionError, match=r"the playbook nope\.yml is missing"):
        resources.playbook("nope")


def test_version_prints_where_the_playbooks_and_roles_come_from() -> None:
    from vllm_provision.cli import cli

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].startswith("provision (vllm-provision) 0.")
    assert f"playbooks: {resources.folder('playbooks')}" in lines
    assert f"roles: {resources.folder('roles')}" in lines


def test_verify_runs_pytest_on_the_packaged_suite_without_outside_configuration() -> None:
    from vllm_provision.cli.verify import pytest_args

    suite = resources.folder("verify")
    args = pytest_args(Path("inv.yml"), ("a=1",), ("-k", "watchdog"), suite)
    assert args[:2] == ["-c", "/dev/null"]
    assert args[args.index("--confcutdir") + 1] == str(suite)
    assert "vllm_provision.resources.verify.options" in args
    assert args[-6:] == ["--inventory", "inv.yml", "--verify-extra-vars", "a=1", "-k",
                         "watchdog"]
