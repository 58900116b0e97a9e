"""The router what-if sees tiers: each replica replays with the offload tier its run recorded (or one given to all),
llm-d's precise prefix scorer weighs a block in a CPU tier 0.8 against 1.0 in the GPU cache, Dynamo's KV router
counts one overlap over the tiers, and the routing loss counts a block held in any tier of another replica (it
would have been loaded, not recomputed)."""

from __future__ import annotations

from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.whatif.fleet import POLICIES, FleetPlan, _Router, simulate_fleet
from instrumented_engine.whatif.replay import ReplayPlan
from instrumented_engine.whatif.units import ReplayClock, ReplayRequest, WhatIfResult
from instrumented_engine.whatif.whole_length import WholeLengthCache
from kvobs.semconv.reasons import RouterPolicy


def _choose(policy: str, prefixes: dict[str, tuple[int, int]]) -> str:
    """The replica `policy` picks for an 8-block prompt whose prefix each replica holds as `prefixes` (blocks in the
    cache, then in the tier), the replicas otherwise alike."""
    clock = ReplayClock()
    caches = {n: WholeLengthCache(BlockManager(64, 16, clock=clock), 16, WhatIfResult(64, policy), clock) for n in "ab"}
    req = ReplayRequest("r1", "s1", 0.0, 1.0, 8 * 16 + 1, 8 * 16 + 2, tuple(range(1, 10)))
    fleet = FleetPlan(ReplayPlan([req], 16), {"r1": "a"}, {"a": 64, "b": 64})
    seq = type("Seq", (), {"block_hashes": list(range(9))})()
    return _Router(policy, ["a", "b"], fleet, 1.0, 0.0, 0).choose(req, seq, caches, prefixes)


def test_llm_d_weighs_a_cpu_block_at_0_8_and_dynamo_counts_every_tier():
    prefix, load = RouterPolicy.PREFIX.value, RouterPolicy.PREFIX_LOAD.value
    assert _choose(prefix, {"a": (0, 4), "b": (3, 0)}) == "a"  # 4 x 0.8 = 3.2 beats 3 in the cache
    assert _choose(prefix, {"a": (0, 3), "b": (3, 0)}) == "b"  # 3 x 0.8 = 2.4 does not
    assert _choose(prefix, {"a": (2, 2), "b": (3, 0)}) == "a"  # 2 + 1.6
    assert _choose(load, {"a": (0, 3), "b": (2, 0)}) == "a"  # 5 blocks to compute against 6
    assert _choose(load, {"a": (0, 2), "b": (2, 0)}) == "a"  # a tie on cost: the first replica


def test_a_fleet_replays_with_the_tiers_its_runs_recorded_or_one_given(served_fleet):
    store = served_fleet.store
    recorded = FleetPlan.from_store(store)
    assert recorded.tiers == {}  # its replicas' /metrics (recorded before kvobs said its tier there) say none
    tiered = FleetPlan.from_store(store, tier_blocks=64)
    assert tiered.tiers == {"replica-a": 64, "replica-b": 64}
    for policy in POLICIES:
        plain, with_tier = simulate_fleet(recorded, policy), simulate_fleet(tiered, policy)
        assert plain.tier_hit_tokens == 0
        if policy in (RouterPolicy.AS_ROUTED.value, RouterPolicy.ROUND_ROBIN.value):  # the same routes either way
            # each replica's cache behaves as it did; the tier adds what it loaded
            assert with_tier.hit_tokens - with_tier.tier_hit_tokens == plain.hit_tokens
    routed = simulate_fleet(tiered, RouterPolicy.ROUND_ROBIN.value)
    assert routed.tier_hit_tokens > 0  # sessions' prefixes evicted from a replica's cache came back from its tier
