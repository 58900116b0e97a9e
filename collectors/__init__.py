"""Collectors: vLLM's (and our engine's) /metrics, ZMQ KV events and OTLP traces into the kvobs store."""
