"""KV-event batches (normalized at the door: `kvobs.block_events`) -> store rows, session attribution and footprints.

    ingest = KVIngest(writer, instance="vllm-a", activity=activity, bridge=bridge)
    subscriber = KVEventSubscriber(endpoint, ingest.on_batch, drops, on_restart=ingest.on_restart)
    ingest.snapshot()        # every interval: per-session footprint rows for sessions that changed

Rows (`kv_events`, times are vLLM's batch timestamps):
- `stored` per block, with its parent hash (the chain) and the session that stored it;
- `removed` per block and per owning session (the session(s) whose `BlockStored` introduced it; no session when it
  was stored before the collector subscribed); chains that begin alike for less than a block: `shared_starts`.
- `cleared` per `AllBlocksCleared` (`num_blocks`: the resident blocks it dropped, each once; `num_tokens` theirs,
  `reason` `reset`), and per publisher restart (`reason` `restart`): a new vLLM process starts with an empty cache.

Footprint snapshots (`snapshots` with `session_id`): blocks resident now, blocks lost so far (removed or
cleared), blocks removed while the session was in a tool pause (`session_evicted_idle_blocks`), and blocks
removed while it was idle whose verdict is still pending (`session_pending_idle_blocks`). Idleness needs the
session's request spans, which arrive after the request ends, so a removal is looked at `settle_s` after it
arrived; an idle one is then pending until hindsight decides (`SessionActivity.idle_verdict`): a tool pause
once the session's next request is known, after its end once the session ended (`session_ends`, the SDK's
`sessions.ended_at`) or stayed away `end_after_s` of stream time. Removals during a request, before a session's
first request, of sessions with no known request, or after a session's end are never counted as pause losses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from typing import Protocol

from collectors.kv.adoption import Adoption, LossSpans
from collectors.kv.batch_rows import CLEARED, REMOVED, STORED, TIER_REMOVED, TIER_STORED, BatchRows
from collectors.kv.chains import ChainTracker, removal_rows
from collectors.kv.core import Core, load
from collectors.kv.recent_stores import RecentStores
from collectors.kv.sequence_aliases import SequenceAliases
from collectors.kv.shared_starts import SharedStarts
from collectors.session_activity import BEFORE, PAUSE, PENDING, UNKNOWN, SessionActivity
from kvobs.block_clock import BlockClock
from kvobs.block_events import Batch, Cleared, Placeholder, Removed, Stored, UnknownTier
from kvobs.semconv.attributes import is_lower_tier
from kvobs.semconv.reasons import RELEASE_REASONS, EvictionReason
from kvobs.semconv.sessions import SESSION_IDLE_S
from kvobs.semconv.spans import SessionSource
from kvobs.store.rows import KVEventColumns, SessionRecord, SnapshotRecord
from kvobs.store.runs import Runs

log = logging.getLogger(__name__)

RESTART = "restart"
# How long a batch's rows wait for room in a full store queue before they are dropped (and counted). Meanwhile the
# ZMQ socket buffers what vLLM publishes (its high-water mark is vLLM's: 100,000 batches), so a burst is stored,
# not lost; a store that stays down drops rows one wait at a time, never stopping the subscriber for long.
STORE_WAIT_S = 10.0
OPEN = (UNKNOWN, BEFORE)  # verdicts a request joined later can still change


class RowWriter(Protocol):
    """What the ingest uses of a store writer (`StoreWriter`; in a stream worker, `collectors.kv.worker`'s)."""

    def add_many(self, records: KVEventColumns, *, wait_s: float = ...) -> object: ...

    def add(self, record: SnapshotRecord) -> object: ...

    def insert_missing(self, record: SessionRecord) -> object: ...


class KVIngest(Adoption):
    """Args:
    writer: the store writer.
    instance: the vLLM's name in every row.
    activity: session request intervals (idle classification); None: nothing is classified idle.
    bridge: gets each batch's removals and clears as spans (see `collectors.kv.bridge`); None: no spans.
    settle_s: how long a removal waits for its session's request spans before it is classified.
    verdict_wait_s: how long (stream time) a removal outside every request its session is known to have made yet
        stays open (`settle_s` by default): an agent's step, which ties a request to its session, comes after the
        request's span and the collector's join wait, so the collector gives `settle_s` + its join wait.
    session_ends: session ids -> when they ended (the store's `sessions.ended_at`), for sessions with pending
        losses; None: only the stream-time horizon ends a session.
    session_idle_s: a session with nothing resident, nothing pending and no event for this long (stream time) is
        forgotten (`num_sessions_forgotten`), so memory does not grow with every session ever seen. If it comes
        back, its footprint counts start again.
    core: what keeps each tier's chains and clock (`collectors.kv.core`): the compiled one where it is built, by
        default.
    """

    def __init__(
        self,
        writer: RowWriter,
        *,
        instance: str,
        activity: SessionActivity | None = None,
        bridge: LossSpans | None = None,
        settle_s: float = 10.0,
        session_ends: Callable[[list[str]], dict[str, float]] | None = None,
        session_idle_s: float = SESSION_IDLE_S,
        verdict_wait_s: float | None = None,
        clock: Callable[[], float] = time.time,
        core: Core | None = None,
    ) -> None:
        self.writer = writer
        self.instance = instance
        self.activity = activity
        self.bridge = bridge
        self.settle_s = settle_s
        self.session_ends = session_ends
        self.session_idle_s = session_idle_s
        self.verdict_wait_s = settle_s if verdict_wait_s is None else verdict_wait_s
        self.clock = clock
        self.num_lost_in_pause = 0  # (session, block) removals settled as in a tool pause, ever (a counter)
        self.num_sessions_forgotten = 0
        self.num_ids_cut = 0  # session ids over MAX_ID_BYTES, cut (kvobs.identifiers.clip_id)
        self.num_placeholders = 0  # offload placeholders' hashes seen (`Placeholder`): not stored as blocks
        self.unknown_tiers: Counter[str] = Counter()  # tier kvobs does not know -> its blocks seen (not read)
        self.starts = SharedStarts()  # the device tier's chains' first blocks, by their tokens
        self._dropped_repeated = self._dropped_unknown = 0  # those counts of tiers a clear dropped
        self._last_seen: OrderedDict[str, float] = OrderedDict()  # session -> latest event (stream time), oldest 1st
        self.core = core or load()
        self.chains: ChainTracker = self.core.new_chains()  # the device tier's chains: footprints, losses, pauses
        # other (tier, group)s' chains: an offload tier's own stores and removals, a hybrid model's other groups'
        self.tiers: dict[tuple[str | None, int], ChainTracker] = {}
        self.primary: tuple[str | None, int] | None = None  # the device tier and group: the first block stored's
        self._routes: dict[tuple, ChainTracker] = {}  # (medium, group) as events name them -> `_tier`'s answer
        self._clocks: dict[tuple, BlockClock] = {}  # the clocks of tiers a clear ended, until they come back
        self.block_size: int | None = None
        self._sessions_seen: set[str] = set()
        # removals to classify, a batch at a time: (arrived, event ts, sessions that lost blocks, blocks per session)
        self._pending: deque[tuple[float, float, list[str], Counter]] = deque()
        self._changed: set[str] = set()
        self._idle: dict[str, list[float]] = {}  # session -> event times of its removals with a pending verdict
        self.latest_ts = float("-inf")  # stream time: the newest batch's timestamp (-inf before the first)
        # ownership by inference (`collectors.block_owners`, off until `infer_owners`): the stores of blocks that
        # named no session, and the removals of such blocks, held until their session may be known
        self.recent: RecentStores | None = None
        self.hold_s = 0.0
        self._held: deque[list] = deque()  # [arrived, ts, block (store's key), row fields, session, lost]
        self.aliases: SequenceAliases | None = None  # its blocks by Dynamo's names (`name_sequences`), or not kept
        self.lock = threading.Lock()

    # ---- batches --------------------------------------------------------------------------------------
    def on_batch(self, seq: int, batch: Batch) -> None:
        """The batch's rows go to the writer as one `KVEventColumns` (no object per row: thousands a second)."""
        with self.lock:  # (ownership by inference adopts blocks from the collector's tick)
            self._on_batch(batch)

    def _on_batch(self, batch: Batch) -> None:
        ts = batch.ts
        rows = self.core.new_rows()
        cleared: dict[str | None, int] = {}
        touched: set[str] = set()  # sessions with an event in this batch
        self.latest_ts = max(self.latest_ts, ts)
        # the common events inline, as `_removed` and `_stored` write them (a method call an event was a tenth of
        # attribution): the device tier's removals with nothing held, its stores of known sessions within a chain
        routes, device, seen, holding = self._routes, self.chains, self._sessions_seen, self.hold_s or self.recent
        aliases = self.aliases
        for event in batch.events:
            if type(event) is Removed:
                if not holding and routes.get((event.medium, event.group_idx)) is device:
                    reason, tokens = event.reason, self.block_size
                    lost = reason not in RELEASE_REASONS
                    device.remove_rows(
                        rows, event.hashes, lost, ts, event.medium, tokens, event.group_idx, reason, REMOVED, True
                    )
                else:
                    self._removed(ts, event, rows)
            elif type(event) is Stored:
                if aliases is not None:
                    aliases.stored(event)
                session = event.session_id
                if (
                    session in seen  # (None never is)
                    and event.first_tokens is None
                    and event.hashes
                    and routes.get((event.medium, event.group_idx)) is device
                ):
                    touched.add(session)
                    self.block_size = event.block_size
                    device.store_rows(rows, event, ts, STORED, 0)
                else:
                    self._stored(ts, event, rows, touched)
            elif type(event) is Cleared:
                cleared = self._cleared(rows, EvictionReason.RESET.value, ts)
            elif type(event) is Placeholder:
                self._placeholder(ts, event, rows)
            elif type(event) is UnknownTier:
                self._unknown_tier(event)
        self.num_ids_cut += batch.ids_cut
        removed = Counter(rows.losers)  # owner -> blocks it lost in this batch (None: owner unknown)
        losers = [owner for owner in removed if owner is not None]
        if losers:
            self._pending.append((self.clock(), ts, losers, removed))
        touched.update(losers)
        last_seen = self._last_seen
        for session in touched:  # (`_seen`, inline)
            before = last_seen.get(session)
            last_seen[session] = ts if before is None or ts > before else before
            last_seen.move_to_end(session)
        self._changed |= touched
        self._flush(ts, rows)
        if self.bridge is not None and (removed or cleared):
            self.bridge.on_batch(self.instance, ts, removed, cleared)

    def on_restart(self) -> None:
        """The publisher restarted: its cache is empty, every chain we track has ended."""
        rows, now = self.core.new_rows(), self.clock()
        self._cleared(rows, RESTART, self.latest_ts if self.latest_ts > float("-inf") else now)  # (stream time)
        self._flush(now, rows)

    def clock_of(self, medium: str | None, group: int | None, kind: str) -> BlockClock:
        """The block clock of a stored row's tier, as the stream routed its event (the first store names the
        primary): a restart's rebuild feeds it (`collectors.kv.rebuild`), holding `lock`."""
        if self.primary is None and kind == STORED:
            self.primary = (medium, group or 0)
        return (self._routes.get((medium, group)) or self._tier(medium, group)).clock

    def clocks(self) -> list[BlockClock]:
        """Every tier's block clock."""
        return [chains.clock for chains in (self.chains, *self.tiers.values())]

    @property
    def num_repeated_stores(self) -> int:
        """Stores of blocks already resident in their tier (an announcement again: their rows count no block)."""
        return self._dropped_repeated + sum(t.num_repeated for t in (self.chains, *self.tiers.values()))

    @property
    def num_unknown_removals(self) -> int:
        """Removals of blocks not resident in their tier (stored before the collector subscribed, or removed twice):
        stored as they came, with no session."""
        return self._dropped_unknown + sum(t.num_unknown_removed for t in (self.chains, *self.tiers.values()))

    def _stored(self, ts: float, event: Stored, rows: BatchRows, touched: set[str]) -> None:
        session = event.session_id  # every row of the event carries it
        self.block_size = event.block_size
        if session is not None:
            touched.add(session)
            if session not in self._sessions_seen:
                self._sessions_seen.add(session)
                self.writer.insert_missing(SessionRecord(session, started_at=ts, source=SessionSource.VLLM.value))
        hashes = event.hashes
        if not hashes:
            return
        medium, group, parent = event.medium, event.group_idx, event.parent
        lower = is_lower_tier(medium)
        if self.primary is None and not lower:
            self.primary = (medium, group or 0)
        chains = self._routes.get((medium, group)) or self._tier(medium, group)
        shared = 0  # (a chain begun as another did, for less than a block: its first row says how many tokens)
        if event.first_tokens and chains is self.chains:
            shared = self.starts.see(hashes[0], event.first_tokens, event.block_size, len(hashes) * event.block_size)
        if self.recent is not None and session is None and chains is self.chains:
            self.recent.add(ts, hashes, parent)
        # (a block announced again: its row counts none)
        chains.store_rows(rows, event, ts, TIER_STORED if lower else STORED, shared)

    def _placeholder(self, ts: float, event: Placeholder, rows: BatchRows) -> None:
        """Hashes that reached an offload tier, no content: no block of this cache; counted, and stored as the tier's
        copies of the hash alone (`tier_stored`: no parent, no tokens; one announced again counts once)."""
        if not self.num_placeholders:
            log.info(
                "KV events of %s: offload placeholders (BlockStored without tokens or block size, medium %s) are "
                "counted (kvobs_collector_kv_offload_placeholders_total) and stored as the tier's copies of the hash "
                "alone (tier_stored rows without parent or tokens)",
                self.instance,
                event.medium,
            )
        self.num_placeholders += len(event.hashes)
        chains = self._routes.get((event.medium, None)) or self._tier(event.medium, None)
        stored = chains.stored
        firsts = [flag for block_hash in event.hashes for flag in (stored([block_hash], None, None, ts) or [1])]
        rows.placeholders(event.hashes, event.medium, firsts, chains.clock.came_back(event.hashes, ts))

    def _unknown_tier(self, event: UnknownTier) -> None:
        """Blocks of a tier kvobs does not know: not read as any tier's (fail closed); counted, said once a tier."""
        if event.medium not in self.unknown_tiers:
            log.warning(
                "KV events of %s name a tier kvobs does not know, %r: its blocks are counted "
                "(kvobs_collector_kv_unknown_tier_blocks_total), not read as any tier's",
                self.instance,
                event.medium,
            )
        self.unknown_tiers[event.medium] += len(event.hashes)

    def _removed(self, ts: float, event: Removed, rows: BatchRows) -> None:
        medium, tokens, group, reason = event.medium, self.block_size, event.group_idx, event.reason
        chains = self._routes.get((medium, group)) or self._tier(medium, group)
        device = chains is self.chains  # another tier's or group's removal is not the session losing its prefix
        lost = reason not in RELEASE_REASONS
        row_kind = TIER_REMOVED if is_lower_tier(medium) else REMOVED
        if device and self.hold_s:
            self._removed_holding(ts, event, rows, chains, lost, row_kind, tokens)
        else:  # (a row each block and owner)
            chains.remove_rows(rows, event.hashes, lost, ts, medium, tokens, group, reason, row_kind, device)

    def _removed_holding(
        self, ts: float, event: Removed, rows: BatchRows, chains, lost: bool, row_kind: str, tokens: int | None
    ) -> None:
        """A device removal while ownership by inference runs: a block that named no session is held until its
        session may be known (`_release`); the others' rows as `remove_rows` writes them."""
        medium, group, reason = event.medium, event.group_idx, event.reason

        def held(block_hash, block, lifetime) -> bool:
            if block[1] != (None,):
                return False
            shared = dict(medium=medium, num_tokens=tokens, group_idx=group, reason=reason)
            fields = dict(parent_hash=block[0], **shared, lifetime_s=lifetime)
            self._held.append([self.clock(), ts, block_hash, fields, None, lost])
            return True  # (its loss span too waits for its session: `_release`)

        blocks, lifetimes = chains.remove(event.hashes, lost, ts)
        columns = removal_rows(event.hashes, blocks, lifetimes, held)
        if not columns[0]:
            return
        rows.removed(*columns, medium=medium, num_tokens=tokens, group_idx=group, reason=reason, row_kind=row_kind)
        rows.losers += columns[2]

    def _tier(self, medium: str | None, group: int | None) -> ChainTracker:
        """The chains of a (tier, KV-cache group): the device tier's first group (`primary`) are `self.chains`;
        any other has its own, so an offload tier's stores and removals, or a hybrid model's sliding-window group
        dropping its copy of a block the full-attention group still holds, never touch the device chains. An event
        naming no medium or no group, or one before any block was stored, goes to the primary's."""
        if self.primary is None:
            return self.chains
        key = (self.primary[0] if medium is None else medium, self.primary[1] if group is None else group)
        tier = self.chains if key == self.primary else self.tiers.get(key)
        if tier is None:  # (on a new route; a tier a clear ended keeps its clock: its blocks were lost, not unknown)
            tier = self.tiers[key] = self.core.new_chains(clock=self._clocks.pop(key, None))
        self._routes[(medium, group)] = tier
        return tier

    def _cleared(self, rows: BatchRows, reason: str, ts: float) -> dict[str | None, int]:
        num_blocks = self.chains.resident()  # each resident block once, however many sessions owned it
        lost = self.chains.cleared(ts)
        for key, tier in self.tiers.items():  # (their counters and clocks outlive them)
            self._dropped_repeated += tier.num_repeated
            self._dropped_unknown += tier.num_unknown_removed
            tier.cleared(ts)
            self._clocks[key] = tier.clock
        self.tiers, self._routes = {}, {}  # every tier's blocks went with it
        self._changed.update(s for s in lost if s is not None)
        rows.add(CLEARED, num_tokens=num_blocks * (self.block_size or 0), reason=reason, num_blocks=num_blocks)
        return lost

    def _flush(self, ts: float, rows: BatchRows) -> None:
        n = len(rows)
        if n:
            columns = KVEventColumns(ts=Runs.of(ts, n), instance=Runs.of(self.instance, n), **rows.columns())
            self.writer.add_many(columns, wait_s=STORE_WAIT_S)

    # ---- footprints -----------------------------------------------------------------------------------
    @property
    def num_pending_idle(self) -> int:
        """(session, block) removals while idle whose verdict (tool pause or after the end) is not known yet."""
        return sum(len(times) for times in list(self._idle.values()))

    def snapshot(self, *, final: bool = False) -> int:
        """Classify settled removals and write a footprint row per changed session, stamped with the stream's own
        time (the latest batch's timestamp, as its events are); returns rows written."""
        now = self.clock()
        if self._held:
            with self.lock:
                self._release(now if final else now - self.hold_s)
        self._classify(now if final else now - self.settle_s, final=final)
        stamp = self.latest_ts if self.latest_ts > float("-inf") else now
        changed, self._changed = self._changed, set()
        for session in sorted(changed):
            fp = self.chains.footprints.get(session)
            if fp is None:
                continue
            self.writer.add(
                SnapshotRecord(
                    ts=stamp,
                    instance=self.instance,
                    session_id=session,
                    session_blocks=fp.resident,
                    session_evicted_blocks=fp.removed + fp.cleared,
                    session_evicted_idle_blocks=fp.removed_idle,
                    session_pending_idle_blocks=len(self._idle.get(session, ())),
                )
            )
        self.forget_idle_sessions()
        return len(changed)

    def _seen(self, session: str, ts: float) -> None:
        self._last_seen[session] = max(ts, self._last_seen.get(session, ts))
        self._last_seen.move_to_end(session)

    def forget_idle_sessions(self) -> int:
        """Forget sessions idle past `session_idle_s` with nothing resident or pending; returns how many."""
        horizon, forgotten, busy = self.latest_ts - self.session_idle_s, 0, []
        while self._last_seen:
            session, last = next(iter(self._last_seen.items()))
            if last > horizon:
                break
            self._last_seen.popitem(last=False)
            footprint = self.chains.footprints.get(session)
            if (footprint is not None and footprint.resident > 0) or session in self._idle or session in self._changed:
                busy.append((session, last))  # still holds blocks or awaits a verdict: looked at again later
                continue
            self.chains.footprints.pop(session, None)
            self._sessions_seen.discard(session)
            forgotten += 1
        for session, last in busy:
            self._last_seen[session] = last
        self.num_sessions_forgotten += forgotten
        return forgotten

    def _classify(self, arrived_before: float, *, final: bool = False) -> None:
        if self.activity is not None and self._pending:
            self.activity.resolve_pending()
        while self._pending and self._pending[0][0] <= arrived_before:
            _, ts, sessions, blocks = self._pending.popleft()
            if self.activity is not None:
                for session in sessions:
                    self._idle.setdefault(session, []).extend([ts] * blocks[session])
        if self._idle:
            self._settle(final=final)

    def _settle(self, *, final: bool = False) -> None:
        """Give each pending idle removal its verdict where one is known: a tool pause, or after the end."""
        if self.activity is None:  # (nothing is pending without it: `_classify`)
            return
        ended = self.session_ends(list(self._idle)) if self.session_ends is not None else {}
        all_verdicts = self.activity.idle_verdicts(self._idle, now=self.latest_ts, ended=set(ended))
        for session, times in list(self._idle.items()):
            verdicts = all_verdicts[session]
            self.chains.footprint(session).removed_idle += verdicts.count(PAUSE)
            self.num_lost_in_pause += verdicts.count(PAUSE)
            # a loss outside every request known so far may yet fall in a pause: the requests around it can still
            # be joined to the session (their spans come after they end, their steps after the join wait)
            still = [
                ts
                for ts, verdict in zip(times, verdicts)
                if verdict == PENDING or (verdict in OPEN and not final and self.latest_ts - ts < self.verdict_wait_s)
            ]
            if len(still) != len(times):
                self._changed.add(session)
            if still:
                self._idle[session] = still
            else:
                del self._idle[session]
