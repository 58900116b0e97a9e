"""The block pool: vLLM V1's `BlockPool` with owners: the blocks, the free queue, the cached-hash map, the events.

    pool = BlockPool(num_blocks, policy=LRUPolicy(), activity=SessionPauses(), clock=time.time)
    block = pool.take_free_block(seq, now)     # evicts it first if it held cached content
    pool.cache(block)                          # its hash is set: prefix lookups find it now
    pool.release(block, now)                   # ref_cnt 0: back to the free queue, cached at the tail
    pool.take_events()                         # BlockEvicted and the rest, in order

What vLLM's `BlockPool` does (free queue, `cached_block_hash_to_block`, eviction when a cached block is taken for
new content, an event queue drained by `take_events`), plus who owns each cached block (the sessions that stored
or hit it) and why each block was evicted. The block manager (`manager.py`), the session lifecycle (`sessions.py`)
and invalidation (`invalidation.py`) are built on it and change the cache only through it.

Invariants: block 0 is a null placeholder, never in the queue; every block with ref_cnt 0 is in the free queue,
cached or not; a cached block stays in the map until it is evicted (taken for new content, dropped on purpose) or
the pool is cleared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.block import KVBlock
from instrumented_engine.engine.kv_cache.eviction import EvictionPolicy
from instrumented_engine.engine.kv_cache.free_block_queue import FreeBlockQueue
from instrumented_engine.engine.kv_cache.hashing import BlockHash, external_hash
from instrumented_engine.engine.kv_cache.session_pauses import SessionPauses
from instrumented_engine.engine.sequence import Sequence
from kvobs.semconv.attributes import MEDIUM_GPU
from kvobs.semconv.reasons import PRESSURE_REASONS, EvictionReason, InvalidationReason


class BlockPool:
    """The blocks, their free queue and cached-hash map, their owners, and the events of what happened to them.

    `medium` is the tier the blocks live in, as vLLM's events name it: this pool is the primary cache the model
    attends from, `GPU` in vLLM's words on any device (vLLM's BlockPool publishes `GPU` on its CPU build too: the
    recorded 0.32 capture); an offload tier would publish its own (`CPU`, as vLLM's offloading connector does). It
    is set on every `BlocksStored` and `BlockEvicted`, and the publisher, spans and store rows read it from there.
    """

    def __init__(
        self,
        num_blocks: int,
        *,
        policy: EvictionPolicy,
        activity: SessionPauses,
        clock: Callable[[], float],
        medium: str = MEDIUM_GPU,
    ) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved); got {num_blocks}")
        self.num_blocks = num_blocks
        self.policy = policy
        self.activity = activity  # who is idle since when: an eviction names the paused owners
        self.clock = clock
        self.medium = medium
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[BlockHash, KVBlock] = {}
        self.session_blocks: Counter[str] = Counter()  # cached blocks each session stored or hit
        self.session_roots: dict[str, BlockHash] = {}  # each session's first block (its system prompt's chain)
        self._events: list[ev.KVEvent] = []

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0, cached or not (what allocation can take)."""
        return len(self.free_queue)

    @property
    def num_resident_blocks(self) -> int:
        """Cached blocks no request holds: prefix content kept for reuse."""
        return sum(1 for b in self.cached.values() if b.ref_cnt == 0)

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: the pinned fraction, 1 - free / usable."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    # ---- events -----------------------------------------------------------------------------
    def emit(self, event: ev.KVEvent) -> None:
        self._events.append(event)

    def take_events(self) -> list[ev.KVEvent]:
        events, self._events = self._events, []
        return events

    # ---- taking and giving back blocks ------------------------------------------------------
    def touch(self, block: KVBlock, session_id: str | None, now: float) -> None:
        """A prefix hit: `block` gains a holder (leaving the free queue if it had none) and `session_id` owns it."""
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        block.ref_cnt += 1
        block.last_used_ts = now
        if session_id is not None:
            self.own(block, session_id)

    def take_free_block(self, cause: Sequence, now: float) -> KVBlock:
        """The block the policy picks from the free queue, for `cause`'s new content (evicted first if cached)."""
        block, reason = self.policy.choose(self.free_queue, self.activity, now)
        self.free_queue.remove(block)
        if block.is_cached:
            self.evict(block, reason, now, cause=cause)
        block.ref_cnt = 1
        block.last_used_ts = now
        return block

    def release(self, block: KVBlock, now: float) -> bool:
        """One holder lets go of `block`; at none it joins the free queue: cached at the tail (LRU), else at the head
        (reused first). Whether it went back cached."""
        block.ref_cnt -= 1
        if block.ref_cnt:
            return False
        block.last_used_ts = now
        if block.is_cached:
            self.free_queue.append(block)
            return True
        self.free_queue.appendleft(block)
        return False

    # ---- the cache ----------------------------------------------------------------------------
    def cache(self, block: KVBlock, session_id: str | None) -> None:
        """`block` (its hash and chain set) enters the cache; `session_id` owns it."""
        if session_id is not None:
            self.own(block, session_id)
        self.cached[block.cached_hash] = block

    def own(self, block: KVBlock, session_id: str) -> None:
        if session_id not in block.sessions:
            block.sessions.add(session_id)
            self.session_blocks[session_id] += 1

    def evict(
        self,
        block: KVBlock,
        reason: EvictionReason,
        now: float,
        *,
        cause: Sequence | None = None,
        invalidation_reason: InvalidationReason | None = None,
    ) -> None:
        """`block` leaves the cache (`BlockEvicted`, with its owners and those of them paused); under pressure, its
        paused owners' loss is pending until hindsight settles it (`SessionPauses.lost`)."""
        del self.cached[block.cached_hash]
        paused = tuple(s for s in sorted(block.sessions) if self.activity.is_pending_owner(s, now))
        if reason in PRESSURE_REASONS:
            for session_id in paused:
                self.activity.lost(session_id, now)
        self.emit(
            ev.BlockEvicted(
                now,
                cause.request_id if cause else None,
                cause.session_id if cause else None,
                block_id=block.block_id,
                block_hash=external_hash(block.cached_hash),
                parent_block_hash=None if block.parent_hash is None else external_hash(block.parent_hash),
                reason=reason,
                owner_sessions=tuple(sorted(block.sessions)),
                lifetime_s=now - block.stored_ts,
                idle_s=now - block.last_used_ts,
                invalidation_reason=invalidation_reason,
                paused_sessions=paused,
                medium=self.medium,
            )
        )
        for session_id in block.sessions:
            self.session_blocks[session_id] -= 1
            if not self.session_blocks[session_id]:
                del self.session_blocks[session_id]
        block.clear_hash()

    def drop(
        self, block: KVBlock, reason: EvictionReason, now: float, invalidation_reason: InvalidationReason | None = None
    ) -> None:
        """Evict `block` on purpose; a free one moves to the queue head (its content is gone: reuse it first). A
        block in use stays with its request, hashless, so nothing new can hit it."""
        self.evict(block, reason, now, invalidation_reason=invalidation_reason)
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
            self.free_queue.appendleft(block)

    def clear(self) -> tuple[int, list[str]]:
        """Forget every hash (vLLM's reset_prefix_cache): (blocks cleared, their owners)."""
        sessions = sorted({s for b in self.cached.values() for s in b.sessions})
        for block in self.cached.values():
            block.clear_hash()
        num_blocks = len(self.cached)
        self.cached.clear()
        self.session_blocks.clear()
        self.session_roots.clear()
        return num_blocks, sessions
