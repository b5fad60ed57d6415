"""Every unit file an ``up`` installs carries the marker that ``down --purge`` and
``--take-over`` look for (vllm_provision/modules/template.py ``stamped``, state/prune.py):
a plugin backend's template without it is stamped, ours are left as they are."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vllm_provision.core.paths import UNIT_MARKER
from vllm_provision.modules.template import stamped
from vllm_provision.state import prune

ROOT = Path(__file__).resolve().parents[2]
TOY_UNIT = ROOT / "tests" / "data" / "backends" / "toy_stub" / "templates" / "toy-stub.service.j2"


def _foreign(path: Path) -> list[str]:
    """What prune's host-side script calls foreign among ``[path]``, run here with bash."""
    out = subprocess.run(["bash", "-c", prune.state_script([], [str(path)])], check=True,
                         capture_output=True, text=True).stdout
    return prune.foreign(out)


def test_a_unit_without_the_marker_is_stamped_once_and_prune_then_calls_it_ours(
        tmp_path: Path) -> None:
    text = TOY_UNIT.read_text(encoding="utf-8")
    assert UNIT_MARKER not in text  # the example plugin does not write it itself
    unit = tmp_path / "toy-stub.service"
    unit.write_text(text)
    assert _foreign(unit) == [str(unit)]
    once = stamped(text, "template")
    assert once.splitlines()[0].startswith(UNIT_MARKER)
    assert once.endswith(text) and "template module" in once.splitlines()[0]
    assert stamped(once, "template") == once  # idempotent: a second up changes nothing
    unit.write_text(once)
    assert _foreign(unit) == []


@pytest.mark.parametrize("template", sorted((ROOT / "roles").glob("*/templates/*.service.j2")),
                         ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_our_unit_templates_carry_the_marker_so_they_are_not_stamped(template: Path) -> None:
    head = template.read_text(encoding="utf-8").splitlines()[:3]
    assert any(line.startswith(UNIT_MARKER) for line in head), template


def test_the_marker_below_line_3_does_not_count() -> None:
    text = "[Unit]\nDescription=x\n\n" + UNIT_MARKER + "\n"
    assert stamped(text, "copy").splitlines()[0].startswith(UNIT_MARKER + " (the copy module)")
