"""Invalidation: the part of the block manager that drops cached blocks on purpose (an invalidation, a reset).

`BlockManager` inherits it; it works on the manager's cache (`cached`, `session_roots`, versions) and records
what it dropped as events, exactly like capacity evictions: one `BlockEvicted` per block (eviction reason
`invalidation`, with the invalidation's reason) and one summary `Invalidated`, or one `CacheCleared` for a reset.
"""

from __future__ import annotations

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.hashing import external_hash
from kvobs.semconv.reasons import EvictionReason, InvalidationReason, names

NEEDS_SESSION = (InvalidationReason.SYSTEM_PROMPT_CHANGE, InvalidationReason.SESSION_FORGET)


class Invalidation:
    """Mixed into `BlockManager` (which provides the attributes and `_evict`, `_to_head`, `clock`)."""

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
        if reason is InvalidationReason.ADAPTER_SWAP and adapter is None:
            raise ValueError(f"invalidation reason {reason.value!r} needs an adapter name")
        if reason is InvalidationReason.WEIGHTS_UPDATE:
            self.weights_version += 1
            victims = list(self.cached.values())
        elif reason is InvalidationReason.ADAPTER_SWAP:
            self.adapter_versions[adapter] = self.adapter_versions.get(adapter, 0) + 1
            victims = [b for b in self.cached.values() if b.adapter == adapter]
        elif reason is InvalidationReason.SYSTEM_PROMPT_CHANGE:
            root = self.session_roots.get(session_id)
            victims = [b for b in self.cached.values() if root is not None and b.root_hash == root]
        else:
            victims = [b for b in self.cached.values() if session_id in b.sessions]
        now = self.clock()
        hashes = tuple(external_hash(b.block_hash) for b in victims)
        sessions = sorted({s for b in victims for s in b.sessions})
        for block in victims:
            self._evict(block, EvictionReason.INVALIDATION, now, invalidation_reason=reason)
            if block.ref_cnt == 0:
                self._to_head(block)
        event = ev.Invalidated(now, None, session_id, reason, len(victims), hashes, tuple(sessions))
        self._events.append(event)
        return event

    def reset(self) -> ev.CacheCleared | None:
        """Clear every hash, as vLLM's reset_prefix_cache; None (refused) while blocks are in use."""
        if self.num_free_blocks != self.num_usable_blocks:
            return None
        now = self.clock()
        sessions = sorted({s for b in self.cached.values() for s in b.sessions})
        for block in self.cached.values():
            block.clear_hash()
        num_blocks = len(self.cached)
        self.cached.clear()
        self.session_blocks.clear()
        self.session_roots.clear()
        event = ev.CacheCleared(now, None, None, num_blocks, tuple(sessions))
        self._events.append(event)
        return event
