"""vLLM's adapter at the door: what `kvobs.vllm.normalize` decides, so no reader after it looks at vLLM's wire."""

from __future__ import annotations

from kvobs.block_events import Cleared, Placeholder, Removed, Stored
from kvobs.identifiers import MAX_ID_BYTES
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import decode, normalize
from tests.collectors.recorded import kv_messages


def _stored(hashes, parent=None, *, tokens=16, medium="GPU", lora_name=None, **fields) -> wire.BlockStored:
    return wire.BlockStored(hashes, parent, [1] * tokens * len(hashes), tokens, None, medium, lora_name, **fields)


def test_an_offload_placeholder_is_flagged_and_a_self_describing_store_is_not():
    placeholder = wire.BlockStored([7, 8], None, [], 0, None, "CPU", None)
    described = _stored([7, 8], medium="cpu")  # vLLM's self-describing offload
    events = normalize(wire.KVEventBatch(1.0, [placeholder, described])).events
    assert events[0] == Placeholder([7, 8], "CPU")
    assert type(events[1]) is Stored and (events[1].medium, events[1].hashes) == ("CPU", [7, 8])


def test_hashes_become_the_store_s_unsigned_64_bit_ints_whatever_form_they_came_in():
    digest = bytes(range(32))
    batch = wire.KVEventBatch(1.0, [_stored([-5, digest], parent=-1), wire.BlockRemoved([digest, 2**63], "GPU")])
    stored, removed = normalize(batch).events
    low = int.from_bytes(digest[-8:], "big")
    assert (stored.hashes, stored.parent) == ([2**64 - 5, low], 2**64 - 1)
    assert removed.hashes == [low, 2**63]


def test_ids_and_names_are_cut_to_a_column_and_a_cut_is_said():
    long_id = "s" * (MAX_ID_BYTES + 10)
    fits = "é" * (MAX_ID_BYTES // 2)  # over a quarter of the bytes in characters, and still fits
    batch = normalize(
        wire.KVEventBatch(
            1.0,
            [
                _stored([1], session_id=long_id, lora_name="x" * 999),
                _stored([2], session_id="s1"),
                _stored([3], session_id=fits),
            ],
        )
    )
    cut, whole, kept = batch.events
    assert batch.ids_cut == 1 and len(cut.session_id.encode()) == MAX_ID_BYTES and cut.session_id != long_id
    assert len(cut.lora_name.encode()) == MAX_ID_BYTES
    assert (whole.session_id, whole.lora_name, kept.session_id) == ("s1", None, fits)


def test_consecutive_removals_of_one_tier_group_and_reason_are_one_event_in_the_stream_s_order():
    events = [
        wire.BlockRemoved([1], "GPU", 0),
        wire.BlockRemoved([2], "GPU", 0),
        wire.BlockRemoved([10], "gpu", 0),  # the same tier by its one name: its own event, as sent
        wire.BlockRemoved([3], "GPU", 0, reason="session_release"),
        wire.BlockRemoved([4], "GPU", 0, reason="not ours"),  # not a kvobs reason: none, as vLLM's
        wire.BlockRemoved([5], "GPU", 1),
        wire.BlockRemoved([6], "CPU", 1),
        _stored([7]),
        wire.BlockRemoved([8], "CPU", 1),  # after a store: its own event (order is kept)
        wire.AllBlocksCleared(),
        wire.BlockRemoved([9], "CPU", 1),
    ]
    decoded = decode(wire.encode_batch(wire.KVEventBatch(1.0, events, 0)))
    assert decoded.num_events == len(events) and (decoded.unknown, decoded.refused) == (0, 0)
    assert decoded.batch.events == [
        Removed([1, 2], "GPU", 0, None),
        Removed([10], "GPU", 0, None),
        Removed([3], "GPU", 0, "session_release"),
        Removed([4], "GPU", 0, None),
        Removed([5], "GPU", 1, None),
        Removed([6], "CPU", 1, None),
        decoded.batch.events[6],
        Removed([8], "CPU", 1, None),
        Cleared(),
        Removed([9], "CPU", 1, None),
    ]
    assert isinstance(decoded.batch.events[6], Stored) and decoded.batch.events[6].hashes == [7]


def test_the_recorded_vllm_stream_keeps_every_block_and_every_field_it_sent():
    for message in kv_messages():
        raw = wire.decode_batch(message.frames[2]).batch
        decoded = decode(message.frames[2])
        assert decoded.num_events == len(raw.events) and decoded.batch.ts == raw.ts
        sent = [(type(e).__name__, h) for e in raw.events for h in getattr(e, "block_hashes", [None])]
        kept = [(_wire_name(e), h) for e in decoded.batch.events for h in getattr(e, "hashes", [None])]
        assert kept == [(kind, None if h is None else wire.as_uint64(h)) for kind, h in sent]
        for before, after in zip((e for e in raw.events if type(e) is wire.BlockStored), _of(decoded, Stored)):
            assert (after.block_size, after.session_id, after.group_idx) == (
                before.block_size,
                before.session_id,
                before.group_idx,
            )
            assert after.medium == before.medium.upper()


def _wire_name(event) -> str:
    return {Stored: "BlockStored", Removed: "BlockRemoved", Cleared: "AllBlocksCleared"}[type(event)]


def _of(decoded, kind) -> list:
    return [e for e in decoded.batch.events if type(e) is kind]
