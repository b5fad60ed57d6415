"""The JSON Schemas of every command's ``--json`` output, shipped in the package.

One file per command in ``vllm_provision/schemas/`` (``up.json``, ``lab-status.json`` for
``provision lab status``), JSON Schema draft 2020-12, sharing ``common.json`` (the error object
every command prints on invalid input, the run summary of ``up``/``down``/``restart``/``play``).
``provision schema COMMAND`` prints one; docs/json-output.md describes them. Each object's
documented keys are stable: a key is only ever added (the schema then gains it), never renamed
or removed without a new major version.

``facts.json`` holds the facts of one host as generated from
:class:`vllm_provision.facts.model.HostFacts` (:func:`facts_schema`; ``python -m
vllm_provision.cli.json_schemas --write`` regenerates it, a unit test fails while it is stale).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from vllm_provision.core.errors import ProvisionError

DRAFT = "https://json-schema.org/draft/2020-12/schema"
ID_BASE = "https://vllm-provision.invalid/schemas/"
COMMON = "common"


def schema_name(path: Sequence[str]) -> str:
    """The schema file's name (without ``.json``) of the command named by ``path``
    (``("lab", "status")`` -> ``lab-status``)."""
    return "-".join(path)


def _folder() -> Any:
    return resources.files("vllm_provision").joinpath("schemas")


def names() -> list[str]:
    """Every schema's name, sorted (``common`` included)."""
    return sorted(entry.name[:-len(".json")] for entry in _folder().iterdir()
                  if entry.name.endswith(".json"))


def path_of(name: str) -> str:
    """Where schema ``name`` lies (the installed package's file, or the checkout's)."""
    return str(_folder().joinpath(f"{name}.json"))


def load(name: str) -> dict[str, Any]:
    """The schema ``name`` (``up``, ``lab-status``, ``common``) as data.

    Raises:
        ProvisionError: no such schema (naming the ones there are).
    """
    entry = _folder().joinpath(f"{name}.json")
    if not entry.is_file():
        raise ProvisionError.single(f"schema {name!r}", "no such schema",
                                    expected=", ".join(n.replace("-", " ") for n in names()
                                                       if n != COMMON),
                                    fix="name a command that has --json, e.g. "
                                        "`provision schema up` or `provision schema lab status`")
    data: dict[str, Any] = json.loads(entry.read_text(encoding="utf-8"))
    return data


def validate(name: str, document: Any) -> None:
    """Validate ``document`` (a command's decoded ``--json`` output) against schema ``name``,
    references to ``common.json`` resolved. Needs the ``test`` extra (jsonschema).

    Raises:
        jsonschema.ValidationError: the document does not match (the best-matching error).
        ProvisionError: no such schema.
    """
    import jsonschema
    from referencing import Registry, Resource

    registry: Registry = Registry()
    for other in names():
        registry = registry.with_resource(ID_BASE + f"{other}.json",
                                          Resource.from_contents(load(other)))
    schema = load(name)
    if isinstance(document, dict) and document.get("error") is not True and "anyOf" in schema:
        # not the error object: check against the command's own object, for a precise message
        schema = {**{k: v for k, v in schema.items() if k != "anyOf"}, **schema["anyOf"][1]}
    validator = jsonschema.Draft202012Validator(schema, registry=registry,
                                                format_checker=jsonschema.FormatChecker())
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        raise error


# --- facts.json, generated from the HostFacts dataclasses -----------------------------------

_ATTRIBUTE = re.compile(r"^ {8}(?P<names>[a-z_0-9]+(?:, [a-z_0-9]+)*): (?P<text>.*)$")


def _attribute_docs(cls: type) -> dict[str, str]:
    """The ``Attributes:`` entries of a dataclass docstring, by field name, on one line each."""
    docs: dict[str, str] = {}
    current: list[str] = []
    for line in (cls.__doc__ or "").splitlines():
        match = _ATTRIBUTE.match(line)
        if match:
            current = [n.strip() for n in match.group("names").split(",")]
            for name in current:
                docs[name] = match.group("text").strip()
        elif current and line.startswith(" " * 12) and line.strip():
            for name in current:
                docs[name] += " " + line.strip()
        else:
            current = []
    return docs


def _type_schema(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of one type hint as ``dataclasses.asdict`` and ``json.dumps`` write it."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        schema = _type_schema(inner[0], defs) if len(inner) == 1 else {
            "anyOf": [_type_schema(a, defs) for a in inner]}
        return {"anyOf": [schema, {"type": "null"}]} if type(None) in args else schema
    if origin in (tuple, list):
        return {"type": "array", "items": _type_schema(args[0], defs)} if args else \
            {"type": "array"}
    if origin in (dict, Mapping) or origin is typing.get_origin(Mapping[str, str]):
        return {"type": "object", "additionalProperties": _type_schema(args[1], defs)}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # a placeholder against recursion
            defs[hint.__name__] = _dataclass_schema(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    simple = {int: "integer", str: "string", bool: "boolean", float: "number"}
    if hint in simple:
        return {"type": simple[hint]}
    if hint is Any:
        return {}
    raise TypeError(f"no JSON Schema for {hint!r}")


def _dataclass_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    docs = _attribute_docs(cls)
    properties = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        schema = _type_schema(hints[item.name], defs)
        if docs.get(item.name):
            schema = {"description": docs[item.name], **schema}
        properties[item.name] = schema
    summary = (cls.__doc__ or "").strip().split("\n\n", 1)[0].replace("\n", " ")
    return {"type": "object", "description": " ".join(summary.split()),
            "properties": properties, "required": list(properties),
            "additionalProperties": False}


def facts_schema() -> dict[str, Any]:
    """The schema of ``provision facts --json``: ``hosts`` (host name -> the facts of
    :class:`~vllm_provision.facts.model.HostFacts`, every field, as ``asdict`` writes them) and
    ``errors`` (host name -> the rendered error), or the common error object."""
    from vllm_provision.checks.memory import MemoryEstimate
    from vllm_provision.facts.model import HostFacts

    defs: dict[str, Any] = {}
    _type_schema(HostFacts, defs)
    _type_schema(MemoryEstimate, defs)
    defs["MemoryEstimates"] = {
        "type": "object", "description": "replica name -> its GPU memory estimate "
        "(docs/preflight.md, 'Will the model fit'), or why there is none; CPU replicas are "
        "left out",
        "additionalProperties": {"anyOf": [
            {"$ref": "#/$defs/MemoryEstimate"},
            {"type": "object", "required": ["skipped"], "additionalProperties": False,
             "properties": {"skipped": {"type": "string"}}}]}}
    return {
        "$schema": DRAFT, "$id": ID_BASE + "facts.json",
        "title": "provision facts --json",
        "description": "The facts of every host probed (one SSH round trip each) and the hosts "
                       "whose probe failed. Generated from vllm_provision.facts.model.HostFacts "
                       "by `python -m vllm_provision.cli.json_schemas --write`.",
        "anyOf": [
            {"$ref": "common.json#/$defs/error"},
            {"type": "object", "required": ["hosts", "errors"], "additionalProperties": False,
             "properties": {
                 "hosts": {"type": "object", "description": "host name -> its facts",
                           "additionalProperties": {"$ref": "#/$defs/HostFacts"}},
                 "errors": {"type": "object", "description": "host name -> why its facts "
                            "could not be gathered (unreachable, probe failed)",
                            "additionalProperties": {"type": "string"}},
                 "memory": {"$ref": "#/$defs/MemoryEstimates"}}},
        ],
        "$defs": dict(sorted(defs.items())),
    }


def facts_text() -> str:
    """``facts.json`` as written: :func:`facts_schema` indented, with a final newline."""
    return json.dumps(facts_schema(), indent=2) + "\n"


def main(argv: Sequence[str]) -> int:
    """``python -m vllm_provision.cli.json_schemas [--write]``: print or rewrite ``facts.json``."""
    text = facts_text()
    if list(argv) == ["--write"]:
        from pathlib import Path

        target = Path(str(_folder().joinpath("facts.json")))
        partial = target.with_name(target.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(target)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
