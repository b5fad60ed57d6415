"""Write the module reference (docs/modules.md) from the modules' declarations.

``python -m vllm_provision.modules.reference`` prints it; ``--write PATH`` writes it (atomically);
``--check PATH`` exits 1 when PATH differs from what the declarations give. The text comes from
each module's docstring and its ``ARGUMENT_SPEC`` (:mod:`vllm_provision.modules.arguments`), so
the reference cannot drift from the code: ``tests/unit/test_module_contracts.py`` fails when the
file in docs/ is stale.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
import tempfile
from pathlib import Path

from vllm_provision.modules import file_module_names, find_module
from vllm_provision.modules.arguments import KIND_WORDS, Argument

REGENERATE = "python -m vllm_provision.modules.reference --write docs/modules.md"


def render() -> str:
    """The whole reference as Markdown, modules in name order."""
    lines = [
        "# Module reference",
        "",
        "Generated from the modules' declarations (`ARGUMENT_SPEC` in",
        "`vllm_provision/modules/<name>.py`, see `vllm_provision/modules/arguments.py`); do not",
        f"edit it by hand, run `{REGENERATE}`.",
        "",
        "A task's arguments are checked against its module's declaration when the playbook loads,",
        "before any connection: an unknown argument, a missing required one, and every value",
        "that is not a template. Templated values are checked once rendered. `null` counts as",
        "absent. Kinds:",
        "",
        *(f"- `{kind}`: {words}" + (" (or a string of one, as in Ansible)"
                                    if kind in ("int", "float") else "")
          for kind, words in KIND_WORDS.items()),
        "",
    ]
    for name in file_module_names():
        lines += _module_section(name)
    return "\n".join(lines).rstrip("\n") + "\n"


def _module_section(name: str) -> list[str]:
    spec = find_module(name)
    assert spec is not None and spec.arguments is not None, name
    module = importlib.import_module(f"vllm_provision.modules.{name}")
    where = ("the controller, once per play batch" if spec.runs_on == "controller"
             else "each host of the play")
    lines = [f"## `{name}`", "", f"Runs on {where}."
             + (" Free form: a string is its `" + spec.arguments.free_form + "`."
                if spec.arguments.free_form else ""), ""]
    lines += _docstring_markdown(inspect.getdoc(module) or "")
    lines.append("")
    if not spec.arguments.arguments:
        lines += ["No arguments.", ""]
        return lines
    lines += ["| argument | kind | required | default | allowed | what it does |",
              "|---|---|---|---|---|---|"]
    lines += [_row(argument) for argument in spec.arguments.arguments]
    lines.append("")
    return lines


def _row(argument: Argument) -> str:
    kinds = " or ".join(f"`{k}`" for k in argument.kinds)
    if isinstance(argument.default, bool):
        default = f"`{str(argument.default).lower()}`"
    elif isinstance(argument.default, float):
        default = f"`{argument.default:g}`"
    elif argument.default is not None:
        default = f"`{argument.default}`"
    else:
        default = argument.default_text or ""
    allowed = ""
    if argument.choices:
        allowed = ", ".join(f"`{c}`" for c in argument.choices)
    elif argument.minimum is not None or argument.maximum is not None:
        low = "" if argument.minimum is None else f"{argument.minimum:g}"
        high = "" if argument.maximum is None else f"{argument.maximum:g}"
        allowed = f"{low}-{high}" if low and high else (f">= {low}" if low else f"<= {high}")
    cells = [f"`{argument.name}`", kinds, "yes" if argument.required else "", default, allowed,
             argument.help]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _docstring_markdown(text: str) -> list[str]:
    """The docstring as Markdown: an indented block after a line ending ``::`` becomes a YAML
    code block (reStructuredText's literal block)."""
    out: list[str] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.endswith("::"):
            out += [line[:-1], ""]
            index += 1
            while index < len(lines) and not lines[index].strip():
                index += 1
            block: list[str] = []
            while index < len(lines) and (lines[index].startswith("    ")
                                          or not lines[index].strip()):
                block.append(lines[index][4:])
                index += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["```yaml", *block, "```"]
            if index < len(lines):
                out.append("")
            continue
        out.append(line)
        index += 1
    return out


def write(path: Path) -> None:
    """Write the reference to ``path`` atomically (a temp file in the same folder, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(render())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """Print, write (``--write PATH``) or check (``--check PATH``) the reference.

    Returns:
        0; 1 when ``--check`` finds the file missing or stale.
    """
    parser = argparse.ArgumentParser(prog="python -m vllm_provision.modules.reference",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="PATH", help="write the reference here")
    group.add_argument("--check", type=Path, metavar="PATH",
                       help="exit 1 when this file is not what the declarations give")
    args = parser.parse_args(argv)
    if args.write is not None:
        write(args.write)
        return 0
    if args.check is not None:
        current = args.check.read_text(encoding="utf-8") if args.check.is_file() else ""
        if current != render():
            print(f"{args.check} is stale; run: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
