"""Every inventory variable is read through the settings resolver, its default in one place.

``vllm_provision.settings`` layers the variables table's defaults and the roles' defaults under
the inventory (docs/inventory.md, docs/architecture.md); product code outside it reads the
resolved mapping and keeps no default of its own. The scan below fails on a read such as
``vars.get("vllm_port", 8000)`` or ``vars.get("vllm_device") or "cuda"`` anywhere in the package
outside ``settings/``.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

from test_checks_parity_host import make_replica

import vllm_provision
from vllm_provision import settings

PACKAGE = Path(vllm_provision.__file__).parent
PREFIXES = ("vllm_", "ray_", "preflight_")


def _variable_get(node: ast.AST) -> str | None:
    """The variable name of a ``<mapping>.get("<prefix>...", ...)`` call, or None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith(PREFIXES)):
        return node.args[0].value
    return None


def inline_defaults(source: str) -> list[tuple[int, str]]:
    """(line, variable) of every read of a ``vllm_*``/``ray_*``/``preflight_*`` variable with a
    default of its own: ``.get(name, default)`` or ``.get(name) or default``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = _variable_get(node)
        if name is not None and (len(node.args) > 1 or node.keywords):  # type: ignore[attr-defined]
            found.append((node.lineno, name))
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            name = _variable_get(node.values[0])
            if name is not None:
                found.append((node.lineno, name))
    return sorted(found)


def test_the_scan_finds_both_forms_of_inline_default():
    source = ('a = vars.get("vllm_api_port", 8000)\n'
              'b = replica.vars.get("vllm_device") or "cuda"\n'
              'c = values["vllm_device"]\n'
              'd = result.get("vllm_version")\n'
              'e = vars.get("other_name", 1)\n')
    assert inline_defaults(source) == [(1, "vllm_api_port"), (2, "vllm_device")]


def test_no_product_code_outside_settings_keeps_a_default_of_its_own():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
             for path in sorted(PACKAGE.rglob("*.py"))
             if "settings" not in path.relative_to(PACKAGE).parts
             for line, name in inline_defaults(path.read_text(encoding="utf-8"))]
    assert found == [], ("read these through vllm_provision.settings (replica_settings, "
                         "node_settings, layered), whose defaults come from the variables "
                         "table and the roles' defaults:\n" + "\n".join(found))


def test_watchdog_port_is_the_nodes_else_the_replicas_else_the_role_default():
    default = settings.base()["vllm_watchdog_port"]
    replica = make_replica()
    assert [settings.watchdog_port(replica, n) for n in replica.nodes] == [default, default]
    replica = make_replica(vars={"vllm_watchdog_port": 29600})
    h2 = replica.nodes[1]
    replica = replace(replica, nodes=(replica.nodes[0], replace(
        h2, host=replace(h2.host, vars={"vllm_watchdog_port": 29700}))))
    assert [settings.watchdog_port(replica, n) for n in replica.nodes] == [29600, 29700]
    assert settings.watchdog_port(replica) == 29600  # rank 0's: the firewall's one port
