"""TensorRT-LLM's KV-cache events through kvobs's door: the JSON its server answers on `POST /kv_cache_events`
(`tests/fixtures/trtllm`, in the form of TensorRT-LLM's own serializer) normalized by its adapter, and fetched by a
collector from a real HTTP server into the store, tiers, gaps and bad events counted; and the same events as
NVIDIA Dynamo's TensorRT-LLM publisher pushes them over ZMQ in vLLM's wire."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from collectors.collector import Collector, CollectorOptions
from kvobs.block_events import Cleared, Placeholder, Removed, Stored, UnknownTier
from kvobs.store import open_store
from kvobs.trtllm.normalize import TrtllmAdapter
from tests.collectors.replay import publisher, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for

POLLS_DIR = Path(__file__).parents[1] / "fixtures" / "trtllm"
POLLS = json.loads((POLLS_DIR / "kv_cache_events.json").read_text())
BIG = 2**64 - 5


def test_the_adapter_normalizes_each_kind_of_event():
    adapter = TrtllmAdapter()
    first = adapter.decode(json.dumps(POLLS[0]).encode(), ts=100.0)
    assert first.batch.ts == 100.0 and (first.unknown, first.refused, first.num_events) == (0, 0, 3)
    assert first.batch.events == [
        Cleared(),
        Stored([11, 12, BIG], None, 4, "GPU", 0, None),
        Stored([21], 11, 4, "GPU", 0, None),
    ]
    second = adapter.decode(json.dumps(POLLS[1]).encode(), ts=200.0)
    assert (second.unknown, second.refused, second.num_events) == (1, 1, 5)
    assert second.batch.events == [
        Removed([12], "GPU", 0, None),  # moved to the secondary pool: off the device, onto the host,
        Stored([12], 11, 4, "CPU", 0, None),  # its parent and size as stored
        Removed([99], "GPU", 0, None),  # a block never seen moves as a hash that reached the tier
        Placeholder([99], "CPU"),
        Removed([12], "CPU", 0, None),  # each removal from the level its block was last on
        Removed([BIG], "GPU", 0, None),
        UnknownTier([31], "LEVEL2"),  # a third level is no tier kvobs knows: failed closed
    ]
    assert (adapter.first_event_id, adapter.last_event_id) == (3, 9)


def _engine(answers: list[list]) -> tuple[ThreadingHTTPServer, list[str]]:
    """A server answering `POST /kv_cache_events` with each of `answers` in turn, then `[]`; the paths it was asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            asked.append(self.path)
            body = json.dumps(answers.pop(0) if answers else []).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, asked


def test_a_collector_fetches_them_into_the_store(tmp_path):
    """`--kv-events NAME=http://...`: the collector calls the engine, and its rows are those of any engine's stream;
    events the engine's full queue dropped (a jump in `event_id`) are counted as lost, bad events counted alone."""
    later = [{"event_id": 12, "data": {"type": "removed", "block_hashes": [21]}, "window_size": 4096}]  # 10, 11 lost
    server, asked = _engine([*POLLS, later])
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    options = CollectorOptions(kv_events=[f"trt=http://127.0.0.1:{server.server_port}"], interval_s=3600)
    collector = Collector(options, store=store)
    collector.start()
    try:
        (stream,) = collector.streams
        wait_for(lambda: stream.subscriber.num_batches == 3 and len(asked) > 3)
    finally:
        collector.stop()
        server.shutdown()
    poller = stream.subscriber
    assert set(asked) == {"/kv_cache_events"} and (poller.num_lost, poller.num_gaps, poller.num_restarts) == (2, 1, 0)
    assert dict(poller.shapes) == {"trtllm-json": 3} and poller.num_events == 3 + 5 + 1
    assert poller.lag_s is None  # its events carry no time: the lag is not known, never shown as 0
    assert collector.drops.totals()["kv_events"] == 2  # the unknown type and the stored event without blocks
    assert stream.ingest.unknown_tiers == {"LEVEL2": 1}
    events = store.reads.kv_events()
    assert set(events["instance"]) == {"trt"}
    stored = events[events["kind"].isin(["stored", "tier_stored"])]
    assert sorted(zip(stored["kind"], stored["block_hash"], stored["medium"])) == sorted(
        [("stored", 11, "GPU"), ("stored", 12, "GPU"), ("stored", BIG, "GPU"), ("stored", 21, "GPU")]
        + [("tier_stored", 12, "CPU")]  # a move to the host tier: a copy there, no block of the device cache's
        + [("tier_stored", 99, "CPU")]  # a block never seen stored moved there: its hash alone (a placeholder)
    )
    removed = events[events["kind"].isin(["removed", "tier_removed"])]
    assert sorted(zip(removed["kind"], removed["block_hash"], removed["medium"])) == sorted(
        [("removed", 12, "GPU"), ("removed", 99, "GPU"), ("removed", BIG, "GPU"), ("removed", 21, "GPU")]
        + [("tier_removed", 12, "CPU")]  # 99: on the device, as its move says
    )
    assert "KV events trt: connect http://127.0.0.1:" in collector.describe()


DYNAMO_FRAMES = [json.loads(line) for line in (POLLS_DIR / "dynamo_frames.jsonl").read_text().splitlines()]


def test_the_same_events_pushed_by_dynamos_relay_are_read_as_vllms_wire(tmp_path):
    """The fixture's events as NVIDIA Dynamo 1.6.1's TensorRT-LLM publisher sends them with its consolidator on
    (`record_dynamo.py`: Dynamo's own `Publisher` and `ZmqKvEventPublisher`): vLLM's wire over ZMQ, read by the
    collector's subscriber as any vLLM's. What the relay leaves out is left out: it drops cache-level moves
    (`updated`), so a block moved to the host pool stays on the device until its removal, and reads a block on any
    level as stored, so only the HTTP poll says tiers."""
    assert {f["dynamo"] for f in DYNAMO_FRAMES} == {"1.6.1"}
    port = free_port()
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    collector = Collector(
        CollectorOptions(kv_events=[f"trt=tcp://127.0.0.1:{port}"], kv_events_bind=True, interval_s=3600), store=store
    )
    collector.start()
    try:
        with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub:
            wait_subscribed(pub)
            for frame in DYNAMO_FRAMES:
                pub.send_multipart(
                    [frame["topic"].encode(), frame["seq"].to_bytes(8, "big"), bytes.fromhex(frame["payload"])]
                )
            (stream,) = collector.streams
            wait_for(lambda: stream.subscriber.num_batches == len(DYNAMO_FRAMES))
    finally:
        collector.stop()
    subscriber = stream.subscriber
    assert dict(subscriber.shapes) == {"array batch, map events": 4}
    assert (subscriber.num_lost, collector.drops.totals().get("kv_events", 0)) == (0, 0)
    events = store.reads.kv_events()
    assert set(events["medium"]) == {None}  # no medium named: the device cache's blocks; no tier rows
    stored = sorted(events[events["kind"] == "stored"]["block_hash"])
    removed = sorted(events[events["kind"] == "removed"]["block_hash"])
    assert stored == sorted([11, 12, BIG, 21, 31])  # 31: on cache level 2, which the poll fails closed
    assert removed == sorted([12, BIG])  # 12 at its removal, not at its move to the host pool
    chained = events[events["kind"] == "stored"].set_index("block_hash")["parent_hash"]
    assert chained[21] == 11 and chained[BIG] == 12  # signed on the wire, the same unsigned hashes as the poll's
