"""A fleet in one store: the recorded vLLM run as two replicas behind one collector (`fleet_run`). Every
per-instance read narrows to the instances asked for, the parts add up to the whole, and a block cached on two
replicas is not a restore. (The contract suite holds SQLite, PostgreSQL and chDB to the same answers.)"""

from __future__ import annotations

import pandas as pd

from tests.runs import FLEET


def test_every_source_names_its_replica(fleet_run):
    store = fleet_run.store
    assert store.reads.instances() == list(FLEET)
    for name in ("instance_snapshots", "requests", "kv_events"):
        assert set(getattr(store.reads, name)()["instance"]) == set(FLEET), name  # requests: from service.instance.id


def test_the_parts_add_up_to_the_fleet(fleet_run):
    store = fleet_run.store
    for name, column in (
        ("instance_snapshots", None),
        ("requests", None),
        ("stored_blocks", None),
        ("kv_event_counts", "events"),
        ("block_losses", "blocks"),
    ):
        read = getattr(store.reads, name)
        whole = read()
        parts = [read(instances=[instance]) for instance in FLEET]
        size = (lambda f: len(f)) if column is None else (lambda f, c=column: int(f[c].sum()))
        assert all(size(part) > 0 for part in parts), name
        assert sum(map(size, parts)) == size(whole), name
        assert size(read(instances=[])) == 0 and size(read(instances=FLEET)) == size(whole)


def test_counts_by_instance_sum_to_the_fleet_counts(fleet_run):
    store = fleet_run.store
    first, last = store.reads.time_range()
    for bucket in (5.0, 60.0):
        each = store.reads.kv_event_counts(first + 3.3, last, bucket_s=bucket, by_instance=True)
        assert set(each["instance"]) == set(FLEET)
        keys = ["bucket", "kind", "reason"]
        summed = each.fillna({"reason": ""}).groupby(keys, as_index=False)[["events", "blocks"]].sum()
        whole = store.reads.kv_event_counts(first + 3.3, last, bucket_s=bucket).fillna({"reason": ""})
        pd.testing.assert_frame_equal(
            summed.sort_values(keys, ignore_index=True), whole.sort_values(keys, ignore_index=True), check_dtype=False
        )


def test_a_block_on_two_replicas_is_not_a_restore(fleet_run):
    """Both replicas store the same prefix blocks (the same prompts): counted per instance, a restore is a block
    stored again on the same replica, as the raw rows show."""
    store = fleet_run.store
    stored = store.reads.stored_blocks()
    per_instance = stored.groupby(["instance", "block_hash"]).size()
    restored = store.reads.top_restored_blocks(limit=10_000)
    assert not restored.empty
    assert {(i, h): s for i, h, s in zip(restored["instance"], restored["block_hash"], restored["restores"])} == {
        key: int(n) - 1
        for key, n in per_instance[per_instance > 1].items()  # each store after the first came back
    }
    on_both = stored.groupby("block_hash")["instance"].nunique()
    assert (on_both == 2).any(), "the replicas share no block: the test would not tell"


def test_churn_counts_a_restore_per_replica(fleet_run):
    from kvobs.analytics.cache.chains import eviction_churn

    stored = fleet_run.store.reads.stored_blocks()
    churn = eviction_churn(stored)
    restored = fleet_run.store.reads.top_restored_blocks(limit=10_000)
    assert churn["restored_blocks"] == len(restored) > 0
    assert churn["extra_stores"] == int(restored["restores"].sum())
    assert churn["blocks"] == len(stored.groupby(["instance", "block_hash"])) > stored["block_hash"].nunique()


def test_snapshot_times_are_the_instance_snapshots_grouped_by_bucket(fleet_run):
    """`snapshot_times` is `instance_snapshots` cut into buckets per instance, grouped in the database: every bucket
    with a snapshot, its first and last time and how many, narrowed to the instances asked for."""
    store = fleet_run.store
    first, last = store.reads.time_range()
    for since, until, bucket in (
        (first + 3.3, last, 5.0),
        (first + 3.3, last, 60.0),
        (first + 61.5, last - 7.2, 120.0),
    ):
        snaps = store.reads.instance_snapshots(since, until)
        expected = (
            snaps.assign(bucket=(snaps["ts"] // bucket) * bucket)
            .groupby(["instance", "bucket"], as_index=False)
            .agg(first_ts=("ts", "min"), last_ts=("ts", "max"), samples=("ts", "size"))
        )
        got = store.reads.snapshot_times(since, until, bucket)  # whole minutes from the rollup, the edges from rows
        assert len(got) > 2 and set(got["instance"]) == set(FLEET)
        pd.testing.assert_frame_equal(got, expected, check_dtype=False)
        pd.testing.assert_frame_equal(store.reads.raw_snapshot_times(since, until, bucket), expected, check_dtype=False)
        one = store.reads.snapshot_times(since, until, bucket, instances=FLEET[:1])
        assert set(one["instance"]) == set(FLEET[:1]) and len(one) == (expected["instance"] == FLEET[0]).sum()
