"""A KV stream's blocks that name no session, handed to a session later (`KVIngest.adopt`, ownership by inference):
a resident block becomes the session's (its footprint); a removal of one is held until its session may be known,
then stored with the session it was given, or with none, and never lost; a held removal given a session counts
as that session's loss (in a tool pause where it fell in one), and its loss span names the session."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collectors.kv.bridge import KVSpanBridge
from collectors.kv.ingest import KVIngest
from collectors.session_activity import SessionActivity
from kvobs.semconv import attributes as a
from kvobs.store import StoreWriter
from tests.collectors.test_kv_streams import _removed, _stored


def test_blocks_that_named_no_session_are_adopted_resident_or_held(store):
    now = [0.0]
    activity = SessionActivity(clock=lambda: now[0])
    # its first request, then a pause, then its next
    activity.add_request(f"{1:032x}", f"{1:016x}", 0.0, 1.0, session_id="trip")
    activity.add_request(f"{2:032x}", f"{2:016x}", 9.0, 10.0, session_id="trip")
    writer = StoreWriter(store)
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    bridge = KVSpanBridge(provider.get_tracer("kv"), activity)
    ingest = KVIngest(writer, instance="vllm", activity=activity, bridge=bridge, settle_s=1.0, clock=lambda: now[0])
    ingest.infer_owners(hold_s=30.0, recent_s=100.0)
    ingest.on_batch(0, _stored(0.5, None, 10))  # blocks 10 and 11, naming no session
    ingest.on_batch(1, _stored(0.6, None, 20))  # 20 and 21: never given a session
    now[0] = 3.0
    ingest.on_batch(2, _removed(3.0, 11, 21))  # in the pause: held, not written yet
    ingest.snapshot()
    writer.flush()
    assert store.reads.kv_events(kinds=["removed"]).empty and not exported.get_finished_spans()  # removals held

    stores = ingest.recent_stores()
    assert stores["block_hash"].tolist() == [10, 11, 20, 21] and stores["session_id"].isna().all()
    assert ingest.adopt({("vllm", 10, 0.5): "trip", ("vllm", 11, 0.5): "trip"}) == 2  # one resident, one held
    footprint = ingest.chains.footprints["trip"]
    assert (footprint.stored, footprint.resident, footprint.removed) == (2, 1, 1)

    now[0] = 40.0  # the hold has passed: both removals stored, one with the session it was given
    ingest.snapshot()
    now[0] = 42.0  # and, settled, its loss was in the session's tool pause (its next request came)
    ingest.snapshot()
    writer.close()
    removed = store.reads.kv_events(kinds=["removed"]).set_index("block_hash")["session_id"]
    assert removed.astype(object).where(removed.notna(), None).to_dict() == {11: "trip", 21: None}
    # the stores keep what they named (none): the pages tie them to sessions as they read, and say so
    assert store.reads.kv_events(kinds=["stored"])["session_id"].isna().all()
    # the loss span of the held removal names the session its block was tied to, once the hold passed
    spans = exported.get_finished_spans()
    assert [tuple(s.attributes[a.KV_SESSIONS_AFFECTED]) for s in spans] == [("trip",)]
    assert [link.context.span_id for link in spans[0].links] == [2]  # the session's latest request when it was made
    latest = store.reads.session_snapshots("trip").iloc[-1]
    assert (latest["session_blocks"], latest["session_evicted_blocks"], latest["session_evicted_idle_blocks"]) == (
        1,
        1,
        1,
    )
