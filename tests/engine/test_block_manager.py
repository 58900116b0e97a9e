"""Exact tests of the block manager: ids, order, ref counts, hash chains, invalidation, events."""

from __future__ import annotations

import pytest

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.eviction import SessionTTLPolicy
from instrumented_engine.engine.kv_cache.hashing import MASK_64, external_hash, hash_block, hash_chain
from instrumented_engine.engine.kv_cache.manager import BlockManager
from tests.engine.helpers import FakeClock, admit, kinds, make_seq, run_then_pause

BS = 4


def new_bm(num_blocks: int = 9, **kw) -> tuple[BlockManager, FakeClock]:
    clock = FakeClock()
    return BlockManager(num_blocks, BS, clock=clock, **kw), clock


def test_hash_chain_is_chained_and_keyed():
    tokens = list(range(10))
    chain = hash_chain(tokens, BS, (0,))
    assert len(chain) == 2  # only full blocks
    assert chain[0] == hash_block(None, tokens[0:4], (0,))
    assert chain[1] == hash_block(chain[0], tokens[4:8], (0,))
    # a different first block changes every later hash; a different key too
    assert hash_chain([99] + tokens[1:], BS, (0,))[1] != chain[1]
    assert hash_chain(tokens, BS, (1,))[0] != chain[0]
    assert external_hash(chain[0]) == int.from_bytes(chain[0][-8:], "big") <= MASK_64


def test_allocation_takes_queue_head_and_skips_null_block():
    bm, _ = new_bm()
    seq = make_seq("a", list(range(10)))
    assert bm.allocate(seq, 10)
    assert seq.block_table == [1, 2, 3]
    assert bm.num_free_blocks == 5 and bm.usage == pytest.approx(3 / 8)
    assert isinstance(bm.take_events()[0], ev.BlocksAllocated)


def test_register_emits_stored_for_full_blocks_only():
    bm, _ = new_bm()
    seq = make_seq("a", list(range(10)), session="s1")
    admit(bm, seq)
    (alloc, stored) = bm.take_events()
    assert alloc.block_ids == (1, 2, 3)
    assert stored.block_ids == (1, 2) and stored.parent_block_hash is None
    assert stored.token_ids == tuple(range(8)) and stored.session_id == "s1"
    chain = hash_chain(list(range(10)), BS, bm.hash_key(None))
    assert stored.block_hashes == tuple(external_hash(h) for h in chain)
    assert bm.blocks[2].parent_hash == chain[0] and bm.blocks[2].root_hash == chain[0]


def test_prefix_lookup_stops_at_first_miss_and_caps_at_num_tokens_minus_one():
    bm, _ = new_bm(num_blocks=12)
    a = make_seq("a", list(range(12)))
    admit(bm, a)
    bm.free(a)
    # exactly 12 tokens (3 full blocks): the last token must be recomputed, so 2 blocks hit
    assert [b.block_id for b in bm.lookup(make_seq("b", list(range(12))))] == [1, 2]
    # a miss in block 1 stops the walk even though block 2's tokens match
    c = make_seq("c", [0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 12])
    assert [b.block_id for b in bm.lookup(c)] == [1]


def test_hits_revive_free_cached_blocks_and_count_refs():
    bm, _ = new_bm()
    a = make_seq("a", list(range(9)), session="s1")
    admit(bm, a)
    b = make_seq("b", list(range(9)), session="s2")
    hits = admit(bm, b)
    assert [h.block_id for h in hits] == [1, 2]
    assert bm.blocks[1].ref_cnt == 2 and bm.blocks[1].sessions == {"s1", "s2"}
    assert b.block_table == [1, 2, 4]
    bm.free(a)
    assert bm.blocks[1].ref_cnt == 1
    bm.free(b)
    assert all(bm.blocks[i].ref_cnt == 0 for i in (1, 2, 3, 4))
    # a hit on a free cached block takes it out of the free queue
    free_before = bm.num_free_blocks
    admit(bm, make_seq("c", list(range(9))))
    assert bm.num_free_blocks == free_before - 3


def test_free_order_uncached_to_head_cached_to_tail_in_reverse():
    bm, _ = new_bm()
    a = make_seq("a", list(range(10)))  # blocks 1,2 cached, 3 partial
    admit(bm, a)
    bm.free(a)
    order = [b.block_id for b in bm.free_queue]
    # 3 (uncached) at the head; then the never-used 4..8; then the chain tail (2) before its head (1)
    assert order == [3, 4, 5, 6, 7, 8, 2, 1]


def test_lru_eviction_order_and_event():
    bm, clock = new_bm(num_blocks=5)  # 4 usable
    a = make_seq("a", list(range(8)), session="s1")
    admit(bm, a)
    bm.free(a)
    clock.advance(5)
    bm.take_events()
    b = make_seq("b", [50 + i for i in range(12)], session="s2")  # needs 3 blocks: 2 free + evict 1
    assert bm.allocate(b, 12)
    assert b.block_table == [3, 4, 2]  # chain tail (2) evicted first
    evicted = [e for e in bm.take_events() if isinstance(e, ev.BlockEvicted)]
    assert len(evicted) == 1
    e = evicted[0]
    assert (e.block_id, e.reason, e.owner_sessions, e.request_id, e.session_id) == (2, "capacity", ("s1",), "b", "s2")
    assert e.lifetime_s == 5 and e.idle_s == 5
    assert bm.lookup(make_seq("c", list(range(8)) + [1])) == [bm.blocks[1]]


def test_allocate_fails_without_side_effects():
    bm, _ = new_bm(num_blocks=3)
    seq = make_seq("a", list(range(9)))
    assert not bm.allocate(seq, 9)
    assert seq.block_table == [] and bm.num_free_blocks == 2 and bm.take_events() == []


def test_session_ttl_protects_paused_session_then_expires():
    clock = FakeClock()
    bm = BlockManager(5, BS, clock=clock, policy=SessionTTLPolicy(ttl_s=10))
    run_then_pause(bm, "a", list(range(8)), "paused")
    o = make_seq("o", [70 + i for i in range(8)], session="other")
    admit(bm, o)
    bm.free(o)  # free queue: 2, 1 (paused), then 4, 3 (other)
    bm.take_events()
    n = make_seq("n", [90 + i for i in range(4)], session="new")
    assert bm.allocate(n, 4)
    # LRU would take block 2 (paused's); session_ttl skips it and takes "other"'s chain tail
    assert n.block_table == [4]
    (evicted,) = [e for e in bm.take_events() if isinstance(e, ev.BlockEvicted)]
    assert evicted.owner_sessions == ("other",) and evicted.reason == "capacity"
    assert evicted.paused_sessions == ()  # "other" never began a request through the session tracker
    clock.advance(11)  # the pause outlived the TTL: its blocks are fair game, reason "ttl"
    m = make_seq("m", [110 + i for i in range(4)], session="new")
    assert bm.allocate(m, 4)
    assert m.block_table == [2]
    (evicted,) = [e for e in bm.take_events() if isinstance(e, ev.BlockEvicted)]
    assert evicted.owner_sessions == ("paused",) and evicted.reason == "ttl"
    assert evicted.paused_sessions == ("paused",)  # lost while its session waited on a tool


def test_session_ttl_falls_back_to_lru_when_everything_is_protected():
    clock = FakeClock()
    bm = BlockManager(3, BS, clock=clock, policy=SessionTTLPolicy(ttl_s=100))
    run_then_pause(bm, "a", list(range(8)), "p")
    n = make_seq("n", [90 + i for i in range(4)], session="new")
    assert bm.allocate(n, 4) and n.block_table == [2]
    (evicted,) = [e for e in bm.take_events() if isinstance(e, ev.BlockEvicted)]
    assert evicted.paused_sessions == ("p",)
    bm.release_session("p")  # a released session is no longer paused
    m = make_seq("m", [110 + i for i in range(4)], session="new")
    assert bm.allocate(m, 4)
    assert [e.paused_sessions for e in bm.take_events() if isinstance(e, ev.BlockEvicted)] == [()]


def test_weights_update_changes_every_hash_and_drops_cache():
    bm, _ = new_bm()
    a = make_seq("a", list(range(8)), session="s1")
    admit(bm, a)
    bm.free(a)
    bm.take_events()
    result = bm.invalidate("weights_update")
    assert isinstance(result, ev.Invalidated) and result.num_blocks == 2 and result.sessions_affected == ("s1",)
    removed = [e for e in bm.take_events() if isinstance(e, ev.BlockEvicted)]
    assert {e.block_id for e in removed} == {1, 2}
    assert all(e.reason == "invalidation" and e.invalidation_reason == "weights_update" for e in removed)
    assert bm.cached == {}
    b = make_seq("b", list(range(8)) + [1])
    assert bm.lookup(b) == []
    assert b.block_hashes[0] != a.block_hashes[0]  # the new version keys every hash differently
    assert [blk.block_id for blk in bm.free_queue][:2] in ([1, 2], [2, 1])  # uncached: moved to the head


def test_adapter_swap_drops_only_that_adapters_blocks():
    bm, _ = new_bm(num_blocks=12)
    plain = make_seq("p", list(range(8)))
    lora = make_seq("l", list(range(8)), adapter="sql")
    admit(bm, plain)
    admit(bm, lora)
    assert len(bm.cached) == 4  # the adapter keys its blocks apart
    result = bm.invalidate("adapter_swap", adapter="sql")
    assert result.num_blocks == 2
    assert all(b.adapter is None for b in bm.cached.values()) and len(bm.cached) == 2
    with pytest.raises(ValueError, match="adapter"):
        bm.invalidate("adapter_swap")


def test_system_prompt_change_drops_blocks_chained_from_that_prompt():
    bm, _ = new_bm(num_blocks=16)
    system = [7, 7, 7, 7]
    s1 = make_seq("1", system + [1, 1, 1, 1, 1], session="s1")
    s2 = make_seq("2", system + [2, 2, 2, 2, 2], session="s2")
    other = make_seq("3", [5, 5, 5, 5, 5], session="s3")
    for s in (s1, s2, other):
        admit(bm, s)
        bm.free(s)
    result = bm.invalidate("system_prompt_change", session_id="s1")
    assert result.num_blocks == 3 and result.sessions_affected == ("s1", "s2")
    assert len(bm.cached) == 1 and next(iter(bm.cached.values())).sessions == {"s3"}
    with pytest.raises(ValueError, match="session_id"):
        bm.invalidate("system_prompt_change")


def test_session_forget_drops_what_the_session_used_even_shared():
    bm, _ = new_bm(num_blocks=16)
    a = make_seq("a", list(range(9)), session="s1")
    b = make_seq("b", list(range(9)), session="s2")  # shares both of a's blocks
    c = make_seq("c", [50] * 9, session="s2")
    for s in (a, b, c):
        admit(bm, s)
        bm.free(s)
    result = bm.invalidate("session_forget", session_id="s1")
    assert result.num_blocks == 2
    assert {frozenset(b.sessions) for b in bm.cached.values()} == {frozenset({"s2"})}


def test_invalidating_blocks_in_use_keeps_them_with_their_request():
    bm, _ = new_bm()
    a = make_seq("a", list(range(9)), session="s1")
    admit(bm, a)
    bm.invalidate("session_forget", session_id="s1")
    assert a.block_table == [1, 2, 3] and bm.blocks[1].ref_cnt == 1 and not bm.blocks[1].is_cached
    bm.free(a)
    assert [b.block_id for b in bm.free_queue][:3] == [1, 2, 3]  # uncached now: to the head


def test_manual_reset_refused_while_in_use_then_clears():
    bm, _ = new_bm()
    a = make_seq("a", list(range(9)), session="s1")
    admit(bm, a)
    bm.take_events()
    assert bm.invalidate("manual_reset") is None
    assert bm.take_events() == [] and len(bm.cached) == 2
    bm.free(a)
    bm.take_events()
    cleared = bm.invalidate("manual_reset")
    assert isinstance(cleared, ev.CacheCleared) and cleared.num_blocks == 2 and cleared.sessions_affected == ("s1",)
    assert kinds(bm.take_events()) == ["cleared"] and bm.cached == {}


def test_release_session_drops_exclusively_owned_free_blocks():
    bm, _ = new_bm(num_blocks=16)
    a = make_seq("a", list(range(9)), session="s1")
    b = make_seq("b", list(range(4)) + [9] * 5, session="s2")  # shares block 0 only
    for s in (a, b):
        admit(bm, s)
        bm.free(s)
    bm.take_events()
    assert bm.release_session("s1") == 1
    (e,) = bm.take_events()
    assert e.reason == "session_release" and e.owner_sessions == ("s1",)


def test_unknown_reason_is_a_clear_error():
    bm, _ = new_bm()
    with pytest.raises(ValueError, match="unknown invalidation reason 'oops'"):
        bm.invalidate("oops")


def test_caching_disabled_never_hits_or_stores():
    bm, _ = new_bm(enable_caching=False)
    a = make_seq("a", list(range(9)))
    admit(bm, a)
    bm.free(a)
    assert bm.cached == {} and bm.lookup(make_seq("b", list(range(9)))) == []
    assert "stored" not in kinds(bm.take_events())


def test_session_block_counts_follow_stores_hits_and_evictions():
    bm, _ = new_bm(num_blocks=9)
    a = make_seq("a", list(range(12)), session="s1")
    admit(bm, a)
    bm.free(a)
    assert bm.session_blocks == {"s1": 3}  # 12 tokens: 3 full blocks registered
    b = make_seq("b", list(range(8)) + [70, 71, 72, 73, 74], session="s2")
    admit(bm, b)  # hits s1's first two blocks, stores its own third
    bm.free(b)
    assert bm.session_blocks == {"s1": 3, "s2": 3}
    bm.invalidate("session_forget", session_id="s2")  # drops every block s2 stored or hit
    assert bm.session_blocks == {"s1": 1}  # s1's third block was never shared
    assert [blk.sessions for blk in bm.blocks if blk.is_cached] == [{"s1"}]
