"""Mooncake Store master's KV events -> kvobs's normalized block events (`kvobs.block_events`): its adapter at the door.

    decoded = decode(payload)    # a Mooncake master batch -> Decoded; None: the payload is not one (vLLM's, say)

Mooncake's master (`mooncake_master --enable_kv_events`, `kv_event_publisher.cpp`, kvcache-ai/Mooncake at
0d1884d64521) publishes the standardized KV events of Dynamo's RFC #1527 on a ZMQ PUB socket in vLLM's framing
(empty topic, 8-byte big-endian sequence, msgpack payload): a payload is `[timestamp_ms, [event map, ...], dp_rank]`,
each event a map with `event_type` `stored`, `removed` or `cleared` (and, by default, vLLM's `type` beside it), the
object's `medium` (`cpu` or `disk`), `object_key`, `seq_hashes`, `tenant_id`, `backend_id` and `group_id`; no tokens,
no parent, and a block size only where the master was given one. Each object is a pooled block, its availability per
medium: a copy moved to disk is a `stored` on `disk` and a `removed` on `cpu`.

What kvobs makes of it:
- a block's hash: its `seq_hashes` (or vLLM's `block_hashes`) where the master sent any; else its `object_key` read
  as a u64 where it is one (decimal or `0x` hex, as Mooncake's earlier publisher parsed it); else the key's SHA-256,
  first 8 bytes (a key of LMCache's, say): equal keys, equal blocks;
- its tier: the medium as kvobs names it, REMOTE (`REMOTE_CPU`, `REMOTE_DISK`): a pool every replica of the fleet
  reads, never one replica's own (`is_shared_tier`), so no routing loss is claimed against it;
- `stored` -> `Stored` (no parent, the block size given or 0: not said), `removed` -> `Removed`, `cleared` -> `Cleared`;
  another `event_type` is unknown (skipped, counted), a store or removal naming no block is refused alone.

A full publisher queue drops its oldest event and skips a sequence number for it, so each dropped event is a gap the
subscriber counts as a batch lost (`kvobs_collector_kv_event_batches_lost_total`: from Mooncake, each one event):
Mooncake has no replay socket to fill it.
"""

from __future__ import annotations

import hashlib

import msgspec

from kvobs.block_events import Batch, Cleared, Decoded, Event, Removed, Stored
from kvobs.semconv.attributes import LOCALITY_REMOTE, tier_name
from kvobs.vllm.kv_events import as_uint64_list

SHAPE = "mooncake store: map events"  # the wire shape a batch of Mooncake's master is counted under
_MS_FROM = 1e11  # a batch time past this is milliseconds (Mooncake's), not seconds
_any = msgspec.msgpack.Decoder()
CLEARED = Cleared()


def decode(payload: bytes) -> Decoded | None:
    """A Mooncake master payload, normalized; None where the payload is not one (its events are not maps naming
    an `event_type`)."""
    try:
        value = _any.decode(payload)
    except (msgspec.DecodeError, ValueError):
        return None
    if not (isinstance(value, list) and len(value) >= 2 and isinstance(value[1], list)):
        return None
    ts, items = value[0], value[1]
    if not all(isinstance(e, dict) and "event_type" in e for e in items) or not items:
        return None
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts < 1e14:
        return None
    events: list[Event] = []
    unknown = refused = 0
    for item in items:
        kind = item.get("event_type")
        if kind == "cleared":
            events.append(CLEARED)
            continue
        if kind not in ("stored", "removed"):
            unknown += 1
            continue
        hashes = _hashes(item)
        tier, known = tier_name(_text(item.get("medium")), LOCALITY_REMOTE)
        if not hashes or tier is None or not known:
            refused += 1
            continue
        if kind == "stored":
            size = item.get("block_size")
            size = size if type(size) is int and 0 < size < 2**31 else 0
            events.append(Stored(hashes, None, size, tier, None, None))
        else:
            events.append(Removed(hashes, tier, None, None))
    seconds = ts / 1000 if ts > _MS_FROM else float(ts)
    return Decoded(Batch(seconds, events), unknown, refused, SHAPE, len(items) - unknown - refused)


def _hashes(item: dict) -> list[int]:
    for name in ("seq_hashes", "block_hashes"):
        given = item.get(name)
        if isinstance(given, list) and given and all(type(h) is int for h in given):
            return as_uint64_list(given)  # (signed 64-bit where a publisher sent them so)
    key = item.get("object_key")
    if not isinstance(key, str) or not key:
        return []
    return [key_hash(key)]


def key_hash(key: str) -> int:
    """An object key as a block hash: the u64 it spells (decimal or `0x` hex), else its SHA-256's first 8 bytes."""
    try:
        value = int(key, 16) if key[:2].lower() == "0x" else int(key, 10) if key.isdigit() else -1
    except ValueError:
        value = -1
    if 0 <= value < 2**64:
        return value
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None
