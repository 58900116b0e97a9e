"""Invalidation: dropping cached blocks on purpose (an invalidation, a reset), and the versions block hashes carry.

It works on the block pool's cache and records what it dropped as events, exactly like capacity evictions: one
`BlockEvicted` per block (eviction reason `invalidation`, with the invalidation's reason) and one summary
`Invalidated`, or one `CacheCleared` for a reset. A weights update or an adapter swap also bumps a version every
later block hash includes (`hash_key`), so nothing computed before can be hit after.
"""

from __future__ import annotations

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.hashing import external_hash
from instrumented_engine.engine.kv_cache.pool import BlockPool
from kvobs.semconv.reasons import EvictionReason, InvalidationReason, names

NEEDS_SESSION = (InvalidationReason.SYSTEM_PROMPT_CHANGE, InvalidationReason.SESSION_FORGET)


class Invalidation:
    """Invalidations and resets of `pool`'s cache, and the weights and adapter versions hashes are keyed by."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.weights_version = 0
        self.adapter_versions: dict[str, int] = {}

    def hash_key(self, adapter: str | None) -> tuple:
        """Extra keys every block hash carries: the weights version and the adapter's version."""
        if adapter is None:
            return (self.weights_version,)
        return (self.weights_version, adapter, self.adapter_versions.get(adapter, 0))

    def invalidate(
        self, reason: str | InvalidationReason, *, session_id: str | None = None, adapter: str | None = None
    ) -> ev.Invalidated | ev.CacheCleared | None:
        """Drop cached blocks for `reason`; returns the summary event, or None when refused.

        - weights_update: bump the weights version (every future hash changes); drop every cached block.
        - adapter_swap: bump `adapter`'s version; drop the blocks computed under it.
        - system_prompt_change: drop every block chained from `session_id`'s first block (its system prompt).
        - session_forget: drop every cached block `session_id` stored or hit.
        - manual_reset: vLLM's reset_prefix_cache; refused (None) while any block is in use.
        Blocks in use stay with their requests but lose their hash, so nothing new can hit them.
        """
        try:
            reason = InvalidationReason(reason)
        except ValueError:
            choices = ", ".join(names(InvalidationReason))
            raise ValueError(f"unknown invalidation reason {reason!r}; choose one of {choices}") from None
        if reason is InvalidationReason.MANUAL_RESET:
            return self.reset()
        if reason in NEEDS_SESSION and session_id is None:
            raise ValueError(f"invalidation reason {reason.value!r} needs a session_id")
        cached = self.pool.cached.values()
        if reason is InvalidationReason.WEIGHTS_UPDATE:
            self.weights_version += 1
            victims = list(cached)
        elif reason is InvalidationReason.ADAPTER_SWAP:
            if adapter is None:
                raise ValueError(f"invalidation reason {reason.value!r} needs an adapter name")
            self.adapter_versions[adapter] = self.adapter_versions.get(adapter, 0) + 1
            victims = [b for b in cached if b.adapter == adapter]
        elif reason is InvalidationReason.SYSTEM_PROMPT_CHANGE:
            root = self.pool.session_roots.get(session_id) if session_id is not None else None
            victims = [b for b in cached if root is not None and b.root_hash == root]
        else:
            victims = [b for b in cached if session_id in b.sessions]
        now = self.pool.clock()
        hashes = tuple(external_hash(b.cached_hash) for b in victims)
        sessions = sorted({s for b in victims for s in b.sessions})
        for block in victims:
            self.pool.drop(block, EvictionReason.INVALIDATION, now, invalidation_reason=reason)
        event = ev.Invalidated(now, None, session_id, reason, len(victims), hashes, tuple(sessions))
        self.pool.emit(event)
        return event

    def reset(self) -> ev.CacheCleared | None:
        """Clear every hash, as vLLM's reset_prefix_cache; None (refused) while blocks are in use."""
        if self.pool.num_free_blocks != self.pool.num_usable_blocks:
            return None
        now = self.pool.clock()
        num_blocks, sessions = self.pool.clear()
        event = ev.CacheCleared(now, None, None, num_blocks, tuple(sessions))
        self.pool.emit(event)
        return event
