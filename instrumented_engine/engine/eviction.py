"""Eviction policies: which free block the allocator takes next, and why.

A policy is a small strategy chosen by name (`make_eviction_policy(EvictionPolicyName.LRU)`). It picks a victim from
the free queue; the block manager does the bookkeeping. `lru` is vLLM's order (the queue head).
`session_ttl` protects the cached blocks of sessions in a tool pause (no request in flight, not
released) for `ttl_s` seconds after their last request ended; once no unprotected block remains,
plain LRU applies again.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from instrumented_engine.engine.block import KVBlock
from instrumented_engine.engine.free_block_queue import FreeBlockQueue
from kvobs.semconv.reasons import EvictionPolicyName, EvictionReason, names


class SessionPauses:
    """Which sessions have requests in flight, and since when the others have been paused (idle)."""

    def __init__(self) -> None:
        self._in_flight: Counter[str] = Counter()
        self.idle_since: dict[str, float] = {}

    def begin(self, session_id: str | None) -> None:
        if session_id is not None:
            self._in_flight[session_id] += 1
            self.idle_since.pop(session_id, None)

    def end(self, session_id: str | None, now: float) -> None:
        if session_id is None or self._in_flight[session_id] == 0:
            return
        self._in_flight[session_id] -= 1
        if self._in_flight[session_id] == 0:
            del self._in_flight[session_id]
            self.idle_since[session_id] = now

    def release(self, session_id: str) -> None:
        self.idle_since.pop(session_id, None)

    def is_active(self, session_id: str) -> bool:
        return session_id in self._in_flight


class EvictionPolicy(Protocol):
    name: str

    def choose(self, queue: FreeBlockQueue, activity: SessionPauses, now: float) -> tuple[KVBlock, EvictionReason]:
        """Return the block to take and, if it is cached, the eviction reason."""
        ...


class LRUPolicy:
    name = EvictionPolicyName.LRU

    def choose(self, queue: FreeBlockQueue, activity: SessionPauses, now: float) -> tuple[KVBlock, EvictionReason]:
        return queue.peek(), EvictionReason.CAPACITY


class SessionTTLPolicy:
    """Skip blocks owned by a session paused less than `ttl_s` ago; fall back to the head."""

    name = EvictionPolicyName.SESSION_TTL

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s

    def choose(self, queue: FreeBlockQueue, activity: SessionPauses, now: float) -> tuple[KVBlock, EvictionReason]:
        for block in queue:
            if not block.is_cached:
                return block, EvictionReason.CAPACITY
            paused = [activity.idle_since[s] for s in block.sessions if s in activity.idle_since]
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
