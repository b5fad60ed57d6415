"""Every release of the shipped ``vllm serve`` table against both backends' rendered commands:
what preflight's ``vllm_serve.options`` says (checks/vllm_serve.py), and what the lab's
stand-in, parsing as that release does (its options from the same table), does with the same
words. The two must agree: preflight refuses a release exactly when its parser would."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
from vllm_provision_lab.gpu.install import GUEST_PACKAGE
from vllm_provision_lab.gpu.spec import serve_surface

from vllm_provision.checks import vllm_serve
from vllm_provision.checks.finding import Severity
from vllm_provision.core.models import EngineArgs, Host, Node, Replica
from vllm_provision.facts.model import HostFacts
from vllm_provision.inventory.view import node_argv
from vllm_provision.settings.vllm_cli import parse_release, releases

MP_OPTIONS = {"--nnodes", "--node-rank", "--master-addr", "--master-port"}


def replica(backend: str) -> Replica:
    nodes = tuple(Node(Host(f"h{i + 1}", f"10.0.0.{11 + i}"), i, f"10.0.0.{11 + i}")
                  for i in range(2))
    return Replica("llama", backend, nodes,  # type: ignore[arg-type]
                   EngineArgs(model="/srv/models/m", tensor_parallel_size=4,
                              pipeline_parallel_size=2, served_model_name="llama",
                              max_model_len=4096,
                              extra_args=("--enforce-eager", "--dtype", "float32")))


def stand_in_exit(argv: list[str], release: str) -> int:
    """0 when the stand-in's parser of ``release`` takes ``argv``, else argparse's exit code."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(GUEST_PACKAGE.parent))
        from vllm_lab_standin.args import parse

        spec: dict[str, Any] = serve_surface(release)
        assert spec["serve_release"] == release
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parse(argv, spec)
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


@pytest.mark.parametrize("release", releases())
@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_each_release_against_both_backends_commands(release: str, backend: str) -> None:
    chosen = replica(backend)
    facts = {n.name: HostFacts(host=n.name, packages={"vllm": release}) for n in chosen.nodes}
    findings = vllm_serve.check_serve_options(chosen, facts)
    refused = {f.item.split()[0] for f in findings if f.severity is Severity.ERROR}
    has_mp_options = (parse_release(release) or ()) >= (0, 11, 1)
    if backend == "mp" and not has_mp_options:
        assert refused == MP_OPTIONS, findings
    else:
        assert refused == set(), findings
        assert {f.severity for f in findings} == {Severity.OK}
    for node in chosen.nodes:
        argv = node_argv(chosen, node)
        if argv is None:  # a Ray worker runs no vllm serve
            continue
        assert stand_in_exit(argv, release) == (2 if refused else 0), (release, argv)
