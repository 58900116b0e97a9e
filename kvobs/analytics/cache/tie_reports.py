"""A session's ties and a collector's, counted and said: how the blocks of a session's requests were tied to it
where they named no session (`session_ties`, for its page), and the doctor's check of a collector's ties
(`ties_check`), over `kvobs.analytics.cache.ownership`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from kvobs.analytics.cache.chains import with_sessions
from kvobs.analytics.cache.ownership import block_ties
from kvobs.semconv.spans import BLOCKS_TIED, BlockTie, KVEventKind

TIE_WORDS = {
    BlockTie.INFERENCE.value: "tied to it by inference (their depth, their times, its chain)",
    BlockTie.STORED_NOTHING.value: "stored nothing new (all of it was cached)",
    BlockTie.AMBIGUOUS.value: "not tied: more than one chain fit, or one another request's fit too",
    BlockTie.NO_CHAIN.value: "not tied: their chain's root was not read",
    BlockTie.NO_COUNTS.value: "not tied: no token counts or times",
    BlockTie.NO_SESSION.value: "not tied: no step named their session",
}


def ties_check(ties: Mapping[str, float]) -> tuple[bool, str]:
    """(ok, words) of a collector's `kvobs_collector_requests_tied_total` by tie: ok while most of the requests
    during which blocks naming no session were stored had them tied, or stored nothing new."""
    counts = {tie: int(n) for tie, n in ties.items() if n}
    settled = counts.get(BlockTie.INFERENCE.value, 0) + counts.get(BlockTie.STORED_NOTHING.value, 0)
    settled += counts.get(BlockTie.HEADER.value, 0)
    untied = {tie: n for tie, n in counts.items() if tie not in BLOCKS_TIED and tie != BlockTie.STORED_NOTHING.value}
    words = f"of {sum(counts.values()):,} requests whose KV blocks named no session, {settled:,} tied or all cached"
    if untied:
        tie, n = max(untied.items(), key=lambda item: item[1])
        why = TIE_WORDS.get(tie, tie).removeprefix("not tied: ")
        fix = (
            "; send X-Session-ID to own them exactly"
            if tie in (BlockTie.NO_SESSION.value, BlockTie.AMBIGUOUS.value)
            else ""
        )
        words += f"; {sum(untied.values()):,} not tied ({n:,} of them: {why}{fix})"
    return settled >= sum(untied.values()), words


def ties_said(ties: Counter) -> str:
    """A session's ties (`session_ties`) in words, for its page."""
    parts = "; ".join(f"{n:,} {TIE_WORDS.get(tie, tie)}" for tie, n in ties.most_common())
    return (
        f"{sum(ties.values()):,} of its requests stored KV blocks that named no session (no X-Session-ID reached "
        f"the server with them): {parts}. Its footprint and losses count the blocks tied to it, and no other."
    )


def names_its_blocks(store, session_id: str, since: float, until: float) -> bool:
    """Whether a block stored in [since, until] names the session: its requests carried the header, so every block
    they stored names it (read from the blocks, not from the requests: vLLM's request spans name no session)."""
    stored = KVEventKind.STORED.value
    return not store.reads.kv_events(since, until, kinds=[stored], session_id=session_id, limit=1).empty


TIE_LOOKBACK_S = 600.0  # stored blocks read before a session's first step: where its chains' recent roots are


def session_ties(store, session_id: str) -> Counter:
    """How the blocks of a session's requests were tied to it (BlockTie -> its requests), of its requests whose
    blocks named no session; empty where a header named every block they stored (a request that stored nothing new
    names none, and says nothing), or the session has no steps."""
    steps = store.reads.steps(session_id=session_id)
    if steps.empty:
        return Counter()
    first, last = float(steps["started_at"].min()), float(steps[["started_at", "ended_at"]].max().max())
    if names_its_blocks(store, session_id, first, last):
        return Counter()
    requests = with_sessions(store.reads.requests(first, last), store.reads.steps(first, last))
    mine = set(requests.loc[requests["session_id"] == session_id, "request_id"])
    # every block stored then named its session (the fleet's stores, read whole only when some did not)
    if not mine or store.reads.stored_blocks(first - TIE_LOOKBACK_S, last, latest=1, unnamed=True).empty:
        return Counter()
    stored = store.reads.stored_blocks(first - TIE_LOOKBACK_S, last)
    ties = block_ties(requests, stored)
    found = Counter(ties.loc[ties["request_id"].isin(mine) & (ties["tie"] != BlockTie.HEADER.value), "tie"])
    if set(found) <= {BlockTie.STORED_NOTHING.value}:  # what they stored (if anything) named the session
        return Counter()
    return found
