"""vLLM's own rewrites of a ``vllm serve`` line (``FlexibleArgumentParser.parse_args``,
vllm/utils/argparse_utils.py) as ``settings.vllm_cli.argv.read_argv`` and the lab's stand-in
make them, on the shipped table: ``-O3`` and ``--json-option.key value`` are options vLLM
takes, not unknown words."""

from __future__ import annotations

import contextlib
import io

import pytest
from vllm_provision_lab.gpu.install import GUEST_PACKAGE
from vllm_provision_lab.gpu.spec import serve_surface

from vllm_provision.settings.vllm_cli import surface
from vllm_provision.settings.vllm_cli.argv import read_argv, value_problem


def read(release: str, argv: list[str]) -> list[tuple[str, str | None, bool]]:
    """(resolved name, value, refused) of each option word."""
    found, _ = surface(release)
    return [(o.name, o.value, o.error is not None or value_problem(o) is not None)
            for o in read_argv(found, argv)]


@pytest.mark.parametrize(("release", "argv", "expected"), [
    # --optimization-level exists (0.12.0 on): -O3, -O=3 and -O 3 all set it
    ("0.33.0", ["-O3"], [("--optimization-level", "3", False)]),
    ("0.33.0", ["-O=3"], [("--optimization-level", "3", False)]),
    ("0.33.0", ["-O", "3", "-tp", "2"], [("--optimization-level", "3", False),
                                         ("--tensor-parallel-size", "2", False)]),
    # before it, -O is the alias of --compilation-config and -O3 its level
    ("0.10.0", ["-O3"], [("--compilation-config", "3", False)]),
    ("0.10.0", ["-O.level=3"], [("--compilation-config", "3", False)]),
    # a key of a JSON option, with its value inline or as the next word; underscores before
    # the first dot are dashes
    ("0.33.0", ["--compilation-config.cudagraph_mode", "FULL", "--enforce-eager"],
     [("--compilation-config", "FULL", False), ("--enforce-eager", None, False)]),
    ("0.33.0", ["--hf_overrides.rope_scaling.type=yarn"], [("--hf-overrides", "yarn", False)]),
    # a dotted key of an option the release does not have is still unknown
    ("0.33.0", ["--no-such-option.key", "1"], [("--no-such-option", "1", True)]),
])
def test_vllms_rewrites_are_read_as_the_options_they_become(release, argv, expected):
    assert read(release, argv) == expected


def stand_in_exit(release: str, argv: list[str]) -> int:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(GUEST_PACKAGE.parent))
        from vllm_lab_standin.args import parse

        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parse(["/m", *argv], serve_surface(release))
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


@pytest.mark.parametrize(("release", "argv", "code"), [
    ("0.33.0", ["-O3"], 0),
    ("0.33.0", ["-O", "3"], 0),
    ("0.10.0", ["-O3"], 0),
    ("0.33.0", ["--compilation-config.cudagraph_mode", "FULL"], 0),
    ("0.33.0", ["--hf_overrides.rope_scaling.type=yarn", "--enforce-eager"], 0),
    ("0.33.0", ["--no-such-option.key", "1"], 2),
])
def test_the_stand_in_makes_the_same_rewrites(release, argv, code):
    assert stand_in_exit(release, argv) == code
