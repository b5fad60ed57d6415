"""Every invalid inventory under tests/data/inventories/bad gives one clear problem, no traceback.

The table of expectations is ``tests/data/inventories/bad/expected.yml``: for each case the
message fragment, the key path and the value the problem must name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_provision.cli.options import parse_extra_vars
from vllm_provision.core.errors import InventoryError, ProvisionError
from vllm_provision.inventory import load_inventory, require_replicas, select_hosts, yaml_limits

BAD = Path(__file__).resolve().parents[1] / "data" / "inventories" / "bad"
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((BAD / "expected.yml").read_text())


def _inventory_path(case: str, spec: dict[str, Any]) -> Path:
    if "inventory" in spec:
        return BAD / spec["inventory"]  # an absolute path (/dev/zero) stays as it is
    path = BAD / case
    return path / "inventory.yml" if path.is_dir() else path


def _special_file(kind: str, folder: Path) -> Path:
    """A file git cannot hold: a FIFO (must not hang), or a file over the size cap (sparse)."""
    path = folder / f"{kind}.yml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        with path.open("wb") as handle:
            handle.truncate(yaml_limits.MAX_BYTES + 1)
    return path


def _extra_vars(spec: dict[str, Any], special: Path | None) -> dict[str, Any] | None:
    """``extra_vars`` as parsed values, or ``extra_args``: raw ``-e`` words parsed as the CLI
    does (``@name`` relative to this folder, ``@SPECIAL`` for the special file)."""
    raw = [word.replace("@SPECIAL", f"@{special}") if special else word
           for word in spec.get("extra_args", ())]
    raw = [f"@{BAD / word[1:]}" if word.startswith("@") and not word.startswith("@/") else word
           for word in raw]
    return parse_extra_vars(raw) if raw else spec.get("extra_vars")


def _error_for(case: str, spec: dict[str, Any], tmp_path: Path) -> ProvisionError:
    special = _special_file(spec["special"], tmp_path) if "special" in spec else None
    path = special if special and "extra_args" not in spec else _inventory_path(case, spec)
    with pytest.raises(ProvisionError) as caught:
        inventory = load_inventory(path, _extra_vars(spec, special))
        select_hosts(inventory, spec["pattern"]) if "pattern" in spec else None
        require_replicas(inventory)
    return caught.value


def test_every_bad_case_has_an_expectation() -> None:
    on_disk = {p.name for p in BAD.iterdir() if p.name != "expected.yml"}
    assert on_disk <= set(EXPECTED), f"cases without an expectation: {on_disk - set(EXPECTED)}"
    assert len(on_disk) >= 30


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_inventory_names_file_key_and_value(case: str, tmp_path: Path) -> None:
    spec = EXPECTED[case]
    started = time.monotonic()
    error = _error_for(case, spec, tmp_path)
    elapsed = time.monotonic() - started
    text = error.render()
    # a bound against a YAML bomb or a deep nesting that would hang, not a timing goal
    # (bench/ has those): generous, because a loaded 2-core CI machine takes ~3 s here
    assert elapsed < 15.0, f"{case} took {elapsed:.1f} s to refuse"
    assert len(error.problems) == spec.get("problems", 1), text
    assert spec["message"] in text
    if not {"pattern", "extra_vars", "extra_args", "special"} & set(spec) and not str(
            spec.get("inventory", "")).startswith("/"):
        # The file named is the inventory or, for folder cases, a file inside the case folder.
        named = _inventory_path(case, spec) if "inventory" in spec else BAD / case
        assert all(p.where.startswith(str(named)) for p in error.problems), text
    if "key" in spec:
        assert spec["key"] in error.problems[0].where or spec["key"] in text
    if "value" in spec:
        assert spec["value"] in text
    if "absent" in spec:
        assert spec["absent"] not in text
        assert spec["absent"] not in repr(error.problems)
    assert "Traceback" not in text
    for problem in error.problems:
        assert problem.fix, f"problem without a fix: {problem.render()}"


def test_all_problems_of_a_file_are_reported_at_once(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_port: 0\n    vllm_api_prot: 8000\n  hosts:\n    h1:\n"
        "      ansible_become: perhaps\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(inventory)
    wheres = [p.where for p in caught.value.problems]
    assert wheres == [f"{inventory}:3: all.vars.ansible_port",
                      f"{inventory}:4: all.vars.vllm_api_prot",
                      f"{inventory}:7: all.hosts.h1.ansible_become"]


@pytest.mark.parametrize(("args", "fragment"), [
    (["-i", str(BAD / "secret-with-newline.yml")], "vllm_api_key contains a newline"),
    (["-i", str(BAD.parent / "good" / "mp-two-nodes" / "inventory.yml"), "--limit", "lama"],
     "no host or group named 'lama'"),
])
def test_the_cli_prints_the_problem_without_a_traceback_and_exits_1(
        args: list[str], fragment: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "from vllm_provision.cli import main; main()", "check", *args],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    assert fragment in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "sk-live-1234" not in result.stdout + result.stderr
