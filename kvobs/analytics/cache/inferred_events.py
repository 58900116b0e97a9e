"""A session's KV events that name no session, found as a page reads them: the blocks its requests stored, tied to
those requests by inference (`ownership.block_ties`: their depth, their times, the session's chain), the later losses
of those blocks, and the events its own requests made (a prefix hit, an allocation, a preemption), each marked with
how it was tied, so a step's story shows what a framework agent's requests did to the cache without the header.

    tied = tied_events(store, "coder-1", since, until, request_ids)    # kv_events rows, with `tie`

The stores keep what the events named; nothing here is written.
"""

from __future__ import annotations

import pandas as pd

from kvobs.analytics.cache.chains import with_sessions
from kvobs.analytics.cache.ownership import block_ties, owned_stored
from kvobs.analytics.cache.tie_reports import TIE_LOOKBACK_S, names_its_blocks
from kvobs.semconv.spans import BLOCK_LOSS_KINDS, BlockTie, KVEventKind
from kvobs.store.interface import Store

K = KVEventKind
OWN_KINDS = (K.HIT.value, K.ALLOCATED.value, K.PREEMPTED.value)  # their request_id is the request's own (an
# `evicted` row names the request that took the block, not its owner)
BY_REQUEST = "request"  # a row of the session's own request, whose session the request did not carry


def tied_events(store: Store, session_id: str, since: float, until: float, request_ids) -> pd.DataFrame:
    """The `kv_events` rows in (since, until] that name no session and are `session_id`'s, with `tie`:
    `inference` (a block its requests stored, or that block's loss) or `request` (an event of one of
    `request_ids`, the session's requests); empty where every block stored then named a session, or one named
    this session (its requests carried the header)."""
    if names_its_blocks(store, session_id, since, until):
        return pd.DataFrame()  # the header named its blocks: none of the unnamed ones is its
    if store.reads.stored_blocks(since - TIE_LOOKBACK_S, until, latest=1, unnamed=True).empty:
        return pd.DataFrame()
    events = store.reads.kv_events(since, until)
    unnamed = events[events["session_id"].isna() & (events["ts"] > since)]
    if unnamed.empty:
        return pd.DataFrame()
    own = unnamed[unnamed["kind"].isin(OWN_KINDS) & unnamed["request_id"].isin(set(request_ids))]
    stored = store.reads.stored_blocks(since - TIE_LOOKBACK_S, until)
    before = since - TIE_LOOKBACK_S
    requests = with_sessions(store.reads.requests(before, until), store.reads.steps(before, until))
    owned = owned_stored(stored, block_ties(requests, stored))
    mine = owned[(owned["session_id"] == session_id) & (owned["tie"] == BlockTie.INFERENCE.value)]
    stores = {(i, int(h), float(t)) for i, h, t in zip(mine["instance"], mine["block_hash"], mine["ts"])}
    first_stored: dict[tuple[str, int], float] = {}
    for instance, block_hash, ts in sorted(stores, key=lambda key: key[2]):
        first_stored.setdefault((instance, block_hash), ts)
    keys = list(zip(unnamed["instance"], unnamed["block_hash"], unnamed["ts"]))
    is_store = (unnamed["kind"] == K.STORED.value).to_numpy() & [
        h is not None and not pd.isna(h) and (i, int(h), float(t)) in stores for i, h, t in keys
    ]
    is_loss = unnamed["kind"].isin(BLOCK_LOSS_KINDS).to_numpy() & [
        h is not None and not pd.isna(h) and float(t) >= first_stored.get((i, int(h)), float("inf")) for i, h, t in keys
    ]
    parts = [own.assign(tie=BY_REQUEST), unnamed[is_store | is_loss].assign(tie=BlockTie.INFERENCE.value)]
    return pd.concat([p for p in parts if not p.empty]) if any(not p.empty for p in parts) else pd.DataFrame()
