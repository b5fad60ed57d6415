"""The stand-in's ``vllm serve`` parser built from one release's options (the lab's
``serve_options``): what that release's argparse accepts, refuses and resolves."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_provision_lab.gpu.install import GUEST_PACKAGE

OPTIONS = [
    {"name": "--tensor-parallel-size", "aliases": ["-tp"], "takes_value": True, "kind": "int"},
    {"name": "--pipeline-parallel-size", "aliases": ["-pp"], "takes_value": True,
     "kind": "int"},
    {"name": "--distributed-executor-backend", "takes_value": True, "kind": "str",
     "choices": ["external_launcher", "mp", "ray", "uni"]},
    {"name": "--served-model-name", "takes_value": True, "kind": "str", "nargs": "+"},
    {"name": "--enforce-eager", "takes_value": False, "kind": "bool", "negatable": True},
    {"name": "--model", "takes_value": True, "kind": "str"},
    {"name": "--port", "takes_value": True, "kind": "int"},
    {"name": "--api-key", "takes_value": True, "kind": "str"},
    {"name": "--api-server-count", "takes_value": True, "kind": "int"},
]


def spec(allow_abbrev: bool = True) -> dict[str, object]:
    return {"serve_options": OPTIONS, "serve_allow_abbrev": allow_abbrev}


def parse(argv: list[str], spec: dict[str, Any]) -> Any:
    """The guest package's parser (it runs on the lab's hosts, not as part of the lab)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(GUEST_PACKAGE.parent))
        from vllm_lab_standin.args import parse as guest_parse

        return guest_parse(argv, spec)


def test_a_release_parser_takes_its_options_and_fills_vllms_defaults_for_the_rest():
    ns = parse(["/m", "-tp", "4", "--distributed-executor-backend", "ray",
                "--served-model-name", "a", "b", "--no-enforce-eager"], spec())
    assert ns.model == "/m" and ns.tensor_parallel_size == 4
    assert ns.distributed_executor_backend == "ray" and ns.served_model_name == ["a", "b"]
    assert ns.enforce_eager is False
    # options this release lacks read as vLLM's defaults
    assert ns.nnodes == 1 and ns.node_rank == 0 and ns.headless is False
    assert ns.pipeline_parallel_size == 1 and ns.port == 8000 and ns.api_server_count is None


def test_an_option_the_release_lacks_exits_2_as_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        parse(["/m", "--nnodes", "2"], spec())
    assert exc.value.code == 2
    assert "unrecognized arguments: --nnodes 2" in capsys.readouterr().err


def test_a_value_outside_the_choices_exits_2(capsys):
    with pytest.raises(SystemExit):
        parse(["/m", "--distributed-executor-backend", "slurm"], spec())
    assert "invalid choice: 'slurm'" in capsys.readouterr().err


def test_underscores_become_dashes_as_in_vllms_flexible_parser():
    assert parse(["/m", "--tensor_parallel_size=2"], spec()).tensor_parallel_size == 2


def test_abbreviations_follow_the_release(capsys):
    assert parse(["/m", "--tensor-par", "2"], spec()).tensor_parallel_size == 2
    with pytest.raises(SystemExit):
        parse(["/m", "--api", "k"], spec())  # --api-key or --api-server-count
    assert "ambiguous option: --api" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["/m", "--tensor-par", "2"], spec(allow_abbrev=False))
    assert "unrecognized arguments: --tensor-par" in capsys.readouterr().err


def test_without_a_release_the_stand_ins_own_list_is_used():
    ns = parse(["/m", "--nnodes", "2", "--node-rank", "1", "--headless"], {})
    assert (ns.nnodes, ns.node_rank, ns.headless) == (2, 1, True)
