"""vLLM's KV-event wire format against frames recorded from a real vLLM 0.32."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgspec
import pytest

from kvobs.vllm import kv_events as wire

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"


def recorded_frames() -> list[list[bytes]]:
    with open(FIXTURES / "kv_events.jsonl") as f:
        return [[base64.b64decode(x) for x in json.loads(line)["frames_b64"]] for line in f]


def test_recorded_stream_decodes_with_the_counts_vllm_reported():
    kinds: dict[str, int] = {}
    seqs = []
    for topic, seq, payload in recorded_frames():
        assert topic == b"kv"
        seqs.append(wire.seq_from_bytes(seq))
        batch, unknown, _, _ = wire.decode_batch(payload)
        assert unknown == 0 and batch.data_parallel_rank == 0
        for event in batch.events:
            kinds[type(event).__name__] = kinds.get(type(event).__name__, 0) + 1
    # the fixture README: 102 BlockStored, 171 BlockRemoved, 1 AllBlocksCleared; sequence numbers from 0
    assert kinds == {"BlockStored": 102, "BlockRemoved": 171, "AllBlocksCleared": 1}
    assert seqs == list(range(len(seqs)))


def test_our_structs_encode_vllm_frames_byte_for_byte():
    for _, _, payload in recorded_frames():
        batch = wire.decode_batch(payload).batch
        assert wire.encode_batch(batch) == payload


def test_stored_event_fields_and_unsigned_hashes():
    _, _, payload = recorded_frames()[0]
    batch = wire.decode_batch(payload).batch
    stored = batch.events[0]
    assert isinstance(stored, wire.BlockStored)
    sessions = {step["session"] for step in json.loads((FIXTURES / "agent_steps.json").read_text())}
    assert stored.session_id in sessions and stored.block_size == 128 and stored.parent_block_hash is None
    assert len(stored.token_ids) == 128 * len(stored.block_hashes)
    assert any(h > 2**63 - 1 for h in stored.block_hashes)  # unsigned 64-bit, beyond int64


def test_positional_events_of_older_releases_decode():
    older = msgspec.msgpack.encode(
        [
            1.5,
            [
                ["BlockStored", [7, 8], None, list(range(32)), 16, None, "GPU", None],
                # every field, in vLLM 0.32's declaration order (locality, ownership, then session_id), and one more
                [
                    "BlockStored",
                    [9],
                    8,
                    list(range(16)),
                    16,
                    None,
                    "GPU",
                    None,
                    None,
                    0,
                    None,
                    None,
                    None,
                    None,
                    "s1",
                    1,
                ],
                ["BlockRemoved", [7], "GPU"],
                ["AllBlocksCleared"],
            ],
            None,
        ]
    )
    batch, unknown, _, _ = wire.decode_batch(older)
    assert unknown == 0 and batch.ts == 1.5 and batch.data_parallel_rank is None
    stored, later, removed, cleared = batch.events
    assert stored.block_hashes == [7, 8] and stored.block_size == 16 and stored.medium == "GPU"
    assert later.parent_block_hash == 8 and later.session_id == "s1"  # trailing unknown field ignored
    assert removed.block_hashes == [7] and isinstance(cleared, wire.AllBlocksCleared)


def test_bytes_hashes_unknown_fields_and_unknown_types():
    payload = msgspec.msgpack.encode(
        [
            2.0,
            [
                {"type": "BlockRemoved", "block_hashes": [b"\x01" * 32], "medium": "GPU", "new_field": 1},
                {"type": "BlockTransferred", "block_hashes": [1]},
            ],
            0,
        ]
    )
    batch, unknown, _, _ = wire.decode_batch(payload)
    assert unknown == 1
    assert batch.events == [wire.BlockRemoved(block_hashes=[b"\x01" * 32], medium="GPU")]


def test_a_list_of_hashes_maps_as_each_hash_does():
    ints = [0, 7, 2**63, 2**64 - 1, -1, -(2**63)]  # negatives: Python's built-in hash of old releases
    assert wire.as_uint64_list(ints) == [wire.as_uint64(h) for h in ints] == [0, 7, 2**63, 2**64 - 1, 2**64 - 1, 2**63]
    digests = [b"\x01" * 32, bytes(range(32))]
    assert wire.as_uint64_list(digests) == [int.from_bytes(d[-8:], "big") for d in digests]
    assert wire.as_uint64_list([]) == []
    mixed = [5, b"\x02" * 32, 2**64 - 1]  # the wire's `list[int | bytes]` allows both in one event
    assert wire.as_uint64_list(mixed) == [wire.as_uint64(h) for h in mixed]


def test_a_bad_event_is_refused_alone_and_the_batch_goes_on():
    """The probe's F2: block_size 2**63 is valid msgpack but no store column holds it; it took its batch with it."""

    def stored(h: int, block_size: int) -> dict:
        return {
            "type": "BlockStored",
            "block_hashes": [h],
            "parent_block_hash": None,
            "token_ids": [],
            "block_size": block_size,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        }

    payload = msgspec.msgpack.encode(
        [2.0, [stored(1, 16), stored(2, 2**63), {"type": "BlockStored"}, stored(3, -1), stored(-5, 16)], 0]
    )
    batch, unknown, refused, _ = wire.decode_batch(payload)
    assert (unknown, refused) == (0, 3) and [e.block_hashes for e in batch.events] == [[1], [-5]]
    assert wire.as_uint64(-5) == 2**64 - 5  # an old release's signed hash, as the store's UInt64


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00garbage",
        msgspec.msgpack.encode({"ts": 1}),
        msgspec.msgpack.encode([float("nan"), [], 0]),
        msgspec.msgpack.encode([-1.0, [], 0]),
    ],
)
def test_malformed_payloads_raise_decode_error(payload):
    with pytest.raises(wire.DecodeError):
        wire.decode_batch(payload)


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("inproc://kv", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://collector:5557", False),
    ],
)
def test_bind_or_connect_follows_vllms_rule(endpoint, binds):
    assert wire.should_bind(endpoint) is binds


# ---- every shape a vLLM sends: the batch as an array or a map, each event as a map or positional -------------
class _MapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    """The batch as vLLM's main encodes it: the same fields, as a map (no `array_like`)."""

    ts: float
    events: list
    data_parallel_rank: int | None = None


def _positional(event: wire.Event) -> list:
    """An event as releases up to 0.23 sent it: `[tag, field, ...]` in declaration order."""
    return [type(event).__name__, *(getattr(event, name) for name in event.__struct_fields__)]


def _shapes(batch: wire.KVEventBatch) -> dict[str, bytes]:
    positional = [_positional(e) for e in batch.events]
    return {
        "array batch, map events": wire.encode_batch(batch),
        "array batch, positional events": msgspec.msgpack.encode([batch.ts, positional, batch.data_parallel_rank]),
        "map batch, map events": msgspec.msgpack.encode(_MapBatch(batch.ts, batch.events, batch.data_parallel_rank)),
        "map batch, positional events": msgspec.msgpack.encode(_MapBatch(batch.ts, positional, 0)),
    }


def test_every_batch_and_event_shape_decodes_to_the_recorded_events():
    """Each of the four shapes decodes to the recorded events and is told by its name (`Decoded.shape`, what the
    collector counts per replica and `kvobs doctor` reports)."""
    for _, _, payload in recorded_frames():
        recorded = wire.decode_batch(payload).batch
        for shape, frame in _shapes(recorded).items():
            decoded, unknown, refused, seen = wire.decode_batch(frame)
            assert (unknown, refused) == (0, 0), shape
            assert seen == shape and shape in wire.WIRE_SHAPES
            assert (decoded.ts, decoded.events, decoded.data_parallel_rank) == (
                recorded.ts,
                recorded.events,
                0,
            ), shape


def test_a_map_batch_skips_an_unknown_event_and_refuses_a_bad_one_alone():
    stored = wire.BlockStored([7], None, [1] * 16, 16, None, "GPU", None)
    frame = msgspec.msgpack.encode(
        {
            "ts": 1.8e9,
            "events": [{"type": "BlockPromoted", "block_hashes": [7]}, {"type": "BlockRemoved"}, stored],
            "data_parallel_rank": 1,
        }
    )
    decoded, unknown, refused, _ = wire.decode_batch(frame)
    assert (decoded.events, decoded.data_parallel_rank, unknown, refused) == ([stored], 1, 1, 1)
    with pytest.raises(wire.DecodeError):
        wire.decode_batch(msgspec.msgpack.encode({"ts": -1.0, "events": []}))


def test_events_that_leave_optional_fields_out_decode_with_none_and_a_missing_required_one_is_refused():
    """SGLang omits `lora_name` and `medium` when they are none (its structs give them defaults), and its older
    releases sent positional events cut after the last field they had; vLLM's structs require those fields."""
    map_stored = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [1] * 16}
    map_stored |= {"block_size": 16, "lora_id": None, "cache_salt": "t"}  # no medium, no lora_name; a field not vLLM's
    positional = ["BlockStored", [8], 7, [2] * 16, 16, None]  # cut after lora_id
    no_size = ["BlockStored", [9], None, [3] * 16]  # cut before block_size: required
    removed = {"type": "BlockRemoved", "block_hashes": [7]}  # no medium
    payload = msgspec.msgpack.encode([1.0, [map_stored, positional, no_size, removed]])
    decoded, unknown, refused, shape = wire.decode_batch(payload)
    assert (unknown, refused, shape) == (0, 1, "array batch, positional events")
    first, second, third = decoded.events
    assert (first.block_hashes, first.medium, first.lora_name, first.block_size) == ([7], None, None, 16)
    assert (second.block_hashes, second.parent_block_hash, second.medium) == ([8], 7, None)
    assert third == wire.BlockRemoved(block_hashes=[7], medium=None)
