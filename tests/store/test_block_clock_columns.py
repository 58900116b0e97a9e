"""A block's loss and its store back, known at ingest (`kvobs.block_clock`): on every recording whose truth is in
its rows (the real vLLM run, the two-replica fleets, our engine's agent run with tool pauses), each loss row's
`lifetime_s` and each store row's `restored` equal what the reads looked up by hash before revision 0021
(`tests.store.hash_lookups`), row for row."""

from __future__ import annotations

import pandas as pd
import pytest

from collectors.kv.chains import Footprint
from collectors.kv.ingest import KVIngest
from collectors.kv.rebuild import WINDOW_S, rebuild_clocks
from kvobs.block_clock import BlockClock
from kvobs.block_events import Batch, Cleared, Placeholder, Removed, Stored
from kvobs.semconv.spans import CLOCK_KINDS
from kvobs.store import StoreWriter, open_store
from tests.collectors.recorded import kv_messages
from tests.collectors.recorded_run import collect_recorded_source
from tests.store.hash_lookups import STORED, lifetimes_by_hash, restores_by_hash

RUNS = ["vllm_run", "fleet_run", "served_fleet", "vllm_fleet", "agent_run"]


def assert_columns_match_the_hash_lookups(events: pd.DataFrame) -> tuple[int, int]:
    """The columns against the look-ups; returns (restores, lifetimes) compared, so a test can say it saw some."""
    stored = events[events["kind"] == STORED]
    assert stored["restored"].notna().all(), "a store row without its restore flag"
    expected = restores_by_hash(events)
    pd.testing.assert_series_equal(stored["restored"].astype(int), expected, check_names=False)
    gaps = stored["restored_after_s"]
    assert (gaps.notna() == (stored["restored"] == 1)).all() and (gaps.dropna() >= 0).all()
    lifetimes = lifetimes_by_hash(events)
    written = events.loc[lifetimes.index, "lifetime_s"]
    assert written.notna().all(), "a loss whose store is in the rows has no lifetime"
    assert written.to_numpy() == pytest.approx(lifetimes.to_numpy(), abs=1e-6)
    return int(expected.sum()), len(lifetimes)


@pytest.mark.parametrize("run", RUNS)
def test_the_columns_equal_what_the_hash_lookups_returned(run, request):
    store = request.getfixturevalue(run).store
    restores, lifetimes = assert_columns_match_the_hash_lookups(store.reads.kv_events())
    if run != "vllm_fleet":  # (the real two-replica vLLM fleet lost no block: there, no store may be called a restore)
        assert restores > 0 and lifetimes > 0, "no block lost and back: the run would not tell"


def test_the_clock_says_lifetimes_restores_and_forgets_past_its_bounds(kv_core):
    clock = kv_core.new_clock(max_blocks=4, horizon_s=100.0)
    assert clock.stored([1, 2], 10.0) is None
    assert clock.lost([2, 9], 25.0) == [15.0, None]  # 9: never stored here
    assert clock.stored([2, 3, 9], 40.0) == [15.0, None, None]  # 2 came back after 15 s; 9's loss was not shown
    clock.cleared(50.0)
    assert clock.stored([1], 60.0) == [10.0] and clock.stored([3], 200.0) is None  # 3 lost 150 s ago: past the horizon
    assert clock.stored([4, 5, 6, 7], 210.0) is None and list(clock.stored_at) == [4, 5, 6, 7]  # the oldest forgotten
    assert clock.lost([1], 220.0) == [None]


def test_expired_losses_are_dropped_a_stretch_at_a_time_and_never_said_meanwhile(kv_core):
    """A loss past the horizon is dropped by the first trim due after it expired (a 64th of the horizon after the
    oldest loss's expiry), not looked for on every loss; until then it is held, and its block stored back is no
    restore."""
    clock = kv_core.new_clock(horizon_s=64.0)  # (a trim is due a second of stream time after the oldest loss expired)
    clock.stored([1, 2, 3, 4], 0.0)
    assert clock.lost([1], 10.0) == [10.0] and clock.lost([2], 10.5) == [10.5] and clock.lost([3], 74.2) == [74.2]
    assert list(clock.lost_at) == [1, 2, 3]  # 1 expired at 74.0; no trim is due before 75.0
    assert clock.stored([1], 74.5) is None and list(clock.lost_at) == [2, 3]  # past the horizon: no restore said
    assert clock.lost([4], 75.6) == [75.6] and list(clock.lost_at) == [3, 4]  # the trim due: 2 expired at 74.5
    assert clock.lost([1], 139.0) == [64.5] and list(clock.lost_at) == [3, 4, 1]  # the next is due at 139.2
    assert clock.lost([], 139.3) == [] and list(clock.lost_at) == [4, 1]


def test_a_clock_whose_caller_keeps_the_store_times_holds_only_what_a_rebuild_told_it():
    clock = BlockClock(horizon_s=100.0)
    clock.stored([1, 2], 10.0)  # a rebuild's history: blocks no chain holds yet
    assert clock.came_back([2, 3], 20.0) is None and list(clock.stored_at) == [1]  # 2's time is its caller's now
    assert clock.lost([1, 2, 3], 30.0, [None, 20.0, None]) == [20.0, 10.0, None]  # 1: the history's; 3: unknown
    assert not clock.stored_at and list(clock.lost_at) == [1, 2]
    assert clock.came_back([2], 45.0) == [15.0] and list(clock.lost_at) == [1]
    clock.cleared(50.0, resident={7: None, 1: None})  # the caller's resident blocks (1 back, unsaid)
    assert clock.lost_at == {7: 50.0, 1: 50.0}


def test_the_chains_forget_their_oldest_past_their_bound_and_the_owners_footprints_say_so(kv_core):
    chains = kv_core.new_chains(max_blocks=200)
    for n in range(26):  # 26 sessions' chains of 8 blocks: 208 stored, 8 past the bound
        chains.stored(list(range(8 * n, 8 * n + 8)), None, f"s{n}", float(n))
    assert chains.resident() == 198 and chains.hashes()[0] == 10  # the excess and a margin of 1%, oldest first
    assert chains.footprints["s0"] == Footprint(resident=0, stored=8) and chains.footprints["s1"].resident == 6
    assert chains.footprints["s25"].resident == 8
    assert chains.removed(3) is None and chains.num_unknown_removed == 1  # forgotten: its loss is no one's
    assert chains.removed(10) == (9, ("s1",), 1.0) and chains.footprints["s1"] == Footprint(
        resident=5, stored=8, removed=1
    )


def _collect_kv(store, messages) -> None:
    """The KV-event frames through a real collector (KV events only) into `store`, then stopped."""
    with collect_recorded_source(store, "kv", messages=messages):
        pass


CLOCKED = ["ts", "kind", "block_hash", "lifetime_s", "restored", "restored_after_s"]


def test_a_restarted_collector_writes_the_lifetimes_and_restores_of_one_that_ran_on(store_url, tmp_path):
    """The recorded vLLM stream through one collector, and through one that stops halfway and a new one that takes
    the rest: the new one rebuilds its block clocks from the store (`block_history`), so every row's lifetime and
    restore are the same, including the losses and restores of blocks the first collector saw stored."""
    messages = kv_messages()
    whole = open_store(f"sqlite:///{tmp_path / 'whole.db'}")
    _collect_kv(whole, messages)
    restarted = open_store(store_url)
    half = len(messages) // 2
    _collect_kv(restarted, messages[:half])
    first_half_rows = len(restarted.reads.kv_events())
    _collect_kv(restarted, messages[half:])
    once, twice = whole.reads.kv_events()[CLOCKED], restarted.reads.kv_events()[CLOCKED]
    pd.testing.assert_frame_equal(once, twice, check_dtype=False)
    later = twice.iloc[first_half_rows:]
    across = later[
        (later["lifetime_s"] > 0) & ~later["block_hash"].isin(later.loc[later["kind"] == STORED, "block_hash"])
    ]
    assert len(across) > 0, "no loss after the restart of a block stored before it: the test would not tell"
    assert (later["restored"] == 1).sum() > 0
    whole.close()
    restarted.close()


def _tier_stream() -> list[Batch]:
    """A cache with a CPU tier below it, as vLLM's offloading connector reports it: each store written through to the
    tier (self-describing, and as placeholders), the cache losing blocks the tier keeps, the tier dropping its
    oldest, blocks stored back to both; a reset halfway."""
    batches, ts = [], 1.8e9
    for round_ in range(6):
        base = 100 * (round_ % 3)  # (rounds 3-5 store rounds 0-2's blocks again: restores on both tiers)
        chain = [base + i for i in range(1, 5)]
        events: list = [
            Stored(chain, None, 16, "GPU", 0, f"s{round_}"),
            Stored(chain, None, 16, "CPU", 0, None),
            Placeholder([base + 50], "CPU"),
        ]
        batches.append(Batch(ts, events))
        batches.append(Batch(ts + 1, [Removed(chain[2:], "GPU", 0, None), Removed(chain[:1], "CPU", 0, None)]))
        if round_ == 3:
            batches.append(Batch(ts + 2, [Cleared()]))
        ts += 10
    return batches


@pytest.mark.parametrize("window_s", [WINDOW_S, 5.0])
def test_a_restarted_collector_rebuilds_every_tiers_clock(store_url, tmp_path, window_s):
    """The same from the stream of a cache and its CPU tier (stores, placeholders, removals on each, a reset): the
    tier's rows get their own lifetimes and restores, the same with and without a restart halfway; the same whether
    the rebuild reads the store in one window or in windows whose edges fall on rows (5 s: every 10 s a batch at
    +0, +1 and +2 s)."""
    stream = _tier_stream()

    def ingest_into(store, batches, *, warm: bool) -> None:
        writer = StoreWriter(store)
        ingest = KVIngest(writer, instance="vllm-a")
        if warm:
            held = store.reads.kv_events()["kind"].isin(CLOCK_KINDS).sum()  # every one within the horizon
            assert rebuild_clocks(ingest, store.lookups, window_s=window_s) == held > 0
        for seq, batch in enumerate(batches):
            ingest.on_batch(seq, batch)
        writer.close()

    whole = open_store(f"sqlite:///{tmp_path / 'whole.db'}")
    ingest_into(whole, stream, warm=False)
    restarted = open_store(store_url)
    ingest_into(restarted, stream[:5], warm=False)
    ingest_into(restarted, stream[5:], warm=True)
    once, twice = whole.reads.kv_events()[CLOCKED], restarted.reads.kv_events()[CLOCKED]
    pd.testing.assert_frame_equal(once, twice, check_dtype=False)
    tier = once[once["kind"].isin(["tier_stored", "tier_removed"])]
    assert (tier["restored"] == 1).any() and tier["lifetime_s"].notna().any()
    stored = once[once["kind"] == STORED]
    assert (stored["restored"] == 1).any()
    whole.close()
    restarted.close()
