"""NVIDIA Dynamo's block hashes: what its KV router, and its request trace's `input_sequence_hashes`, name a prompt's
blocks by.

    local = block_hash(tokens[:16])                     # one block's tokens: xxh3-64 of them as u32 little-endian
    block_hashes(tokens, 16)                            # each whole block's, in order
    sequence_hashes(tokens, 16)                         # a prompt's blocks, root first (its last partial one too)
    next_sequence_hash(parent_sequence, local)          # a block's, from its parent's and its own tokens'

As Dynamo 1.6.1 computes them (its KV router's indexer), checked by reproducing every hash of the request rows its
own frontend wrote (`tests/fixtures/dynamo-trace`): a block's local hash is xxh3-64 with seed 1337 over its token
ids, each packed as four little-endian bytes; a chain's first block's sequence hash is its local hash, each later
block's is xxh3-64 (same seed) of its parent's sequence hash and its own local hash packed as two little-endian
u64s. A trace row hashes the prompt's last, partial block the same way. The same tokens give the same hashes on
every worker and in every run (no per-process seed, unlike an engine's own block hash): a trace row's blocks can be
found among a worker's KV events by their tokens.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

SEED = 1337
_PAIR = struct.Struct("<QQ")


def _xxh3_64(data: bytes) -> int:
    import xxhash  # (the collectors extra: read only where Dynamo's hashes are asked for)

    return xxhash.xxh3_64_intdigest(data, seed=SEED)


def block_hash(tokens: Sequence[int]) -> int:
    """One block's local hash: its tokens alone."""
    return _xxh3_64(struct.pack(f"<{len(tokens)}I", *tokens))


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Each whole block's local hash, in order (a partial last block is no block an engine stores; a block size of 0,
    an offload placeholder's, makes none)."""
    if block_size <= 0:
        return []
    whole = len(tokens) - len(tokens) % block_size
    return [block_hash(tokens[i : i + block_size]) for i in range(0, whole, block_size)]


def next_sequence_hash(parent: int | None, local: int) -> int:
    """A block's sequence hash: its local hash where it begins a chain, else its parent's and its own, hashed."""
    return local if parent is None else _xxh3_64(_PAIR.pack(parent, local))


def sequence_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """A prompt's blocks' sequence hashes, root first, as a Dynamo trace row lists them (a last partial block too)."""
    out: list[int] = []
    parent = None
    for start in range(0, len(tokens), block_size):
        parent = next_sequence_hash(parent, block_hash(tokens[start : start + block_size]))
        out.append(parent)
    return out
