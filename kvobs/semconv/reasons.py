"""Enumerated label values: why a cached block was dropped, why a cache was invalidated."""

from __future__ import annotations

import enum


class EvictionReason(str, enum.Enum):
    """Why a cached block lost its content (`kvcache.eviction.reason`, label `reason`)."""

    CAPACITY = "capacity"  # the allocator needed a free block and took this cached one (LRU order)
    INVALIDATION = "invalidation"  # an invalidation (weights, adapter, system prompt, session) dropped it
    RESET = "reset"  # a prefix-cache reset cleared every hash
    SESSION_RELEASE = "session_release"  # its only session declared itself done
    TTL = "ttl"  # session_ttl policy: the owning session's tool pause outlived the TTL


class InvalidationReason(str, enum.Enum):
    """Why cached blocks were invalidated (`kvcache.invalidation.reason`, label `reason`)."""

    WEIGHTS_UPDATE = "weights_update"
    ADAPTER_SWAP = "adapter_swap"
    SYSTEM_PROMPT_CHANGE = "system_prompt_change"
    SESSION_FORGET = "session_forget"
    MANUAL_RESET = "manual_reset"
