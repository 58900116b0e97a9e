"""How LMCache names its per-request spans: its multiprocess server's tracing subscriber
(`lmcache/v1/mp_observability/subscribers/tracing/mp_server.py`, LMCache 0.5.6), read in its source and checked
against the spans it emits (`tests/fixtures/lmcache-spans/record.py`).

One root span `request` per vLLM request, under the tracer `lmcache_mp.server`, its attribute `session_id` the id
vLLM's connector gave LMCache: vLLM's internal request id, the client's request id and `-` and 8 random hex
characters (vLLM 0.34 `InputProcessor.assign_request_id`; the id itself where
`VLLM_DISABLE_REQUEST_ID_RANDOMIZATION` is set), while vLLM's own `llm_request` span names the client's. Once the
lookup ended, the root carries its tokens as integers; children `mp.lookup_prefetch`, `mp.retrieve` and `mp.store`
time each operation (their attributes are the event's metadata, stringified).
"""

from __future__ import annotations

import re

SCOPE = "lmcache_mp.server"  # the tracer's name: the instrumentation scope of its spans
ROOT = "request"
LOOKUP, RETRIEVE, STORE = "mp.lookup_prefetch", "mp.retrieve", "mp.store"
CHILDREN = (LOOKUP, RETRIEVE, STORE)

REQUEST_ID = "session_id"  # the root's (and each child's) attribute: the request id the connector named
REQUESTED_TOKENS = "requested_tokens"
HIT_TOKENS = "hit_tokens"
L1_HIT_TOKENS = "l1_hit_tokens"  # found in its L1 (host memory)
L2_HIT_TOKENS = "l2_hit_tokens"  # found further in its L2 (its storage backends), past L1's prefix
EARLY_EXIT_REASON = "early_exit_reason"

CONNECTOR = "lmcache"  # how a lookup's connector is named in the store

# vLLM's internal id of a request: the client's id, then `-` and 8 characters of a random uuid's hex
_INTERNAL_SUFFIX = re.compile(r"-[0-9a-f]{8}$")


def client_request_id(connector_id: str) -> str | None:
    """The client's request id (vLLM's `llm_request` span's `gen_ai.request.id`) of an internal id a connector
    named; None where it does not have vLLM's internal form (then it may be the client's own: compared as is)."""
    return connector_id[:-9] if _INTERNAL_SUFFIX.search(connector_id) else None
