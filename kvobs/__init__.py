"""kvobs: observability and tracing for KV-cache behaviour in LLM agents."""

__version__ = "0.1.0"
