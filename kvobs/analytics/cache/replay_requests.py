"""The recorded requests as a replay takes them, read once for the what-if (`ReplayPlan.from_store`) and for the
Mooncake export (`kvobs.formats.mooncake`), so a run exported and replayed is the run replayed.

    found = replayable(store, since, until)     # requests once each, their sessions, their chains
    for r in found.requests.itertuples():
        if never_scheduled(r) or r.request_id not in found.chains: ...

Each request once (`once_each`), its session filled from the agent step that sent it and, where its blocks named no
session, from the blocks tied to it (`ownership.with_tied_blocks`), its chain rebuilt from the KV events' hash chains
(`chains.request_chains`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvobs.analytics.cache.chains import BlockGraph, request_chains, with_sessions
from kvobs.analytics.cache.ownership import with_tied_blocks
from kvobs.store.interface import Store


@dataclass(frozen=True)
class Replayable:
    requests: pd.DataFrame  # once each, sessions filled
    steps: pd.DataFrame
    stored: pd.DataFrame  # the stored blocks, with the sessions their requests were tied to
    ties: pd.DataFrame  # how each request whose blocks named no session was tied (`ownership.block_ties`)
    graph: BlockGraph
    chains: dict[str, list[int]]  # request id -> its chain, root first (those with a known chain)
    duplicates: int  # requests recorded under two instance names, counted once

    def block_size(self) -> int:
        """The tokens of a stored block, as the KV events say.

        Raises:
            ValueError: no stored block in the range.
        """
        sizes = self.stored["num_tokens"].dropna()
        if sizes.empty:
            raise ValueError("the store holds no stored KV blocks in this range (is KV-event collection on?)")
        return int(sizes.mode().iloc[0])


def replayable(store: Store, since=None, until=None, *, instances=None) -> Replayable:
    """The requests of [since, until] on `instances` (None: all), with what a replay needs of them."""
    steps = store.reads.steps(since, until)
    requests, duplicates = once_each(with_sessions(store.reads.requests(since, until, instances=instances), steps))
    stored = store.reads.stored_blocks(since, until, instances=instances)
    requests, stored, ties = with_tied_blocks(requests, stored)  # where the blocks name no session
    graph = BlockGraph.from_stored(stored)
    return Replayable(requests, steps, stored, ties, graph, request_chains(requests, stored, graph), duplicates)


def once_each(requests: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Each request once: one recorded under two instance names (our engine's own row, and a collector's from the
    same engine's span) is one request, whose copies would count its hits and recompute twice in the observed row
    and once in the replay. Keeps the row that says what was cached; returns how many copies were left out."""
    if requests.empty or not requests["request_id"].duplicated().any():
        return requests, 0
    ordered = requests.assign(_known=requests["cached_tokens"].notna()).sort_values("_known", ascending=False)
    kept = ordered.drop_duplicates("request_id").drop(columns="_known").sort_index()
    return kept, len(requests) - len(kept)


def never_scheduled(request) -> bool:
    """A request (a row of `requests`) the engine never scheduled (its client hung up in the queue): it looked
    nothing up and held nothing, so neither the observed figures nor a replay count it."""
    return pd.isna(request.queue_s) and pd.isna(request.first_token_ts) and pd.isna(request.cached_tokens)
