"""Differential test: ``provision inventory --list`` agrees with ``ansible-inventory --list``.

Every case under ``tests/data/inventories/ansible/`` (see its README.md) is one folder holding the
inventory source (a file or a directory: the one entry that is not ``group_vars``/``host_vars``)
and, beside it, the ``group_vars``/``host_vars`` Ansible reads. For each, both tools list the
inventory; every group (its hosts and children) and every host variable Ansible defines must be
the same in ours, and ours may add only the ``_vllm_provision`` key. ansible-core is pinned in
the ``test`` extra (pyproject.toml).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from vllm_provision.cli import cli
from vllm_provision.inventory.view import EXTRA_KEY

CORPUS = Path(__file__).resolve().parents[1] / "data" / "inventories" / "ansible"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def _source(case: str) -> Path:
    entries = [p for p in (CORPUS / case).iterdir()
               if p.name not in ("group_vars", "host_vars")]
    assert len(entries) == 1, f"{case}: one inventory source expected, found {entries}"
    return entries[0]


def _ansible(source: Path, tmp_path: Path) -> dict[str, Any] | str:
    """ansible-inventory's --list of ``source``, or its error text."""
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(config), "ANSIBLE_HOME": str(tmp_path),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",
           "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(source), "--list"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        return f"ansible-inventory failed on {source}:\n{done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def ansible_lists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any] | str]:
    """Every case listed by ansible-inventory, a few at a time (each run takes about 1 s)."""
    def one(case: str) -> dict[str, Any] | str:
        return _ansible(_source(case), tmp_path_factory.mktemp(case))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(CASES, pool.map(one, CASES), strict=True))


def _ours(source: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["inventory", "-i", str(source), "--list"])
    assert result.exit_code == 0, f"provision inventory failed on {source}:\n{result.output}"
    return json.loads(result.stdout)


def _differences(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    found: list[str] = []
    groups = sorted(set(theirs) - {"_meta"} | set(ours) - {"_meta", EXTRA_KEY})
    for group in groups:
        if theirs.get(group) != ours.get(group):
            found.append(f"group {group}: ansible {theirs.get(group)} != ours {ours.get(group)}")
    hostvars_a = theirs["_meta"]["hostvars"]
    hostvars_o = ours["_meta"]["hostvars"]
    for host in sorted(set(hostvars_a) | set(hostvars_o)):
        a, o = hostvars_a.get(host, {}), hostvars_o.get(host, {})
        for name in sorted(set(a) | set(o)):
            if a.get(name, "<unset>") != o.get(name, "<unset>"):
                found.append(f"host {host} var {name}: ansible {a.get(name, '<unset>')!r} != "
                             f"ours {o.get(name, '<unset>')!r}")
    return found


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30, CASES
    readme = (CORPUS / "README.md").read_text()
    missing = [case for case in CASES if f"`{case}`" not in readme]
    assert not missing, f"cases not described in README.md: {missing}"


@pytest.mark.parametrize("case", CASES)
def test_provision_inventory_matches_ansible_inventory(
        case: str, ansible_lists: dict[str, dict[str, Any] | str]) -> None:
    theirs = ansible_lists[case]
    assert isinstance(theirs, dict), theirs
    ours = _ours(_source(case))
    differences = _differences(theirs, ours)
    assert not differences, f"{case}: " + "\n".join(differences)
    assert ours.get("_meta", {}).get("profile") == theirs["_meta"].get("profile")
