"""Enumerated facts: why a cached block was dropped, why a cache was invalidated, why a request was preempted (or
looked its prefix up again), the eviction policies by name, and the agents' client-side step routings.

Each enum is a `str`, and `str(member)` is its value, so a member can go straight into a Prometheus label, an
OpenTelemetry attribute or a store column.
"""

from __future__ import annotations

import enum


class Name(str, enum.Enum):
    """A string enumeration whose `str()` and `format()` are the value (as `enum.StrEnum` from Python 3.11)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class EvictionReason(Name):
    """Why a cached block lost its content (`kvcache.eviction.reason`, label `reason`)."""

    CAPACITY = "capacity"  # the allocator needed a free block and took this cached one (LRU order)
    INVALIDATION = "invalidation"  # an invalidation (weights, adapter, system prompt, session) dropped it
    RESET = "reset"  # a prefix-cache reset cleared every hash
    SESSION_RELEASE = "session_release"  # its only session declared itself done
    TTL = "ttl"  # session_ttl policy: the owning session's tool pause outlived the TTL


# Blocks the agent gave up itself (its session ended and let them go): released, never counted as lost. A loss is
# what the cache took from a session that still wanted it (capacity, TTL, invalidation, preemption, reset).
RELEASE_REASONS = frozenset({EvictionReason.SESSION_RELEASE.value})


# Losses a session suffers while it waits on a tool: the cache needed room (or its protection lapsed).
# Invalidations, resets and releases are decisions about content, not pressure, and are never counted so.
PRESSURE_REASONS = frozenset({EvictionReason.CAPACITY, EvictionReason.TTL})


# `kv_events.reason` of a `hit` row when a preempted request looked its prefix up again.
READMISSION = "readmission"


class InvalidationReason(Name):
    """Why cached blocks were invalidated (`kvcache.invalidation.reason`, label `reason`)."""

    WEIGHTS_UPDATE = "weights_update"
    ADAPTER_SWAP = "adapter_swap"
    SYSTEM_PROMPT_CHANGE = "system_prompt_change"
    SESSION_FORGET = "session_forget"
    MANUAL_RESET = "manual_reset"  # vLLM's reset_prefix_cache: every cached hash dropped


class PreemptionReason(Name):
    """Why a running request lost its blocks (`kvcache.preemption.reason`)."""

    CAPACITY = "capacity"  # a running request could not grow: the most recently admitted one was preempted


class EvictionPolicyName(Name):
    """The engine's eviction policies by name (`--eviction-policy`, `kvobs whatif --policy`)."""

    LRU = "lru"  # vLLM's order: the least recently used free block first
    SESSION_TTL = "session_ttl"  # protect the blocks of sessions in a tool pause for a TTL, then LRU


class StepRouting(Name):
    """How `kvobs agents` spreads steps over several `--base-url` replicas (`--routing`; client-side, for tests and
    demos: `kvobs.agent.routing`)."""

    ROUND_ROBIN = "round_robin"  # every step to the next replica: a session's steps hop replicas
    SESSION = "session"  # each session sticks to one replica
    RANDOM = "random"  # a replica drawn for each step


class PairApart(Name):
    """Why a request's prefix was compared with no other replica (`kvobs_collector_routing_uncompared_requests_total`
    and `routing.FleetCheck`): its replica was the only one, or the others differ in block size, or their block
    hashes never meet theirs (sessions ran on both, no block was ever stored on both)."""

    NO_OTHER_REPLICA = "no_other_replica"
    BLOCK_SIZE = "block_size"
    HASHES_DIFFER = "hashes_differ"


class RouterPolicy(Name):
    """The routers `kvobs whatif --replicas` replays a fleet's traffic under (`instrumented_engine.whatif.fleet`)."""

    AS_ROUTED = "as_routed"  # each request replayed on the replica that served it (a replay, not the observation)
    ROUND_ROBIN = "round_robin"
    SESSION_AFFINITY = "session_affinity"  # sticky by session
    PREFIX = "prefix"  # llm-d's precise prefix-cache scorer: the longest resident prefix, ties by load
    PREFIX_LOAD = "prefix_load"  # Dynamo's KV router: least prefill-load x blocks to compute + active decode blocks


def names(enum_type: type[Name]) -> list[str]:
    """The values of an enumeration, in declaration order (for `choices=` and error messages)."""
    return [member.value for member in enum_type]
