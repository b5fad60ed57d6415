"""``provision schema [COMMAND...]``: print the JSON Schema of a command's ``--json`` output."""

from __future__ import annotations

import json

import click

from vllm_provision.cli.help import examples


@click.command("schema", epilog=examples(
    "provision schema                      # the commands that have one, and where",
    "provision schema up > up.schema.json",
    "provision schema lab status"))
@click.argument("words", nargs=-1, metavar="[COMMAND...]")
def command(words: tuple[str, ...]) -> None:
    """Print the JSON Schema (draft 2020-12) of COMMAND's --json output, or list them.

    The schemas ship inside the package (vllm_provision/schemas/); shared parts live in
    common.json. A documented key is never renamed or removed; new keys are added to the
    schema as they appear (docs/json-output.md).
    """
    from vllm_provision.cli import json_schemas

    if not words:
        for name in json_schemas.names():
            click.echo(f"{name:<12} {json_schemas.path_of(name)}")
        return
    click.echo(json.dumps(json_schemas.load(json_schemas.schema_name(words)), indent=2))
