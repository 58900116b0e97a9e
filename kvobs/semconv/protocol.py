"""Names and defaults on the wire that several parts share: the session header, default ports, the hit-lookup
reason of a re-admission. One definition each."""

from __future__ import annotations

# The agent session an LLM request belongs to (HTTP header names are case-insensitive).
SESSION_ID_HEADER = "X-Session-ID"

# The store every command opens unless told (`--store`, else this environment variable, else the SQLite file).
STORE_URL_ENV = "KVOBS_STORE_URL"
DEFAULT_STORE_URL = "sqlite:///kvobs.db"

# Default ports (each a flag's default; the README and docker-compose.yml use the same numbers).
ENGINE_PORT = 8000  # kvobs serve: OpenAI API, /metrics (vLLM's default too)
DASHBOARD_PORT = 8501  # kvobs dashboard (Streamlit's default)
# kvobs demo's collector takes the agents' OTLP/HTTP here: not 4317/4318, which a local Jaeger or OTel Collector holds.
DEMO_COLLECTOR_PORT = 4328

# A session idle this long after its last request has ended (`--session-end-after-s` of `kvobs serve` and
# `kvobs collect`): what it loses after that is lost after its end, never in a tool pause.
SESSION_END_AFTER_S = 300.0

# The collector forgets a session's state after this long without a KV event (`kvobs collect --session-idle-s`):
# well past its end, so no pause is cut short; bounds memory however many sessions a fleet has seen.
SESSION_IDLE_S = 3600.0

# `kv_events.reason` of a `hit` row when a preempted request looked its prefix up again.
READMISSION = "readmission"

# The longest identifier from outside (session id, request id, adapter name, header value), in UTF-8 bytes: the
# engine refuses longer ones with 400; the collector cuts longer ones from vLLM (`kvobs.identifiers.clip_id`),
# since every store row of a session carries its id.
MAX_ID_BYTES = 255  # = the store's id columns, VARCHAR(255) (kvobs/store/schema.py uses this)

# The largest request body `kvobs serve` reads (`--max-request-bytes`; 413 beyond it): 2,000 times a full 8k-token
# prompt, far below the 100 MB body that once went straight to the JSON parser.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
