"""The offload tier (vLLM's offloading connector, `--kv-offloading-size`): write-through stores, LRU room, a prefix
lookup that goes on in the tier after the cache's hits, and loads with their real copy; its events as vLLM's
connector publishes them, its rows and metrics.

Truth comes from scripted runs: a session's pause outlasts what the cache holds, and what the tier saved or lost is
checked against the block manager's and the tier's own records; the real model checks that a loaded prefix is the
same KV as a recomputed one (identical greedy tokens), and that a run with the tier differs from one without only
where the tier held blocks.
"""

from __future__ import annotations

from collections import Counter

import pytest

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.hashing import external_hash
from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.kv_cache.offload import OffloadTier
from instrumented_engine.engine.scheduler import Scheduler
from instrumented_engine.observers.kv_publisher import to_wire_events
from instrumented_engine.sampling_params import SamplingParams
from kvobs.block_events import Placeholder, Stored
from kvobs.semconv.attributes import MEDIUM_CPU
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import decode
from tests.engine.helpers import FakeClock, make_seq

BS = 4  # tokens a block


def _engine(num_blocks: int, tier_blocks: int, clock: FakeClock) -> tuple[BlockManager, Scheduler]:
    bm = BlockManager(num_blocks, BS, clock=clock, offload_blocks=tier_blocks, describe_offloads=True)
    return bm, Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=256, enable_chunked_prefill=True, clock=clock)


def _serve(bm: BlockManager, sched: Scheduler, rid: str, tokens: list[int], session: str) -> list[ev.KVEvent]:
    """One request to completion, its prompt computed in one step (no model: the block manager's own run); the
    tier's copies are taken as the runner would take them. Its events."""
    seq = make_seq(rid, tokens, session=session)
    sched.add(seq)
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == [seq]
    for copy in bm.tier_loads:
        bm.tier_loaded(copy, 0, 0.0)
    bm.tier_loads.clear()
    sched.mark_computed(out)
    for copy in bm.tier_stores:
        bm.tier_stored(copy, 0, 0.0)
    bm.tier_stores.clear()
    sched.finish(seq, "stop")
    return sched.take_events()


def _of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_a_pause_longer_than_the_cache_holds_is_saved_by_the_tier_block_for_block():
    """Session a stores 3 blocks and pauses; b's prompt takes the whole cache, evicting a's blocks; the tier, written
    through, still holds them: a's next request loads its 3 blocks instead of computing them, and the blocks it
    loads are exactly those the cache evicted and the tier stored."""
    clock = FakeClock()
    bm, sched = _engine(num_blocks=6, tier_blocks=16, clock=clock)
    a1 = _serve(bm, sched, "a1", list(range(13)), "a")  # 3 full blocks + 1 token
    (stored,) = _of(a1, ev.TierStored)
    assert stored.medium == MEDIUM_CPU and len(stored.block_hashes) == 3 and stored.parent_block_hash is None
    assert stored.block_hashes == _of(a1, ev.BlocksStored)[0].block_hashes  # the cache's blocks, written through
    clock.advance(30)
    b1 = _serve(bm, sched, "b1", list(range(100, 120)), "b")  # 5 blocks: every one of the cache's
    evicted = {e.block_hash for e in _of(b1, ev.BlockEvicted) if "a" in e.owner_sessions}
    assert evicted == set(stored.block_hashes)  # the cache lost a's prefix during its pause
    clock.advance(30)
    a2 = _serve(bm, sched, "a2", list(range(13)) + [7, 7, 7, 7], "a")
    (lookup,) = _of(a2, ev.PrefixLookup)
    assert lookup.hit_tokens == 0 and lookup.tier_hit_tokens == 3 * BS
    (loaded,) = _of(a2, ev.TierLoaded)
    assert set(loaded.block_hashes) == evicted and loaded.num_tokens == 3 * BS and loaded.medium == MEDIUM_CPU
    # the loaded blocks are the cache's again: stored there, and not stored to the tier twice
    assert set(_of(a2, ev.BlocksStored)[0].block_hashes) >= evicted
    assert all(set(e.block_hashes).isdisjoint(evicted) for e in _of(a2, ev.TierStored))


def test_a_tier_too_small_keeps_the_newest_copies_and_says_which_it_dropped():
    """A tier of 5 blocks: b's 5 push a's 3 out (LRU, published as the connector's removals, naming the owner), so
    a's pause loss is a loss from every tier: nothing to load, the prompt is computed."""
    clock = FakeClock()
    bm, sched = _engine(num_blocks=6, tier_blocks=5, clock=clock)
    a1 = _serve(bm, sched, "a1", list(range(13)), "a")
    a_hashes = set(_of(a1, ev.TierStored)[0].block_hashes)
    b1 = _serve(bm, sched, "b1", list(range(100, 120)), "b")  # 5 blocks: the cache's and the tier's all
    dropped = _of(b1, ev.TierRemoved)
    assert {h for e in dropped for h in e.block_hashes} == a_hashes
    assert all(e.owner_sessions == ("a",) and e.reason is None for e in dropped)
    assert len(bm.tier) == 5 and a_hashes.isdisjoint(bm.tier.entries)
    a2 = _serve(bm, sched, "a2", list(range(13)) + [9], "a")
    (lookup,) = _of(a2, ev.PrefixLookup)
    assert lookup.hit_tokens == 0 and lookup.tier_hit_tokens == 0 and not _of(a2, ev.TierLoaded)


def test_the_tier_refuses_a_store_larger_than_itself_and_invalidation_reaches_its_copies():
    tier = OffloadTier(2)
    assert tier.store([1, 2, 3], "s") is None and tier.num_store_failures == 1 and not len(tier)
    clock = FakeClock()
    bm, sched = _engine(num_blocks=16, tier_blocks=16, clock=clock)
    _serve(bm, sched, "a1", list(range(13)), "a")
    _serve(bm, sched, "b1", list(range(50, 63)), "b")
    assert len(bm.tier) == 6
    bm.invalidate("session_forget", session_id="a")
    (removed,) = _of(sched.take_events(), ev.TierRemoved)
    assert removed.owner_sessions == ("a",) and removed.reason == "session_forget" and len(removed.block_hashes) == 3
    assert len(bm.tier) == 3
    bm.invalidate("weights_update")  # every hash changes: no copy can be hit again
    assert len(bm.tier) == 0


def test_the_tiers_events_are_vllms_offloading_connectors_placeholders_or_self_describing():
    hashes = (11, 12)
    stored = ev.TierStored(
        1.0, "r", "s", hashes, None, tuple(range(8)), 4, MEDIUM_CPU, described=False, num_bytes=8, seconds=0.1
    )
    removed = ev.TierRemoved(2.0, None, None, hashes, MEDIUM_CPU, ("s",))
    placeholders = to_wire_events([stored, removed])
    assert [type(e) for e in placeholders] == [wire.BlockStored, wire.BlockStored, wire.BlockRemoved]
    assert all(e.block_size == 0 and e.token_ids == [] and e.medium == "CPU" for e in placeholders[:2])
    batch = decode(wire.encode_batch(wire.KVEventBatch(1.0, placeholders, 0))).batch
    assert [type(e) for e in batch.events][:2] == [Placeholder, Placeholder]
    described = ev.TierStored(
        1.0, "r", "s", hashes, 10, tuple(range(8)), 4, MEDIUM_CPU, described=True, num_bytes=8, seconds=0.1
    )
    (event,) = decode(wire.encode_batch(wire.KVEventBatch(1.0, to_wire_events([described]), 0))).batch.events
    assert isinstance(event, Stored) and event.hashes == [11, 12] and event.parent == 10
    assert event.medium == MEDIUM_CPU and event.block_size == 4 and event.session_id is None  # (vLLM's names none)


@pytest.fixture(scope="module")
def paired_runs(make_llm):
    """The same six-prompt workload twice over, on a cache of 9 blocks (each prompt evicts the last one's
    suffix), without and with a CPU tier that holds everything."""
    from tests.engine.test_generation import shared_prefix_prompts

    runs = []
    for tier_bytes in (None, 64 * 737_280):  # 64 blocks of SmolLM2's float32 KV (737,280 bytes a block of 16)
        llm = make_llm(num_blocks=9, max_model_len=112, kv_offloading_size=tier_bytes)
        prompts = shared_prefix_prompts(llm.tokenizer)
        outs = [llm.generate([p], SamplingParams(temperature=0, max_tokens=8))[0] for p in prompts * 2]
        runs.append((llm, outs))
    return runs


def test_a_loaded_prefix_is_the_same_kv_as_a_recomputed_one(paired_runs):
    (_, without), (llm, with_tier) = paired_runs
    assert [o.output_token_ids for o in with_tier] == [o.output_token_ids for o in without]
    loads = _of(llm.events, ev.TierLoaded)
    assert loads and all(e.num_bytes == len(e.block_hashes) * 737_280 and e.seconds > 0 for e in loads)
    stores = _of(llm.events, ev.TierStored)
    assert all(e.num_bytes == len(e.block_hashes) * 737_280 and not e.described for e in stores)


def test_a_run_with_the_tier_differs_only_where_the_tier_held_blocks(paired_runs):
    """The cache does the same thing in both runs (a loaded block takes a block as a computed one does): the same
    stores, evictions and allocations in the same order; each request's cached tokens grow by what it loaded."""
    (plain, without), (tiered, with_tier) = paired_runs

    def cache_events(llm):
        return [
            (e.kind, getattr(e, "block_hashes", getattr(e, "block_hash", None)))
            for e in llm.events
            if isinstance(e, ev.BlocksStored | ev.BlockEvicted | ev.BlocksAllocated | ev.BlocksFreed)
        ]

    assert cache_events(tiered) == cache_events(plain)
    loaded = Counter()
    for e in _of(tiered.events, ev.TierLoaded):
        loaded[e.request_id] += e.num_tokens
    assert sum(loaded.values()) > 0
    for a, b in zip(without, with_tier):
        assert b.num_cached_tokens - a.num_cached_tokens == loaded[b.request_id]
    lookups = {e.request_id: e for e in _of(tiered.events, ev.PrefixLookup)}
    assert all(lookups[r].tier_hit_tokens == n for r, n in loaded.items())
    # every block the tier loaded is one it stored before: the tier's own record
    stored = {h for e in _of(tiered.events, ev.TierStored) for h in e.block_hashes}
    assert {h for e in _of(tiered.events, ev.TierLoaded) for h in e.block_hashes} <= stored


def test_hashes_the_tier_keys_are_those_published():
    clock = FakeClock()
    bm, sched = _engine(num_blocks=16, tier_blocks=16, clock=clock)
    seq = make_seq("x", list(range(9)), session="s")
    _serve(bm, sched, "x", list(range(9)), "s")
    bm.update_block_hashes(seq)
    assert set(bm.tier.entries) == {external_hash(h) for h in seq.block_hashes}


def test_vllms_offloading_metrics_come_with_the_tier_and_count_its_copies():
    from prometheus_client import generate_latest

    from instrumented_engine.observers.dispatch import dispatch
    from instrumented_engine.observers.metrics import EngineMetrics

    def exposition(offload: bool, events) -> str:
        metrics = EngineMetrics("smollm2", cache_config={"block_size": "4"}, max_model_len=64, offload=offload)
        dispatch(metrics, metrics.HANDLERS, events)
        return generate_latest(metrics.registry).decode()

    lookup = ev.PrefixLookup(1.0, "r", "s", query_tokens=20, hit_tokens=4, hit_blocks=1, tier_hit_tokens=12)
    loaded = ev.TierLoaded(1.1, "r", "s", (1, 2, 3), 12, MEDIUM_CPU, num_bytes=3_000_000, seconds=0.25)
    stored = ev.TierStored(1.2, "r", "s", (4,), 3, (0,) * 4, 4, MEDIUM_CPU, False, num_bytes=1_000_000, seconds=0.5)
    text = exposition(True, [lookup, loaded, stored])
    for line in (
        'vllm:kv_offload_load_bytes_total{engine="0",model_name="smollm2"} 3e+06',
        'vllm:kv_offload_load_time_total{engine="0",model_name="smollm2"} 0.25',
        'vllm:kv_offload_store_bytes_total{engine="0",model_name="smollm2"} 1e+06',
        'vllm:kv_offload_store_time_total{engine="0",model_name="smollm2"} 0.5',
        'vllm:external_prefix_cache_queries_total{engine="0",model_name="smollm2"} 16.0',
        'vllm:external_prefix_cache_hits_total{engine="0",model_name="smollm2"} 12.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="smollm2",source="external_kv_transfer"} 12.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="smollm2",source="local_compute"} 4.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="smollm2",source="local_cache_hit"} 4.0',
    ):
        assert line in text, line
    assert "kv_offload" not in exposition(False, [lookup]) and "external_prefix" not in exposition(False, [lookup])


def test_vllms_flags_make_the_tier(tmp_path):
    import argparse

    from instrumented_engine.commands.engine_flags import add_engine_arguments, engine_config
    from instrumented_engine.config import CacheLayout, EngineConfig

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--kv-offloading-size", "0.5", "--kv-offload-events", "self-describing"])
    config = engine_config(args)
    assert (config.kv_offloading_size, config.kv_offloading_backend) == (2**29, "native")
    layout = CacheLayout.derive(config, bytes_per_token=46_080, model_context=2048)
    assert layout.num_offload_blocks == 2**29 // (46_080 * 16)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-offloading-backend", "lmcache"])
    with pytest.raises(ValueError, match="holds no block"):
        CacheLayout.derive(EngineConfig(kv_offloading_size=1000), bytes_per_token=46_080, model_context=2048)
