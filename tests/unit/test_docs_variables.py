"""The docs name only variables the code knows, and state the defaults the code has.

Sources of truth: ``vllm_provision/settings/variables.py`` (inventory variables) and
``roles/*/defaults/main.yml`` (role defaults an inventory may override), and the unit templates
(``Directive={{ variable }}`` or a literal). Checked in README.md and docs/*.md:

- every backticked ``vllm_*``/``ray_*``/``preflight_*``/``provision_*`` name is a variable, a
  role default, a module, a role, an inventory group or a Python package;
- a table with a ``default`` column, and ``name (default X)`` / ``name, default X`` in prose,
  state the default the code has;
- a unit setting written ``Directive=N``, or a table row for ``Directive``, gives only values the
  templates can produce with their defaults (``TimeoutStopSec=30`` when the default is 15 fails).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_provision.inventory.replicas import synthetic_groups
from vllm_provision.modules import find_module
from vllm_provision.settings import variables

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ROLES = ROOT / "roles"
# Python packages (not variables) whose names share the prefixes: this one, the lab's (lab/) and
# the lab's stand-in package installed into the lab hosts (lab/vllm_provision_lab/gpu/guest), and
# vLLM's router the front door installs (docs/front-door.md).
PACKAGES = {"vllm_provision", "vllm_provision_lab", "vllm_router", *(p.name for p in
                               (ROOT / "lab/vllm_provision_lab/gpu/guest").iterdir() if p.is_dir())}
NAME = re.compile(r"`((?:vllm|ray|preflight|provision)_[a-z0-9_]*[a-z0-9])([^a-z0-9_])")


def role_defaults() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path in sorted(ROLES.glob("*/defaults/main.yml")):
        found.update(yaml.safe_load(path.read_text()) or {})
    return found


DEFAULTS: dict[str, Any] = {**{n: v.default for n, v in variables.VARIABLES.items()},
                            **role_defaults()}


def _known_name(name: str) -> bool:
    # vllm_router_*: the router's own metric names (docs/monitoring.md), not variables
    return (name in DEFAULTS or name in PACKAGES or (ROLES / name).is_dir()
            or name.startswith("vllm_router_")
            or name in synthetic_groups() or name in ("vllm_replicas", "vllm_gateways")
            or find_module(name) is not None)


def _same(documented: str, default: Any) -> bool:
    text = documented.strip().strip("`").removesuffix(" s").strip()
    if default is None:
        return text in ("unset", "none", "-")
    if isinstance(default, bool):
        return text.lower() == str(default).lower()
    return text == str(default)


def test_every_documented_variable_name_exists() -> None:
    unknown = sorted({(path.name, m.group(1)) for path in DOCS
                      for m in NAME.finditer(path.read_text())
                      if m.group(2) not in "./(" and not _known_name(m.group(1))})
    assert not unknown, f"documented but unknown to variables.py and the role defaults: {unknown}"


def documented_defaults(text: str) -> list[tuple[str, str]]:
    """``(name, documented default)`` from tables with a ``default`` column and from prose."""
    found: list[tuple[str, str]] = []
    column = None
    for line in text.splitlines():
        cells = ([c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
                 if line.startswith("|") else [])  # "\|" is a pipe inside a cell
        if not cells:
            column = None
            continue
        lowered = [c.lower() for c in cells]
        if "default" in lowered:
            column = lowered.index("default")
            continue
        named = re.fullmatch(r"`([a-z0-9_]+)`", cells[0])
        if column is not None and named and column < len(cells) and named.group(1) in DEFAULTS:
            found.append((named.group(1), cells[column].strip("*")))
    for m in re.finditer(r"`([a-z][a-z0-9_]+)`(?:,| \()\s*default:?\s+`([^`]+)`", text):
        if m.group(1) in DEFAULTS and m.group(2) not in DEFAULTS:  # not "default `other_var`"
            found.append((m.group(1), m.group(2)))
    for m in re.finditer(r"`([a-z][a-z0-9_]+)` \((/[^)\s,]+|\d+)\)", text):
        if m.group(1) in DEFAULTS:
            found.append((m.group(1), m.group(2)))
    return found


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_documented_defaults_match_the_code(path: Path) -> None:
    wrong = [(name, value, DEFAULTS[name]) for name, value in documented_defaults(path.read_text())
             if not _same(value, DEFAULTS[name]) and "required" not in value]
    assert not wrong, f"{path.name}: (variable, documented, code): {wrong}"


def directive_values() -> dict[str, set[str]]:
    """Unit directive -> the values the templates give it with the role defaults."""
    values: dict[str, set[str]] = {}
    defaults = role_defaults()
    for template in sorted(ROLES.glob("*/templates/*.j2")):
        for m in re.finditer(r"^([A-Z][A-Za-z]+)=(.*)$", template.read_text(), re.M):
            directive, raw = m.group(1), m.group(2).strip()
            ref = re.fullmatch(r"\{\{\s*([a-z0-9_]+)\s*\}\}", raw)
            if ref and ref.group(1) in defaults:
                values.setdefault(directive, set()).add(str(defaults[ref.group(1)]))
            elif re.fullmatch(r"\d+", raw):
                values.setdefault(directive, set()).add(raw)
    return values


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_documented_unit_settings_match_the_templates(path: Path) -> None:
    allowed = directive_values()
    text = path.read_text()
    wrong = [(d, v) for d, v in re.findall(r"`([A-Z][A-Za-z]+)=(\d+)`", text)
             if d in allowed and v not in allowed[d]]
    for d, cell in re.findall(r"^\| `([A-Z][A-Za-z]+)` \| ([^|]+)\|", text, re.M):
        if d in allowed:
            wrong += [(d, v) for v in re.findall(r"\b(\d+)\b", cell) if v not in allowed[d]]
    assert not wrong, f"{path.name}: (directive, documented value) not in the templates: {wrong}"


def test_the_checks_see_what_they_check() -> None:
    # the checks must not pass by reading nothing: the directive map and the docs' defaults
    assert directive_values()["TimeoutStopSec"] == {"15", "20", "5"}
    assert ("vllm_watchdog_probe_failures", "3") in documented_defaults(
        (ROOT / "docs/recovery.md").read_text())
    assert documented_defaults("| name | default |\n|---|---|\n| `vllm_api_port` | 8001 |\n") \
        == [("vllm_api_port", "8001")]
    assert not _same("8001", DEFAULTS["vllm_api_port"])


def test_vllm_hf_token_is_accepted_as_a_secret_and_masked(tmp_path: Path) -> None:
    from vllm_provision.core.errors import ProvisionError
    from vllm_provision.inventory import load_inventory
    from vllm_provision.settings.masking import Masker

    def write(token: str) -> Path:
        path = tmp_path / "inventory.yml"
        path.write_text(f"""all:
  children:
    vllm_replicas:
      children:
        llm:
          vars: {{vllm_backend: mp, vllm_model: /srv/models/m, vllm_hf_token: {token}}}
          hosts:
            h1: {{ansible_host: 10.0.0.11, vllm_node_rank: 0}}
""")
        return path

    inventory = load_inventory(write("hf_0123456789abcdef"))
    assert variables.VARIABLES["vllm_hf_token"].secret
    assert Masker.from_inventory(inventory).text("HF_TOKEN=hf_0123456789abcdef") == (
        f"HF_TOKEN={variables.MASK}")
    with pytest.raises(ProvisionError) as short:
        load_inventory(write("hf_1"))
    assert "vllm_hf_token" in short.value.render() and "hf_1" not in short.value.render()
