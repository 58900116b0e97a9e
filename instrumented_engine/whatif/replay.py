"""What-if: replay recorded requests and their hash chains through the block manager, without tensors.

    plan = ReplayPlan.from_store(store)                       # requests, chains, block size, what was observed
    for n in (32, 64, 128):
        print(simulate(plan, num_blocks=n, policy="session_ttl", ttl_s=30).hit_rate)

Our engine's data is replayed step for step from its recorded traffic (`whatif.recorded`): at the observed size and
policy that reproduces the run. Otherwise (vLLM's data, which has no allocations), each recorded request arrives
when it was recorded looking its prefix up (arrival + queue time) with its rebuilt chain (see
`kvobs.analytics.cache.chains`), looks its prefix up and takes its prompt's blocks, takes a decode block each time its
output fills one (`REPLAY_WORDS`), and holds them until its recorded finish; then its blocks are freed in vLLM's
order and the session counts as idle until its next request, which is what `session_ttl` protects; after its last
recorded request the session has ended (the replay knows the future: what it lost after that is lost after its end,
and its blocks are no longer protected). A request that finds no room waits (FCFS) until a finish frees enough. The
block manager is the engine's own, so LRU order, hit caps, eviction reasons and the tool-pause verdicts are the
engine's.

"Blocks lost" is one definition everywhere (`kvobs.store.composed.ComposedReads.block_losses`): each lost block
once (evictions, invalidations and vLLM's removals; a block several sessions owned counts once), resets and the
blocks a session released not included (those are counted apart, `released_blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from instrumented_engine.engine.kv_cache.eviction import make_eviction_policy
from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.observers.losses import LossTally
from instrumented_engine.whatif.engine_rules import registers_of
from instrumented_engine.whatif.recorded import RecordedReplay, RecordedTraffic, releases
from instrumented_engine.whatif.units import ReplayClock, ReplayRequest, WhatIfResult, replay_sequence
from instrumented_engine.whatif.whole_length import WholeLengthCache
from kvobs.analytics.cache import (
    COUNTERS,
    NO_SOURCE,
    REQUESTS,
    hit_rate_in,
    hit_rate_summary,
    hit_rates,
    known_hit_rate,
    lookup_ts,
    never_scheduled,
    num_inferred,
    replayable,
)
from kvobs.analytics.runs import Span
from kvobs.analytics.steps import response_cached_tokens, responses_hit_rate
from kvobs.semconv.reasons import EvictionPolicyName
from kvobs.semconv.spans import KVEventKind
from kvobs.store import composed
from kvobs.store.interface import Store

# how a request of an engine that publishes no allocations (vLLM) holds blocks in the replay, as the pages say it
REPLAY_WORDS = (
    "each request takes its prompt's blocks at its lookup and a decode block each time its output fills one, its "
    "output spread evenly from its recorded first token to its finish, and holds them to its finish, waiting for room; "
    "others find its prompt's blocks as its engine makes them findable"
)


@dataclass
class ReplayPlan:
    requests: list[ReplayRequest]
    block_size: int
    # what the run achieved (`observed_figures`); its `hit` is that of the replayed requests whose responses said
    # their cached tokens (`answered`: (request id, prompt tokens)), where any did and the engine's rows do not say;
    # the counters' hit rate (all its traffic), where scraped and not what `hit` is, is kept as `counted`
    observed: dict = field(default_factory=dict)
    skipped: int = 0  # requests without a known chain or times
    never_admitted: int = 0  # requests never scheduled (aborted in the queue): they looked nothing up, as vLLM counts
    skipped_prompt_tokens: int = 0  # ... their prompt tokens (those that say them)
    inferred: int = 0  # requests whose blocks named no session, tied to theirs by inference (`analytics.ownership`)
    duplicates: int = 0  # requests recorded under two instance names (an engine's own row and its span's), once each
    recorded: RecordedTraffic | None = None  # our engine's step-by-step traffic (None: the whole-length replay)
    span: Span | None = None  # the run it replays (None: a range, runs unknown)
    policy: str | None = None  # the run's eviction policy, where it recorded one
    engine: str | None = None  # the run's engine (`RunEngine`), where it said one: when its blocks become findable
    tier_blocks: int | None = None  # the offload tier below the run's cache, in blocks (0: none; None: not said)
    releases: dict[str, float] = field(default_factory=dict)  # session -> when its agent released it (our engine)

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @classmethod
    def from_store(
        cls, store: Store, since=None, until=None, *, block_size: int | None = None, instances=None
    ) -> ReplayPlan:
        """The requests of [since, until] on `instances` (None: all) as one cache saw them: ask it of one run
        (`whatif_runs.replay_plans` cuts a range at each restart)."""
        found = replayable(store, since, until, instances=instances)
        reqs, steps, chains, graph = found.requests, found.steps, found.chains, found.graph
        block_size = found.block_size() if block_size is None else block_size
        plan, skipped, skipped_tokens, never = [], 0, 0, 0
        for r in reqs.itertuples(index=False):
            if never_scheduled(r):
                never += 1  # the run never scheduled it: no lookup, no query, nothing held (the observed row's too)
                continue
            chain = chains.get(r.request_id)
            if chain is None or pd.isna(r.finished_ts) or pd.isna(r.prompt_tokens):
                skipped += 1
                skipped_tokens += 0 if pd.isna(r.prompt_tokens) else int(r.prompt_tokens)
                continue
            completion = 0 if pd.isna(r.completion_tokens) else int(r.completion_tokens)
            plan.append(
                ReplayRequest(
                    r.request_id,
                    r.session_id if isinstance(r.session_id, str) else None,  # (no session: None, never NaN)
                    float(lookup_ts(r)),
                    float(r.finished_ts),
                    int(r.prompt_tokens),
                    int(r.prompt_tokens) + completion,
                    tuple(chain),
                    float(r.arrival_ts),
                    None if pd.isna(r.first_token_ts) else float(r.first_token_ts),
                )
            )
        rates = hit_rates(reqs, chains, graph, block_size=block_size)
        recorded = RecordedTraffic.from_store(store, since, until, plan)
        observed = observed_figures(store, since, until, rates, instances=instances, requests=reqs)
        said = response_cached_tokens(reqs, steps)
        answered = [(r.request_id, r.prompt_tokens) for r in plan if r.request_id in said]
        if answered and observed["hit"].source in COUNTED:  # the replayed requests' own, not the range's
            hit = responses_hit_rate(answered, said)
            observed.update(hit=hit, hit_rate=hit.rate, counted=observed["hit"], answered=answered)
        elif observed["hit"].source == REQUESTS:  # where only some say theirs: those, the replay's over the same
            said_by_some = known_hit_rate([(r.request_id, r.prompt_tokens) for r in plan], reqs)
            if said_by_some is not None:
                observed.update(hit=said_by_some[0], hit_rate=said_by_some[0].rate, answered=said_by_some[1])
            counters = hit_rate_in(store, since, until, instances, requests=reqs.iloc[0:0])
            if counters.source == COUNTERS:  # kept: they tell traffic whose requests never reached kvobs
                observed["counted"] = counters
        return cls(
            plan,
            block_size,
            observed=observed,
            skipped=skipped,
            skipped_prompt_tokens=skipped_tokens,
            never_admitted=never,
            duplicates=found.duplicates,
            recorded=recorded,
            inferred=num_inferred(found.ties),
            # (the releases' rows are read only where the counts say there are some: vLLM's data has none)
            releases=releases(store, since, until, instances) if observed["released_blocks"] else {},
        )


# an observed hit rate of counters (the engine's, over all its traffic in the range), or none: where any replayed
# request's response said its cached tokens, those requests are compared instead (the same as the replay's)
COUNTED = (COUNTERS, NO_SOURCE)
INFERRED = (
    "{:,} requests' blocks named no session (no X-Session-ID reached the server): each was tied to its session's "
    "request by its depth, its times and its session's chain (kvobs.analytics.cache.ownership), "
    "only where one chain fit"
)
NEVER_ADMITTED = (
    "{:,} requests were never scheduled (their clients hung up in the queue): they looked nothing up, so they are "
    "in neither the observed hit rate nor the replay"
)
DUPLICATES = (
    "{:,} requests were recorded under two instance names (an engine's own rows and a collector's from its spans?): "
    "each is counted once, in the observed row as in the replay"
)


def observed_figures(
    store: Store, since, until, rates: pd.DataFrame, *, instances=None, requests: pd.DataFrame | None = None
) -> dict:
    """What the recorded run achieved: hit rate (`kvobs.analytics.cache.hit_rate`, as everywhere, with the tokens it
    divides and where they came from), blocks lost, blocks lost in tool pauses (settled) and still pending,
    recompute tokens."""
    counts = store.reads.kv_event_counts(since, until, bucket_s=1e12, instances=instances)
    lost, released = composed.losses_in(counts)["blocks"].sum(), composed.releases_in(counts)["blocks"].sum()
    tier_kinds = [KVEventKind.TIER_STORED.value, KVEventKind.TIER_LOADED.value]
    footprints = store.reads.session_footprints(since, until, instances=instances)
    snaps = store.reads.instance_snapshots(since, until, instances=instances)
    summary = hit_rate_summary(rates)
    hit = hit_rate_in(store, since, until, instances, requests=requests)
    return {
        "num_blocks": int(snaps["blocks_total"].dropna().iloc[-1]) + 1 if snaps["blocks_total"].notna().any() else None,
        "hit_rate": hit.rate,
        "hit": hit,
        "evicted_blocks": int(lost),
        "released_blocks": int(released),
        "lost_in_pause_blocks": int(footprints["session_evicted_idle_blocks"].fillna(0).sum()),
        "pending_idle_blocks": int(footprints["session_pending_idle_blocks"].fillna(0).sum()),
        "recompute_tokens": summary["recompute_tokens"] if summary["achieved"] is not None else None,
        "tier_events": int(counts.loc[counts["kind"].isin(tier_kinds), "blocks"].sum()),
    }


def simulate(
    plan: ReplayPlan,
    *,
    num_blocks: int,
    policy: str = EvictionPolicyName.LRU.value,
    ttl_s: float = 30.0,
    tier_blocks: int = 0,
    decode_growth: bool = True,
    registers: str | None = None,
) -> WhatIfResult:
    """Replay `plan` through a `num_blocks` cache under `policy`, with an offload tier of `tier_blocks` below it
    (LRU, write-through, as vLLM's CPU offloading: `whatif.tier`): our engine's recorded traffic step for step when
    the plan has it (`whatif.recorded`), else each request from its lookup to its finish (`WholeLengthCache`; its
    decode's blocks taken as its output fills them, or with `decode_growth` False all at its lookup; its prompt's
    blocks found by others as the plan's engine makes them findable, or as `registers` says when given)."""
    clock = ReplayClock()
    manager = BlockManager(
        num_blocks,
        plan.block_size,
        policy=make_eviction_policy(policy, ttl_s=ttl_s),
        clock=clock,
        offload_blocks=tier_blocks,
    )
    ttl = ttl_s if policy == EvictionPolicyName.SESSION_TTL.value else None
    result = WhatIfResult(num_blocks, policy, tier_blocks=tier_blocks, ttl_s=ttl)
    if plan.recorded is not None:
        return _replay_recorded(plan, manager, clock, result)
    registers = registers_of(plan.engine) if registers is None else registers
    cache = WholeLengthCache(manager, plan.block_size, result, clock, decode_growth=decode_growth, registers=registers)
    losses = LossTally(tier=manager.tier is not None)
    arrivals = sorted(plan.requests, key=lambda r: r.arrival_ts)
    cache.last_request = {r.session_id: r.request_id for r in arrivals if r.session_id is not None}
    released = sorted((ts, session) for session, ts in plan.releases.items())

    def settle(until: float) -> None:
        """Finishes and session releases up to `until`, in time order (an agent's release drops its blocks)."""
        while True:
            finish, release = cache.next_finish(), released[0][0] if released else float("inf")
            if min(finish, release) > until or min(finish, release) == float("inf"):
                return
            if finish <= release:
                cache.finish_one()
            else:
                clock.now, session = released.pop(0)
                manager.release_session(session)
            cache.tally(losses)

    for req in arrivals:
        settle(req.arrival_ts)
        clock.now = req.arrival_ts
        cache.arrive(req)
        cache.tally(losses)
    settle(float("inf"))
    return _tally(result, losses)


def _replay_recorded(plan: ReplayPlan, manager: BlockManager, clock: ReplayClock, result: WhatIfResult) -> WhatIfResult:
    key = manager.hash_key(None)
    sequences = {r.request_id: replay_sequence(r, key, plan.block_size) for r in plan.requests}
    replay, losses = RecordedReplay(manager, sequences, result), LossTally(tier=manager.tier is not None)
    result.requests = len(plan.requests)
    result.query_tokens = sum(r.prompt_tokens for r in plan.requests)
    if plan.recorded is None:
        raise ValueError("a recorded replay needs the run's recorded actions (ReplayPlan.recorded)")
    for action in plan.recorded.actions:
        clock.now = action.ts
        replay.apply(action)
        replay.tally(losses)
    for session_id in list(manager.activity.pending):  # hindsight: these sessions never came back
        manager.end_session(session_id)
    replay.tally(losses)
    return _tally(result, losses)


def _tally(result: WhatIfResult, losses: LossTally) -> WhatIfResult:
    result.evicted_blocks, result.by_reason = losses.num_lost, dict(losses.by_reason)
    result.released_blocks = losses.num_released
    result.lost_in_pause_blocks, result.lost_after_end_blocks = losses.num_lost_in_pause, losses.num_lost_after_end
    result.saved_in_pause_blocks = losses.num_saved_in_pause
    return result
