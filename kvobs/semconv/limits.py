"""The largest input kvobs takes from outside: identifiers and request bodies."""

from __future__ import annotations

# The longest identifier from outside (session id, request id, adapter name, header value), in UTF-8 bytes: the
# engine refuses longer ones with 400; the collector cuts longer ones from vLLM (`kvobs.identifiers.clip_id`),
# since every store row of a session carries its id.
MAX_ID_BYTES = 255  # = the store's id columns, VARCHAR(255) (kvobs/store/schema.py uses this)

# The longest tier name kvobs stores (`kvobs.semconv.attributes.tier_name`: REMOTE_SHARED_STORAGE and a secondary
# tier's own name fit), in characters = the store's `kv_events.medium` column, VARCHAR(64)
MAX_TIER_CHARS = 64

# The largest request body `kvobs serve` reads (`--max-request-bytes`; 413 beyond it): room for any prompt the model
# takes many times over, and a bound on what reaches the JSON parser.
MAX_REQUEST_BYTES = 16 * 1024 * 1024
