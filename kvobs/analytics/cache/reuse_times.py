"""How long after its store a block was used again: the reuse time, the other half of what a TTL pin is set by
(beside `ages_at_eviction`), overall and per session kind: the requesting session's agent (`agent_kinds`), or any
grouping of requests a caller gives (the tool of the pause before each step: `kvobs.analytics.steps.request_tools`;
the session itself).

    reuse = range_reuse_times(store, since, until)       # {ALL: EvictionAges(count, unknown, quantiles), agent: ...}
    print(reuse_words(reuse))

Read from the request lookups (`routing.request_lookups`: the prompt blocks each request found on its replica at its
lookup, as the shortfall split counts them) and the chains they were read with: each block a request found is
timed from its latest store (on any replica) at or before the lookup, once a store: the first hit after a store is
its reuse, a later hit of the same copy is not counted again. A hit block whose store the range's events never
showed (stored before them) has no reuse time: counted as unknown, never as a time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.cache.ages_at_eviction import ALL, EvictionAges, distribution, distribution_words
from kvobs.analytics.cache.routing import lookup_chains, read_inputs, request_lookups


def reuse_times(
    lookups: pd.DataFrame, chains: dict[str, list[int]], stored: pd.DataFrame, kinds: dict[str, str] | None = None
) -> dict[str, EvictionAges]:
    """`ALL`'s reuse times, then each session kind's (`kinds`: request id -> its kind, e.g. `agent_kinds`), from
    `lookups` (`LOOKUP_COLUMNS`), the requests' `chains` and the `stored` rows (`block_hash`, `ts`) they were read
    with."""
    times: dict[int, np.ndarray] = {}
    if not stored.empty:
        frame = stored.dropna(subset=["block_hash"])
        for block_hash, ts in frame.groupby(frame["block_hash"].astype("uint64"))["ts"]:
            times[int(block_hash)] = np.sort(ts.to_numpy(float))
    hit_since: dict[int, float] = {}  # block -> the store its latest counted hit was timed from
    gaps, unknown = [], []  # (request, seconds); the requests of hits whose store was not seen
    for row in lookups.sort_values("lookup_ts", kind="stable").itertuples(index=False):
        chain = chains.get(row.request_id) or []
        for block_hash in chain[: int(row.own_blocks)]:
            stores = times.get(int(block_hash))
            at = -1 if stores is None else int(np.searchsorted(stores, row.lookup_ts, side="right")) - 1
            if at < 0:
                unknown.append(row.request_id)
                continue
            store_ts = float(stores[at])  # type: ignore[index]
            if hit_since.get(block_hash) == store_ts:
                continue  # this copy was used before: its reuse is counted
            hit_since[block_hash] = store_ts
            gaps.append((row.request_id, row.lookup_ts - store_ts))
    frame = pd.DataFrame(gaps, columns=["request_id", "seconds"])
    missing = pd.Series(unknown, dtype=object)
    out = {ALL: distribution(frame["seconds"], len(missing))}
    if not kinds:
        return out
    named, unnamed = frame["request_id"].map(kinds), missing.map(kinds)
    for kind in sorted(set(named.dropna()) | set(unnamed.dropna())):
        out[str(kind)] = distribution(frame.loc[named == kind, "seconds"], int((unnamed == kind).sum()))
    return out


def agent_kinds(requests: pd.DataFrame, sessions: pd.DataFrame) -> dict[str, str]:
    """request id -> its session's agent (the SDK's `agent_name`), for the requests whose session names one."""
    if sessions.empty or "agent_name" not in sessions or requests.empty:
        return {}
    agents = sessions.dropna(subset=["agent_name"]).set_index("session_id")["agent_name"]
    named = requests["session_id"].map(agents)
    return {str(rid): str(agent) for rid, agent in zip(requests["request_id"], named) if isinstance(agent, str)}


def range_reuse_times(store, since, until, kinds: dict[str, str] | None = None) -> dict[str, EvictionAges]:
    """The reuse times of the requests that arrived in [since, until], read from `store`, per `kinds` (request id ->
    kind; None: per agent, `agent_kinds`)."""
    requests, steps = store.reads.requests(since, until), store.reads.steps(since, until)
    if requests.empty:
        return reuse_times(pd.DataFrame(columns=["lookup_ts"]), {}, pd.DataFrame())
    tied, events, check = read_inputs(store, requests, steps, since, until)  # (read once: the lookups' and chains')
    lookups = request_lookups(tied, events, check)
    _, stored, _, _, chains = lookup_chains(tied, events, {})
    if kinds is None:
        kinds = agent_kinds(tied, store.reads.sessions())
    return reuse_times(lookups, chains, stored, kinds)


def reuse_words(reuse: dict[str, EvictionAges]) -> str:
    """The reuse times as `kvobs whatif` prints them beside a TTL sweep, a line per session kind."""
    title = "Reuse times (a block's latest store to its first hit after it, in the range's lookups):"
    return distribution_words(title, "hits", "whose store was not seen", reuse)
