"""The variables table: its reference doc is current, its examples and defaults are valid."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from vllm_provision import resources
from vllm_provision.core.models import EngineArgs
from vllm_provision.inventory.source import Origin, Problems, Setting
from vllm_provision.inventory.values import check_setting
from vllm_provision.settings import variables

DOC = Path(__file__).resolve().parents[2] / "docs" / "inventory.md"
ORIGIN = Origin(Path("inventory.yml"), ("all", "vars", "x"))


def test_docs_inventory_md_holds_the_current_table() -> None:
    text = DOC.read_text()
    begin, end = "<!-- variables:begin -->\n", "<!-- variables:end -->"
    current = text[text.index(begin) + len(begin):text.index(end)]
    assert current == variables.render_markdown_table(), (
        "docs/inventory.md is out of date: paste render_markdown_table() between the markers")


def test_every_variable_is_in_the_table_once() -> None:
    table = variables.render_markdown_table()
    for name in variables.VARIABLES:
        assert table.count(f"| `{name}` |") == 1


@pytest.mark.parametrize("name", sorted(variables.VARIABLES))
def test_the_documented_example_is_valid(name: str) -> None:
    problems = Problems()
    value = yaml.safe_load(variables.VARIABLES[name].example)
    assert check_setting(name, Setting(value, ORIGIN), problems) is not None, problems.items


@pytest.mark.parametrize("name", sorted(variables.defaults()))
def test_the_default_is_valid(name: str) -> None:
    problems = Problems()
    default = variables.defaults()[name]
    assert check_setting(name, Setting(default, ORIGIN), problems) is not None, problems.items


def test_engine_args_defaults_match_the_table() -> None:
    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    for var in variables.VARIABLES.values():
        if var.engine_field is None or var.required:
            continue
        field = fields[var.engine_field]
        default = field.default if field.default is not dataclasses.MISSING else None
        expected = tuple(var.default) if isinstance(var.default, list) else var.default
        assert default == expected, var.name


def test_every_engine_field_has_a_variable() -> None:
    covered = {v.engine_field for v in variables.VARIABLES.values() if v.engine_field}
    assert covered == {f.name for f in dataclasses.fields(EngineArgs)}


@pytest.mark.parametrize(("name", "secret"), [
    ("vllm_api_key", True), ("HF_TOKEN", True), ("db_password", True), ("my_secret", True),
    ("OPENAI_API_KEY", True), ("vllm_api_port", False), ("ansible_ssh_private_key_file", False),
    ("NCCL_DEBUG", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    assert variables.is_secret_name(name) is secret


def test_mask_hides_secret_values_and_secret_keys_of_a_mapping() -> None:
    assert variables.mask("vllm_api_key", "sk-1") == variables.MASK
    assert variables.mask("vllm_env", {"HF_TOKEN": "hf_x", "NCCL_DEBUG": "INFO"}) == {
        "HF_TOKEN": variables.MASK, "NCCL_DEBUG": "INFO"}
    assert variables.mask("vllm_api_port", 8000) == 8000


@pytest.mark.parametrize(("name", "value", "converted"), [
    ("vllm_api_port", "8001", 8001), ("ansible_become", "yes", True),
    ("ansible_become", "False", False), ("vllm_version", 0.12, "0.12"),
    ("vllm_extra_args", ["--max-num-seqs", 64], ["--max-num-seqs", "64"]),
    ("vllm_env", {"A": 1, "B": True}, {"A": "1", "B": "true"}),
])
def test_values_are_converted_the_way_ansible_reads_them(name: str, value: object,
                                                         converted: object) -> None:
    checked = check_setting(name, Setting(value, ORIGIN), Problems())
    assert checked is not None and checked.value == converted


@pytest.mark.parametrize(("name", "value"), [
    ("vllm_api_port", True), ("vllm_api_port", 65536), ("vllm_tensor_parallel_size", 0),
    ("vllm_extra_args", [["nested"]]), ("vllm_env", {"A": [1]}), ("vllm_backend", "uni"),
    ("vllm_venv", "opt/vllm"), ("vllm_service_user", "Bad User"), ("ansible_host", "-oX"),
    ("vllm_api_host", "localhost"), ("vllm_model", 3),
])
def test_invalid_values_are_refused(name: str, value: object) -> None:
    problems = Problems()
    assert check_setting(name, Setting(value, ORIGIN), problems) is None
    assert len(problems.items) == 1 and problems.items[0].where == ORIGIN.where


def test_role_defaults_can_be_overridden_from_the_inventory_or_the_command_line() -> None:
    from pathlib import Path

    from vllm_provision.inventory import load_inventory

    lab = Path(__file__).resolve().parents[2] / "inventory" / "lab-mp.yml"
    inventory = load_inventory(lab, extra_vars={"vllm_restart_sec": "3",
                                                "ray_head_unit_name": "ray-gcs.service"})
    assert inventory.hosts["h1"].vars["vllm_restart_sec"] == 3
    assert inventory.hosts["h1"].vars["ray_head_unit_name"] == "ray-gcs.service"


def test_a_role_default_override_of_the_wrong_kind_is_refused() -> None:
    from pathlib import Path

    import pytest

    from vllm_provision.core.errors import InventoryError
    from vllm_provision.inventory import load_inventory

    lab = Path(__file__).resolve().parents[2] / "inventory" / "lab-mp.yml"
    with pytest.raises(InventoryError) as caught:
        load_inventory(lab, extra_vars={"vllm_restart_sec": "soon"})
    assert "vllm_restart_sec has the wrong type" in caught.value.render()
    with pytest.raises(InventoryError) as caught:
        load_inventory(lab, extra_vars={"vllm_unit_name": "x.service\nExecStartPre=/bin/sh"})
    assert "line break" in caught.value.render()


WATCHDOG_DEFAULTS = yaml.safe_load(
    resources.role_file("vllm_watchdog", "defaults", "main.yml").read_text())


@pytest.mark.parametrize("name", sorted(WATCHDOG_DEFAULTS))
def test_every_watchdog_knob_can_be_set_in_the_inventory(tmp_path: Path, name: str) -> None:
    from vllm_provision.inventory import load_inventory

    good = Path(__file__).resolve().parents[1] / "data" / "inventories" / "good"
    default = WATCHDOG_DEFAULTS[name]
    # A value of the knob's kind (vllm_provision.settings.kinds): a number, a unit name or a path
    # below
    # a prefix the tool owns.
    value = default * 2 if isinstance(default, (int, float)) else (
        "vp-watchdog.service" if name.endswith("_unit_name") else f"/srv/vllm-vp/{name}")
    (tmp_path / "inventory.yml").write_text(
        (good / "mp-two-nodes" / "inventory.yml").read_text())
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "llama.yml").write_text(yaml.safe_dump({name: value}))
    inventory = load_inventory(tmp_path / "inventory.yml")
    assert [inventory.hosts[h].vars[name] for h in ("h1", "h2")] == [value, value]


def test_a_wrong_type_message_masks_a_secret_options_value_and_cuts_a_long_value():
    from vllm_provision.inventory.values import SHOW_MAX_CHARS, show

    text = show("vllm_extra_args", "--max-num-seqs 4 --api-key=k3y-v4lue-1 --api_k k3y-v4lue-2")
    assert "k3y-v4lue" not in text and text.count(variables.MASK) == 2
    assert "--max-num-seqs 4" in text
    listed = show("vllm_extra_args", ["--hf-token", "hf_abcdefgh", "--port", 1])
    assert "hf_abcdefgh" not in listed and "'--port', 1" in listed
    assert len(show("vllm_model", "x" * 5000)) <= SHOW_MAX_CHARS + len("... (cut)")
