"""KV-cache events as plain dataclasses.

The block manager and scheduler append these; `LLMEngine.step()` drains them. Telemetry adapters,
the KV-event publisher and the store consume them; nothing here knows about OpenTelemetry.
Every event carries `ts` (epoch seconds), the `request_id` and `session_id` it concerns (None where
no request caused it, e.g. an invalidation). Block hashes are the unsigned 64-bit ints vLLM publishes.

Facts that more than one consumer needs are decided here, once, as properties of the event: whether a lost
block was evicted or invalidated and under which reasons (`BlockEvicted.loss_kind`, `.store_reason`), which
idle owners lost it with the verdict pending (`.pending_owners`: pressure took it while they were between
requests), and how those verdicts settle (`IdleLossesSettled`: in a tool pause when the session came back, after
its end when it was released or stayed away). A reset (`CacheCleared`) is a loss of every cached block with
eviction reason `reset` and invalidation reason `manual_reset`. Metrics, spans, store rows and the vLLM-format
publisher read these instead of deciding for themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from kvobs.semconv.reasons import PRESSURE_REASONS, EvictionReason, InvalidationReason, PreemptionReason
from kvobs.semconv.spans import KVEventKind

# The engine's one KV-cache group, as vLLM's hybrid allocator numbers and names groups (`group_idx`,
# `kv_cache_spec_kind`): every layer attends fully, so every block is in group 0. The publisher and the store say it.
KV_CACHE_GROUP = 0
KV_CACHE_SPEC_KIND = "full_attention"


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
    tier_hit_tokens: int = 0  # tokens after the primary cache's hits found in the offload tier (loaded, not computed)
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
    medium: str | None = None  # the tier the blocks live in, as vLLM names it (`BlockManager.medium`)
    kind = "stored"


@dataclass(frozen=True)
class TierStored(KVEvent):
    """Blocks copied into the offload tier (vLLM's offloading connector's BlockStored, `medium` `CPU`), in chain
    order. `described`: published with their tokens and chain (vLLM's `self_describing_kv_events`), else as vLLM's
    placeholders (a hash each, no tokens, block size 0)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str
    described: bool
    num_bytes: int  # KV bytes copied from the primary cache
    seconds: float  # the copy's time
    adapter: str | None = None
    kind = "tier_stored"


@dataclass(frozen=True)
class TierRemoved(KVEvent):
    """Copies the offload tier dropped, for room (vLLM's connector's BlockRemoved) or with an invalidation:
    `owner_sessions` had stored them. A copy dropped is no loss of the prefix by itself: the primary cache may still
    hold the block."""

    block_hashes: tuple[int, ...]
    medium: str
    owner_sessions: tuple[str, ...]
    reason: InvalidationReason | None = None  # an invalidation dropped them; None: room was made
    kind = "tier_removed"


@dataclass(frozen=True)
class TierLoaded(KVEvent):
    """A request's prefix continued in the offload tier: its blocks were copied back into the primary cache instead
    of recomputed (vLLM counts them in the request's cached tokens, and as external prefix-cache hits)."""

    block_hashes: tuple[int, ...]
    num_tokens: int
    medium: str
    num_bytes: int
    seconds: float  # the copy's time
    kind = "tier_loaded"


@dataclass(frozen=True)
class BlockEvicted(KVEvent):
    """A cached block lost its content (vLLM's BlockRemoved).

    `request_id`/`session_id` name the request whose allocation caused a capacity eviction;
    `owner_sessions` the sessions that had stored or hit the block; `paused_sessions` those of them that
    were idle (no request in flight, not released, idle for less than the session-end horizon) when the
    block was dropped: whether that was a tool pause is settled later (`IdleLossesSettled`).
    """

    block_id: int
    block_hash: int
    parent_block_hash: int | None
    reason: EvictionReason
    owner_sessions: tuple[str, ...]
    lifetime_s: float
    idle_s: float
    invalidation_reason: InvalidationReason | None = None
    paused_sessions: tuple[str, ...] = ()
    medium: str | None = None  # the tier the block lived in, as vLLM names it (`BlockManager.medium`)
    kind = "evicted"

    def __post_init__(self) -> None:
        _coerce(self, "reason", EvictionReason)
        if self.invalidation_reason is not None:
            _coerce(self, "invalidation_reason", InvalidationReason)

    @property
    def loss_kind(self) -> KVEventKind:
        """`invalidated` when an invalidation dropped the block, else `evicted`."""
        return KVEventKind.INVALIDATED if self.invalidation_reason is not None else KVEventKind.EVICTED

    @property
    def store_reason(self) -> str:
        """The reason a `kv_events` row gives: the invalidation's reason, else the eviction's."""
        return (self.invalidation_reason or self.reason).value

    @property
    def pending_owners(self) -> tuple[str, ...]:
        """Idle owners that lost the block to pressure (capacity or TTL): a tool pause or the session's end,
        settled by a later `IdleLossesSettled`. Invalidations and releases are never pause losses."""
        return self.paused_sessions if self.reason in PRESSURE_REASONS else ()


@dataclass(frozen=True)
class IdleLossesSettled(KVEvent):
    """Hindsight on a session's pending losses (`BlockEvicted.pending_owners`): `num_blocks` blocks it lost while
    idle were lost in a tool pause (`in_pause`: its next request began), or not (after its end: released, or idle
    past the session-end horizon; or after its next request reached the server, before the engine took it)."""

    num_blocks: int
    in_pause: bool
    session_blocks: int = 0  # cached blocks the session still stored or hit, now
    kind = "idle_losses_settled"


@dataclass(frozen=True)
class BlocksFreed(KVEvent):
    block_ids: tuple[int, ...]
    num_cached: int
    kind = "freed"


@dataclass(frozen=True)
class Preempted(KVEvent):
    num_blocks_freed: int
    num_computed_tokens_lost: int
    reason: PreemptionReason = PreemptionReason.CAPACITY
    kind = "preempted"

    def __post_init__(self) -> None:
        _coerce(self, "reason", PreemptionReason)


@dataclass(frozen=True)
class Resumed(KVEvent):
    hit_tokens: int
    num_preemptions: int
    kind = "resumed"


@dataclass(frozen=True)
class Invalidated(KVEvent):
    reason: InvalidationReason
    num_blocks: int
    block_hashes: tuple[int, ...]
    sessions_affected: tuple[str, ...]
    kind = "invalidated"

    def __post_init__(self) -> None:
        _coerce(self, "reason", InvalidationReason)


@dataclass(frozen=True)
class CacheCleared(KVEvent):
    """Every cached hash was dropped (vLLM's AllBlocksCleared): an invalidation of every cached block.

    Unlike other invalidations it comes without per-block `BlockEvicted` events (as in vLLM), so its
    `num_blocks` are counted as lost under both reasons below.
    """

    num_blocks: int
    sessions_affected: tuple[str, ...] = field(default_factory=tuple)
    kind = "cleared"
    eviction_reason: ClassVar[EvictionReason] = EvictionReason.RESET
    invalidation_reason: ClassVar[InvalidationReason] = InvalidationReason.MANUAL_RESET


def _coerce(event: KVEvent, name: str, enum_type: type) -> None:
    """A reason given by value ("capacity") becomes its enum member; an unknown one is a ValueError here."""
    value = getattr(event, name)
    if not isinstance(value, enum_type):
        object.__setattr__(event, name, enum_type(value))
