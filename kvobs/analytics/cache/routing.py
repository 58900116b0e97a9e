"""Routing loss: the prefix a request recomputed on its replica while another replica of the fleet held it.

    check = FleetCheck.of(events, requests)               # block sizes; replicas whose hashes never meet
    losses = routing_losses(requests, events, check)      # one row per request whose prefix could be compared
    losses, check = fleet_losses(store, requests, steps, since, until)   # the same, read from a store
    summary = routing_summary(losses, since, until)       # per instance and for the fleet: tokens/s, share

At each request's lookup (`chains.lookup_ts`: when it was first scheduled), the prefix it found on its own replica
(`cached_tokens`, in whole blocks; where a source does not report it, as vLLM's request spans do not, its own
replica's resident prefix at that moment, which is what the lookup finds) is compared with the longest prefix of
its hash chain (`chains.request_chains`, root first, capped at prompt - 1 tokens as the engine caps a lookup)
resident on each other replica at that moment. Residency comes from the replicas' own KV events, swept once in time
order (`FleetIndex`): a block is resident on a replica from
its `stored` event until its `removed` (vLLM), `evicted` or `invalidated` (kvobs) event, or a `cleared`. A request
whose own hit is shorter than another replica's by at least one block has a routing loss: `routed_blocks` blocks
(`routed_tokens` tokens) it recomputed that `best_instance` held.

What it cannot see it does not claim. A prefix is compared only between replicas whose block hashes can meet: the
same block size, and hash chains that do meet where sessions moved between them (vLLM seeds its first block's hash
from `PYTHONHASHSEED`, else a fixed seed with sha256 and a random one with xxhash; `FleetCheck.notes` says which
pairs were left out and why, `FleetCheck.uncompared` why a request was compared with none). A block stored before
the events read is not known to be resident, and a chain whose root was stored before them cannot be aligned
(`read_inputs` reads `RESIDENCY_LOOKBACK_S` before the range, and `STORED_WITHIN_S` after it for the blocks its last
requests stored): both make the loss smaller, never larger. A request without a known chain is left out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvobs.analytics.cache.chains import BlockGraph, lookup_times, lookup_ts, request_chains, with_sessions
from kvobs.analytics.cache.fleet_index import CLEARED, LOSS_KINDS, STORE_KINDS, STORED, FleetIndex
from kvobs.analytics.cache.ownership import with_tied_blocks
from kvobs.semconv.reasons import PairApart
from kvobs.semconv.spans import KVEventKind
from kvobs.store.interface import Store
from kvobs.store.rollups import MISS_PARTS

ROUTING_KINDS = (*sorted(STORE_KINDS), *sorted(LOSS_KINDS), CLEARED)  # the KV events residency is rebuilt from
COLUMNS = [
    "request_id",
    "session_id",
    "instance",
    "lookup_ts",
    "prompt_tokens",
    "block_size",
    "own_blocks",
    "best_blocks",
    "best_instance",
    "routed_blocks",
    "routed_tokens",
    "replicas_compared",
]
LOOKUP_COLUMNS = [
    *COLUMNS,
    "prompt_blocks",
    "tier_blocks",
    "available_blocks",
    *(f"{part}_blocks" for part in MISS_PARTS if part != "routed"),  # `routed_blocks` is in COLUMNS
]
SUMMARY_COLUMNS = ["instance", "requests", "prompt_tokens", "routed_tokens", "routed_share", "routed_tokens_per_s"]
FLEET = "fleet"  # the summary's row over every instance
RESIDENCY_LOOKBACK_S = 3600.0  # KV events read before a range, for what was resident at its first lookups
# KV events read after a range: the blocks a request stores (its chain) come after its lookup, up to its end, and a
# replica's event times run after the agent's step ends (vLLM publishes a block when it is full, then its batch)
STORED_WITHIN_S = 120.0


@dataclass
class FleetCheck:
    """Which replicas' prefixes can be compared: `block_sizes` per instance (from their stored blocks), the pairs
    left out (`apart`) and why each was (`why`: a `PairApart` value), and a sentence for each reason (`notes`)."""

    block_sizes: dict[str, int] = field(default_factory=dict)
    apart: set[frozenset[str]] = field(default_factory=set)
    why: dict[frozenset[str], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        events: pd.DataFrame,
        requests: pd.DataFrame,
        *,
        base: FleetCheck | None = None,
        hashes: bool = True,
        met: set[frozenset[str]] | None = None,
        crossed: dict[frozenset[str], int] | None = None,
    ) -> FleetCheck:
        """`events`: KV events with the `stored` ones; `requests`: their `instance` and `session_id`. `base`: what an
        earlier check found (block sizes are kept); `hashes`: also tell replicas whose chains never meet (sessions
        ran on both, and no block was stored on both), which needs the whole range's stored blocks (a short slice of
        a long run may hold no shared block by chance); or give that evidence gathered over a longer time: `met`
        (pairs that both stored some block: `FleetIndex.meets`) and `crossed` (pair -> sessions that ran on both)."""
        stored = events[events["kind"] == STORED] if not events.empty else events
        check = cls(block_sizes=dict(base.block_sizes) if base is not None else {})
        for instance, sizes in stored.groupby("instance")["num_tokens"]:
            counts = Counter(int(n) for n in sizes.dropna())
            if counts:
                check.block_sizes[str(instance)] = counts.most_common(1)[0][0]
        if len(set(check.block_sizes.values())) > 1:
            listed = ", ".join(f"{name} {size}" for name, size in sorted(check.block_sizes.items()))
            check.notes.append(
                f"replicas differ in block size ({listed} tokens): a prefix is compared only between replicas of "
                "the same block size"
            )
        if met is None and hashes:
            held = {name: set(group.dropna().map(int)) for name, group in stored.groupby("instance")["block_hash"]}
            met = {
                frozenset((a, b)) for a in held for b in held if a < b and held[a] & held[b]
            }  # (pairs of replicas that both stored some block in the range)
        if crossed is None:
            crossed = _shared_sessions(requests) if hashes else {}
        names = sorted(check.block_sizes)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                pair = frozenset((a, b))
                if check.block_sizes[a] != check.block_sizes[b]:
                    check.apart.add(pair)
                    check.why[pair] = PairApart.BLOCK_SIZE.value
                elif met is not None and crossed.get(pair) and pair not in met:
                    check.apart.add(pair)
                    check.why[pair] = PairApart.HASHES_DIFFER.value
                    check.notes.append(hashes_differ(a, b, crossed[pair]))
        return check

    def comparable(self, a: str, b: str) -> bool:
        return a != b and a in self.block_sizes and b in self.block_sizes and frozenset((a, b)) not in self.apart

    def uncompared(self, instance: str) -> str:
        """Why a request on `instance` was compared with no other replica (a `PairApart` value)."""
        others = [name for name in self.block_sizes if name != instance]
        if instance not in self.block_sizes or not others:
            return PairApart.NO_OTHER_REPLICA.value
        reasons = {self.why.get(frozenset((instance, name))) for name in others}
        return PairApart.HASHES_DIFFER.value if PairApart.HASHES_DIFFER.value in reasons else PairApart.BLOCK_SIZE.value


def hashes_differ(a: str, b: str, sessions: int) -> str:
    """The sentence for a pair whose block hashes never meet, with what makes them meet."""
    return (
        f"{a} and {b} never stored the same block although {sessions} session(s) ran on both: their block hashes "
        "differ, so a prefix on one cannot be found on the other, and routing loss between them is not measured. "
        "vLLM seeds the first block's hash from PYTHONHASHSEED where it is set (a sha256 hash algorithm then uses "
        "it too; unset, sha256 uses a fixed seed and xxhash a random one per process): give every replica the same "
        "PYTHONHASHSEED, or leave it unset on all of them with a sha256 --prefix-caching-hash-algo"
    )


def _shared_sessions(requests: pd.DataFrame) -> dict[frozenset[str], int]:
    """Per pair of instances, how many sessions sent requests to both."""
    out: dict[frozenset[str], int] = defaultdict(int)
    known = requests.dropna(subset=["session_id"])
    for names in known.groupby("session_id")["instance"].unique():
        names = sorted(str(n) for n in names)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                out[frozenset((a, b))] += 1
    return out


def routing_losses(
    requests: pd.DataFrame,
    events: pd.DataFrame,
    check: FleetCheck | None = None,
    index: FleetIndex | None = None,
    *,
    apply_until: float | None = None,
) -> pd.DataFrame:
    """One row per request (columns `COLUMNS`) whose chain, root included, is known and whose replica has another
    to compare with. `events`: KV events of `ROUTING_KINDS`, from before the requests' lookups (what was resident
    then) to their ends (the blocks they stored); `requests`: `requests` rows (sessions filled,
    `chains.with_sessions`). `index`: the fleet as it stood before the first event, advanced in place through the
    events up to `apply_until` (all by default; later ones only give the requests' chains); a new one by default."""
    check = FleetCheck.of(events, requests) if check is None else check
    index = FleetIndex() if index is None else index
    if len(check.block_sizes) < 2:
        requests = requests.iloc[0:0]
    frame = _lookups(requests, events, check, index, apply_until)
    return frame[frame["replicas_compared"] > 0][COLUMNS].reset_index(drop=True)


def request_lookups(
    requests: pd.DataFrame,
    events: pd.DataFrame,
    check: FleetCheck | None = None,
    index: FleetIndex | None = None,
    *,
    apply_until: float | None = None,
    pause_from: dict[str, float] | None = None,
) -> pd.DataFrame:
    """`routing_losses`' rows for every request whose chain is known, on one replica as on many (columns
    `LOOKUP_COLUMNS`), with each prompt block the request missed counted once, by why (`MISS_PARTS`, in this
    order): `routed` (another replica held it at the lookup), `cold` (no replica had stored it before),
    `invalidated` (its replica invalidated it, or reset), `pause` (its replica evicted it while the session was
    idle: after the session's previous request ended), `capacity` (evicted otherwise, or on another replica that
    held it), `unexplained` (its replica held it, yet it was not found). `available_blocks`: the prompt blocks a
    cache that never evicted would have held = hit + all but `cold`. `tier_blocks`: of the hit, the blocks its
    replica held only in a lower tier at the lookup (loaded from an offload tier, not found in the cache).

    `index` (one that tracks losses), `apply_until`: as `routing_losses`'; `pause_from`: request id -> when its
    session's previous request ended (by default from `requests` themselves: `pause_starts`)."""
    check = FleetCheck.of(events, requests) if check is None else check
    index = FleetIndex(track_losses=True) if index is None else index
    if index.lost is None:
        raise ValueError("request_lookups needs a FleetIndex(track_losses=True)")
    return _lookups(requests, events, check, index, apply_until, pause_from)


def primary_group(events: pd.DataFrame) -> pd.DataFrame:
    """Each instance's rows of its primary KV-cache group (that of its first stored block; a row naming no group
    belongs to it): a hybrid model's other groups (sliding window, ...) cache the same hashes apart and drop them on
    their own schedule, which is no loss of the prefix (as the collector's device chains, `collectors.kv.ingest`)."""
    if "group_idx" not in events.columns or events["group_idx"].isna().all():
        return events
    groups = events["group_idx"]
    first = events[(events["kind"] == STORED) & groups.notna()].groupby("instance", sort=False)["group_idx"].first()
    primary = events["instance"].map(first)
    return events[groups.isna() | primary.isna() | (groups == primary)]


def _lookups(
    requests: pd.DataFrame,
    events: pd.DataFrame,
    check: FleetCheck,
    index: FleetIndex,
    apply_until: float | None,
    pause_from: dict[str, float] | None = None,
) -> pd.DataFrame:
    events, stored, graph, requests, chains = lookup_chains(requests, events, index.parent)
    if pause_from is None:
        pause_from = pause_starts(requests) if index.lost is not None else {}
    queries = []
    for req in requests.itertuples(index=False):
        chain, size = chains.get(req.request_id), check.block_sizes.get(req.instance)
        if not chain or size is None or pd.isna(req.prompt_tokens):
            continue
        if chain[0] not in graph.parent or graph.parent[chain[0]] is not None:
            continue  # its root was stored before what is known (or never): its blocks cannot be aligned
        others = [name for name in check.block_sizes if check.comparable(req.instance, name)]
        max_blocks = max(int(req.prompt_tokens) - 1, 0) // size
        queries.append((lookup_ts(req), req, chain[:max_blocks], others, size, pause_from.get(req.request_id)))
    queries.sort(key=lambda q: q[0])
    frame = pd.DataFrame(_sweep(queries, events, index, apply_until), columns=LOOKUP_COLUMNS)
    held = frame["best_instance"].astype(object)
    return frame.assign(best_instance=held.where(held.notna(), None))  # None, not NaN, where no other held more


def lookup_chains(requests: pd.DataFrame, events: pd.DataFrame, before: dict[int, int | None]) -> tuple:
    """What a lookup sweep reads its requests' chains from: (the events in time order, the first stored copy of each
    block deciding; their stores; the block graph, through the blocks `before` (block -> parent) knew; the requests,
    tied to the blocks that name no session; each request's chain)."""
    events = primary_group(events.sort_values("ts", kind="stable"))  # the first stored block in time decides
    stored = events[events["kind"] == STORED]
    graph = BlockGraph.from_stored(stored)
    for block_hash, parent in before.items():  # chains through blocks stored before these events
        graph.parent.setdefault(block_hash, parent)
    requests, stored, _ = with_tied_blocks(requests, stored, before=before)  # blocks that name no session
    chains = request_chains(requests, stored, graph) if not requests.empty else {}
    return events, stored, graph, requests, chains


def pause_starts(requests: pd.DataFrame, earlier: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """request id -> when its session's previous request ended (the start of the pause before it). `earlier`:
    session -> (arrival, end) of a request before these (a caller that reads requests in slices remembers each
    session's latest), the previous request of a session's first one here if it arrived before it."""
    out: dict[str, float] = {}
    known = requests.dropna(subset=["session_id"]).sort_values("arrival_ts", kind="stable")
    for session_id, group in known.groupby("session_id", sort=False):
        ends = group["finished_ts"].to_numpy(float)
        ids, arrivals = group["request_id"].to_numpy(object), group["arrival_ts"].to_numpy(float)
        before = (earlier or {}).get(session_id)
        if before is not None and before[0] < arrivals[0] and before[1] == before[1]:
            out[ids[0]] = float(before[1])
        for rid, end in zip(ids[1:], ends[:-1]):
            if end == end:
                out[rid] = float(end)
    return out


def _sweep(queries: list, events: pd.DataFrame, index: FleetIndex, apply_until: float | None) -> list[dict]:
    """The index advanced through the events in time order up to each lookup, and each lookup's longest resident
    prefix on the other replicas (and, where the index tracks losses, why each missed block was missing); then
    through the rest of the events up to `apply_until`."""
    ts = events["ts"].to_numpy(float)
    columns = [events[c].to_numpy(object) for c in ("kind", "instance", "block_hash", "parent_hash")]
    columns.append(ts)
    media = events["medium"] if "medium" in events.columns else pd.Series(None, index=events.index, dtype=object)
    columns.append(media.astype(object).where(media.notna(), None).to_numpy(object))  # None where no tier is named
    rows, at = [], 0
    for looked_up, req, chain, others, size, pause_from in queries:
        stop = max(int(np.searchsorted(ts, looked_up, side="right")), at)
        index.apply(*(column[at:stop] for column in columns))
        at = stop
        best, best_instance = 0, None
        for name in others:
            n = index.prefix_on(name, chain)
            if n > best:
                best, best_instance = n, name
        # its own hit: as it reported it, else (vLLM's request spans carry no cached tokens) its own replica's
        # resident prefix at the lookup, which is what vLLM's lookup finds
        own = index.prefix_on(req.instance, chain) if pd.isna(req.cached_tokens) else int(req.cached_tokens) // size
        own = min(own, len(chain))
        routed = max(best - own, 0)
        row = {
            "request_id": req.request_id,
            "session_id": req.session_id,
            "instance": req.instance,
            "lookup_ts": looked_up,
            "prompt_tokens": int(req.prompt_tokens),
            "block_size": size,
            "own_blocks": own,
            "best_blocks": best,
            "best_instance": best_instance if routed else None,
            "routed_blocks": routed,
            "routed_tokens": routed * size,
            "replicas_compared": len(others),
            "prompt_blocks": len(chain),
        }
        if index.lost is not None:
            row.update(_misses(index, req.instance, chain, own, best, looked_up, pause_from))
        rows.append(row)
    end = len(ts) if apply_until is None else int(np.searchsorted(ts, apply_until, side="right"))
    index.apply(*(column[at:end] for column in columns))
    return rows


def _misses(index, instance, chain, own, best, looked_up, pause_from) -> dict[str, int]:
    """Each prompt block after the hit, counted once by why it was missing, and the hit's blocks held only in a
    lower tier (`request_lookups`)."""
    counts = dict.fromkeys(MISS_PARTS, 0)
    tier = index.held_below_only(instance, chain[:own])
    held = index.resident.get(instance, ())
    for position in range(own, len(chain)):
        block_hash = chain[position]
        loss = index.lost.get((instance, block_hash))
        if position < best:
            part = "routed"
        elif index.first_stored.get(block_hash, np.inf) >= looked_up:
            part = "cold"
        elif block_hash in held:
            part = "unexplained"
        elif loss is not None and loss[1] in (KVEventKind.INVALIDATED.value, CLEARED):
            part = "invalidated"
        elif loss is not None and pause_from is not None and loss[0] > pause_from:
            part = "pause"
        else:
            part = "capacity"
        counts[part] += 1
    out = {f"{part}_blocks": n for part, n in counts.items()}
    out["available_blocks"] = len(chain) - counts["cold"]
    out["tier_blocks"] = tier
    return out


def routing_summary(losses: pd.DataFrame, since: float, until: float) -> pd.DataFrame:
    """Per instance and for the fleet (`FLEET`, last): the requests compared, their prompt tokens, the tokens
    recomputed that another replica held (`routed_tokens`), their share of the prompt tokens and their rate over
    the range (tokens/s)."""
    sums = pd.DataFrame(
        {
            "instance": losses["instance"],
            "compared_requests": 1,
            "compared_prompt_tokens": losses["prompt_tokens"].astype(float),
            "routed_tokens": losses["routed_tokens"].astype(float),
        }
    )
    return routing_summary_of_sums(sums.groupby("instance", as_index=False).sum(), since, until)


def routing_summary_of_sums(sums: pd.DataFrame, since: float, until: float) -> pd.DataFrame:
    """`routing_summary` of per-instance sums (`instance`, `compared_requests`, `compared_prompt_tokens`,
    `routed_tokens`: as `kvobs.store.rollups.LOOKUP_MINUTES` keeps them), instances with no request compared left
    out."""
    span = max(until - since, 1e-9)
    sums = sums[sums["compared_requests"] > 0].sort_values("instance")
    rows = []
    totals = sums[["compared_requests", "compared_prompt_tokens", "routed_tokens"]].sum()
    for name, row in [*((r["instance"], r) for _, r in sums.iterrows()), (FLEET, totals)]:
        prompt, routed = int(row["compared_prompt_tokens"]), int(row["routed_tokens"])
        rows.append(
            {
                "instance": name,
                "requests": int(row["compared_requests"]),
                "prompt_tokens": prompt,
                "routed_tokens": routed,
                "routed_share": routed / prompt if prompt else np.nan,
                "routed_tokens_per_s": routed / span,
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def fleet_losses(
    store: Store, requests: pd.DataFrame, steps: pd.DataFrame, since: float | None, until: float | None
) -> tuple[pd.DataFrame, FleetCheck]:
    """`routing_losses` of `requests` (their sessions filled from `steps`), with the KV events read from the store
    (`read_inputs`); nothing is read unless the store has heard of two instances."""
    if requests.empty or len(store.reads.instances()) < 2:
        return pd.DataFrame(columns=COLUMNS), FleetCheck()
    requests, events, check = read_inputs(store, requests, steps, since, until)
    return routing_losses(requests, events, check), check


def request_routing(
    store: Store, requests: pd.DataFrame, steps: pd.DataFrame, since: float | None, until: float | None
) -> pd.DataFrame:
    """The routing losses of `requests` (`COLUMNS`, as `fleet_losses`), as a collector measured them
    (`request_lookups`) for the instances it measures (`lookup_progress`), without reading a KV event: a request of
    such an instance without its row is left out (looked up after the collector's mark: pending; before it: its
    chain was not known, or it came before the collector started). Replayed (`fleet_losses`) for the instances no
    collector measures."""
    if requests.empty or len(store.reads.instances()) < 2:
        return pd.DataFrame(columns=COLUMNS)
    names = sorted(set(requests["instance"]))
    measured = set(store.reads.lookup_progress(instances=names)["instance"])
    mine = requests["instance"].isin(measured)
    parts = []
    if mine.any():
        rows = stored_lookups(store, requests[mine])
        parts.append(rows.loc[rows["replicas_compared"] > 0, COLUMNS])
    if not mine.all():
        parts.append(fleet_losses(store, requests[~mine], steps, since, until)[0])
    found = [part for part in parts if not part.empty]
    return pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=COLUMNS)


def stored_lookups(store: Store, requests: pd.DataFrame) -> pd.DataFrame:
    """The lookups a collector measured of `requests` (`reads.request_lookups`), as `request_lookups` gives them
    (`LOOKUP_COLUMNS`): those of them that have a row."""
    if requests.empty:
        return pd.DataFrame(columns=LOOKUP_COLUMNS)
    looked_up = lookup_times(requests)
    rows = store.reads.request_lookups(
        float(looked_up.min()), float(looked_up.max()), instances=sorted(set(requests["instance"]))
    )
    rows = rows[rows["request_id"].isin(set(requests["request_id"]))]
    return rows.assign(routed_tokens=rows["routed_blocks"] * rows["block_size"])[LOOKUP_COLUMNS].reset_index(drop=True)


def read_inputs(
    store: Store, requests: pd.DataFrame, steps: pd.DataFrame, since: float | None, until: float | None
) -> tuple[pd.DataFrame, pd.DataFrame, FleetCheck]:
    """What a lookup analysis of `requests` reads: the requests with their sessions filled from `steps`, the KV
    events of `ROUTING_KINDS` from `RESIDENCY_LOOKBACK_S` before `since` to `STORED_WITHIN_S` after `until` (the
    blocks its last requests stored), and the replicas' check."""
    start = None if since is None else since - RESIDENCY_LOOKBACK_S
    end = None if until is None else until + STORED_WITHIN_S
    events = store.reads.kv_events(start, end, kinds=ROUTING_KINDS)
    requests = with_sessions(requests, steps)
    return requests, events, FleetCheck.of(events, requests)
