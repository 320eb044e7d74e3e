"""Flows: multi-step workflows from shared templates, with fan-out, parallelism and fail-fast."""
