"""``python -m vllm_provision.cli``: the same as the ``provision`` command."""

from vllm_provision.cli import main

main()
