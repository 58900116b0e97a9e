"""Where kvobs listens and stores by default: the ports and the store URL every command's flags fall back to (the
docs and docker-compose.yml use the same numbers)."""

from __future__ import annotations

# The store every command opens unless told (`--store`, else this environment variable, else the SQLite file).
STORE_URL_ENV = "KVOBS_STORE_URL"
DEFAULT_STORE_URL = "sqlite:///kvobs.db"

ENGINE_PORT = 8000  # kvobs serve: OpenAI API, /metrics (vLLM's default too)
DASHBOARD_PORT = 8501  # kvobs dashboard (Streamlit's default)
# kvobs demo's collector takes the agents' OTLP/HTTP here: not 4317/4318, which a local Jaeger or OTel Collector holds.
DEMO_COLLECTOR_PORT = 4328
