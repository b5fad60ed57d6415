"""Facts: one probe per host (one SSH round trip) and pure parsers that turn its output into
:class:`~vllm_provision.facts.model.HostFacts`."""

from vllm_provision.facts.model import HostFacts

__all__ = ["HostFacts"]
