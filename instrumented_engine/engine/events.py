"""KV-cache events as plain dataclasses.

The block manager and scheduler append these; `LLMEngine.step()` drains them. Telemetry adapters,
the KV-event publisher and the store consume them; nothing here knows about OpenTelemetry.
Every event carries `ts` (epoch seconds), the `request_id` and `session_id` it concerns (None where
no request caused it, e.g. an invalidation). Block hashes are the unsigned 64-bit ints vLLM publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVEvent:
    ts: float
    request_id: str | None
    session_id: str | None

    kind = "event"


@dataclass(frozen=True)
class PrefixLookup(KVEvent):
    """A request looked its prefix up at admission (`readmission` after a preemption)."""

    query_tokens: int
    hit_tokens: int
    hit_blocks: int
    readmission: bool = False
    reuse_gaps_s: tuple[float, ...] = ()  # per hit block: time since its last use
    kind = "prefix_lookup"


@dataclass(frozen=True)
class BlocksAllocated(KVEvent):
    block_ids: tuple[int, ...]
    num_free_after: int
    kind = "allocated"


@dataclass(frozen=True)
class BlocksStored(KVEvent):
    """Full blocks registered in the prefix cache (vLLM's BlockStored)."""

    block_ids: tuple[int, ...]
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]  # all stored blocks' tokens, in order
    block_size: int
    adapter: str | None = None
    kind = "stored"


@dataclass(frozen=True)
class BlockEvicted(KVEvent):
    """A cached block lost its content (vLLM's BlockRemoved).

    `request_id`/`session_id` name the request whose allocation caused a capacity eviction;
    `owner_sessions` the sessions that had stored or hit the block; `paused_sessions` those of them
    that were in a tool pause (no request in flight, not released) when the block was dropped.
    """

    block_id: int
    block_hash: int
    parent_block_hash: int | None
    reason: str  # capacity | invalidation | reset | session_release | ttl
    owner_sessions: tuple[str, ...]
    lifetime_s: float
    idle_s: float
    invalidation_reason: str | None = None
    paused_sessions: tuple[str, ...] = ()
    kind = "evicted"


@dataclass(frozen=True)
class BlocksFreed(KVEvent):
    block_ids: tuple[int, ...]
    num_cached: int
    kind = "freed"


@dataclass(frozen=True)
class Preempted(KVEvent):
    num_blocks_freed: int
    num_computed_tokens_lost: int
    reason: str = "capacity"
    kind = "preempted"


@dataclass(frozen=True)
class Resumed(KVEvent):
    hit_tokens: int
    num_preemptions: int
    kind = "resumed"


@dataclass(frozen=True)
class Invalidated(KVEvent):
    reason: str  # weights_update | adapter_swap | system_prompt_change | session_forget | manual_reset
    num_blocks: int
    block_hashes: tuple[int, ...]
    sessions_affected: tuple[str, ...]
    kind = "invalidated"


@dataclass(frozen=True)
class CacheCleared(KVEvent):
    """Every cached hash was dropped (vLLM's AllBlocksCleared)."""

    num_blocks: int
    sessions_affected: tuple[str, ...] = field(default_factory=tuple)
    kind = "cleared"
