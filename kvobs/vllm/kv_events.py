"""vLLM's KV-cache event stream: message structs, encoding, decoding and the socket rules.

The wire format (vLLM 0.24 and later, checked against frames recorded from vLLM 0.32):

- a ZMQ PUB message of 3 frames: `topic`, the sequence number (8-byte big-endian, per publisher,
  from 0), and the payload;
- the payload is msgpack of the batch `[ts, events, data_parallel_rank]` (a positional array; vLLM's main has
  moved it to a map `{"ts": ..., "events": [...], "data_parallel_rank": ...}` too: `decode_batch` reads both);
- each event is a msgpack map tagged by `"type"`: `BlockStored`, `BlockRemoved` or `AllBlocksCleared`.
  Releases up to 0.23 sent positional arrays `["BlockStored", hashes, parent, ...]` instead;
  `decode_batch` accepts both and ignores fields it does not know.
- An offloading connector's placeholder (`BlockStored` with no `token_ids` and `block_size` 0: the block's hash
  reached another tier, its content not described) is decoded as it is; `kvobs.vllm.normalize` flags it.

Values are checked where they are decoded: sizes, ids and indexes are integers in [0, 2^63) and the batch time a
finite, non-negative number, what every store column can hold. An event with a value out of range (or a known
event that is malformed) is refused alone and counted; the batch's other events go on. A batch whose own time is
out of range is refused whole.

Block hashes are the unsigned low 64 bits of the block digest (`bytes` when vLLM runs with
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`). The structs below encode byte-for-byte as vLLM does, so a
stock vLLM subscriber decodes what `encode_batch` produces.

Replay: a DEALER (or REQ) client sends the first wanted sequence number (8 bytes, big-endian) to the
publisher's ROUTER socket; vLLM 0.33 answers one `(topic, seq, payload)` message per buffered batch
from that number on, then `(b"", REPLAY_END, b"")`; releases up to 0.24 answered `(seq, payload)`.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import msgspec

REPLAY_END = (-1).to_bytes(8, "big", signed=True)

BlockHash = int | bytes
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # what a signed 64-bit column holds
Timestamp = Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]  # seconds since the epoch: finite, before year 5138
UINT64_MASK = 2**64 - 1


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (the tag is the class name, under the key "type")."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the prefix cache; `token_ids` holds every stored block's tokens in order."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: Count
    lora_id: Count | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: Count | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: Count | None = None
    locality: str | None = None  # vLLM 0.26+: a storage tier's place, LOCAL or REMOTE to the replica; None: unspecified
    ownership: str | None = None  # vLLM 0.32: the secondary tier that published it (its name: "fs", "kvcr"); None: none
    session_id: str | None = None  # vLLM 0.32's (the request's `session_id`), and our engine's before it


class BlockRemoved(KVCacheEvent):
    """Cached blocks lost their content (vLLM emits one event per block).

    `reason` is kvobs's extension, sent by our engine only when the block was not simply taken for room (a session
    release, a TTL, an invalidation: `kvobs.vllm.normalize.REMOVAL_REASONS`); vLLM never sends it, and a subscriber
    that does not know the key ignores it (msgspec's default for map-encoded structs), so an ordinary eviction's
    bytes are vLLM's."""

    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: Count | None = None
    locality: str | None = None
    ownership: str | None = None
    reason: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """Every cached block was dropped (a successful prefix-cache reset)."""


class LeanBlockStored(BlockStored, tag="BlockStored"):
    """`BlockStored` as a collector decodes it (`decode_batch(lean=True)`): its tokens left as msgpack, read only
    where they are used (`tokens_of`); decoding every block's tokens was most of a batch's decode."""

    token_ids: msgspec.Raw  # type: ignore[assignment]


Event = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: Timestamp
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _CheckedBatch(msgspec.Struct, array_like=True, gc=False):
    ts: Timestamp
    events: list[Event]
    data_parallel_rank: int | None = None


class _RawMapBatch(msgspec.Struct, gc=False):  # the batch as a map (vLLM's main)
    ts: Timestamp
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _CheckedMapBatch(msgspec.Struct, gc=False):
    ts: Timestamp
    events: list[Event]
    data_parallel_rank: int | None = None


LeanEvent = LeanBlockStored | BlockRemoved | AllBlocksCleared


class _LeanBatch(msgspec.Struct, array_like=True, gc=False):
    ts: Timestamp
    events: list[LeanEvent]
    data_parallel_rank: int | None = None


class _LeanMapBatch(msgspec.Struct, gc=False):
    ts: Timestamp
    events: list[LeanEvent]
    data_parallel_rank: int | None = None


_MAP_MARKERS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}  # msgpack's fixmap, map 16 and map 32 first bytes
_ARRAY_MARKERS = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}  # fixarray, array 16 and array 32


_encoder = msgspec.msgpack.Encoder()
# (checked, raw) decoders for each batch shape; checked: the common case, every event known and valid
_ARRAY_BATCH = (msgspec.msgpack.Decoder(_CheckedBatch), msgspec.msgpack.Decoder(_RawBatch))
_MAP_BATCH = (msgspec.msgpack.Decoder(_CheckedMapBatch), msgspec.msgpack.Decoder(_RawMapBatch))
_LEAN = (msgspec.msgpack.Decoder(_LeanBatch), msgspec.msgpack.Decoder(_LeanMapBatch))  # (array batch, map batch)
_token_decoder = msgspec.msgpack.Decoder(list[Count])
_map_event_decoder = msgspec.msgpack.Decoder(Event)
_any_decoder = msgspec.msgpack.Decoder()
_POSITIONAL: dict[str, type[BlockStored | BlockRemoved | AllBlocksCleared]] = {
    cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)
}


class DecodeError(ValueError):
    """A payload that is not a vLLM KV-event batch."""


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


class Decoded(NamedTuple):
    batch: KVEventBatch
    unknown: int  # events of a type this release does not know (skipped)
    refused: int  # known events that were malformed or held a value out of range (dropped alone)
    shape: str = ""  # the wire shape (`WIRE_SHAPES`): the batch's, then its events'


# what `Decoded.shape` says: a batch as an array (vLLM until mid-2026) or a map, its events as maps tagged `type`
# (vLLM 0.24+) or positional arrays (up to 0.23)
WIRE_SHAPES = (
    "array batch, map events",
    "array batch, positional events",
    "map batch, map events",
    "map batch, positional events",
)


def decode_batch(payload: bytes, *, lean: bool = False) -> Decoded:
    """Decode a payload: the batch, and how many of its events were skipped as unknown or refused as bad. `lean`: a
    fast path's stores leave their tokens undecoded (`LeanBlockStored`, read by `tokens_of`, which checks them).

    Raises:
        DecodeError: the payload is not a batch (or its time is out of range).
    """
    as_map = bool(payload[:1]) and payload[0] in _MAP_MARKERS
    checked, raw_decoder = _MAP_BATCH if as_map else _ARRAY_BATCH
    fast: msgspec.msgpack.Decoder[Any] = _LEAN[as_map] if lean else checked
    batch_shape = "map batch" if as_map else "array batch"
    try:  # all in one pass when every event is a known, valid map (what vLLM 0.24+ sends): the fast path
        whole = fast.decode(payload)
        batch = KVEventBatch(whole.ts, whole.events, whole.data_parallel_rank)
        return Decoded(batch, 0, 0, f"{batch_shape}, map events")
    except (msgspec.DecodeError, ValueError):
        pass  # an unknown, positional or bad event among them (or not a batch): event by event, to say which
    try:
        raw = raw_decoder.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        raise DecodeError(f"not a KV-event batch: {exc}") from exc
    events: list[Event] = []
    unknown = refused = 0
    positional = any(bytes(item)[:1] and bytes(item)[0] in _ARRAY_MARKERS for item in raw.events)
    for item in raw.events:
        try:
            event = _decode_event(bytes(item))
        except DecodeError:
            refused += 1
            continue
        if event is None:
            unknown += 1
        else:
            events.append(event)
    shape = f"{batch_shape}, {'positional' if positional else 'map'} events"
    return Decoded(KVEventBatch(raw.ts, events, raw.data_parallel_rank), unknown, refused, shape)


def tokens_of(event: BlockStored) -> list[int]:
    """A store's tokens, decoded where a lean decode left them as msgpack.

    Raises:
        DecodeError: they are not a list of token ids.
    """
    tokens: list[int] | msgspec.Raw = event.token_ids
    if isinstance(tokens, list):
        return tokens
    try:
        return _token_decoder.decode(tokens)
    except (msgspec.DecodeError, ValueError) as exc:
        raise DecodeError(f"malformed KV event: token_ids: {exc}") from exc


def _decode_event(data: bytes) -> Event | None:
    try:
        return _map_event_decoder.decode(data)
    except msgspec.ValidationError as exc:
        try:
            value = _any_decoder.decode(data)
        except (msgspec.DecodeError, ValueError) as inner:  # ValueError: a string that is not UTF-8
            raise DecodeError(f"malformed KV event: {inner}") from inner
        if isinstance(value, dict) and value.get("type") not in _POSITIONAL:
            return None  # a newer event type: skip it
        if isinstance(value, dict):
            fields = {k: v for k, v in value.items() if k != "type"}
            return _with_missing_as_none(_POSITIONAL[value["type"]], fields)
        if not isinstance(value, list):
            raise DecodeError(f"malformed KV event: {exc}") from exc
    except (msgspec.DecodeError, ValueError) as exc:
        raise DecodeError(f"malformed KV event: {exc}") from exc
    return _decode_positional(value)


def _with_missing_as_none(cls: type[Event], given: dict) -> Event:
    """`given` (an event's fields by name) as `cls`, a field left out as none: SGLang omits its optional fields
    (`lora_name`, `medium`) when they are none, which vLLM's structs require; a required one missing is refused."""
    given.update((name, None) for name in cls.__struct_fields__ if name not in given)
    try:
        return msgspec.convert(given, cls)
    except msgspec.ValidationError as exc:
        raise DecodeError(f"malformed {cls.__name__} event: {exc}") from exc


def _decode_positional(value: list) -> Event | None:
    """Releases up to 0.23 (and SGLang's older ones): `[tag, field0, field1, ...]` in declaration order; extra trailing
    fields ignored, missing ones none (refused where a required field is missing)."""
    if not value or not isinstance(value[0], str):
        raise DecodeError(f"malformed positional KV event: {value!r:.80}")
    cls = _POSITIONAL.get(value[0])
    if cls is None:
        return None
    fields = cls.__struct_fields__
    return _with_missing_as_none(cls, dict(zip(fields, value[1 : 1 + len(fields)])))


def should_bind(endpoint: str) -> bool:
    """vLLM's rule: the publisher binds a wildcard or local-transport endpoint, else it connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def seq_bytes(seq: int) -> bytes:
    """A sequence number as vLLM sends it: 8 bytes, big-endian."""
    return seq.to_bytes(8, "big")


def seq_from_bytes(data: bytes) -> int:
    """The one decoder of a sequence frame (a batch's, a replay request's or reply's): signed, so the end mark
    `REPLAY_END` reads -1; DecodeError unless 8 bytes."""
    if len(data) != 8:
        raise DecodeError(f"sequence frame must be 8 bytes; got {len(data)}")
    return int.from_bytes(data, "big", signed=True)


def as_uint64(block_hash: BlockHash) -> int:
    """A hash as the store keeps it (UInt64): ints as they are, a negative one (Python's built-in `hash` of old
    releases) as its two's complement; bytes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`) reduced to the low 64 bits,
    big-endian, which is the int vLLM would have published."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big")
    return block_hash & UINT64_MASK


def as_uint64_list(block_hashes: list) -> list[int]:
    """`as_uint64` of each hash of an event, ints masked in one comprehension: a stored event carries up to
    thousands of hashes, and a call per hash would cost as much as the rest of their ingest. The wire allows ints
    and bytes in one list: one that is not all ints goes hash by hash. A list of ints already in range is returned as
    it is (msgpack's unsigned ints are: only old releases sent negative ones)."""
    if block_hashes and type(block_hashes[0]) is int:
        try:
            if min(block_hashes) >= 0 and max(block_hashes) <= UINT64_MASK:
                return block_hashes
            return [h & UINT64_MASK for h in block_hashes]
        except TypeError:  # bytes among the ints
            pass
    return [as_uint64(h) for h in block_hashes]
