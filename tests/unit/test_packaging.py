"""The built sdist and wheel hold every playbook, role, template, the watchdog program and the
verify suite; a missing resource is an error naming it, never empty defaults. The operator's
wheel holds no lab code and no stand-in: the lab is the distribution in lab/ (its pyproject
lists its packages and pins this release) and adds `provision lab` through an entry point."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from setuptools import find_namespace_packages

import vllm_provision.cli
from vllm_provision import resources
from vllm_provision.core.errors import ProvisionError
from vllm_provision.settings import variables

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab"  # the second distribution, vllm-provision-lab
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
                 "vllm_provision/resources/roles/vllm_watchdog/files/vllm_watchdog_rules.py",
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
    for name in ("vllm_watchdog.py", "vllm_watchdog_rules.py"):
        assert (resources.folder("roles") / "vllm_watchdog" / "files" / name).is_file()
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


def test_the_operator_wheel_holds_no_lab_code_and_no_stand_in(
        built_dists: dict[str, Any]) -> None:
    wheel = zipfile.ZipFile(built_dists["wheel"])
    names = wheel.namelist()
    assert [n for n in names if n.split("/")[0] not in (
        "vllm_provision", "vllm_provision-0.1.0.dist-info")] == []
    assert [n for n in names if "vllm_lab_standin" in n or "nvidia_smi" in n
            or n.startswith(("vllm_provision/lab/", "vllm_provision_lab"))] == []
    # nor under another name: no file of the wheel has the bytes of a file of the lab
    lab_files = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in LAB.rglob("*.py")
                 if "__pycache__" not in p.parts and p.stat().st_size}
    assert len(lab_files) > 30
    copies = {n: lab_files[digest] for n in names
              if (digest := hashlib.sha256(wheel.read(n)).hexdigest()) in lab_files}
    assert copies == {}
    entry_points = wheel.read("vllm_provision-0.1.0.dist-info/entry_points.txt").decode()
    assert entry_points.split() == ["[console_scripts]", "provision", "=",
                                    "vllm_provision.cli:main"]


def test_the_lab_pyproject_lists_its_packages_pins_this_release_and_adds_provision_lab(
) -> None:
    lab = tomllib.loads((LAB / "pyproject.toml").read_text())
    product = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert lab["project"]["name"] == "vllm-provision-lab"
    assert lab["project"]["version"] == product["version"]
    assert lab["project"]["dependencies"] == [f"vllm-provision=={product['version']}"]
    assert lab["project"]["entry-points"] == {
        vllm_provision.cli.ENTRY_POINT_GROUP: {"lab": "vllm_provision_lab.cli:command"}}
    listed = set(lab["tool"]["setuptools"]["packages"])
    assert listed == set(find_namespace_packages(where=str(LAB), include=["vllm_provision_lab*"]))
    # the package data is "*.py": the lab has no file of another kind that a wheel would drop
    assert lab["tool"]["setuptools"]["package-data"] == {"*": ["*.py"]}
    assert [p for p in (LAB / "vllm_provision_lab").rglob("*") if p.is_file()
            and "__pycache__" not in p.parts and p.suffix != ".py"] == []
    product_packages = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["packages"]
    assert [p for p in product_packages if "lab" in p] == []


def test_the_installed_lab_adds_provision_lab_through_its_entry_point() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(
        group=vllm_provision.cli.ENTRY_POINT_GROUP) if e.name == "lab"]
    assert entry.dist is not None and entry.dist.name == "vllm-provision-lab"
    assert entry.dist.version == importlib.metadata.version("vllm-provision")
    result = CliRunner().invoke(vllm_provision.cli.cli, ["lab", "--help"])
    assert result.exit_code == 0, result.output
    assert "Throw-away Debian hosts" in result.output and "occupy" in result.output


def test_without_the_lab_provision_lab_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(vllm_provision.cli, "_entry_points", dict)
    helped = CliRunner().invoke(vllm_provision.cli.cli, ["--help"])
    assert helped.exit_code == 0
    assert re.search(r"\n  lab +Not installed: the local test lab", helped.output)
    monkeypatch.setattr("sys.argv", ["provision", "lab", "up", "--hosts", "3"])
    with pytest.raises(SystemExit) as exited:
        vllm_provision.cli.main()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "provision lab" in err and "is not installed" in err
    assert "vllm-provision-lab" in err and "bash scripts/setup.sh" in err
    assert "pip install -e ./lab" in err and "Traceback" not in err


def test_a_broken_command_entry_point_is_an_error_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    broken = importlib.metadata.EntryPoint(
        "lab", "vllm_provision_lab.absent:command", vllm_provision.cli.ENTRY_POINT_GROUP)
    monkeypatch.setattr(vllm_provision.cli, "_entry_points", lambda: {"lab": broken})
    with pytest.raises(ProvisionError) as caught:
        CliRunner().invoke(vllm_provision.cli.cli, ["lab", "up"], catch_exceptions=False)
    text = caught.value.render()
    assert "entry point lab = vllm_provision_lab.absent:command" in text
    assert "ModuleNotFoundError" in text and "reinstall" in text
    # a name of the product's own commands cannot be taken over by an entry point
    monkeypatch.setattr(vllm_provision.cli, "_entry_points", lambda: {"up": broken})
    up = vllm_provision.cli.cli.get_command(click.Context(vllm_provision.cli.cli), "up")
    assert up is not None and up.callback is not None
    assert up.callback.__module__ == "vllm_provision.cli.up"
