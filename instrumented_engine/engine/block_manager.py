"""The block manager: vLLM V1's prefix-caching block pool, with eviction reasons and owners.

Invariants:
- Block 0 is a null placeholder, never allocated (padding in block tables points at it).
- Every block with ref_cnt 0 is in the free queue, cached or not; a cached block stays in the hash map until it
  is taken for new content (eviction) or invalidated. Sessions and invalidation: `session_lifecycle`, `invalidation`.
- Prefix lookup walks a request's full-block hashes from the start and stops at the first miss;
  at most num_tokens - 1 tokens can hit (the last token is recomputed for its logits).
- Blocks are registered (hashed, `BlocksStored`) only after their KV has been written.
- Freeing walks a block table in reverse, so a chain's tail is evicted before its head; uncached
  blocks go to the queue head (reused first), cached ones to the tail (LRU).
The manager holds no tensors, so the same code runs the engine and the what-if simulator.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.block import KVBlock
from instrumented_engine.engine.eviction import EvictionPolicy, LRUPolicy
from instrumented_engine.engine.free_block_queue import FreeBlockQueue
from instrumented_engine.engine.hashing import BlockHash, external_hash, hash_chain
from instrumented_engine.engine.invalidation import Invalidation
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.engine.session_lifecycle import SessionLifecycle
from instrumented_engine.engine.session_pauses import SessionPauses
from kvobs.semconv.attributes import MEDIUM_GPU
from kvobs.semconv.reasons import PRESSURE_REASONS, EvictionReason, InvalidationReason
from kvobs.semconv.sessions import SESSION_END_AFTER_S


class BlockManager(SessionLifecycle, Invalidation):
    """Allocates KV blocks to sequences and keeps the prefix cache.

    Args:
        num_blocks: blocks in the pool, including the null block 0.
        block_size: tokens per block.
        enable_caching: prefix lookup and keeping freed blocks cached.
        policy: which free block to take next (default LRU, vLLM's order).
        clock: time source (epoch seconds) for events; tests inject a fake one.
        session_end_after_s: an idle session has ended after this long without a request (see `SessionPauses`).

    `medium` is the tier the blocks live in, as vLLM's events name it: this pool is the primary cache the model
    attends from, `GPU` in vLLM's words on any device (vLLM's BlockPool publishes `GPU` on its CPU build too: the
    recorded 0.32 capture); an offload tier would publish its own (`CPU`, as vLLM's offloading connector does). It
    is set on every `BlocksStored` and `BlockEvicted`, and the publisher, spans and store rows read it from here.
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
    ) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved); got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.policy = policy or LRUPolicy()
        self.clock = clock
        self.medium = MEDIUM_GPU  # on every BlocksStored / BlockEvicted; see the class docstring
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[BlockHash, KVBlock] = {}
        self.activity = SessionPauses(session_end_after_s)
        self.weights_version = 0
        self.adapter_versions: dict[str, int] = {}
        self.session_roots: dict[str, BlockHash] = {}
        self.session_blocks: Counter[str] = Counter()  # cached blocks each session stored or hit
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

    def take_events(self) -> list[ev.KVEvent]:
        events, self._events = self._events, []
        return events

    # ---- hashing ----------------------------------------------------------------------------
    def hash_key(self, adapter: str | None) -> tuple:
        """Extra keys every block hash carries: the weights version and the adapter's version."""
        if adapter is None:
            return (self.weights_version,)
        return (self.weights_version, adapter, self.adapter_versions.get(adapter, 0))

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

    def can_allocate(self, seq: Sequence, num_new_tokens: int, hits: list[KVBlock] = ()) -> bool:
        return self._num_blocks_needed(seq, num_new_tokens, hits) <= self._num_available(hits)

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: list[KVBlock] = ()) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens, first reviving `hits`.

        Returns False, changing nothing, when the free queue cannot supply enough blocks.
        """
        num_needed = self._num_blocks_needed(seq, num_new_tokens, hits)
        if num_needed > self._num_available(hits):
            return False
        now = self.clock()
        for block in hits:
            self._touch(block, seq.session_id, now)
            seq.block_table.append(block.block_id)
        seq.num_registered_blocks += len(hits)
        new_ids = tuple(self._take_free_block(seq, now).block_id for _ in range(num_needed))
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

    def _touch(self, block: KVBlock, session_id: str | None, now: float) -> None:
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        block.ref_cnt += 1
        block.last_used_ts = now
        if session_id is not None:
            self._own(block, session_id)

    def _own(self, block: KVBlock, session_id: str) -> None:
        if session_id not in block.sessions:
            block.sessions.add(session_id)
            self.session_blocks[session_id] += 1

    def _disown(self, block: KVBlock) -> None:
        for session_id in block.sessions:
            self.session_blocks[session_id] -= 1
            if not self.session_blocks[session_id]:
                del self.session_blocks[session_id]

    def _take_free_block(self, seq: Sequence, now: float) -> KVBlock:
        block, reason = self.policy.choose(self.free_queue, self.activity, now)
        self.free_queue.remove(block)
        if block.is_cached:
            self._evict(block, reason, now, cause=seq)
        block.ref_cnt = 1
        block.last_used_ts = now
        return block

    # ---- registering written blocks -------------------------------------------------------------
    def register_computed_blocks(self, seq: Sequence) -> None:
        """Hash and cache the blocks of `seq` that became full once its computed KV was written."""
        if not self.enable_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
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
            if seq.session_id is not None:
                self._own(block, seq.session_id)
            self.cached[block_hash] = block
            stored_ids.append(block.block_id)
            stored_hashes.append(external_hash(block_hash))
        seq.num_registered_blocks = num_full
        if seq.session_id is not None and seq.block_hashes:
            self.session_roots[seq.session_id] = seq.block_hashes[0]
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
                medium=self.medium,
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
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                block.last_used_ts = now
                if block.is_cached:
                    self.free_queue.append(block)
                    num_cached += 1
                else:
                    self.free_queue.appendleft(block)
        if seq.block_table:
            self._emit(ev.BlocksFreed, seq, now, block_ids=tuple(seq.block_table), num_cached=num_cached)
        seq.block_table = []
        seq.num_registered_blocks = 0

    # ---- internals ----------------------------------------------------------------------------
    def _evict(
        self,
        block: KVBlock,
        reason: EvictionReason,
        now: float,
        *,
        cause: Sequence | None = None,
        invalidation_reason: InvalidationReason | None = None,
    ) -> None:
        del self.cached[block.block_hash]
        paused = tuple(s for s in sorted(block.sessions) if self.activity.is_pending_owner(s, now))
        if reason in PRESSURE_REASONS:
            for session_id in paused:
                self.activity.lost(session_id)
        self._events.append(
            ev.BlockEvicted(
                now,
                cause.request_id if cause else None,
                cause.session_id if cause else None,
                block_id=block.block_id,
                block_hash=external_hash(block.block_hash),
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
        self._disown(block)
        block.clear_hash()

    def _to_head(self, block: KVBlock) -> None:
        """An uncached free block moves to the queue head: it is reused before any cached block."""
        self.free_queue.remove(block)
        self.free_queue.appendleft(block)

    def _emit(self, cls: type[ev.KVEvent], seq: Sequence, now: float, **fields) -> None:
        self._events.append(cls(now, seq.request_id, seq.session_id, **fields))
