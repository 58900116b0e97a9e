"""vLLM's KV-event wire -> kvobs's normalized block events (`kvobs.block_events`): vLLM's adapter at the door.

    decoded = decode(payload)          # Decoded(Batch of Stored | Removed | Cleared, unknown, refused, shape)
    batch = normalize(wire_batch)      # a batch already decoded (`kvobs.vllm.kv_events.decode_batch`)

What it decides, so no reader after it does: hashes as unsigned 64-bit ints (`kv_events.as_uint64`), the tier's one
name (`tier_name`, of its medium, locality and owner), ids and names cut to a column (`clip_id`), each block's extra
keys as JSON, an offloading connector's placeholder (no tokens, block size 0) told apart, a tier kvobs does not know
failing closed (`UnknownTier`), and `BlockRemoved.reason` kept only where it is one of kvobs's engine's reasons
(vLLM sends none). Consecutive removals that name the same tier, group and reason become one `Removed`.
"""

from __future__ import annotations

import hashlib

import msgspec

from kvobs import dynamo_hashes
from kvobs.block_events import Batch, Cleared, Decoded, Event, Placeholder, Removed, Stored, UnknownTier
from kvobs.identifiers import clip_id
from kvobs.mooncake_store import normalize as mooncake_store
from kvobs.semconv.attributes import tier_name
from kvobs.semconv.limits import MAX_ID_BYTES
from kvobs.semconv.reasons import EvictionReason, InvalidationReason
from kvobs.vllm import kv_events as wire
from kvobs.vllm.kv_events import as_uint64, as_uint64_list

# The `BlockRemoved.reason` values a collector keeps (kvobs's engine's eviction and invalidation reasons); any other
# value is not ours and is kept as no reason.
REMOVAL_REASONS = frozenset(r.value for r in (*EvictionReason, *InvalidationReason))
EXTRA_KEYS_MAX_CHARS = 1024  # a block's extra keys kept as JSON up to this long, else as their digest
CLEARED = Cleared()
_json = msgspec.json.Encoder()


def decode(payload: bytes, *, token_hashes: bool = False) -> Decoded:
    """A vLLM payload, decoded (`kv_events.decode_batch`) and normalized (`token_hashes`: each store's blocks' tokens
    hashed as Dynamo hashes them, `Stored.token_hashes`); one that is not vLLM's but Mooncake Store master's, by
    its adapter (`kvobs.mooncake_store.normalize`).

    Raises:
        kv_events.DecodeError: the payload is not a batch (or its time is out of range).
    """
    try:
        batch, unknown, refused, shape = wire.decode_batch(payload, lean=True)
    except wire.DecodeError:
        pooled = mooncake_store.decode(payload)  # vLLM's framing, RFC #1527's events: Mooncake Store's master
        if pooled is None:
            raise
        return pooled
    normalized, bad_tokens = _normalize(batch, token_hashes)
    return Decoded(normalized, unknown, refused + bad_tokens, shape, len(batch.events) - bad_tokens)


def normalize(batch: wire.KVEventBatch) -> Batch:
    return _normalize(batch)[0]


def _normalize(batch: wire.KVEventBatch, token_hashes: bool = False) -> tuple[Batch, int]:
    """The normalized batch, and how many stores it refused for tokens that are not token ids (a lean decode checks
    a store's tokens only where they are read: a chain's first block, a placeholder's none)."""
    events: list[Event] = []
    bad_tokens = 0
    merging: Removed | None = None  # the removal the next ones of its tier, group and reason join
    sent: tuple = ()  # the merged removal's tier (medium, locality, owner), group and reason as sent
    ids_cut = 0
    for event in batch.events:
        if type(event) is wire.BlockRemoved:
            given = event.block_hashes
            if len(given) == 1 and type(given[0]) is int and given[0] >= 0:  # vLLM's: one unsigned int, kept
                hashes: list[int] = given  # type: ignore[assignment]
            else:
                hashes = as_uint64_list(given)
            said = (event.medium, event.locality, event.ownership, event.group_idx, event.reason)
            if merging is not None and sent == said:
                merging.hashes += hashes
                continue
            tier, known = tier_name(event.medium, event.locality, event.ownership)
            if not known:
                merging = None
                events.append(UnknownTier(hashes, tier or ""))  # (an unknown tier has a name)
                continue
            reason = event.reason if event.reason in REMOVAL_REASONS else None
            merging = Removed(hashes, tier, event.group_idx, reason)
            events.append(merging)
            sent = said
            continue
        merging = None
        if isinstance(event, wire.BlockStored):  # (or wire.LeanBlockStored)
            session, parent, lora = event.session_id, event.parent_block_hash, event.lora_name
            tier, known = tier_name(event.medium, event.locality, event.ownership)
            if not known:
                events.append(UnknownTier(as_uint64_list(event.block_hashes), tier or ""))
                continue
            try:  # (read only where they are used)
                read = token_hashes or parent is None or not event.block_size
                tokens = wire.tokens_of(event) if read else None
            except wire.DecodeError:
                bad_tokens += 1
                continue
            if event.block_size == 0 and not tokens:  # an offloading connector's placeholder (legacy payload)
                events.append(Placeholder(as_uint64_list(event.block_hashes), tier))
                continue
            if session is not None and len(session) * 4 > MAX_ID_BYTES:  # (`clip_id`'s own test, without a call)
                clipped = clip_id(session)
                ids_cut += clipped != session
                session = clipped
            events.append(
                Stored(
                    as_uint64_list(event.block_hashes),
                    parent if parent is None or (type(parent) is int and parent >= 0) else as_uint64(parent),
                    event.block_size,
                    tier,
                    event.group_idx,
                    session,
                    None if event.kv_cache_spec_kind is None else clip_id(event.kv_cache_spec_kind),
                    None if lora is None else clip_id(lora),
                    None if event.extra_keys is None else extra_keys_json(event),
                    tokens[: event.block_size] if parent is None and tokens else None,
                    dynamo_hashes.block_hashes(tokens or [], event.block_size) if token_hashes else None,
                )
            )
        elif type(event) is wire.AllBlocksCleared:
            events.append(CLEARED)
    return Batch(batch.ts, events, batch.data_parallel_rank, ids_cut), bad_tokens


def extra_keys_json(event: wire.BlockStored) -> list[str | None] | None:
    """Each stored block's extra hash keys (multimodal ids, cache salt, adapter, ...) as JSON text, one per block hash
    (None where vLLM gave none; None for all when no block has any); keys longer than `EXTRA_KEYS_MAX_CHARS` as
    `sha256:<hex>` of that JSON, which still compares equal between blocks with the same keys."""
    n, given = len(event.block_hashes), event.extra_keys
    if not given or all(keys is None for keys in given):
        return None
    out: list[str | None] = []
    for keys in list(given[:n]) + [None] * (n - len(given)):
        if keys is None:
            out.append(None)
            continue
        text = _json.encode(keys)
        out.append(text.decode() if len(text) <= EXTRA_KEYS_MAX_CHARS else f"sha256:{hashlib.sha256(text).hexdigest()}")
    return out
