"""Hostile input: every case of tests/data/inventories/hostile/cases.yml is refused at load with
a clear, located error, or, where the value is legal, arrives inert (one word, one env value, or
nowhere), with no unit gaining a line or directive and no env file gaining a variable."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_support import env_values, exec_words, rendered_files, shape, write_inventory

from vllm_provision.core.errors import InventoryError
from vllm_provision.inventory import load_inventory

HOSTILE = Path(__file__).resolve().parents[1] / "data" / "inventories" / "hostile"
BASE = yaml.safe_load((HOSTILE / "base.yml").read_text())
CASES: list[dict[str, Any]] = yaml.safe_load((HOSTILE / "cases.yml").read_text())
MARKER = Path("/tmp/vp-hostile-marker")


def _replica(data: dict[str, Any]) -> dict[str, Any]:
    return data["all"]["children"]["vllm_replicas"]["children"]["llama"]


def build(case: dict[str, Any], tmp_path: Path) -> tuple[Path, dict[str, Any] | None]:
    """Write the case's inventory; return its path and its -e values."""
    path = tmp_path / "inventory.yml"
    if "raw" in case:
        path.write_text(case["raw"])
        return path, case.get("extra")
    data = copy.deepcopy(BASE)
    data["all"]["vars"].update(case.get("all", {}))
    replica = _replica(data)
    for key, value in case.get("replica", {}).items():
        if value is None:
            replica["vars"].pop(key, None)
        else:
            replica["vars"][key] = value
    replica["hosts"]["h1"].update(case.get("host", {}))
    if "host_name" in case:
        replica["hosts"] = {case["host_name"]: replica["hosts"]["h1"], "h2": replica["hosts"]["h2"]}
    if "group_name" in case:
        data["all"]["children"]["vllm_replicas"]["children"] = {case["group_name"]: replica}
    return write_inventory(path, data), case.get("extra")


_BASELINE: dict[str, Any] = {}


def _baseline(tmp_path: Path) -> dict[str, Any]:
    if not _BASELINE:
        _BASELINE.update(shape(load_inventory(write_inventory(tmp_path / "base.yml", BASE))))
    return _BASELINE


def test_the_corpus_is_large_and_covers_every_class() -> None:
    assert len(CASES) >= 90
    assert len({c["id"] for c in CASES}) == len(CASES)
    places = {key for c in CASES for key in ("all", "replica", "host", "extra", "group_name",
                                             "host_name", "raw") if key in c}
    assert places == {"all", "replica", "host", "extra", "group_name", "host_name", "raw"}
    assert sum("inert" in c for c in CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_hostile_case(case: dict[str, Any], tmp_path: Path) -> None:
    path, extra = build(case, tmp_path)
    if "error" in case:
        with pytest.raises(InventoryError) as caught:
            load_inventory(path, extra)
        text = caught.value.render()
        assert case["error"] in text
        # located: every problem names the inventory file (or -e) and says how to fix it
        for problem in caught.value.problems:
            assert problem.where.startswith((str(path), "-e ")), text
            assert problem.fix, text
        if "absent" in case:
            assert case["absent"] not in text and case["absent"] not in repr(caught.value)
        return
    inventory = load_inventory(path, extra)
    baseline = _baseline(tmp_path)
    files = dict(rendered_files(inventory))
    got = shape(files)
    spec = case["inert"]
    value = spec["value"]
    for label, (kind, lines, *keys) in got.items():
        base_kind, base_lines, *base_keys = baseline[label]
        if kind == "unit":
            assert (lines, keys) == (base_lines, base_keys), label
        elif kind == "env":
            added = set(case.get("replica", {}).get("vllm_env") or {}) | (
                {"VLLM_API_KEY"} if "vllm_api_key" in case.get("replica", {}) else set())
            assert set(keys[0]) - set(base_keys[0]) <= added, label
    if spec["arrives"] == "exec":
        words = [w for label, text in files.items() if label.endswith(".service.j2")
                 for argv in exec_words(text) for w in argv]
        assert value in words
    elif spec["arrives"] == "env":
        values = [v for label, text in files.items() if label.endswith(".env.j2")
                  for v in env_values(text).values()]
        assert value in values
    assert not MARKER.exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "vllm_provision.cli", *args],
                          capture_output=True, text=True, timeout=30, env=env)


SAMPLE = ["group-name-0", "host-name-0", "vllm_unit_name-0", "vllm_tmp_dir-0",
          "vllm_config_dir-0", "vllm_host_ip-2", "extra-args-template", "keys-collapse",
          "api-equals-master", "model-option"]


@pytest.mark.parametrize("case_id", SAMPLE)
def test_the_cli_refuses_with_exit_1_and_no_traceback(case_id: str, tmp_path: Path) -> None:
    case = next(c for c in CASES if c["id"] == case_id)
    path, extra = build(case, tmp_path)
    args = ["check", "-i", str(path)]
    for key, value in (extra or {}).items():
        args += ["-e", f"{key}={value}"]
    result = _cli(*args)
    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "internal error" not in output.lower()
    assert case["error"] in output  # an inventory-load message: refused before any SSH
    assert not MARKER.exists()


def test_lipsum_in_an_extra_var_is_refused_in_check_mode_too(tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "inventory.yml", BASE)
    result = _cli("up", "--check", "-i", str(path), "-e",
                  "vllm_served_model_name={{ lipsum.__globals__['os'].popen('touch "
                  f"{MARKER}').read() }}}}")
    assert result.returncode == 1
    assert "holds a Jinja template" in result.stdout + result.stderr
    assert not MARKER.exists()


def test_unsafe_in_an_extra_vars_file_is_kept_as_text_and_never_rendered(tmp_path: Path) -> None:
    from vllm_provision.cli.options import parse_extra_vars

    value = "{{ lipsum.__globals__['os'].popen('touch " + str(MARKER) + "').read() }}"
    extra_file = tmp_path / "extra.yml"
    extra_file.write_text(f'vllm_served_model_name: !unsafe "{value}"\n')
    extra = parse_extra_vars([f"@{extra_file}"])
    inventory = load_inventory(write_inventory(tmp_path / "inventory.yml", BASE), extra)
    words = [w for label, text in rendered_files(inventory) if label.endswith(".service.j2")
             for argv in exec_words(text) for w in argv]
    assert value in words
    assert not MARKER.exists()
