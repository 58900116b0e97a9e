"""vLLM's adapter at the door: what `kvobs.vllm.normalize` decides, so no reader after it looks at vLLM's wire."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec

from collectors.capture import read_kv_messages
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


def _recorded_payloads() -> dict[str, list[bytes]]:
    """Every recording of vLLM's wire (vLLM 0.32, its tiers and sessions, both fleets, SGLang, Dynamo's relay)."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    out = {}
    for path in sorted(fixtures.glob("**/kv_events.jsonl")):
        out[str(path.relative_to(fixtures))] = [frames[-1] for _, frames in read_kv_messages(path)]
    for path in (
        fixtures / "vllm-tiers" / "frames.jsonl",
        fixtures / "vllm-tiers" / "sessions.jsonl",
        fixtures / "sglang" / "frames.jsonl",
        fixtures / "trtllm" / "dynamo_frames.jsonl",
    ):
        lines = path.read_text().splitlines()
        out[str(path.relative_to(fixtures))] = [bytes.fromhex(json.loads(line)["payload"]) for line in lines]
    return out


def _full(payload: bytes):
    """The door's decode with every store's tokens decoded and checked (the path before the lean one)."""
    batch, unknown, refused, shape = wire.decode_batch(payload)
    return normalize(batch), unknown, refused, shape, len(batch.events)


def test_the_lean_decode_gives_every_recording_s_events_as_the_full_one_does():
    recordings = _recorded_payloads()
    assert len(recordings) >= 9 and all(recordings.values())
    for name, payloads in recordings.items():
        for payload in payloads:
            assert tuple(decode(payload)) == _full(payload), name


def test_the_lean_decode_checks_tokens_where_they_are_read_and_matches_the_full_one_on_random_batches():
    rng = random.Random(7)
    for _ in range(300):
        events: list = []
        for _ in range(rng.randint(1, 12)):
            roll = rng.random()
            if roll < 0.4:
                events.append(wire.BlockRemoved([rng.getrandbits(64)], rng.choice(["GPU", "CPU", None])))
            elif roll < 0.45:
                events.append(wire.AllBlocksCleared())
            else:
                n, size = rng.randint(1, 3), rng.choice([0, 4, 16])
                tokens = [rng.randrange(50_000) for _ in range(n * size)]
                events.append(
                    wire.BlockStored(
                        [rng.getrandbits(64) for _ in range(n)],
                        rng.choice([None, rng.getrandbits(63)]),
                        tokens,
                        size,
                        None,
                        rng.choice(["GPU", "cpu"]),
                        None,
                        session_id=rng.choice([None, "s1", "s2"]),
                    )
                )
        payload = wire.encode_batch(wire.KVEventBatch(1.5, events))
        assert tuple(decode(payload)) == _full(payload)
    # tokens that are not token ids: refused where they are read (a chain's first block, a placeholder's), as the
    # full decode refuses them; in a chain's later block, where no reader looks, the lean decode keeps the store
    bad = msgspec.msgpack.encode(["a"] * 16)
    start = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": msgspec.Raw(bad),
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    later = {**start, "block_hashes": [2], "parent_block_hash": 1}
    placeholder = {**start, "block_hashes": [3], "block_size": 0}
    removed = wire.BlockRemoved([9], "GPU")
    for event, kept in ((start, False), (placeholder, False), (later, True)):
        payload = msgspec.msgpack.encode([1.5, [event, removed], None])
        lean, full = decode(payload), _full(payload)
        assert (full[0].events, full[2]) == ([Removed([9], "GPU", None, None)], 1)
        assert (len(lean.batch.events), lean.refused) == ((2, 0) if kept else (1, 1))
        if kept:
            assert lean.batch.events[0] == Stored([2], 1, 16, "GPU", None, None, None, None, None, None)
