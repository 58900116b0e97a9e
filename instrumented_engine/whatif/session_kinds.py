"""A TTL sweep's two distributions, by session kind: the eviction ages (`kvobs.analytics.cache.eviction_ages`) and
the reuse times (`range_reuse_times`), grouped by the session's agent, the tool of the pause (before a request's
step: `kvobs.analytics.steps.request_tools`; an evicted block's: `loss_tools`), or each session.

    ages, reuse = ages_and_reuse(store, since, until, by="tool")
"""

from __future__ import annotations

from kvobs.analytics.cache import eviction_ages, range_reuse_times
from kvobs.analytics.steps import loss_tools, request_tools
from kvobs.semconv.spans import KVEventKind

AGENT, TOOL, SESSION = "agent", "tool", "session"
KINDS = (AGENT, TOOL, SESSION)


def ages_and_reuse(store, since, until, by: str = AGENT) -> tuple[dict, dict]:
    """The range's eviction ages and reuse times, overall and per session kind (`KINDS`), read beside a TTL sweep."""
    # the cache's own losses: vLLM's removals, our engine's evictions (each says its reason)
    removed = store.reads.kv_events(since, until, kinds=[KVEventKind.REMOVED.value, KVEventKind.EVICTED.value])
    if by == AGENT:
        return eviction_ages(removed, store.reads.sessions()), range_reuse_times(store, since, until)
    requests = store.reads.requests(since, until)
    if by == TOOL:
        steps = store.reads.steps(since, until)
        kinds, lost = request_tools(steps, requests), loss_tools(steps, removed)
    else:
        kinds = {str(r): str(s) for r, s in zip(requests["request_id"], requests["session_id"]) if s == s and s}
        lost = removed["session_id"]
    return eviction_ages(removed, kinds=lost), range_reuse_times(store, since, until, kinds)
