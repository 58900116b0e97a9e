"""Eviction policies: which free block the allocator takes next, and why.

A policy is a small strategy chosen by name (`make_eviction_policy(EvictionPolicyName.LRU)`). It picks a victim from
the free queue; the block manager does the bookkeeping. `lru` is vLLM's order (the queue head).
`session_ttl` protects the cached blocks of sessions in a tool pause (no request in flight, not
released) for `ttl_s` seconds after their last request ended; once no unprotected block remains,
plain LRU applies again.
"""

from __future__ import annotations

from typing import Protocol

from instrumented_engine.engine.kv_cache.block import KVBlock
from instrumented_engine.engine.kv_cache.free_block_queue import FreeBlockQueue
from instrumented_engine.engine.kv_cache.session_pauses import SessionPauses
from kvobs.semconv.reasons import EvictionPolicyName, EvictionReason, names


class EvictionPolicy(Protocol):
    name: EvictionPolicyName

    def choose(self, queue: FreeBlockQueue, activity: SessionPauses, now: float) -> tuple[KVBlock, EvictionReason]:
        """Return the block to take and, if it is cached, the eviction reason."""
        ...


class LRUPolicy:
    name = EvictionPolicyName.LRU

    def choose(self, queue: FreeBlockQueue, activity: SessionPauses, now: float) -> tuple[KVBlock, EvictionReason]:
        return queue.peek(), EvictionReason.CAPACITY


class SessionTTLPolicy:
    """Skip blocks owned by a session paused less than `ttl_s` ago; fall back to the head.

    Only a session in a pause protects its blocks: an owner that has ended (released, or idle past the
    session-end horizon, see `SessionPauses`) protects nothing, so its blocks go before any pausing session's.
    """

    name = EvictionPolicyName.SESSION_TTL

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s

    def choose(self, queue: FreeBlockQueue, activity: SessionPauses, now: float) -> tuple[KVBlock, EvictionReason]:
        for block in queue:
            if not block.is_cached:
                return block, EvictionReason.CAPACITY
            paused = [activity.idle_since[s] for s in block.sessions if activity.is_pending_owner(s, now)]
            if not paused:
                return block, EvictionReason.CAPACITY
            if all(now - since >= self.ttl_s for since in paused):
                return block, EvictionReason.TTL  # protection lapsed: the session's pause outlived the TTL
        return queue.peek(), EvictionReason.CAPACITY  # everything is protected: plain LRU applies


def make_eviction_policy(name: str | EvictionPolicyName, *, ttl_s: float = 30.0) -> EvictionPolicy:
    """The policy called `name` (`ttl_s`: how long `session_ttl` protects a paused session's blocks)."""
    try:
        name = EvictionPolicyName(name)
    except ValueError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of {', '.join(names(EvictionPolicyName))}"
        ) from None
    if name is EvictionPolicyName.SESSION_TTL:
        return SessionTTLPolicy(ttl_s)
    return LRUPolicy()
