"""The lab's error type: a :class:`vllm_provision.core.errors.ProvisionError`, so ``provision lab``
renders it as every other error (one block per problem, never a traceback)."""

from __future__ import annotations

from vllm_provision.core.errors import ProvisionError


class LabError(ProvisionError):
    """The local lab could not be brought up, changed or taken down."""
