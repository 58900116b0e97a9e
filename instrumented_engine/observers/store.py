"""Engine step results -> store rows: requests, KV events, per-session and instance snapshots.

    recorder = StoreRecorder(StoreWriter(open_store(url)), instance="engine-0", block_size=16, medium="CPU")
    AsyncEngine(llm_engine, observers=[..., recorder])

Records (see `kvobs.store.rows`):
- `kv_events`: `stored` per block with its parent hash (the chain), `hit` per prefix lookup (`num_tokens` and
  `num_blocks` hit, `reason` `readmission` after a preemption), `allocated` per allocation (`num_blocks`,
  `num_tokens` = blocks x block size),
  `evicted` / `invalidated` per block and per session that owned it (`session_id` = the owner that lost it,
  `request_id` = the request whose allocation took it, `reason` = eviction or invalidation reason),
  `preempted` (`num_tokens` = computed tokens thrown away, `num_blocks` freed), `cleared` on a prefix-cache reset
  (`num_blocks` dropped); with an offload tier, `tier_stored` / `tier_removed` per block its copy reached or left
  (`medium` the tier's) and `tier_loaded` per block a request's prefix found there (copied back, not computed).
- `requests`: one per finished request.
- `snapshots`: one per session each time one of its requests finishes (blocks it has cached, from the request's
  output; evicted so far; lost in a tool pause, settled; lost while idle, still pending; hit tokens) and each time
  hindsight settles its idle losses (a tool pause or its end), and one per instance every
  `snapshot_interval_s`.
- `sessions`: a row (source `engine`) the first time a session is seen; the agent SDK's richer row wins.
- `runs`: this engine's run, once, at its start (`record_run`).

The writer never blocks the engine thread; an error here is logged and counted, never raised.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import RequestOutput, SchedulerStats, StepResult
from instrumented_engine.observers.dispatch import Handlers, dispatch
from kvobs.block_clock import BlockClock
from kvobs.hash_key import HashKey
from kvobs.logs import worth_logging
from kvobs.semconv.reasons import READMISSION, RELEASE_REASONS
from kvobs.semconv.spans import KVEventKind, RunEngine, RunSource, SessionSource, server_cached_from
from kvobs.store.rows import KVEventRecord, RequestRecord, RunRecord, SessionRecord, SnapshotRecord, run_id
from kvobs.store.writer import StoreWriter

log = logging.getLogger(__name__)


@dataclass
class _SessionTally:
    query_tokens: int = 0
    hit_tokens: int = 0
    evicted: int = 0
    evicted_idle: int = 0  # settled: lost in a tool pause
    pending_idle: int = 0  # lost while idle, not settled yet


class StoreRecorder:
    """An `AsyncEngine` observer writing what the engine did into the store.

    Args:
        writer: the store's batched writer (owned by the caller, who closes it).
        instance: this engine's name in every row.
        block_size: tokens per KV block.
        medium: `GPU` or `CPU`.
        snapshot_interval_s: seconds between instance snapshots (taken on the first step after the interval).
        max_sessions: sessions whose tallies are kept (least recently active dropped first).
    """

    def __init__(
        self,
        writer: StoreWriter,
        *,
        instance: str,
        block_size: int,
        medium: str,
        snapshot_interval_s: float = 5.0,
        max_sessions: int = 100_000,
        hash_key: HashKey | None = None,
    ) -> None:
        self.writer = writer
        self.hash_key = hash_key  # block hashes stored keyed (`kvobs.hash_key`); None: as the engine computed them
        self.instance = instance
        self.block_size = block_size
        self.medium = medium
        self.snapshot_interval_s = snapshot_interval_s
        self.max_sessions = max_sessions
        self.num_errors = 0
        self._sessions: OrderedDict[str, _SessionTally] = OrderedDict()
        self._query_tokens = 0
        self._hit_tokens = 0
        self._preemptions = 0
        self._evictions = 0
        self._last_snapshot_ts = float("-inf")
        self._stats: SchedulerStats | None = None  # the step being recorded
        self._clocks: dict[str, BlockClock] = {}  # tier -> when its blocks were stored and lost (the rows' columns)

    def on_step(self, result: StepResult) -> None:
        try:
            self._stats = result.stats
            dispatch(self, self.HANDLERS, result.events)
            for out in result.outputs:
                if out.finished:
                    self._finished(out, result.stats)
            if result.stats.ts - self._last_snapshot_ts >= self.snapshot_interval_s:
                self.instance_snapshot(result.stats)
        except Exception:
            self.num_errors += 1
            if worth_logging(self.num_errors):
                log.exception("recording a step in the store failed (%d so far); the engine goes on", self.num_errors)

    def record_run(
        self, started_at: float, model: str, stats: SchedulerStats, config, *, offload_blocks: int = 0
    ) -> RunRecord:
        """This engine's run (`runs`): it began at `started_at` (as its /metrics says in
        `kvobs_engine_start_time_seconds`, so a collector scraping it names the same run) with an empty cache of
        `stats.num_blocks_total` usable blocks, under `config.eviction_policy` (an `EngineConfig`), an offload tier
        of `offload_blocks` below it (0: none)."""
        run = RunRecord(
            run_id(self.instance, started_at),
            self.instance,
            started_at,
            RunSource.ENGINE.value,
            model=model,
            num_blocks=stats.num_blocks_total,
            block_size=self.block_size,
            eviction_policy=config.eviction_policy,
            offload_blocks=offload_blocks,
            engine=RunEngine.KVOBS.value,
        )
        self.writer.insert_missing(run)
        return run

    def instance_snapshot(self, stats: SchedulerStats) -> None:
        self._last_snapshot_ts = stats.ts
        self.writer.add(
            SnapshotRecord(
                **self._engine_state(stats),
                hit_rate=self._hit_tokens / self._query_tokens if self._query_tokens else None,
                preemptions_total=self._preemptions,
                evictions_total=self._evictions,
            )
        )

    # ---- event handlers (one table, below) ----------------------------------------------------------
    def _stored(self, event: ev.BlocksStored) -> None:
        self._chain(event, KVEventKind.STORED, kv_cache_spec_kind=ev.KV_CACHE_SPEC_KIND, lora_name=event.adapter)

    def _tier_stored(self, event: ev.TierStored) -> None:
        self._chain(event, KVEventKind.TIER_STORED, medium=event.medium)

    def _chain(self, event: ev.BlocksStored | ev.TierStored, kind: KVEventKind, **fields) -> None:
        """A row per stored block, each naming the one before it as its parent (and whether it brought back a block
        lost in its tier)."""
        parent, hashes = event.parent_block_hash, list(event.block_hashes)
        gaps = self._clock(fields.get("medium")).stored(hashes, event.ts) or [None] * len(hashes)
        for block_hash, gap in zip(hashes, gaps):
            self._kv(
                event,
                kind,
                block_hash=block_hash,
                parent_hash=parent,
                num_tokens=event.block_size,
                first_owner=1,
                group_idx=ev.KV_CACHE_GROUP,
                restored=int(gap is not None),
                restored_after_s=gap,
                **fields,
            )
            parent = block_hash

    def _clock(self, medium: str | None) -> BlockClock:
        tier = self.medium if medium is None else medium
        clock = self._clocks.get(tier)
        if clock is None:
            clock = self._clocks[tier] = BlockClock()
        return clock

    def _tier_removed(self, event: ev.TierRemoved) -> None:
        lifetimes = self._clock(event.medium).lost(event.block_hashes, event.ts)
        reason = None if event.reason is None else event.reason.value
        self._tier_blocks(event, KVEventKind.TIER_REMOVED, lifetimes, reason=reason)

    def _tier_loaded(self, event: ev.TierLoaded) -> None:
        """A row per block the request's prefix found in the tier (which of its losses the tier saved)."""
        self._tier_blocks(event, KVEventKind.TIER_LOADED, [None] * len(event.block_hashes))

    def _tier_blocks(
        self, event: ev.TierRemoved | ev.TierLoaded, kind: KVEventKind, lifetimes: list[float | None], **fields
    ) -> None:
        for block_hash, lifetime in zip(event.block_hashes, lifetimes):
            self._kv(
                event,
                kind,
                block_hash=block_hash,
                num_tokens=self.block_size,
                medium=event.medium,
                first_owner=1,
                group_idx=ev.KV_CACHE_GROUP,
                lifetime_s=lifetime,
                **fields,
            )

    def _lookup(self, event: ev.PrefixLookup) -> None:
        if not event.readmission:  # hit tokens: those not computed, the offload tier's with the cache's (vLLM's)
            hit_tokens = event.hit_tokens + event.tier_hit_tokens
            self._query_tokens += event.query_tokens
            self._hit_tokens += hit_tokens
            if event.session_id is not None:
                tally = self._tally(event.session_id)
                tally.query_tokens += event.query_tokens
                tally.hit_tokens += hit_tokens
        self._kv(
            event,
            KVEventKind.HIT,
            num_tokens=event.hit_tokens,
            num_blocks=event.hit_blocks,
            reason=READMISSION if event.readmission else None,
        )

    def _allocated(self, event: ev.BlocksAllocated) -> None:
        num = len(event.block_ids)
        self._kv(event, KVEventKind.ALLOCATED, num_tokens=num * self.block_size, num_blocks=num)

    def _evicted(self, event: ev.BlockEvicted) -> None:
        """One row per owner that lost the block (`session_id` = that owner, `request_id` = who took it)."""
        self._evictions += 1
        (lifetime,) = self._clock(None).lost((event.block_hash,), event.ts)
        for index, owner in enumerate(event.owner_sessions or (None,)):
            if owner is not None and event.store_reason not in RELEASE_REASONS:  # a release is no loss
                tally = self._tally(owner)
                tally.evicted += 1
                tally.pending_idle += owner in event.pending_owners
            self._kv(
                event,
                event.loss_kind,
                session_id=owner,
                block_hash=event.block_hash,
                parent_hash=event.parent_block_hash,
                num_tokens=self.block_size,
                reason=event.store_reason,
                first_owner=int(index == 0),
                group_idx=ev.KV_CACHE_GROUP,
                lifetime_s=lifetime,
            )

    def _preempted(self, event: ev.Preempted) -> None:
        self._preemptions += 1
        self._kv(
            event,
            KVEventKind.PREEMPTED,
            num_tokens=event.num_computed_tokens_lost,
            num_blocks=event.num_blocks_freed,
            reason=event.reason.value,
        )

    def _cleared(self, event: ev.CacheCleared) -> None:
        self._evictions += event.num_blocks
        self._clock(None).cleared(event.ts)
        self._kv(
            event,
            KVEventKind.CLEARED,
            num_tokens=event.num_blocks * self.block_size,
            num_blocks=event.num_blocks,
            reason=event.eviction_reason.value,
        )

    def _settled(self, event: ev.IdleLossesSettled) -> None:
        """Hindsight on a session's idle losses, and a snapshot that shows it."""
        if event.session_id is None or self._stats is None:  # (a settlement names its session; stats come first)
            return
        tally = self._tally(event.session_id)
        tally.pending_idle -= event.num_blocks
        tally.evicted_idle += event.num_blocks if event.in_pause else 0
        self._session_snapshot(event.session_id, event.ts, self._stats, event.session_blocks)

    HANDLERS: Handlers = {
        ev.IdleLossesSettled: _settled,
        ev.BlocksStored: _stored,
        ev.PrefixLookup: _lookup,
        ev.BlocksAllocated: _allocated,
        ev.BlockEvicted: _evicted,
        ev.Preempted: _preempted,
        ev.CacheCleared: _cleared,
        ev.TierStored: _tier_stored,
        ev.TierRemoved: _tier_removed,
        ev.TierLoaded: _tier_loaded,
    }

    def _kv(self, event: ev.KVEvent, kind: KVEventKind, **fields) -> None:
        if self.hash_key is not None:
            for name in ("block_hash", "parent_hash"):
                if fields.get(name) is not None:
                    fields[name] = self.hash_key.hash(fields[name])
        fields.setdefault("session_id", event.session_id)
        fields.setdefault("medium", self.medium)
        self.writer.add(
            KVEventRecord(ts=event.ts, instance=self.instance, kind=kind.value, request_id=event.request_id, **fields)
        )

    # ---- finished requests ---------------------------------------------------------------------------
    def _finished(self, out: RequestOutput, stats: SchedulerStats) -> None:
        trace_id, parent_span_id = parse_traceparent(out.trace_headers)
        self.writer.add(
            RequestRecord(
                request_id=out.request_id,
                instance=self.instance,
                session_id=out.session_id,
                trace_id=trace_id,
                parent_span_id=parent_span_id,
                arrival_ts=out.arrival_ts,
                first_token_ts=out.first_token_ts,
                finished_ts=out.finished_ts,
                queue_s=out.latencies().queue,
                prompt_tokens=out.num_prompt_tokens,
                cached_tokens=out.num_cached_tokens,
                completion_tokens=len(out.output_token_ids),
                num_preemptions=out.num_preemptions,
                finish_reason=out.finish_reason,
                cached_from=server_cached_from(out.num_cached_tokens),
            )
        )
        if out.session_id is None:
            return
        self.writer.insert_missing(
            SessionRecord(out.session_id, started_at=out.arrival_ts, source=SessionSource.ENGINE.value)
        )
        if out.parent_session_id is not None:  # (whoever made the session first: the request says who started it)
            self.writer.upsert(SessionRecord(out.session_id, parent_session_id=out.parent_session_id))
        self._session_snapshot(out.session_id, out.finished_ts or stats.ts, stats, out.session_blocks or 0)

    def _session_snapshot(self, session_id: str, ts: float, stats: SchedulerStats, blocks: int | None) -> None:
        tally = self._tally(session_id)
        self.writer.add(
            SnapshotRecord(
                **{**self._engine_state(stats), "ts": ts},
                session_id=session_id,
                session_blocks=blocks,
                session_evicted_blocks=tally.evicted,
                session_evicted_idle_blocks=tally.evicted_idle,
                session_pending_idle_blocks=tally.pending_idle,
                session_hit_tokens=tally.hit_tokens,
                hit_rate=tally.hit_tokens / tally.query_tokens if tally.query_tokens else None,
            )
        )

    def _engine_state(self, stats: SchedulerStats) -> dict:
        return {
            "ts": stats.ts,
            "instance": self.instance,
            "kv_usage": stats.kv_cache_usage,
            "blocks_total": stats.num_blocks_total,
            "blocks_free": stats.num_blocks_free,
            "blocks_resident": stats.num_blocks_resident,
            "num_running": stats.num_running,
            "num_waiting": stats.num_waiting,
        }

    def _tally(self, session_id: str) -> _SessionTally:
        tally = self._sessions.get(session_id)
        if tally is None:
            tally = self._sessions[session_id] = _SessionTally()
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        return tally


def parse_traceparent(headers: dict[str, str] | None) -> tuple[str | None, str | None]:
    """(trace id, parent span id) of a W3C `traceparent` (version-traceid-spanid-flags); Nones if absent/malformed."""
    parts = (headers or {}).get("traceparent", "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
        return parts[1].lower(), parts[2].lower()
    return None, None
