"""The block manager: vLLM V1's prefix-caching KV cache manager over the block pool, with sessions and invalidation.

    manager = BlockManager(num_blocks=1024, block_size=16)
    hits = manager.lookup(seq)                      # the longest cached prefix
    manager.allocate(seq, num_new_tokens, hits)     # revive the hits, take free blocks for the rest
    manager.register_computed_blocks(seq)           # once their KV is written: hashed, cached, `BlocksStored`
    manager.free(seq)
    manager.take_events()

Composed of the pool (`pool.py`: blocks, free queue, cached map, owners, events), the session lifecycle
(`sessions.py`) and invalidation (`invalidation.py`), each changing the cache only through the pool.

Invariants:
- Prefix lookup walks a request's full-block hashes from the start and stops at the first miss;
  at most num_tokens - 1 tokens can hit (the last token is recomputed for its logits).
- Blocks are registered (hashed, `BlocksStored`) only after their KV has been written.
- Freeing walks a block table in reverse, so a chain's tail is evicted before its head; uncached
  blocks go to the queue head (reused first), cached ones to the tail (LRU).
The manager holds no tensors, so the same code runs the engine and the what-if simulator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.block import KVBlock
from instrumented_engine.engine.kv_cache.eviction import EvictionPolicy, LRUPolicy
from instrumented_engine.engine.kv_cache.hashing import external_hash, hash_chain
from instrumented_engine.engine.kv_cache.invalidation import Invalidation
from instrumented_engine.engine.kv_cache.offload import OffloadTier, TierBlock, TierCopy
from instrumented_engine.engine.kv_cache.pool import BlockPool
from instrumented_engine.engine.kv_cache.session_pauses import SessionPauses
from instrumented_engine.engine.kv_cache.sessions import SessionLifecycle
from instrumented_engine.engine.sequence import Sequence
from kvobs.semconv.reasons import InvalidationReason
from kvobs.semconv.sessions import SESSION_END_AFTER_S

log = logging.getLogger(__name__)


class BlockManager:
    """Allocates KV blocks to sequences and keeps the prefix cache.

    Args:
        num_blocks: blocks in the pool, including the null block 0.
        block_size: tokens per block.
        enable_caching: prefix lookup and keeping freed blocks cached.
        policy: which free block to take next (default LRU, vLLM's order).
        clock: time source (epoch seconds) for events; tests inject a fake one.
        session_end_after_s: an idle session has ended after this long without a request (see `SessionPauses`).
        offload_blocks: blocks of an offload tier below the cache (vLLM's `--kv-offloading-size`); 0: none.
        describe_offloads: the tier's stores are published with their tokens and chain (vLLM's
            `self_describing_kv_events`), else as vLLM's placeholders.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        policy: EvictionPolicy | None = None,
        clock: Callable[[], float] = time.time,
        session_end_after_s: float | None = SESSION_END_AFTER_S,
        offload_blocks: int = 0,
        describe_offloads: bool = False,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.clock = clock
        self.pool = BlockPool(
            num_blocks, policy=policy or LRUPolicy(), activity=SessionPauses(session_end_after_s), clock=clock
        )
        self.sessions = SessionLifecycle(self.pool)
        self.invalidation = Invalidation(self.pool)
        # the pool's parts, read by the scheduler, the engine's observers and tests
        self.num_blocks, self.medium, self.activity = num_blocks, self.pool.medium, self.pool.activity
        self.blocks, self.free_queue, self.cached = self.pool.blocks, self.pool.free_queue, self.pool.cached
        self.session_blocks = self.pool.session_blocks
        # what the engine calls, answered by the part that keeps it
        self.take_events = self.pool.take_events
        self.begin_request, self.end_request = self.sessions.begin_request, self.sessions.end_request
        self.expire_idle_sessions = self.sessions.expire_idle_sessions
        self.end_session, self.release_session = self.sessions.end_session, self.sessions.release_session
        self.hash_key = self.invalidation.hash_key
        self.tier = OffloadTier(offload_blocks) if offload_blocks and enable_caching else None
        self.describe_offloads = describe_offloads
        self.tier_loads: list[TierCopy] = []  # to copy into the primary cache before the step's model run
        self.tier_stores: list[TierCopy] = []  # to copy into the tier after it

    def invalidate(
        self, reason: str | InvalidationReason, *, session_id: str | None = None, adapter: str | None = None
    ) -> ev.Invalidated | ev.CacheCleared | None:
        """`Invalidation.invalidate`, and the offload tier's copies with it: the blocks the cache dropped and, for a
        forgotten session, every copy it stored; a weights update or reset drops them all (stale or cleared)."""
        event = self.invalidation.invalidate(reason, session_id=session_id, adapter=adapter)
        if self.tier is None or event is None:
            return event
        reason = InvalidationReason(reason)
        if reason is InvalidationReason.MANUAL_RESET:  # (its `CacheCleared` says every tier was dropped)
            self.tier.clear()
            return event
        if reason is InvalidationReason.WEIGHTS_UPDATE:
            dropped = list(self.tier.entries.items())
            self.tier.clear()
        else:
            forgotten = (session_id,) if reason is InvalidationReason.SESSION_FORGET and session_id else ()
            dropped = self.tier.drop(set(getattr(event, "block_hashes", ())), forgotten)
        if dropped:
            self._tier_removed(dropped, event.ts, None, session_id, reason)
        return event

    def _tier_removed(
        self,
        dropped: list[tuple[int, TierBlock]],
        now: float,
        request_id: str | None,
        session_id: str | None,
        reason: InvalidationReason | None = None,
    ) -> None:
        assert self.tier is not None
        self.pool.emit(
            ev.TierRemoved(
                now,
                request_id,
                session_id,
                block_hashes=tuple(h for h, _ in dropped),
                medium=self.tier.medium,
                owner_sessions=tuple(sorted({s for _, copy in dropped for s in copy.sessions})),
                reason=reason,
            )
        )

    def reset(self) -> ev.CacheCleared | None:
        """vLLM's reset of the prefix cache (`Invalidation.reset`), its offload tier's with it (as vLLM resets its
        connector's): the one `CacheCleared` says every tier was dropped."""
        cleared = self.invalidation.reset()
        if cleared is not None and self.tier is not None:
            self.tier.clear()
        return cleared

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt 0, cached or not (what allocation can take)."""
        return self.pool.num_free_blocks

    @property
    def num_resident_blocks(self) -> int:
        return self.pool.num_resident_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    # ---- hashing ----------------------------------------------------------------------------
    def update_block_hashes(self, seq: Sequence) -> None:
        """Extend `seq.block_hashes` to every full block of its tokens (recomputed if the key changed)."""
        key = self.hash_key(seq.adapter)
        if key != seq.hash_key:
            seq.hash_key, seq.block_hashes = key, []
        start = len(seq.block_hashes)
        parent = seq.block_hashes[-1] if start else None
        seq.block_hashes.extend(hash_chain(seq.token_ids, self.block_size, key, start=start, parent=parent))

    # ---- lookup and allocation ----------------------------------------------------------------
    def lookup(self, seq: Sequence) -> list[KVBlock]:
        """Cached blocks matching the longest prefix of `seq`, capped at num_tokens - 1 tokens."""
        if not self.enable_caching:
            return []
        self.update_block_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block = self.cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def tier_lookup(self, seq: Sequence, num_hits: int) -> int:
        """Blocks after the cache's `num_hits` that the offload tier holds, consecutively (within the lookup's cap of
        num_tokens - 1 tokens); 0 without a tier."""
        if self.tier is None:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        return self.tier.lookup(external_hash(h) for h in seq.block_hashes[num_hits:max_blocks])  # (to a miss)

    def tier_held(self, seq: Sequence, num_hits: int) -> int:
        """`tier_lookup` without refreshing the tier's copies: what a router scoring this replica sees."""
        if self.tier is None:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        return self.tier.held(external_hash(h) for h in seq.block_hashes[num_hits:max_blocks])

    def load_from_tier(self, seq: Sequence, num_hits: int, num_blocks: int) -> None:
        """After `allocate`: blocks `num_hits` .. + `num_blocks` of `seq`'s table get their KV from the tier (copied
        by the model runner before the step runs: `tier_loads`); the engine reports it (`tier_loaded`)."""
        if not num_blocks or self.tier is None:
            return
        hashes = tuple(external_hash(h) for h in seq.block_hashes[num_hits : num_hits + num_blocks])
        self.tier_loads.append(
            TierCopy(
                seq.request_id,
                seq.session_id,
                seq.block_table[num_hits : num_hits + num_blocks],
                [self.tier.slot_of(h) for h in hashes],
                hashes,
            )
        )

    def tier_loaded(self, copy: TierCopy, num_bytes: int, seconds: float) -> None:
        assert self.tier is not None
        self.pool.emit(
            ev.TierLoaded(
                self.clock(),
                copy.request_id,
                copy.session_id,
                block_hashes=copy.block_hashes,
                num_tokens=len(copy.block_ids) * self.block_size,
                medium=self.tier.medium,
                num_bytes=num_bytes,
                seconds=seconds,
            )
        )

    def tier_stored(self, copy: TierCopy, num_bytes: int, seconds: float) -> None:
        assert self.tier is not None
        self.pool.emit(
            ev.TierStored(
                self.clock(),
                copy.request_id,
                copy.session_id,
                block_hashes=copy.block_hashes,
                parent_block_hash=copy.parent_block_hash,
                token_ids=copy.token_ids,
                block_size=self.block_size,
                medium=self.tier.medium,
                described=self.describe_offloads,
                num_bytes=num_bytes,
                seconds=seconds,
                adapter=copy.adapter,
            )
        )

    def can_allocate(self, seq: Sequence, num_new_tokens: int, hits: Collection[KVBlock] = ()) -> bool:
        return self._num_blocks_needed(seq, num_new_tokens, hits) <= self._num_available(hits)

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: Collection[KVBlock] = ()) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens, first reviving `hits`.

        Returns False, changing nothing, when the free queue cannot supply enough blocks.
        """
        num_needed = self._num_blocks_needed(seq, num_new_tokens, hits)
        if num_needed > self._num_available(hits):
            return False
        now = self.clock()
        for block in hits:
            self.pool.touch(block, seq.session_id, now)
            seq.block_table.append(block.block_id)
        seq.num_registered_blocks += len(hits)
        new_ids = tuple(self.pool.take_free_block(seq, now).block_id for _ in range(num_needed))
        seq.block_table.extend(new_ids)
        if new_ids:
            self._emit(ev.BlocksAllocated, seq, now, block_ids=new_ids, num_free_after=self.num_free_blocks)
        return True

    def _num_blocks_needed(self, seq: Sequence, num_new_tokens: int, hits: Iterable[KVBlock]) -> int:
        hits = list(hits)
        num_tokens = seq.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table) - len(hits))

    def _num_available(self, hits: Iterable[KVBlock]) -> int:
        # Hits that sit in the free queue are revived, not available for new content.
        return self.num_free_blocks - sum(1 for b in hits if b.ref_cnt == 0)

    # ---- registering written blocks -------------------------------------------------------------
    def register_computed_blocks(self, seq: Sequence) -> None:
        """Hash and cache the blocks of `seq` that became full once its computed KV was written."""
        if not self.enable_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
            self._offer_to_tier(seq, num_full)
            return
        self.update_block_hashes(seq)
        now = self.clock()
        first = seq.num_registered_blocks
        stored_ids: list[int] = []
        stored_hashes: list[int] = []
        for index in range(first, num_full):
            block = self.blocks[seq.block_table[index]]
            block_hash = seq.block_hashes[index]
            if block.is_cached or block_hash in self.cached:
                continue  # another sequence registered the same content first; keep the first copy
            block.block_hash = block_hash
            block.parent_hash = seq.block_hashes[index - 1] if index else None
            block.root_hash = seq.block_hashes[0]
            block.adapter = seq.adapter
            block.stored_ts = block.last_used_ts = now
            self.pool.cache(block, seq.session_id)
            stored_ids.append(block.block_id)
            stored_hashes.append(external_hash(block_hash))
        seq.num_registered_blocks = num_full
        if seq.session_id is not None and seq.block_hashes:
            self.pool.session_roots[seq.session_id] = seq.block_hashes[0]
        if stored_ids:
            parent = self.blocks[stored_ids[0]].parent_hash
            self._emit(
                ev.BlocksStored,
                seq,
                now,
                block_ids=tuple(stored_ids),
                block_hashes=tuple(stored_hashes),
                parent_block_hash=None if parent is None else external_hash(parent),
                token_ids=tuple(self._tokens_of(seq, stored_ids)),
                block_size=self.block_size,
                adapter=seq.adapter,
                medium=self.pool.medium,
            )
        self._offer_to_tier(seq, num_full)

    def _offer_to_tier(self, seq: Sequence, num_full: int) -> None:
        """Write-through, as vLLM's offloading connector: the full blocks of `seq` not offered yet go to the tier
        (those it holds are refreshed); the copies it evicts for room are published now, the stored ones once the
        model runner copied them (`tier_stores`, `tier_stored`)."""
        first = seq.num_offered_blocks
        if self.tier is None or num_full <= first:
            return
        seq.num_offered_blocks = num_full
        hashes = [external_hash(h) for h in seq.block_hashes[first:num_full]]
        done = self.tier.store(hashes, seq.session_id)
        if done is None:
            log.warning(
                "request %s: %d blocks could not be stored in the offload tier of %d blocks",
                seq.request_id,
                len(hashes),
                self.tier.num_blocks,
            )
            return
        stored, evicted = done
        if evicted:
            self._tier_removed(evicted, self.clock(), seq.request_id, seq.session_id)
        if not stored:
            return
        index = {h: first + i for i, h in enumerate(hashes)}
        for run in _runs([(index[h], slot) for h, slot in stored]):  # one copy (and event) a chain of blocks
            begin, end = run[0][0], run[-1][0] + 1
            parent = external_hash(seq.block_hashes[begin - 1]) if begin else None
            self.tier_stores.append(
                TierCopy(
                    seq.request_id,
                    seq.session_id,
                    seq.block_table[begin:end],
                    [slot for _, slot in run],
                    tuple(hashes[begin - first : end - first]),
                    parent,
                    tuple(seq.token_ids[begin * self.block_size : end * self.block_size]),
                    seq.adapter,
                )
            )

    def _tokens_of(self, seq: Sequence, block_ids: list[int]) -> list[int]:
        positions = {bid: i for i, bid in enumerate(seq.block_table)}
        tokens: list[int] = []
        for bid in block_ids:
            begin = positions[bid] * self.block_size
            tokens.extend(seq.token_ids[begin : begin + self.block_size])
        return tokens

    # ---- freeing ------------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Release `seq`'s blocks in reverse order (the chain's tail becomes evictable first)."""
        now = self.clock()
        num_cached = 0
        for block_id in reversed(seq.block_table):
            num_cached += self.pool.release(self.blocks[block_id], now)
        if seq.block_table:
            self._emit(ev.BlocksFreed, seq, now, block_ids=tuple(seq.block_table), num_cached=num_cached)
        seq.block_table = []
        seq.num_registered_blocks = 0

    # ---- internals ----------------------------------------------------------------------------
    def _emit(self, cls: type[ev.KVEvent], seq: Sequence, now: float, **fields) -> None:
        self.pool.emit(cls(now, seq.request_id, seq.session_id, **fields))


def _runs(items: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """(block index, slot) pairs in order, cut where the indices stop following one another."""
    runs: list[list[tuple[int, int]]] = []
    for item in items:
        if runs and runs[-1][-1][0] + 1 == item[0]:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs
