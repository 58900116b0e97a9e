"""Prometheus metric names, types, units and meanings.

`vllm` holds vLLM's V1 names with vLLM's meaning (release 0.33; defined in `kvobs.semconv.vllm_metrics`, its
offloading ones in `kvobs.semconv.offload_metrics`), so that dashboards, alert rules and scrapers written for vLLM
read our engine unchanged. Every engine metric carries the labels `model_name` (the served name) and `engine`
(data-parallel index, "0"). `kvobs_metrics` holds what vLLM lacks: evictions and invalidations by reason, cache
residency in blocks, agent-step outcomes. Labels stay low-cardinality: never a request, session or block id.

Names are given without the `_total` suffix for counters: `prometheus_client` appends it on exposition,
as vLLM's own exporter does.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvobs.semconv import offload_metrics as _offload
from kvobs.semconv.metric_spec import metric_spec as _spec
from kvobs.semconv.vllm_metrics import LABEL_SOURCE, vllm  # vLLM's names, and its label kvobs's metrics share

LABEL_MODEL_NAME = "model_name"
LABEL_ENGINE = "engine"
LABEL_REASON = "reason"
LABEL_MEDIUM = "medium"  # a KV tier, as kvobs names it (`kvobs.semconv.attributes.medium_name`)
LABEL_SHAPE = "shape"  # a KV-event batch's wire shape (`kvobs.vllm.kv_events.WIRE_SHAPES`)
LABEL_STATUS = "status"
LABEL_KIND = "kind"  # what cost an agent step (`kvobs.analytics.steps.verdicts.cost_kind`)
LABEL_ERROR_TYPE = "error_type"
LABEL_COMPONENT = "component"
LABEL_INSTANCE = "instance"  # a collector's target (an engine or vLLM), never a request or session
LABEL_TABLE = "table"  # a store table
LABEL_METHOD = "method"  # how a step was joined to its server request, or why not (`kvobs.semconv.spans.StepJoin`)
LABEL_OUTCOME = "outcome"  # what became of a cached-token count a joined step gave its request (`spans.CachedFill`)
LABEL_WORKER = "worker"  # a stream worker of `kvobs collect --workers` (`worker-N`, as its spool folder is named)
LABEL_TIE = "tie"  # how a request's stored blocks were tied to it and its session, or why not (`spans.BlockTie`)

# `metric_samples.name` of a scraped counter's increase over one scrape interval: `<counter name>:increase`; of a
# histogram's count and sum increases: `<name>:count`, `<name>:sum`.
INCREASE_SUFFIX = ":increase"
COUNT_SUFFIX, SUM_SUFFIX = ":count", ":sum"
ENGINE_LABELS = (LABEL_MODEL_NAME, LABEL_ENGINE)
# prometheus_client's process collector (vLLM and `kvobs serve` export it): when the serving process started. A
# collector takes it for the start of a vLLM's run (an empty KV cache); `kvobs serve` says its own
# (`kvobs_engine_start_time_seconds`).
PROCESS_START_TIME = "process_start_time_seconds"

FINISHED_ABORT = "abort"
FINISHED_ERROR = "error"  # the engine failed on this request alone (its sampling or detokenizing raised)
FINISHED_REASONS = ("stop", "length", FINISHED_ABORT, FINISHED_ERROR)  # vLLM's finished_reason label values
REJECTED_QUEUE_FULL = "queue_full"  # kvobs_requests_rejected{reason}


# vLLM's offloading metrics (`kvobs.semconv.offload_metrics`) are vLLM's names too
vars(vllm).update(vars(_offload.vllm_offload))
LABEL_TIER, OFFLOAD_METRICS, TIERING_METRICS = _offload.LABEL_TIER, _offload.OFFLOAD_METRICS, _offload.TIERING_METRICS

# Names older vLLM releases emit -> the current metric they became; scrapers map them.
VLLM_LEGACY_NAMES = {
    "vllm:gpu_cache_usage_perc": vllm.KV_CACHE_USAGE_PERC,
    "vllm:gpu_prefix_cache_queries": vllm.PREFIX_CACHE_QUERIES,
    "vllm:gpu_prefix_cache_hits": vllm.PREFIX_CACHE_HITS,
    "vllm:time_per_output_token_seconds": vllm.INTER_TOKEN_LATENCY,
}

# a stream worker's own store writer: where `kvobs collect --workers` writes a store that takes many writers
# (PostgreSQL, a ClickHouse server) from each worker; absent where the workers' rows go to the collector's writer
_WORKER = "A stream worker's own store writer (kvobs collect --workers on a store many processes write): "

kvobs_metrics = SimpleNamespace(
    KV_BLOCKS_EVICTED=_spec(
        "kvobs_kv_blocks_evicted",
        "counter",
        "blocks",
        "Cached KV blocks whose content was dropped, by reason (capacity, invalidation, reset, session_release, ttl).",
        LABEL_REASON,
    ),
    KV_BLOCKS_INVALIDATED=_spec(
        "kvobs_kv_blocks_invalidated",
        "counter",
        "blocks",
        "Cached KV blocks dropped by an invalidation, by invalidation reason.",
        LABEL_REASON,
    ),
    KV_OFFLOAD_STORE_FAILURES=_spec(  # (vLLM's connector only logs them)
        "kvobs_kv_offload_store_failures", "counter", "stores", "Stores the offload tier refused as larger than itself."
    ),
    KV_CACHE_RESIDENT_BLOCKS=_spec(
        "kvobs_kv_cache_resident_blocks",
        "gauge",
        "blocks",
        "Cached blocks no request holds: prefix content kept for reuse.",
    ),
    KV_CACHE_FREE_BLOCKS=_spec(
        "kvobs_kv_cache_free_blocks",
        "gauge",
        "blocks",
        "Blocks with no request holding them (cached or not): what allocation can take.",
    ),
    KV_CACHE_TOTAL_BLOCKS=_spec(
        "kvobs_kv_cache_total_blocks", "gauge", "blocks", "Usable KV blocks (the reserved null block excluded)."
    ),
    ENGINE_START_TIME=_spec(
        "kvobs_engine_start_time_seconds",
        "gauge",
        "s",
        "When this engine's run began, its KV cache empty (epoch s): its run in the store.",
    ),
    SESSION_PREFIX_LOST=_spec(
        "kvobs_session_prefix_lost",
        "counter",
        "blocks",
        "Cached blocks evicted by capacity pressure or TTL while a session that owned them was "
        "in a tool pause, counted when the pause is known (its next request began).",
    ),
    SESSION_PREFIX_LOST_PENDING=_spec(
        "kvobs_session_prefix_lost_pending",
        "gauge",
        "blocks",
        "Cached blocks idle sessions lost whose verdict is pending: a tool pause if "
        "the session comes back, after its end if it is released or stays away.",
    ),
    REQUESTS_REJECTED=_spec(
        "kvobs_requests_rejected",
        "counter",
        "requests",
        "Requests refused before admission, by reason (queue_full).",
        LABEL_REASON,
    ),
    AGENT_STEPS=_spec(
        "kvobs_agent_steps", "counter", "steps", "Agent steps finished, by status (ok, error).", LABEL_STATUS
    ),
    AGENT_STEP_FAILURES=_spec(
        "kvobs_agent_step_failures", "counter", "steps", "Failed agent steps, by error type.", LABEL_ERROR_TYPE
    ),
    TELEMETRY_DROPPED=_spec(
        "kvobs_telemetry_dropped",
        "counter",
        "items",
        "Telemetry items dropped (full queues, malformed input), by component.",
        LABEL_COMPONENT,
    ),
    STORE_ROWS_EXPIRED=_spec(
        "kvobs_store_rows_expired",
        "counter",
        "rows",
        "Store rows dropped by --retention-days (raw KV events older than the limit), by table.",
        LABEL_TABLE,
    ),
    STORE_QUEUE_ROWS=_spec(
        "kvobs_store_queue_rows",
        "gauge",
        "rows",
        "Rows the store writer accepted and has not committed yet (queued, or in the batch being written).",
    ),
    STORE_QUEUE_PEAK_ROWS=_spec(
        "kvobs_store_queue_peak_rows",
        "gauge",
        "rows",
        "The most rows the store writer held uncommitted at once since it started (a burst a scrape can miss).",
    ),
    STORE_QUEUE_CAPACITY_ROWS=_spec(
        "kvobs_store_queue_capacity_rows",
        "gauge",
        "rows",
        "Rows the store writer's queue takes at most, besides the batch being written; past it producers wait for "
        "room (KV events, up to 10 s a batch), then rows are dropped and counted in "
        'kvobs_telemetry_dropped_total{component="store"}.',
    ),
    STORE_QUEUE_FULL=_spec(
        "kvobs_store_queue_full",
        "counter",
        "units",
        "Units of rows (a KV-event batch's, a span's) that found the store writer's queue full: each waited for room "
        "(KV events, up to 10 s, their socket buffering meanwhile), was refused (an OTLP export answered 429, which "
        "its exporter sends again) or was dropped.",
    ),
    STORE_DRAIN_LAG=_spec(
        "kvobs_store_drain_lag_seconds",
        "gauge",
        "s",
        "How long the oldest row the store writer holds uncommitted has waited (0 when it holds none).",
    ),
    STORE_DRAIN_LAG_PEAK=_spec(
        "kvobs_store_drain_lag_peak_seconds",
        "gauge",
        "s",
        "The longest any row waited in the store writer, from queued to committed, since it started.",
    ),
    WORKER_STORE_QUEUE_ROWS=_spec(
        "kvobs_store_worker_queue_rows",
        "gauge",
        "rows",
        _WORKER + "rows it accepted and has not committed yet.",
        LABEL_WORKER,
    ),
    WORKER_STORE_QUEUE_PEAK_ROWS=_spec(
        "kvobs_store_worker_queue_peak_rows",
        "gauge",
        "rows",
        _WORKER + "the most rows it held uncommitted at once since it started.",
        LABEL_WORKER,
    ),
    WORKER_STORE_QUEUE_CAPACITY_ROWS=_spec(
        "kvobs_store_worker_queue_capacity_rows",
        "gauge",
        "rows",
        _WORKER + "the rows its queue takes at most, besides the batch being written.",
        LABEL_WORKER,
    ),
    WORKER_STORE_QUEUE_FULL=_spec(
        "kvobs_store_worker_queue_full",
        "counter",
        "units",
        _WORKER + "KV-event batches that found its queue full (each waited for room, or was dropped and counted).",
        LABEL_WORKER,
    ),
    WORKER_STORE_DRAIN_LAG=_spec(
        "kvobs_store_worker_drain_lag_seconds",
        "gauge",
        "s",
        _WORKER + "how long the oldest row it holds uncommitted has waited (0 when it holds none).",
        LABEL_WORKER,
    ),
    WORKER_STORE_DRAIN_LAG_PEAK=_spec(
        "kvobs_store_worker_drain_lag_peak_seconds",
        "gauge",
        "s",
        _WORKER + "the longest any row waited in it, from queued to committed, since it started.",
        LABEL_WORKER,
    ),
    COLLECTOR_TARGET_UP=_spec(
        "kvobs_collector_target_up",
        "gauge",
        "1",
        "1 when the collector's last scrape of the instance succeeded, else 0.",
        LABEL_INSTANCE,
    ),
    COLLECTOR_KV_EVENTS=_spec(
        "kvobs_collector_kv_events",
        "counter",
        "events",
        "KV events the collector received and decoded, by instance.",
        LABEL_INSTANCE,
    ),
    COLLECTOR_KV_EVENTS_LOST=_spec(
        "kvobs_collector_kv_event_batches_lost",
        "counter",
        "batches",
        "KV-event batches missing from the sequence that replay could not recover.",
        LABEL_INSTANCE,
    ),
    COLLECTOR_SESSIONS_FORGOTTEN=_spec(
        "kvobs_collector_sessions_forgotten",
        "counter",
        "sessions",
        "Sessions whose state the collector let go after --session-idle-s without a "
        "KV event (nothing resident, nothing pending).",
    ),
    COLLECTOR_KV_WORKER_RESTARTS=_spec(
        "kvobs_collector_kv_worker_restarts",
        "counter",
        "restarts",
        "Times the worker process reading an instance's KV events (kvobs collect --workers) ended unasked; each "
        "time it is started again and its stream resumes after the last batch the collector took (from the replay "
        "socket where one is configured, else the gap is counted lost).",
        LABEL_INSTANCE,
    ),
    COLLECTOR_KV_WORKER_UP=_spec(
        "kvobs_collector_kv_worker_up",
        "gauge",
        "1",
        "1 while the worker process reading an instance's KV events runs, 0 while it is down (ended, its start "
        "again failing: retried with a growing wait); absent where the streams are read in the collector's process.",
        LABEL_INSTANCE,
    ),
    COLLECTOR_KV_CORE_COMPILED=_spec(
        "kvobs_collector_kv_core_compiled",
        "gauge",
        "1",
        "1 while the collector's KV-event streams are attributed by the compiled ingest core (collectors.kv.core), "
        "0 while by its pure-Python fallback (no build found, or KVOBS_KV_CORE=python): the same rows, at more CPU "
        "an event; absent without KV-event streams.",
    ),
    COLLECTOR_KV_STREAMS_SILENT=_spec(
        "kvobs_collector_kv_streams_silent",
        "counter",
        "silences",
        "Times a KV-event stream delivered nothing for --kv-silence-s while the same "
        "replica's /metrics counted prefix-cache queries (both sides connecting: "
        "nobody binds).",
        LABEL_INSTANCE,
    ),
    COLLECTOR_SPAN_STEPS=_spec(
        "kvobs_collector_span_steps",
        "counter",
        "steps",
        "Agent steps made from agent frameworks' spans (one per LLM call), by the convention "
        "they were written in (otel-genai, openinference, openllmetry).",
        LABEL_SOURCE,
    ),
    COLLECTOR_LLM_REQUESTS=_spec(
        "kvobs_collector_llm_requests", "counter", "requests", "llm_request spans the collector stored as requests."
    ),
    COLLECTOR_OTLP_BUSY=_spec(
        "kvobs_collector_otlp_exports_busy",
        "counter",
        "exports",
        "OTLP exports answered 429 / RESOURCE_EXHAUSTED because the store queue was full "
        "(not acknowledged: the exporter retries them).",
    ),
    COLLECTOR_IDS_CUT=_spec(
        "kvobs_collector_ids_cut",
        "counter",
        "ids",
        "Session or request ids longer than 255 bytes that the collector cut to fit the store.",
    ),
    COLLECTOR_KV_OFFLOAD_PLACEHOLDERS=_spec(
        "kvobs_collector_kv_offload_placeholders",
        "counter",
        "blocks",
        "Block hashes in offload placeholders (BlockStored without tokens or block size: a copy reached "
        "another tier) a replica published; counted, not stored as blocks of its cache.",
    ),
    COLLECTOR_KV_CHAIN_STARTS=_spec(
        "kvobs_collector_kv_chain_starts",
        "counter",
        "chains",
        "Distinct first blocks (a chain's start: no parent) a replica stored in its device cache, with their tokens.",
    ),
    COLLECTOR_KV_SHORT_SHARED_STARTS=_spec(
        "kvobs_collector_kv_short_shared_starts",
        "counter",
        "chains",
        "Chains whose first block began with the same tokens as an earlier chain's first block, for 16 tokens or "
        "more but less than a block: a shared prefix shorter than a block, computed again by each, never found cached.",
    ),
    COLLECTOR_KV_SHORT_SHARED_TOKENS=_spec(
        "kvobs_collector_kv_short_shared_tokens",
        "counter",
        "tokens",
        "The tokens those chains shared with an earlier chain's start (each computed again).",
    ),
    COLLECTOR_KV_SHORT_SHARED_STORED_TOKENS=_spec(
        "kvobs_collector_kv_short_shared_stored_tokens",
        "counter",
        "tokens",
        "The tokens those chains stored as they began: what the shared tokens are a share of.",
    ),
    COLLECTOR_KV_REPEATED_STORES=_spec(
        "kvobs_collector_kv_repeated_stores",
        "counter",
        "blocks",
        "Stored blocks a replica announced again while they were resident in that tier (an offload tier may): "
        "stored with first_owner 0, so each block counts once.",
    ),
    COLLECTOR_KV_UNKNOWN_REMOVALS=_spec(
        "kvobs_collector_kv_unknown_removals",
        "counter",
        "blocks",
        "Removed blocks the collector had not seen stored in that tier (stored before it subscribed, or removed "
        "twice): stored with no session, no one's loss.",
    ),
    COLLECTOR_KV_UNKNOWN_TIER_BLOCKS=_spec(
        "kvobs_collector_kv_unknown_tier_blocks",
        "counter",
        "blocks",
        "Block hashes stored to or removed from a tier kvobs does not know (by replica and tier, as the replica "
        "named it): not read as any tier's blocks.",
    ),
    COLLECTOR_KV_WIRE_BATCHES=_spec(
        "kvobs_collector_kv_wire_batches",
        "counter",
        "batches",
        "KV-event batches received, by replica and wire shape (a batch as an array or a map, its events as maps or "
        "positional arrays: which vLLM release sends them).",
    ),
    COLLECTOR_KV_EVENT_LAG=_spec(
        "kvobs_collector_kv_event_lag_seconds",
        "gauge",
        "s",
        "Age of a replica's latest KV-event batch when the collector received it (its timestamp to the collector's "
        "clock: queueing, the network and clock skew).",
    ),
    COLLECTOR_ROUTING_LOSS=_spec(
        "kvobs_collector_routing_loss_tokens",
        "counter",
        "tokens",
        "Prompt tokens a request recomputed on its replica while another replica of the fleet held that prefix "
        "at its lookup (kvobs.analytics.cache.routing), by the replica that served it.",
    ),
    COLLECTOR_ROUTING_COMPARED_TOKENS=_spec(
        "kvobs_collector_routing_compared_prompt_tokens",
        "counter",
        "tokens",
        "Prompt tokens of the requests whose prefix was compared with the other replicas (the routing loss's "
        "denominator).",
    ),
    COLLECTOR_ROUTING_COMPARED_REQUESTS=_spec(
        "kvobs_collector_routing_compared_requests",
        "counter",
        "requests",
        "Requests whose prefix was compared with the other replicas of the fleet.",
    ),
    COLLECTOR_ROUTING_UNCOMPARABLE=_spec(
        "kvobs_collector_routing_uncomparable_requests",
        "counter",
        "requests",
        "Requests the routing meter measured but could compare with no other replica, by the replica that served it "
        "and why (routing.FleetCheck: no other replica, another block size, block hashes that never meet): not in "
        "the routing loss or its denominator.",
    ),
    COLLECTOR_LEASES_LOST=_spec(
        "kvobs_collector_leases_lost",
        "counter",
        "leases",
        "Times another writer was found holding the lease on one of this collector's instances: its KV events and "
        "scrapes are dropped (counted in kvobs_telemetry_dropped_total) until the lease is taken back.",
        LABEL_INSTANCE,
    ),
    COLLECTOR_DYNAMO_TRACE_ROWS=_spec(
        "kvobs_collector_dynamo_trace_rows",
        "counter",
        "rows",
        "Rows of Dynamo's request-trace shards the collector read (--dynamo-trace), by outcome: stored (a request or "
        "a tool call) or left_out (not JSON, not of the schema, or lacking what a request needs).",
        LABEL_OUTCOME,
    ),
    COLLECTOR_DYNAMO_TRACE_JOINS=_spec(
        "kvobs_collector_dynamo_trace_joins",
        "counter",
        "requests",
        "Dynamo request-trace requests by how they were joined with the KV events of the worker that served them "
        "(--dynamo-trace with --kv-events), by outcome: joined, or why not (not_held, ambiguous, no_blocks, "
        "block_size_differs). A joined request is its stream's, and the blocks it named that named no session are "
        "its session's.",
        LABEL_OUTCOME,
    ),
    COLLECTOR_ROUTING_LATE=_spec(
        "kvobs_collector_routing_late_requests",
        "counter",
        "requests",
        "Requests that reached the store after the routing meter had passed their lookup: not in the routing loss.",
    ),
    COLLECTOR_ROUTING_UNMEASURED=_spec(
        "kvobs_collector_routing_unmeasured_seconds",
        "counter",
        "s",
        "Seconds of lookups a restarted routing meter did not measure: its predecessor stopped more than six hours "
        "before it started (RESUME_S), and it measures no further back; the routing loss leaves those requests out.",
        LABEL_INSTANCE,
    ),
    COLLECTOR_STEP_VERDICTS=_spec(
        "kvobs_collector_step_verdicts",
        "counter",
        "steps",
        "Agent steps whose verdict (failure cause, slow cause) the collector decided and wrote once their session "
        "settled, by what cost each: its failure's kind, else its slow cause's (cache, queue, engine, tool, outside), "
        "else none.",
        LABEL_KIND,
    ),
    COLLECTOR_STEPS_JOINED=_spec(
        "kvobs_collector_steps_joined",
        "counter",
        "steps",
        "Steps made from agent frameworks' spans, by how each was joined to its server request (response_id, "
        "trace, timing) or why it was not (unanswered, no_request, id_not_seen, ambiguous, no_counts), and by "
        "the convention they were written in.",
        LABEL_METHOD,
        LABEL_SOURCE,
    ),
    COLLECTOR_REQUESTS_CACHED_FILLED=_spec(
        "kvobs_collector_requests_cached_filled",
        "counter",
        "requests",
        "Joined server requests whose own spans said no cached tokens (vLLM's), by what became of the count the "
        "step's reply gave: filled (stored on the request, cached_from reply), no_count (the step's span holds "
        "none: the server's prompt-token details off, or an instrumentation that keeps no cached count), "
        "counts_differ (the reply's prompt tokens are not the request's: not filled).",
        LABEL_OUTCOME,
    ),
    COLLECTOR_REQUESTS_TIED=_spec(
        "kvobs_collector_requests_tied",
        "counter",
        "requests",
        "Requests during which blocks naming no session were stored, by how their blocks were tied to them and "
        "their session (inference, header) or why not (ambiguous, stored_nothing, no_chain, no_counts, "
        "no_session). A tied request's blocks are its session's: its footprint, losses and tool-pause losses.",
        LABEL_TIE,
    ),
)
