"""vllm-provision: bring up one vLLM replica over several bare-metal GPU servers, idempotently."""

__version__ = "0.1.0"
