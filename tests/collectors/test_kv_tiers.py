"""Tiers and groups in the KV-event stream: each engine's name for a tier is stored under one name (`medium_name`),
and a tier kvobs does not know fails closed (not read as any tier's blocks; counted, and named by `kvobs doctor`);
an offloading connector's placeholders (a hash that reached another tier, no tokens, no block size) are counted and
stored as that tier's copies of the hash alone; a lower tier's stores and removals are rows of their own kinds
(`tier_stored`, `tier_removed`), never read as the cache's blocks; a hybrid model's KV-cache groups each keep their
own chains, and what vLLM says of a block beyond its hash (group, its kind, LoRA adapter, extra keys, and our
engine's removal reason) is stored with it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from collectors.kv.ingest import KVIngest
from kvobs.analytics.cache.fleet_index import FleetIndex
from kvobs.semconv.attributes import MEDIUM_GPU, is_known_medium, is_shared_tier, medium_name, tier_name
from kvobs.store import StoreWriter, open_store
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import decode, normalize


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("GPU", MEDIUM_GPU),
        ("gpu", MEDIUM_GPU),
        ("CPU", "CPU"),
        ("cpu", "CPU"),
        ("Disk", "DISK"),
        ("STORAGE", "STORAGE"),
        ("SHARED_STORAGE", "SHARED_STORAGE"),
        ("CPU_PINNED", "CPU"),  # SGLang's
        ("EXTERNAL", "EXTERNAL"),
        ("FS", "STORAGE"),  # vLLM 0.26's
        ("OBJ", "STORAGE"),
        ("hbm3", "HBM3"),  # not known: named, not read
        (None, None),
    ],
)
def test_each_tier_has_one_name(sent, kept):
    assert medium_name(sent) == kept and is_known_medium(sent) == (sent != "hbm3")


def test_a_tier_kvobs_does_not_know_fails_closed_counted_and_named_by_doctor(tmp_path, caplog):
    from prometheus_client import generate_latest

    from collectors.collector import Collector, CollectorOptions
    from kvobs.commands.doctor import exposition_checks

    store = open_store(f"sqlite:///{tmp_path / 'tiers.db'}")
    collector = Collector(CollectorOptions(kv_events=["vllm-a=tcp://127.0.0.1:1"], interval_s=3600), store=store)
    ingest = collector.streams[0].ingest
    events = [
        wire.BlockStored([1, 2], None, [5] * 32, 16, None, "GPU", None, session_id="s1"),
        wire.BlockStored([1, 2], None, [5] * 32, 16, None, "HBM3", None, session_id="s1"),  # a tier not known
        wire.BlockRemoved([1], "HBM3"),
        wire.BlockRemoved([2], "hbm3"),
    ]
    with caplog.at_level("WARNING", logger="collectors.kv.ingest"):
        ingest.on_batch(0, normalize(wire.KVEventBatch(1.8e9, events, 0)))
    assert ingest.unknown_tiers == {"HBM3": 4}
    assert ingest.chains.footprint("s1").resident == 2 and ingest.chains.footprint("s1").removed == 0  # untouched
    assert [r.getMessage() for r in caplog.records].count(
        "KV events of vllm-a name a tier kvobs does not know, 'HBM3': its blocks are counted "
        "(kvobs_collector_kv_unknown_tier_blocks_total), not read as any tier's"
    ) == 1
    text = generate_latest(collector.registry).decode()
    collector.stop()
    assert 'kvobs_collector_kv_unknown_tier_blocks_total{instance="vllm-a",medium="HBM3"} 4.0' in text
    (check,) = [c for c in exposition_checks(text) if c[0] == "vllm-a"]
    assert check[1] is False and "tiers kvobs does not know, not read: 4 blocks of 'HBM3'" in check[2]
    rows = store.reads.kv_events()
    assert set(rows["medium"]) == {MEDIUM_GPU} and len(rows) == 2
    store.close()


def test_placeholders_are_counted_and_tiers_stored_by_their_one_name(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'tiers.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="vllm-a")
    events = [
        wire.BlockStored([1, 2], None, [5] * 32, 16, None, "gpu", None, session_id="s1"),
        wire.BlockStored([1, 2], None, [], 0, None, "cpu", None),  # the offload placeholder of the same blocks
        wire.BlockStored([3], 2, [6] * 16, 16, None, "Disk", None, session_id="s1"),  # a self-describing offload
        wire.BlockRemoved([1], "GPU"),
    ]
    ingest.on_batch(0, normalize(wire.KVEventBatch(1.8e9, events, 0)))
    writer.close()
    rows = store.reads.kv_events()
    assert list(zip(rows["kind"], rows["block_hash"], rows["medium"], rows["num_tokens"].isna())) == [
        ("stored", 1, MEDIUM_GPU, False),
        ("stored", 2, MEDIUM_GPU, False),
        ("tier_stored", 1, "CPU", True),  # the placeholders: the tier's copies of the hash alone, no tokens
        ("tier_stored", 2, "CPU", True),
        ("tier_stored", 3, "DISK", False),  # a copy in a tier below the device cache: no block of the cache's own
        ("removed", 1, MEDIUM_GPU, False),
    ]
    assert ingest.num_placeholders == 2 and rows["parent_hash"][2:4].isna().all()


def test_an_offload_tiers_stores_and_removals_keep_to_their_own_chains(tmp_path):
    """The device tier is the first one stored to; a CPU tier that stores copies of the same blocks and later drops
    them leaves the device tier's blocks resident and the session's footprint whole: only a device removal is the
    session losing its prefix. Each removal row still names its owner and its tier."""
    store = open_store(f"sqlite:///{tmp_path / 'tiers.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="vllm-a")
    device = wire.BlockStored([1, 2], None, [5] * 32, 16, None, "GPU", None, session_id="s1")
    offload = wire.BlockStored([1, 2], None, [5] * 32, 16, None, "CPU", None, session_id="s1")
    ingest.on_batch(0, normalize(wire.KVEventBatch(1.8e9, [device, offload, wire.BlockRemoved([1, 2], "CPU")], 0)))
    assert ingest.primary == (MEDIUM_GPU, 0) and set(ingest.chains.hashes()) == {1, 2}
    assert ingest.chains.footprints["s1"].resident == 2 and ingest.num_pending_idle == 0
    ingest.on_batch(1, normalize(wire.KVEventBatch(1.8e9 + 1, [wire.BlockRemoved([2], "GPU")], 0)))
    assert set(ingest.chains.hashes()) == {1} and ingest.chains.footprints["s1"].resident == 1
    writer.close()
    removed = store.reads.kv_events(kinds=["removed", "tier_removed"])
    assert list(zip(removed["kind"], removed["block_hash"], removed["medium"], removed["session_id"])) == [
        ("tier_removed", 1, "CPU", "s1"),
        ("tier_removed", 2, "CPU", "s1"),
        ("removed", 2, MEDIUM_GPU, "s1"),
    ]
    # "blocks lost" reads the device cache's removals alone: the CPU tier dropping its copies lost no prefix
    assert store.reads.block_losses(0, 2e9)["blocks"].sum() == 1


def test_a_hybrid_models_groups_keep_their_own_chains_and_every_field_is_stored(tmp_path):
    """vLLM's hybrid allocator caches the same block hashes once per KV-cache group (full attention, sliding window)
    and drops a sliding-window group's copies early, while the full-attention group keeps them: the first group
    stored to is the device chains', so that early drop is no loss of the session's prefix. The events travel as
    the wire carries them (encoded, decoded); each row keeps the group, its kind, the adapter and the extra keys."""
    store = open_store(f"sqlite:///{tmp_path / 'groups.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="vllm-a")
    long_keys = ["salt-" + "x" * 2000]
    full = wire.BlockStored(
        [1, 2],
        None,
        [5] * 32,
        16,
        None,
        "GPU",
        "adapter-" + "a" * 300,
        extra_keys=[["img-1", 0], long_keys],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
        session_id="s1",
    )
    window = wire.BlockStored(
        [1, 2],
        None,
        [5] * 32,
        16,
        None,
        "GPU",
        None,
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        session_id="s1",
    )
    batches = [[full, window, wire.BlockRemoved([1], "GPU", group_idx=1)], [wire.BlockRemoved([2], "GPU", group_idx=0)]]
    for seq, events in enumerate(batches):
        decoded = decode(wire.encode_batch(wire.KVEventBatch(1.8e9 + seq, events, 0)))
        ingest.on_batch(seq, decoded.batch)
        if seq == 0:  # the window group's drop left the device chains and the footprint whole
            assert ingest.primary == (MEDIUM_GPU, 0) and set(ingest.chains.hashes()) == {1, 2}
            assert ingest.chains.footprints["s1"].resident == 2
    assert set(ingest.chains.hashes()) == {1} and ingest.chains.footprints["s1"].resident == 1
    writer.close()
    rows = store.reads.kv_events()
    kinds = [None if pd.isna(kind) else kind for kind in rows["kv_cache_spec_kind"]]
    got = list(zip(rows["kind"], rows["block_hash"], rows["group_idx"], kinds))
    assert got == [
        ("stored", 1, 0, "full_attention"),
        ("stored", 2, 0, "full_attention"),
        ("stored", 1, 1, "sliding_window"),
        ("stored", 2, 1, "sliding_window"),
        ("removed", 1, 1, None),
        ("removed", 2, 0, None),
    ]
    lora = rows["lora_name"].tolist()
    assert lora[0] == lora[1] and lora[0].startswith("adapter-aaa") and "~cut:" in lora[0] and len(lora[0]) == 255
    assert rows["extra_keys"][0] == '["img-1",0]'
    assert rows["extra_keys"][1].startswith("sha256:") and len(rows["extra_keys"][1]) == 7 + 64
    assert rows["extra_keys"][2:].isna().all()


def test_a_removals_reason_from_our_engine_is_kept_and_any_other_value_is_not(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'reasons.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="engine-a")
    stored = wire.BlockStored([1, 2, 3], None, [5] * 48, 16, None, "GPU", None, session_id="s1")
    removals = [
        wire.BlockRemoved([1], "GPU", 0, reason="session_release"),
        wire.BlockRemoved([2], "GPU", 0),  # vLLM's: no reason
        wire.BlockRemoved([3], "GPU", 0, reason="x" * 100),  # not a reason of ours
    ]
    ingest.on_batch(0, decode(wire.encode_batch(wire.KVEventBatch(1.8e9, [stored, *removals], 0))).batch)
    writer.close()
    removed = store.reads.kv_events(kinds=["removed"])
    assert [None if pd.isna(r) else r for r in removed["reason"]] == ["session_release", None, None]


def test_a_block_announced_again_counts_once_and_removals_of_unknown_blocks_are_counted(tmp_path):
    """vLLM's offloading says it: consumers must count a block announced again once, and ignore a removal of a hash
    they never saw stored. The rows keep what was sent; `first_owner` 0 on the repeat makes the block counts (the
    minute rollup's and the raw rows') count it once; both are counted on the collector's /metrics."""
    from prometheus_client import generate_latest

    from collectors.collector import Collector, CollectorOptions

    store = open_store(f"sqlite:///{tmp_path / 'tiers.db'}")
    collector = Collector(CollectorOptions(kv_events=["vllm-a=tcp://127.0.0.1:1"], interval_s=3600), store=store)
    ingest = collector.streams[0].ingest
    first = [
        wire.BlockStored([1, 2], None, [5] * 32, 16, None, "GPU", None, session_id="s1"),
        wire.BlockStored([1, 2], None, [5] * 32, 16, None, "CPU", None, session_id="s1"),
    ]
    again = [
        wire.BlockStored([2, 3], 1, [6] * 32, 16, None, "CPU", None, session_id="s1"),  # 2 again, 3 new
        wire.BlockRemoved([99], "GPU"),  # never stored here
    ]
    ingest.on_batch(0, normalize(wire.KVEventBatch(1.8e9, first, 0)))
    ingest.on_batch(1, normalize(wire.KVEventBatch(1.8e9 + 1, again, 0)))
    assert (ingest.num_repeated_stores, ingest.num_unknown_removals) == (1, 1)
    assert ingest.chains.footprint("s1").resident == 2  # the device tier's two blocks; the CPU tier's are apart
    text = generate_latest(collector.registry).decode()
    collector.stop()
    assert 'kvobs_collector_kv_repeated_stores_total{instance="vllm-a"} 1.0' in text
    assert 'kvobs_collector_kv_unknown_removals_total{instance="vllm-a"} 1.0' in text
    rows = store.reads.kv_events()
    cpu = rows[(rows["kind"] == "tier_stored") & (rows["medium"] == "CPU")]
    assert list(zip(cpu["block_hash"], cpu["first_owner"])) == [(1, 1), (2, 1), (2, 0), (3, 1)]
    counts = store.reads.kv_event_counts(bucket_s=60.0)
    blocks = counts.groupby("kind")["blocks"].sum()
    assert (int(blocks["stored"]), int(blocks["tier_stored"])) == (2, 3)  # the cache's 2; the tier's 3 distinct
    store.close()


VLLM_TIERS = Path(__file__).parents[1] / "fixtures" / "vllm-tiers" / "frames.jsonl"


def _ingested(recording: Path, tmp_path) -> tuple:
    """(store, writer, ingest) of one replica that took every batch of a recording vLLM 0.32 encoded."""
    frames = [json.loads(line) for line in recording.read_text().splitlines()]
    assert {f["vllm"] for f in frames} == {"0.32.0"}
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="vllm-a")
    for frame in frames:
        ingest.on_batch(frame["seq"], decode(bytes.fromhex(frame["payload"])).batch)
    return store, writer, ingest


def test_a_storage_tiers_locality_as_vllms_own_encoder_sends_it(tmp_path):
    """vLLM 0.32's own structs (`tests/fixtures/vllm-tiers/record.py`): one prompt's blocks on the GPU, the CPU tier,
    a LOCAL storage tier, a REMOTE one and KVCR's own host pool. The REMOTE tier is a tier of its own
    (`REMOTE_STORAGE`), so removals from the LOCAL one leave its copies; KVCR's pool (`ownership="kvcr"`) is a tier
    apart from the connector's CPU tier, as vLLM keeps their residencies apart; a locality vLLM does not define fails
    closed. In the fleet's index a REMOTE copy is no replica's own: other replicas may load it too, so no routing
    loss is claimed for it; KVCR's copies are the replica's own until KVCR drops them."""
    store, writer, ingest = _ingested(VLLM_TIERS, tmp_path)
    writer.close()
    rows = store.reads.kv_events()
    said = list(zip(rows["kind"], rows["medium"], rows["block_hash"]))
    hashes = (0x1111, 0x2222, 0x3333)
    tiers = ["CPU", "STORAGE", "REMOTE_STORAGE", "CPU/kvcr"]
    expected = [("stored", MEDIUM_GPU), *[("tier_stored", t) for t in tiers]]
    expected += [("removed", MEDIUM_GPU), *[("tier_removed", t) for t in tiers]]  # (NEARBY: not read, counted)
    assert said == [(kind, medium, h) for kind, medium in expected for h in hashes]
    assert ingest.unknown_tiers == {"STORAGE@NEARBY": 3} and ingest.num_unknown_removals == 0

    index = FleetIndex(track_losses=True)
    for start, end, held in ((0, 15, 3), (15, 24, 3), (24, 30, 0)):  # all stored; the connector's gone; KVCR's gone
        seen = rows.iloc[start:end]
        index.apply(seen["kind"], seen["instance"], seen["block_hash"], seen["parent_hash"], seen["ts"], seen["medium"])
        assert index.prefix_on("vllm-a", list(hashes)) == held
    assert all(index.lost[("vllm-a", h)][1] == "tier_removed" for h in hashes)  # lost with KVCR's copy, the last own


@pytest.mark.parametrize(
    ("medium", "locality", "name", "known"),
    [
        ("STORAGE", None, "STORAGE", True),
        ("STORAGE", "LOCAL", "STORAGE", True),
        ("STORAGE", "REMOTE", "REMOTE_STORAGE", True),
        ("FS", "remote", "REMOTE_STORAGE", True),  # vLLM 0.26's name
        ("CPU", "REMOTE", "REMOTE_CPU", True),
        ("GPU", "REMOTE", "GPU@REMOTE", False),  # the device cache is the replica's own
        ("STORAGE", "NEARBY", "STORAGE@NEARBY", False),
        ("hbm3", "REMOTE", "HBM3@REMOTE", False),
    ],
)
def test_a_tiers_name_of_its_medium_and_locality(medium, locality, name, known):
    assert tier_name(medium, locality) == (name, known)
    assert is_shared_tier(name) == (known and locality is not None and locality.upper() == "REMOTE")


@pytest.mark.parametrize(
    ("medium", "locality", "ownership", "name", "shared"),
    [
        ("CPU", None, "kvcr", "CPU/kvcr", False),
        ("STORAGE", "LOCAL", "kvcr", "STORAGE/kvcr", False),
        ("STORAGE", "REMOTE", "kvcr", "REMOTE_STORAGE/kvcr", True),
        ("SHARED_STORAGE", "REMOTE", "kvcr", "REMOTE_SHARED_STORAGE/kvcr", True),
        ("SHARED_STORAGE", None, "kvcr", "SHARED_STORAGE/kvcr", True),
        ("GPU", None, "kvcr", "GPU", False),  # the device cache is no secondary tier's
        ("CPU", None, " ", "CPU", False),
        ("CPU", None, "x" * 40, "CPU/" + "x" * 16, False),  # cut, so the name fits its column
    ],
)
def test_a_secondary_tier_that_names_itself_is_a_tier_apart(medium, locality, ownership, name, shared):
    assert tier_name(medium, locality, ownership) == (name, True)
    assert is_shared_tier(name) == shared


def test_the_sessions_vllm_032_puts_on_its_stores_own_the_blocks(tmp_path):
    """vLLM 0.32's own structs (`tests/fixtures/vllm-tiers/record.py`): its block pool names the request's session on
    each store, and with `kv_cache_report_mode="full"` reports reused blocks again under the session that reused
    them. Both sessions own the shared prefix: its eviction is a loss of each (one row per owner, the first marked),
    the reuse report counted as a block announced again, with no inference needed."""
    store, writer, ingest = _ingested(VLLM_TIERS.with_name("sessions.jsonl"), tmp_path)
    assert ingest.num_repeated_stores == 2
    assert {s: (f.stored, f.removed, f.resident) for s, f in ingest.chains.footprints.items()} == {
        "s1": (2, 2, 0),
        "s2": (3, 3, 0),
    }
    writer.close()
    removed = store.reads.kv_events(kinds=["removed"])
    owners = sorted(zip(removed["block_hash"], removed["session_id"], removed["first_owner"]))
    assert owners == [(0x1111, "s1", 1), (0x1111, "s2", 0), (0x2222, "s1", 1), (0x2222, "s2", 0), (0x4444, "s2", 1)]
    stored = store.reads.kv_events(kinds=["stored"])  # the reuse report: rows of s2, not the blocks' first stores
    firsts = sorted(zip(stored["block_hash"], stored["session_id"], stored["first_owner"]))
    assert firsts == [(0x1111, "s1", 1), (0x1111, "s2", 0), (0x2222, "s1", 1), (0x2222, "s2", 0), (0x4444, "s2", 1)]
