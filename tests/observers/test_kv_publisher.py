"""The KV-event publisher on real ZMQ sockets: engine events in, vLLM frames out, replay on request."""

from __future__ import annotations

import time
from dataclasses import replace

import msgspec
import pytest
import zmq

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import SchedulerStats, StepResult
from instrumented_engine.observers.kv_publisher import KVEventPublisher, to_wire_events
from kvobs.vllm import kv_events as wire
from tests.server.conftest import free_port

STATS = SchedulerStats(0.0, 0, 0, 10, 10, 0, 0.0, 0, 0, 0, 0)
STORED = ev.BlocksStored(
    1.0,
    "r1",
    "s1",
    block_ids=(1, 2),
    block_hashes=(2**64 - 5, 17),
    parent_block_hash=None,
    token_ids=tuple(range(8)),
    block_size=4,
    medium="GPU",
)
EVICTED = ev.BlockEvicted(
    2.0,
    "r2",
    "s2",
    block_id=2,
    block_hash=17,
    parent_block_hash=2**64 - 5,
    reason="capacity",
    owner_sessions=("s1",),
    lifetime_s=1.0,
    idle_s=0.5,
    medium="CPU",
)
LOOKUP = ev.PrefixLookup(1.0, "r1", "s1", query_tokens=9, hit_tokens=0, hit_blocks=0)
CLEARED = ev.CacheCleared(3.0, None, None, num_blocks=1)


def test_engine_events_map_to_vllm_events():
    stored, removed, cleared = to_wire_events([LOOKUP, STORED, EVICTED, CLEARED])
    assert stored == wire.BlockStored(
        block_hashes=[2**64 - 5, 17],
        parent_block_hash=None,
        token_ids=list(range(8)),
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None, None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
        session_id="s1",
    )
    assert removed == wire.BlockRemoved(block_hashes=[17], medium="CPU", group_idx=0)  # each event's own tier
    assert isinstance(cleared, wire.AllBlocksCleared)


class _VllmBlockRemoved(msgspec.Struct, omit_defaults=True, gc=False, tag="BlockRemoved"):
    """vLLM's own BlockRemoved (vllm/distributed/kv_events.py): no `reason`."""

    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


def test_a_removal_not_for_room_says_why_and_a_vllm_subscriber_still_reads_it():
    """kvobs's `reason` on BlockRemoved: absent from an eviction for room (the bytes are vLLM's), present on a session
    release or an invalidation; vLLM's own struct decodes either (an unknown map key is ignored)."""
    released = replace(EVICTED, reason="session_release")
    invalidated = replace(EVICTED, reason="invalidation", invalidation_reason="weights_update")
    plain, release, invalidation = to_wire_events([EVICTED, released, invalidated])
    assert (plain.reason, release.reason, invalidation.reason) == (None, "session_release", "weights_update")
    vllm_bytes = msgspec.msgpack.encode(_VllmBlockRemoved([17], "CPU", 0))
    assert msgspec.msgpack.encode(plain) == vllm_bytes
    vllm_decoder = msgspec.msgpack.Decoder(_VllmBlockRemoved)
    assert vllm_decoder.decode(msgspec.msgpack.encode(release)) == _VllmBlockRemoved([17], "CPU", 0)


def test_omit_token_ids_keeps_the_prompt_off_the_wire_and_everything_else():
    """The probe's F7: a subscriber decoded a prompt with a password from the token ids."""
    (full,) = to_wire_events([STORED])
    (bare,) = to_wire_events([STORED], omit_token_ids=True)
    assert bare.token_ids == [] and full.token_ids == list(range(8))
    assert (bare.block_hashes, bare.parent_block_hash, bare.block_size, bare.session_id) == (
        full.block_hashes,
        full.parent_block_hash,
        full.block_size,
        full.session_id,
    )


def test_a_steps_events_of_different_moments_go_in_batches_of_their_own_in_order():
    """An eviction while scheduling, the stores after the forward pass: each batch holds one moment's events and
    carries its time, so a subscriber places a loss when it happened, not when the step's events were sent."""
    ctx = zmq.Context.instance()
    port = free_port()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.bind(f"tcp://127.0.0.1:{port}")
    publisher = KVEventPublisher(f"tcp://127.0.0.1:{port}")
    publisher.start()
    try:
        probes = _publish_until_delivered(publisher, sub)
        evicted, stored = replace(EVICTED, ts=10.0), replace(STORED, ts=10.4)
        publisher.on_step(StepResult([], STATS, [evicted, replace(LOOKUP, ts=10.2), stored, replace(stored, ts=10.4)]))
        got = _recv_batches(sub, 2)
        assert [seq for _, seq, _ in got] == [probes, probes + 1]
        assert [(b.ts, [type(e).__name__ for e in b.events]) for _, _, b in got] == [
            (10.0, ["BlockRemoved"]),
            (10.4, ["BlockStored", "BlockStored"]),
        ]
    finally:
        publisher.close()
        sub.close(0)


def _recv_batches(sock: zmq.Socket, count: int) -> list[tuple[bytes, int, wire.KVEventBatch]]:
    out = []
    for _ in range(count):
        topic, seq, payload = sock.recv_multipart()
        out.append((topic, wire.seq_from_bytes(seq), wire.decode_batch(payload)[0]))
    return out


def _publish_until_delivered(publisher: KVEventPublisher, sub: zmq.Socket) -> int:
    """A PUB drops what it sends before the SUB's subscription has reached it, and nothing on either side says when
    that is: publish probe batches until one arrives, then take the rest (all later ones arrive, in order).
    Returns how many were published, which is the next batch's seq."""
    sent = 0
    deadline = time.monotonic() + 10
    while not sub.poll(100):
        assert time.monotonic() < deadline, "no batch reached the subscriber in 10 s"
        publisher.on_step(StepResult([], STATS, [STORED]))
        sent += 1
    first = _recv_batches(sub, 1)[0][1]
    assert first < sent
    _recv_batches(sub, sent - 1 - first)
    return sent


def test_connects_to_a_bound_subscriber_and_replays_both_envelopes():
    ctx = zmq.Context.instance()
    port, replay_port = free_port(), free_port()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.bind(f"tcp://127.0.0.1:{port}")  # a concrete address: the publisher must connect (vLLM's rule)
    publisher = KVEventPublisher(
        f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic="kv"
    )
    publisher.start()
    try:
        probes = _publish_until_delivered(publisher, sub)
        publisher.on_step(StepResult([], STATS, [LOOKUP, STORED]))
        publisher.on_step(StepResult([], STATS, [LOOKUP]))  # nothing vLLM would publish: no message
        publisher.on_step(StepResult([], STATS, [EVICTED, replace(CLEARED, ts=EVICTED.ts)]))
        (t0, s0, b0), (t1, s1, b1) = _recv_batches(sub, 2)
        assert (t0, s0, t1, s1) == (b"kv", probes, b"kv", probes + 1)  # one seq a published batch, none skipped
        assert b0.data_parallel_rank == 0 and b0.events[0].session_id == "s1"
        assert (b0.ts, b1.ts) == (STORED.ts, EVICTED.ts)  # each batch at its events' own time, not the send's
        assert [type(e).__name__ for e in b1.events] == ["BlockRemoved", "AllBlocksCleared"]

        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 5000)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", wire.seq_bytes(probes + 1)])  # REQ-style envelope: the reply keeps it
        replayed = dealer.recv_multipart()
        assert replayed[0] == b"" and replayed[1] == b"kv" and wire.seq_from_bytes(replayed[2]) == probes + 1
        assert wire.decode_batch(replayed[3])[0] == b1
        assert dealer.recv_multipart() == [b"", b"", wire.REPLAY_END, b""]
        dealer.send_multipart([wire.seq_bytes(probes)])  # bare DEALER: no delimiter either way
        assert [wire.seq_from_bytes(dealer.recv_multipart()[1]) for _ in range(2)] == [probes, probes + 1]
        assert dealer.recv_multipart() == [b"", wire.REPLAY_END, b""]
        dealer.close(0)
    finally:
        publisher.close()
        sub.close(0)


def test_unusable_endpoint_is_reported_at_start():
    port = free_port()
    blocker = zmq.Context.instance().socket(zmq.PUB)
    blocker.bind(f"tcp://127.0.0.1:{port}")
    try:
        with pytest.raises(OSError, match="cannot open the KV-event socket"):
            KVEventPublisher(f"tcp://*:{port}").start()
    finally:
        blocker.close(0)
