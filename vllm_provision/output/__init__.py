"""What the operator sees: the report, progress, vLLM's start phases and journal reading."""
