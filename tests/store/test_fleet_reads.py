"""A fleet in one store: the recorded vLLM run as two replicas behind one collector (`fleet_run`). Every
per-instance read narrows to the instances asked for, the parts add up to the whole, and a block cached on two
replicas is not a restore. (The contract suite holds SQLite, PostgreSQL and chDB to the same answers.)"""

from __future__ import annotations

import pandas as pd

from kvobs.store import queries
from tests.runs import FLEET


def test_every_source_names_its_replica(fleet_run):
    store = fleet_run.store
    assert queries.instances(store) == list(FLEET)
    for read in (queries.instance_snapshots, queries.requests, queries.kv_events):
        assert set(read(store)["instance"]) == set(FLEET), read.__name__  # requests: from service.instance.id


def test_the_parts_add_up_to_the_fleet(fleet_run):
    store = fleet_run.store
    for read, column in (
        (queries.instance_snapshots, None),
        (queries.requests, None),
        (queries.stored_blocks, None),
        (queries.kv_event_counts, "events"),
        (queries.block_losses, "blocks"),
    ):
        whole = read(store)
        parts = [read(store, instances=[name]) for name in FLEET]
        size = (lambda f: len(f)) if column is None else (lambda f, c=column: int(f[c].sum()))
        assert all(size(part) > 0 for part in parts), read.__name__
        assert sum(map(size, parts)) == size(whole), read.__name__
        assert size(read(store, instances=[])) == 0 and size(read(store, instances=FLEET)) == size(whole)


def test_counts_by_instance_sum_to_the_fleet_counts(fleet_run):
    store = fleet_run.store
    first, last = queries.time_range(store)
    for bucket in (5.0, 60.0):
        each = queries.kv_event_counts(store, first + 3.3, last, bucket_s=bucket, by_instance=True)
        assert set(each["instance"]) == set(FLEET)
        keys = ["bucket", "kind", "reason"]
        summed = each.fillna({"reason": ""}).groupby(keys, as_index=False)[["events", "blocks"]].sum()
        whole = queries.kv_event_counts(store, first + 3.3, last, bucket_s=bucket).fillna({"reason": ""})
        pd.testing.assert_frame_equal(
            summed.sort_values(keys, ignore_index=True), whole.sort_values(keys, ignore_index=True), check_dtype=False
        )


def test_a_block_on_two_replicas_is_not_a_restore(fleet_run):
    """Both replicas store the same prefix blocks (the same prompts): counted per instance, a restore is a block
    stored again on the same replica, as the raw rows show."""
    store = fleet_run.store
    stored = queries.stored_blocks(store)
    per_instance = stored.groupby(["instance", "block_hash"]).size()
    restored = queries.top_restored_blocks(store, limit=10_000)
    assert not restored.empty
    assert {(i, h): s for i, h, s in zip(restored["instance"], restored["block_hash"], restored["stores"])} == {
        key: int(n) for key, n in per_instance[per_instance > 1].items()
    }
    on_both = stored.groupby("block_hash")["instance"].nunique()
    assert (on_both == 2).any(), "the replicas share no block: the test would not tell"


def test_churn_counts_a_restore_per_replica(fleet_run):
    from kvobs.analytics.chains import eviction_churn

    stored = queries.stored_blocks(fleet_run.store)
    churn = eviction_churn(stored)
    restored = queries.top_restored_blocks(fleet_run.store, limit=10_000)
    assert churn["restored_blocks"] == len(restored) > 0
    assert churn["extra_stores"] == int((restored["stores"] - 1).sum())
    assert churn["blocks"] == len(stored.groupby(["instance", "block_hash"])) > stored["block_hash"].nunique()
