"""KV-cache events as the collector reads them, whichever engine sent them: what an engine's adapter yields at the
door (`kvobs.vllm.normalize` for vLLM's wire), so nothing after the decoder reads an engine's wire again.

    decoded = normalize.decode(payload)             # vLLM's msgpack -> Decoded(batch, unknown, refused, shape)
    for event in decoded.batch.events:              # Stored | Removed | Cleared | Placeholder | UnknownTier, in order
        ...

Normalized means: block hashes as the store keeps them (unsigned 64-bit ints), a tier by kvobs's one name for it
(`kvobs.semconv.attributes.medium_name`), ids and names from outside cut to what a column holds
(`kvobs.identifiers.clip_id`, counted per batch), a block's extra hash keys as JSON text, an offload tier's
placeholder told apart, and a removal's reason only where it is one kvobs knows. Removals that follow one another
naming the same tier, group and reason come as one `Removed` of their hashes (vLLM sends one event a block).
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec


class Stored(msgspec.Struct, gc=False):
    """Blocks entered a tier's cache, in chain order: `hashes[0]`'s parent is `parent`, each next block's the one
    before it."""

    hashes: list[int]
    parent: int | None
    block_size: int  # tokens a block
    medium: str | None  # the tier (`medium_name`); None: the engine named none (its device cache)
    group_idx: int | None  # a hybrid model's KV-cache group; None: not given
    session_id: str | None  # clipped (`Batch.ids_cut`); None: the engine named none
    kv_cache_spec_kind: str | None = None  # clipped
    lora_name: str | None = None  # clipped
    extra_keys: list[str | None] | None = None  # one JSON text (or None) a hash; None: no block has extra keys
    first_tokens: list[int] | None = None  # a chain's start (no parent): its first block's tokens; None: not sent
    # each whole block's tokens hashed as Dynamo's router hashes them (`kvobs.dynamo_hashes.block_hash`), where the
    # decoder was asked (`normalize.decode(token_hashes=True)`: a Dynamo request trace is joined); None: not asked
    token_hashes: list[int] | None = None


class Removed(msgspec.Struct, gc=False):
    """Cached blocks of a tier lost their content."""

    hashes: list[int]
    medium: str | None
    group_idx: int | None
    reason: str | None  # kvobs's eviction or invalidation reason (`kvobs.semconv.reasons`); None: taken for room


class Cleared(msgspec.Struct, gc=False):
    """Every cached block was dropped (a prefix-cache reset)."""


class UnknownTier(msgspec.Struct, gc=False):
    """Blocks stored to or removed from a tier kvobs does not know (`kvobs.semconv.attributes.MEDIUMS`): not read as
    any tier's blocks (an unknown tier could be the device cache or a copy of it), counted and said."""

    hashes: list[int]
    medium: str  # as kvobs names it (`medium_name`: as sent, upper-cased)


class Placeholder(msgspec.Struct, gc=False):
    """An offload tier's copy of blocks whose content the engine did not describe (vLLM's offloading connector
    without self-describing events: no tokens, no block size): hashes that reached the tier, no blocks of a cache."""

    hashes: list[int]
    medium: str | None


Event = Stored | Removed | Cleared | Placeholder | UnknownTier


class Batch(msgspec.Struct, gc=False):
    ts: float  # the engine's own time for the batch (seconds since the epoch)
    events: list[Event]
    data_parallel_rank: int | None = None
    ids_cut: int = 0  # session ids of the batch's stores longer than a column holds, cut


class Decoded(NamedTuple):
    batch: Batch
    unknown: int  # events of a type the adapter does not know (skipped)
    refused: int  # known events that were malformed or held a value out of range (dropped alone)
    shape: str = ""  # the wire shape the engine sent (an adapter's own words, counted per stream)
    num_events: int = 0  # events as the engine sent them (before consecutive removals were merged), less skipped
