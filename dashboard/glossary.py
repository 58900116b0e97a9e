"""Every name a page shows, in one place: the column, series and cause names of the store and the analytics, as
people read them, with their unit and what they count.

    label("e2e_p50")         # 'end to end, median (s)'
    describe("blocks_lost")  # the tooltip: what the number counts
    cause("prefix_evicted_in_pause")   # 'prefix lost in the tool pause'

Tables (`views.tables.show_table`) and charts (`views.charts`) read their headers, legends and tooltips here, so a
name a page shows never is a code name, and one thing is called the same on every page.
"""

from __future__ import annotations

from kvobs.analytics.steps import CAUSE_LABELS
from kvobs.store.latency_sketch import SKETCH_ACCURACY

# name -> (label with its unit, what it counts)
TERMS: dict[str, tuple[str, str]] = {
    # who and when
    "session_id": ("session", "The agent session (conversation)."),
    "agent_name": ("agent", "The agent's name."),
    "source": (
        "recorded by",
        "Who recorded it: sdk (the agent SDK), engine (kvobs serve), vllm (kvobs collect "
        "from vLLM's KV events), or the convention of the agent's own spans it was made from: otel-genai, "
        "openinference, openllmetry; dynamo (NVIDIA Dynamo's request trace, imported).",
    ),
    "started_by": (
        "started by",
        "The session that started this one (a subagent's caller), as its requests said: the SDK's and OpenCode's "
        "X-Parent-Session-ID, Claude Code's agent ids. Blank: not said.",
    ),
    "subagents": ("subagents", "Sessions it started (each a session of its own, with its own steps and blocks)."),
    "instance": ("instance", "The engine or vLLM replica."),
    "run_id": ("run", "An engine run: from a start with an empty cache to the next start."),
    "started_at": ("started", "When it started."),
    "ended_at": ("ended", "When it ended."),
    "ts": ("time", "When it happened."),
    "time": ("time", "When it happened."),
    "first_ts": ("first seen", "The earliest time in the range."),
    "last_ts": ("last seen", "The latest time in the range."),
    "step_index": ("step", "The step's number in its session, from 0."),
    "status": ("status", "ok, or error."),
    "error_type": ("error", "What failed: an HTTP status, timeout, invalid_response (the model's output), ..."),
    "trace_id": ("trace", "The step's trace id."),
    "request_id": ("request", "The engine's request id."),
    # blocks and tokens
    "blocks": ("blocks", "KV blocks."),
    "tokens": ("tokens", "Tokens."),
    "lost": (
        "blocks lost",
        "Cached blocks the cache took from the session so far (evicted, invalidated, removed, reset; not those it "
        "released).",
    ),
    "lost_idle": (
        "lost in tool pauses (blocks)",
        "Cached blocks the session lost while it waited on a tool, counted once it came back.",
    ),
    "pending_idle": (
        "lost while idle, pending (blocks)",
        "Blocks lost while the session was idle: a tool pause if it comes back, after its end if not.",
    ),
    "blocks_lost": (
        "blocks lost",
        "Cached blocks evicted, invalidated or removed, each lost block once (the agents' releases not included).",
    ),
    "blocks_lost_in_pause": (
        "lost in the pause (blocks)",
        "Cached blocks the session lost in the tool pause before this step.",
    ),
    "by_session": ("taken by session", "The session whose request the engine evicted the block for."),
    "stores": ("times stored", "How often the block was stored (computed)."),
    "sessions": ("sessions", "Distinct sessions."),
    "root_hash": ("prefix (root block hash)", "The first block of the chain: one prefix."),
    "block_hash": ("block hash", "vLLM's 64-bit block hash."),
    "restored": ("stored again", "Stores after the first: the block was lost, then computed again."),
    "restores": ("times restored", "How often the block was stored again on its instance after it was lost there."),
    "restored_after_s": (
        "lost for (s, mean)",
        "How long the block had been lost before each restore, on average (known as the events were stored).",
    ),
    # steps and requests
    "steps": ("steps", "Agent steps."),
    "failed": ("failed steps", "Steps that ended in an error."),
    "failed_steps": ("failed steps", "Steps that ended in an error."),
    "share": ("share of failures", "Of the failed steps in the range."),
    "requests": ("requests", "LLM requests."),
    "preemptions": ("preemptions", "Requests preempted (their KV freed, to be recomputed)."),
    "hit_rate": ("prefix-cache hit rate", "Prompt tokens served from the prefix cache / prompt tokens."),
    "join_rate": (
        "joined to requests",
        "Of the session's steps made of an agent framework's spans, the share the collector tied to their server "
        "request (by the reply's id, trace context or timing). Blank: not measured (the SDK's steps).",
    ),
    "kv_usage_max": ("peak KV usage", "The highest pinned KV-cache usage sampled."),
    "prompt_tokens": ("prompt tokens", "Prompt tokens of the requests counted."),
    "routed_tokens": (
        "routing loss (tokens)",
        "Prompt tokens recomputed on the request's replica while another replica of the fleet held them at its lookup.",
    ),
    "routed_share": ("routing loss (share)", "Routing-loss tokens / prompt tokens of the requests compared."),
    "routed_tokens_per_s": ("routing loss (tokens/s)", "Routing-loss tokens per second of the range."),
    "prompt_block_tokens": (
        "prompt (whole blocks, tokens)",
        "The prompt's tokens in whole blocks, up to its last token (which a lookup never finds): what the parts add "
        "up to.",
    ),
    "achieved_tokens": ("hit (tokens)", "Prompt tokens found on the request's own replica, in whole blocks."),
    "tier_tokens": (
        "of which loaded from a lower tier (tokens)",
        "Hit tokens the replica held only in an offload tier at the lookup (CPU, storage): loaded, not recomputed; "
        "a tool-pause eviction the tier saved is counted here, not as a loss.",
    ),
    "prefill_tokens": (
        "prefilled (tokens)",
        "Prompt tokens the engine computed, in whole blocks (the prompt's less those found), and what preemptions "
        "made it compute again.",
    ),
    "recomputed_tokens": ("recomputed (tokens)", "Of the prefilled, tokens some replica had computed before."),
    "recompute_tax": ("recompute tax", "Recomputed tokens / prefilled tokens."),
    "recomputed_pause_tokens": ("in tool pauses", "Recomputed: evicted while the session waited on a tool."),
    "recomputed_capacity_tokens": ("capacity", "Recomputed: evicted for room, no session paused."),
    "recomputed_routed_tokens": ("routing", "Recomputed: another replica of the fleet held them at the lookup."),
    "recomputed_invalidated_tokens": ("invalidated or reset", "Recomputed: invalidated, or the cache was reset."),
    "recomputed_unexplained_tokens": ("unexplained", "Recomputed: held at the lookup, yet not found."),
    "recomputed_preempted_tokens": (
        "preemption",
        "Recomputed after a preemption: the tokens it lost less those its re-admission found again. Blank: the "
        "engine does not say (not measured).",
    ),
    "counted_by": ("counted by", "The engine's own counter the row is read from (each engine's, by its own name)."),
    "cache_tokens": ("found in the cache (tokens)", "Prompt tokens the engine found in its device KV cache."),
    "loaded_tokens": (
        "loaded from a lower tier (tokens)",
        "Prompt tokens the engine loaded from a tier below its cache (an offload tier, LMCache, HiCache's host or "
        "storage tier) instead of computing them. Blank: the engine counted them cached without saying where.",
    ),
    "tiers": ("lower tiers", "The tiers the loads came from, as the engine names them."),
    "computed_tokens": ("computed (tokens)", "Prompt tokens the engine computed: found in no tier."),
    "loaded_share": ("loaded share", "Loaded tokens / prompt tokens."),
    "unit": ("unit", "What the tier's lookups are counted in, as its engine counts them: chunks (vLLM) or blocks."),
    "asked": ("looked up", "Blocks or chunks (the row's unit) the tier was asked for."),
    "found": ("found", "Of those, the blocks or chunks (the row's unit) the tier held."),
    "found_share": ("found share", "Found / looked up."),
    "load_s": ("load time (s)", "The loads' seconds as the engine counted them; blank where it does not count them."),
    "available_tokens": (
        "available (tokens)",
        "Prompt tokens a cache that never evicted would have held at the lookup: stored by some replica before.",
    ),
    "achieved_rate": ("achieved hit rate", "Hit tokens / prompt tokens, in whole blocks."),
    "available_rate": ("available hit rate", "Available tokens / prompt tokens, in whole blocks."),
    "shortfall_tokens": ("shortfall (tokens)", "Available minus hit: the parts routing to capacity below."),
    "cold_tokens": ("cold (tokens)", "Prompt tokens no replica had stored before the lookup."),
    "invalidated_tokens": ("invalidated (tokens)", "Missed because the replica invalidated or reset them."),
    "pause_tokens": ("tool pause (tokens)", "Missed because they were evicted while the session waited on a tool."),
    "capacity_tokens": ("capacity (tokens)", "Missed because they were evicted otherwise (or on another replica)."),
    "unexplained_tokens": ("unexplained (tokens)", "The replica held them at the lookup, yet they were not found."),
    "routed_from": ("prefix held by", "The replica that held more of the step's prefix than the one it ran on."),
    "e2e_p50": ("end to end, median (s)", "Median end-to-end time of the session's steps (5 or more)."),
    "e2e_s": ("end to end (s)", "From the step's start to its end."),
    "ttft_s": ("TTFT (s)", "Time to the first token, as the agent saw it."),
    "ttft_p90_s": (
        "TTFT p90 (s)",
        f"90th percentile time to first token (shown with 10 requests or more; from a latency sketch, within "
        f"{SKETCH_ACCURACY:.0%}).",
    ),
    "latency_s": ("latency (s)", "The whole step: from its start to its end."),
    "typical_s": (
        "typical (s)",
        "The median latency of the session's other successful steps (a failed one's: those of its kind and size).",
    ),
    "excess_s": ("over typical (s)", "How much longer than its typical step it took."),
    "queue_s": (
        "queue (s)",
        "Waiting for the engine to schedule the request (all of it, for a request never scheduled before it ended).",
    ),
    "preempted_s": (
        "preemption (s)",
        "Waiting to be re-admitted after a preemption, and the compute it threw away (measured from the engine's "
        "events; estimated where a server only counts preemptions).",
    ),
    "prefill_s": ("prefill (s)", "From scheduled (or re-admitted) to the first token: computing the prompt."),
    "decode_s": ("decode (s)", "From the first token to the end."),
    "tool_s": ("own tool calls (s)", "The step's own tool calls (the SDK runs a step's tools inside it)."),
    "before_s": (
        "before the server (s)",
        "From the step's start to its request's arrival at the server: the agent's own queue, the network, the "
        "server's accept queue, and whatever the server does before it stamps the arrival (not measured on verdicts "
        "decided before it was a part of its own).",
    ),
    "other_s": (
        "outside the engine (s)",
        "The reply's way back, gaps between the step's requests, the agent's own work: the rest of the latency.",
    ),
    "lost_recompute_s": (
        "recomputing the lost prefix (s)",
        "The share of the step's prefill its lost tokens are of the tokens it computed.",
    ),
    "prefill_rate": ("prefill pace (tokens/s)", "The step's own prefill: tokens it computed per second."),
    "evidence": ("evidence", "What the store shows, with what it cost."),
    "failure_cause": ("why it failed", "The error itself; for a timeout, the part of its latency that cost it."),
    "failure_kind": (
        "kind of failure",
        "For a timeout: cache (a lost prefix, a preemption), queue, engine (its prefill or decode), tool (its own tool "
        "calls), outside (before its request reached the server, or it never did, or outside the engine), timeout (no "
        "request in the store and no telling why); else model (its output) or request (anything else).",
    ),
    "slow_cause": (
        "why it was slow",
        "The part of its latency that explains most of its excess over its typical step (none: not slow).",
    ),
    "verdict": (
        "verdict",
        "decided: by the collector once the session had settled (what the Overview counts); worked out: as this page "
        "opened (no collector decided it).",
    ),
    "slow_steps": ("slow steps", "Steps slower than their session's typical step, decided once their session settled."),
    "of_weighed": ("share of steps", "Of the range's steps weighed: decided, with a request to weigh."),
    "slow_s": ("added (s, median)", "The median of the seconds the cause added over its typical value."),
    "what": ("what happened", ""),
    "story": ("timeline", "The step's story: its pause, its requests' phases and what happened to its blocks."),
    # what-if
    "configuration": ("configuration", "observed: what the run did; else the policy replayed."),
    "hit rate": ("hit rate", "Cached prompt tokens / prompt tokens."),
    "blocks lost": (
        "blocks lost",
        "Each lost block once (evictions, invalidations, removals; resets and the agents' releases not included).",
    ),
    "blocks released": ("blocks released", "Blocks the agents released when their session ended: no loss."),
    "lost in tool pauses": ("lost in tool pauses (blocks)", "Blocks a session lost while it waited on a tool."),
    "recompute tokens": ("recomputed tokens", "Prompt tokens computed again after their blocks were lost."),
    "waited": ("requests that waited", "Requests the replay could not admit at once (no room)."),
    # alerts
    "rule": ("rule", ""),
    "severity": ("severity", ""),
    "state": ("state", "firing or resolved."),
    "value": ("value", "The rule's signal when it changed state."),
    "summary": ("summary", ""),
    "held_s": ("held (s)", "How long back the rule's condition has held, in whole windows of the rule."),
    "for_s": ("needs (s)", "The rule's `for`: how long its condition must hold before it fires."),
    # correlation
    "lag": ("lag (windows)", "Pressure shifted by this many windows: positive, pressure leads latency."),
    "lag_s": ("lag (s)", "The same lag in seconds."),
    "r": ("r", "Pearson's correlation (shown from 10 windows)."),
    "pairs": ("windows", "Windows where both values are known."),
    "ci_low": ("95% CI, low", "Fisher's 95% interval of r."),
    "ci_high": ("95% CI, high", "Fisher's 95% interval of r."),
    "p": ("p (this lag alone)", "Two-sided p-value of r at this lag; consecutive windows are not independent."),
}

# series and cause names in legends and verdicts
SERIES: dict[str, str] = {
    "ttft_p50": "TTFT p50",
    "ttft_p90": "TTFT p90",
    "ttft_p99": "TTFT p99",
    "ttft_mean": "TTFT, mean",
    "itl_p50": "inter-token p50",
    "itl_p90": "inter-token p90",
    "itl_mean": "inter-token, mean",
    "queue_p50": "queue p50",
    "queue_p90": "queue p90",
    "capacity": "capacity (evicted for room)",
    "session_release": "session released",
    "released": "released by the agent (no loss)",
    "ttl": "session TTL",
    "invalidation": "invalidated",
    "reset": "reset",
    "removed": "removed by vLLM",
    "weights_update": "weights update",
    "adapter_swap": "adapter swap",
    "system_prompt_change": "system prompt change",
    "session_forget": "session forgotten",
    "manual_reset": "manual reset",
    "stored": "stored",
    "evicted": "evicted",
    "hit": "found in the cache",
    "allocated": "allocated",
    "preempted": "preempted",
    "invalidated": "invalidated",
    "cleared": "cache reset",
    "ok steps": "ok steps",
    "failed steps": "failed steps",
}
CAUSES: dict[str, str] = {
    **CAUSE_LABELS,
    "timeout": "timeout (no request of the step found to split its time)",
    "invalid_response": "the model's output (invalid_response)",
    "none": "",
}


# What a page lacks, with what would bring it: one sentence per source, the same on every page.
MISSING: dict[str, str] = {
    "snapshots": (
        "No instance snapshots in this range: kvobs collect --vllm-url URL scrapes a vLLM's /metrics into them "
        "(kvobs serve --store writes its own)."
    ),
    "requests": (
        "No requests in this range: vLLM's request spans come in through kvobs collect --otlp-http (vLLM started "
        "with --otlp-traces-endpoint pointing at it); kvobs serve --store writes its own."
    ),
    "kv_events": (
        "No KV events in this range: kvobs collect --kv-events ENDPOINT takes a vLLM's (vLLM started with "
        "--kv-events-config); kvobs serve --store writes its own."
    ),
    "steps": (
        "No agent steps in this range: send the agents' traces (OpenTelemetry GenAI, OpenInference or OpenLLMetry "
        "instrumentation, or the kvobs SDK) to kvobs collect --otlp-http."
    ),
    "sessions": (
        "No sessions in this range: they come from the agents' steps (their traces to kvobs collect --otlp-http) or "
        "from KV events of requests that carried X-Session-ID."
    ),
}


def label(name: str) -> str:
    """The header a column is shown under."""
    return TERMS[name][0] if name in TERMS else SERIES.get(name, name.replace("_", " "))


def describe(name: str) -> str | None:
    return TERMS[name][1] or None if name in TERMS else None


def series(name) -> str:
    return SERIES.get(str(name), str(name).replace("_", " "))


def cause(name) -> str:
    if name is None or name != name:
        return ""
    return CAUSES.get(str(name), str(name).replace("_", " "))
