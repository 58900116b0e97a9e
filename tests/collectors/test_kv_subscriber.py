"""The KV-event subscriber on the recorded frames through real ZMQ sockets: connect mode, gaps filled by
replay in both reply forms, garbage counted and skipped, a publisher restart."""

from __future__ import annotations

import time

import msgspec
import pytest

from collectors.drops import DropCounter
from collectors.kv.subscriber import KVEventSubscriber
from kvobs.block_events import Batch, Removed, Stored
from kvobs.vllm import kv_events as wire
from tests.collectors.recorded import kv_messages
from tests.collectors.replay import publisher, replay_router, wait_subscribed
from tests.server.conftest import free_port
from tests.waiting import wait_for


class Received:
    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.num_blocks = 0  # block hashes stored or removed, and clears
        self.restarts = 0

    def __call__(self, seq: int, batch: Batch) -> None:
        self.seqs.append(seq)
        self.num_blocks += sum(len(e.hashes) if isinstance(e, Stored | Removed) else 1 for e in batch.events)

    def restarted(self) -> None:
        self.restarts += 1


def recorded_event_count() -> int:
    return sum(len(msgspec.msgpack.decode(m.frames[2])[1]) for m in kv_messages())


def recorded_block_count() -> int:
    """Block hashes the recording stores or removes, and its clears, read from the raw msgpack."""
    events = [e for m in kv_messages() for e in msgspec.msgpack.decode(m.frames[2])[1]]
    return sum(len(e["block_hashes"]) if "block_hashes" in e else 1 for e in events)


def run(
    frames: list[tuple[bytes, ...]],
    *,
    bind_subscriber: bool,
    replay: str | None = None,
    expect: int,
    lost_in_transit: set[int] = frozenset(),
    published: list | None = None,
) -> tuple:
    """Publish `frames` (those at `lost_in_transit` indexes never reach the subscriber, but count as published
    for replay); return what the subscriber delivered."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    got, drops = Received(), DropCounter()
    with publisher(endpoint, bind=not bind_subscriber) as pub:
        subscriber = KVEventSubscriber(
            endpoint, got, drops, bind=bind_subscriber, replay_endpoint=replay, on_restart=got.restarted
        )
        subscriber.start()
        try:
            wait_subscribed(pub)
            for i, message in enumerate(frames):
                if published is not None:
                    published.append(message)
                if i not in lost_in_transit:
                    pub.send_multipart(message)
                    time.sleep(0.002)  # a live stream, not a burst: replays happen while it goes on
            wait_for(lambda: len(got.seqs) >= expect, timeout_s=10)
        finally:
            subscriber.stop()
    return got, drops, subscriber


def test_connect_mode_receives_every_recorded_batch_in_order():
    frames = [m.frames for m in kv_messages()]
    got, drops, subscriber = run(frames, bind_subscriber=False, expect=len(frames))
    assert got.seqs == list(range(len(frames)))
    assert subscriber.num_events == recorded_event_count() == 102 + 171 + 1  # the fixture README's totals
    assert got.num_blocks == recorded_block_count()  # every block handed on, consecutive removals merged or not
    assert drops.totals() == {} and subscriber.num_gaps == 0


@pytest.mark.parametrize("form", ["0.33", "0.24"])
def test_dropped_frames_are_recovered_through_replay(form):
    frames = [m.frames for m in kv_messages()]
    dropped = {5, 6, 7, 40, 100}
    replay, published = f"tcp://127.0.0.1:{free_port()}", []
    with replay_router(replay, published, form=form) as asked:
        got, drops, subscriber = run(
            frames,
            bind_subscriber=True,
            replay=replay,
            expect=len(frames),
            lost_in_transit=dropped,
            published=published,
        )
    assert got.seqs == list(range(len(frames)))  # every batch once, in order
    assert subscriber.num_events == recorded_event_count() and got.num_blocks == recorded_block_count()
    assert asked == [5, 40, 100] and subscriber.num_gaps == 3 and subscriber.num_lost == 0
    assert subscriber.num_replayed == len(dropped) and drops.totals() == {}


def test_a_lost_tail_no_later_batch_reveals_is_recovered_through_replay():
    """The last batches of a burst never arrive and nothing comes after them: the quiet stream is checked."""
    frames = [m.frames for m in kv_messages()]
    replay, published = f"tcp://127.0.0.1:{free_port()}", []
    tail = set(range(len(frames) - 4, len(frames)))
    with replay_router(replay, published, form="0.33") as asked:
        got, drops, subscriber = run(
            frames, bind_subscriber=True, replay=replay, expect=len(frames), lost_in_transit=tail, published=published
        )
    assert got.seqs == list(range(len(frames)))
    assert asked == [min(tail)] and subscriber.num_tail_recovered == len(tail) == subscriber.num_replayed
    assert subscriber.num_gaps == 0 and subscriber.num_lost == 0 and drops.totals() == {}


def test_a_gap_without_replay_is_counted_as_lost():
    frames = [m.frames for m in kv_messages()][:20]
    live = frames[:3] + frames[6:]
    got, _, subscriber = run(live, bind_subscriber=True, expect=len(live))
    assert got.seqs == [0, 1, 2, *range(6, 20)]
    assert subscriber.num_gaps == 1 and subscriber.num_lost == 3


def test_garbage_is_counted_and_skipped_and_the_stream_goes_on():
    frames = [m.frames for m in kv_messages()][:6]
    topic, _, payload = frames[0]
    unknown = msgspec.msgpack.encode([1.0, [{"type": "BlockMoved", "block_hashes": [1]}], 0])
    bad = [
        frames[0],
        (topic, wire.seq_bytes(1)),  # two frames
        (topic, b"\x01\x02", payload),  # short sequence frame
        (topic, wire.seq_bytes(1), b"\xc1garbage"),  # not msgpack
        (topic, wire.seq_bytes(2), msgspec.msgpack.encode({"ts": 1.0})),  # msgpack, not a batch
        (topic, wire.seq_bytes(3), unknown),  # an event type from the future
        (topic, wire.seq_bytes(4), payload[: len(payload) // 2]),  # truncated
        *[(t, wire.seq_bytes(i), p) for i, (t, _, p) in enumerate(frames[5:], start=5)],
    ]
    got, drops, _ = run(bad, bind_subscriber=True, expect=3)
    assert got.seqs == [0, 3, 5]  # the batch with only an unknown event still arrives (empty)
    assert drops.get("kv_events", "bad_frame_count") == 1
    assert drops.get("kv_events", "bad_sequence") == 1
    assert drops.get("kv_events", "malformed_batch") == 3
    assert drops.get("kv_events", "unknown_event_type") == 1


def test_a_publisher_restart_is_recognised():
    frames = [m.frames for m in kv_messages()]
    stream = frames[:10] + frames[:5]  # the publisher came back and numbers from 0 again
    got, _, subscriber = run(stream, bind_subscriber=True, expect=len(stream))
    assert got.seqs == [*range(10), *range(5)]
    assert got.restarts == subscriber.num_restarts == 1


def test_a_restart_that_missed_its_first_batches_is_recognised_by_what_follows():
    """The subscriber joins the restarted publisher late: numbers go back to 3, then 4, 5 (not to 0)."""
    frames = [m.frames for m in kv_messages()]
    stream = frames[:10] + frames[3:8]
    got, drops, subscriber = run(stream, bind_subscriber=True, expect=len(stream))
    assert got.seqs == [*range(10), *range(3, 8)]
    assert got.restarts == subscriber.num_restarts == 1 and drops.totals() == {}


def test_a_duplicated_sequence_number_is_skipped_not_taken_for_a_restart():
    """The probe's F8: one repeated number (5 after 9) used to clear every session's blocks and count false losses."""
    frames = [m.frames for m in kv_messages()]
    stream = frames[:10] + [frames[5]] + frames[10:15]
    got, drops, subscriber = run(stream, bind_subscriber=True, expect=15)
    assert got.seqs == list(range(15))
    assert got.restarts == subscriber.num_restarts == 0 and subscriber.num_lost == subscriber.num_gaps == 0
    assert drops.get("kv_events", "duplicate_sequence") == 1


def test_a_tail_batch_that_arrives_live_after_its_replay_is_dropped_not_taken_for_a_restart():
    """CI's flake (stop 58): the quiet-stream check replayed batch 7 while its live copy was still on the way; that
    copy then looked like a restart (7 after 8's expectation, then 8), which cleared every session's blocks."""
    frames = [m.frames for m in kv_messages()][:15]
    endpoint, replay, published = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}", []
    got, drops = Received(), DropCounter()
    with replay_router(replay, published, form="0.33") as asked, publisher(endpoint, bind=False) as pub:
        subscriber = KVEventSubscriber(
            endpoint, got, drops, bind=True, replay_endpoint=replay, on_restart=got.restarted, tail_check_s=0.2
        )
        subscriber.start()
        try:
            wait_subscribed(pub)
            for message in frames[:7]:
                published.append(message)
                pub.send_multipart(message)
            published.append(frames[7])  # in the replay buffer; its live copy is late
            wait_for(lambda: subscriber.num_tail_recovered == 1, timeout_s=10)
            for message in frames[7:]:
                if message is not frames[7]:
                    published.append(message)
                pub.send_multipart(message)
            wait_for(lambda: len(got.seqs) >= 15, timeout_s=10)
            time.sleep(0.3)  # (anything delivered twice would show by now)
        finally:
            subscriber.stop()
    assert asked[0] == 7 and subscriber.num_tail_recovered == 1  # (a later quiet spell asks from 15: nothing more)
    assert got.seqs == list(range(15))
    assert got.restarts == subscriber.num_restarts == 0 and subscriber.num_lost == subscriber.num_gaps == 0
    assert drops.totals() == {}
