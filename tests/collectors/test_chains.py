"""The hash chains' registry (`collectors.kv.chains`): a store of three blocks or more shares one segment among its
blocks, and every block still says its own parent, owners and latest store, however it leaves (removed in any order,
stored again by another session, adopted by the session inferred for it, forgotten past the bound, cleared), in each
core: the pure Python and the compiled one."""

from __future__ import annotations

from collectors.kv.chains import Footprint


def test_each_block_of_a_shared_segment_says_its_own_parent_whatever_the_order_it_leaves_in(kv_core):
    chains = kv_core.new_chains()
    chains.stored([11, 12, 13, 14, 15], 10, "s1", 1.0)  # 10: the parent of its first block, stored before
    chains.stored([21, 22], 15, "s1", 2.0)  # (a short store: a tuple a block)
    assert chains.block(13) == (12, ("s1",), 1.0) and chains.block(21) == (15, ("s1",), 2.0)
    assert chains.block(99) is None
    assert [chains.removed(h) for h in (13, 11, 15, 22, 12, 14, 21)] == [
        (12, ("s1",), 1.0),
        (10, ("s1",), 1.0),
        (14, ("s1",), 1.0),
        (21, ("s1",), 2.0),
        (11, ("s1",), 1.0),
        (13, ("s1",), 1.0),
        (15, ("s1",), 2.0),
    ]
    assert chains.removed(13) is None and chains.num_unknown_removed == 1  # gone already: nobody's
    assert chains.footprints["s1"] == Footprint(resident=0, stored=7, removed=7)


def test_a_block_of_a_segment_stored_again_keeps_its_parent_and_gains_the_owner_and_the_latest_store(kv_core):
    chains = kv_core.new_chains()
    chains.stored([1, 2, 3, 4], None, "s1", 1.0)
    assert chains.stored([1, 2, 3, 5], None, "s2", 2.0) == [0, 0, 0, 1]  # 1..3 announced again; 5 new
    assert chains.removed(3) == (2, ("s1", "s2"), 2.0) and chains.removed(4) == (3, ("s1",), 1.0)
    assert chains.removed(5) == (3, ("s2",), 2.0) and chains.removed(1) == (None, ("s1", "s2"), 2.0)
    assert chains.stored([2], 1, "s1", 3.0) == [0]  # announced again by an owner: no new owner, its latest store
    assert chains.block(2) == (1, ("s1", "s2"), 3.0)
    assert chains.footprints["s1"] == Footprint(resident=1, stored=4, removed=3)
    assert chains.footprints["s2"] == Footprint(resident=1, stored=4, removed=3)


def test_a_segment_block_that_named_no_session_is_adopted_alone(kv_core):
    chains = kv_core.new_chains()
    chains.stored([31, 32, 33, 34], 30, None, 5.0)
    assert chains.adopt(33, "s9") and not chains.adopt(33, "s8")  # owned now: not adopted twice
    assert not chains.adopt(77, "s9")  # not resident
    assert chains.block(33) == (32, ("s9",), 5.0) and chains.block(34) == (33, (None,), 5.0)
    assert chains.removed(33) == (32, ("s9",), 5.0) and chains.removed(32) == (31, (None,), 5.0)


def test_a_clear_counts_each_segments_blocks_for_their_owners_and_its_clock_says_them_lost(kv_core):
    chains = kv_core.new_chains()
    chains.stored([1, 2, 3], None, "a", 1.0)
    chains.stored([4, 5, 6, 7], 3, "b", 2.0)
    chains.stored([4, 8], 3, "a", 3.0)  # 4: b's, stored by a too
    assert chains.cleared(10.0) == {"a": 5, "b": 4} and not chains.resident()
    assert chains.clock.lost_at == dict.fromkeys([1, 2, 3, 4, 5, 6, 7, 8], 10.0)
    assert chains.clock.came_back([8, 9], 15.0) == [5.0, None]  # 8 back 5 s after the clear
    assert chains.footprints["a"] == Footprint(resident=0, stored=5, cleared=5)
